"""Replay of told answers (answer_replay): the buffer, its effect on an update, and its
place in a resumed run."""

import math

import torch

from marl.algorithms.common import replayed_told, samples_for, trainables, update
from marl.algorithms.config import TrainConfig
from marl.algorithms.replay import packed, remember, told_rows
from marl.rollout import collect
from marl.runner import build_policies
from tests.marl.algorithms.test_feedback import Babble, vote_team
from tests.marl.conftest import kill_and_resume


def entry(rows: int, width: int, size: int) -> dict:
    return {"prompts": [[1, 2]] * rows, "completions": [[3]] * rows,
            "support": torch.zeros(rows, width, size, dtype=torch.long),
            "alternatives": torch.ones(rows, width, size)}


def test_the_buffer_keeps_the_last_iterations_and_counts_those_without_told_answers():
    buffer: list = []
    for i in range(4):
        remember(buffer, entry(i + 1, 1, 4) if i != 2 else None, 2)
    assert [len(e.get("prompts", [])) for e in buffer] == [0, 4]
    both = packed([entry(2, 1, 4), {}, entry(3, 2, 10)])
    assert both["support"].shape == (5, 2, 10) and len(both["prompts"]) == 5
    assert both["support"][:2, 1].eq(-1).all() and both["alternatives"][:2, :, 4:].isnan().all()
    assert both["alternatives"][2:].eq(1).all() and packed([{}]) is None


def test_only_rows_told_their_alternatives_are_kept():
    alt = torch.full((3, 1, 4), float("nan"))
    alt[1, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    kept = told_rows([(1,), (2,), (3,)], [[4], [5], [6]], torch.zeros(3, 1, 4, dtype=torch.long),
                     alt)
    assert kept["prompts"] == [[2]] and kept["completions"] == [[5]]
    assert kept["alternatives"].tolist() == [[[0.0, 1.0, 0.0, 0.0]]]
    assert told_rows([(1,)], [[4]], None, None) is None
    assert told_rows([(1,)], [[4]], torch.zeros(1, 1, 4, dtype=torch.long),
                     torch.full((1, 1, 4), float("nan"))) is None


def shifted(alt: torch.Tensor) -> torch.Tensor:
    """The scores of a task whose right answer is the next label (mod 4)."""
    return alt.roll(1, dims=-1)


def told_losses(replay: bool) -> tuple[float, float]:
    """A lone answerer's told loss on its well-formed answers (four labels, scored by the
    task), against the task's scores and against :func:`shifted` ones, after 20 updates of
    lr 1e-2 that learn from the told scores alone (advantages 0), with or without a buffer
    that holds the same answers told the shifted scores."""
    team = vote_team("v2")
    policies = build_policies(team, seed=0)
    cfg = TrainConfig(answer_feedback="full", answer_replay=3 if replay else 0,
                      lr=1e-2, kl_coef=0.0, entropy_coef=0.0, answer_floor=0.0, warmup_steps=0)
    (t,) = trainables(team, policies, cfg)
    babble = Babble(team.task, t.policy.tokenizer)
    batch = collect(team, dict.fromkeys(team.ids, babble), episodes=8, group_size=2, seed=0)
    s = samples_for(t, team, batch, torch.zeros(len(batch.records), len(team.ids)), False,
                    support="answers", feedback=True)
    mine = told_rows(s.prompts, s.completions, s.support, s.alternatives)
    other = {**mine, "alternatives": shifted(mine["alternatives"])}
    for i in range(20):
        t.told = [other] * 3 if replay else []  # replay the shifted copy, not this batch
        update(t, s, cfg, 0.0, seed=i)
    return tuple(float(total.detach() / count)
                 for total, count in (replayed_told(t, mine), replayed_told(t, other)))


def test_replayed_answers_teach_the_answer():
    """Alone, the answer learns the task's scores; with a buffer whose answers were told
    other scores (the next label right), half of each step's told term is theirs and the
    answer learns those too: closer to them than it came alone, further from the task's."""
    chance = math.log(4)
    real_alone, other_alone = told_losses(replay=False)
    real_replayed, other_replayed = told_losses(replay=True)
    assert real_alone < chance - 0.1 < other_alone
    assert other_replayed < other_alone - 0.1 and real_replayed > real_alone + 0.05


def test_kill_and_resume_keeps_the_replayed_answers(tmp_path):
    """Killed at 5 and resumed from the checkpoint at 4: the told answers of iterations
    2-4 come back with the learner's state, or iteration 5's update would differ."""
    from tests.marl.training.test_trainer import lone_answerer, small

    cfg = small(iterations=6, answer_feedback="full", answer_replay=3, warmup_steps=20,
                warmup_episodes=8, checkpoint_every=4)
    full, again = kill_and_resume(lone_answerer(), cfg, tmp_path, kill_at=5, resume_from=4)
    rl = [r for r in full if r["phase"] == "rl"]
    assert again == full and [r.get("replayed", 0) > 0 for r in rl][1:] == [True] * 5
