"""Full-information feedback on answers (answer_feedback: full): the scores of every
alternative answer symbol, and the exact expected gradient they give."""

import numpy as np
import torch

from marl.algorithms.alphabets import pad_ids
from marl.algorithms.feedback import alternative_scores, answer_loss
from marl.policies.base import Completion, Policy
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team
from tests.marl.conftest import ROOT


class Babble(Policy):
    """The task's random messages, tokenised as a model would have written them (ids and a
    stop token), and garbage for every ``garbage``-th request."""

    def __init__(self, task, tokenizer, garbage: int = 0):
        self.task, self.tokenizer, self.garbage = task, tokenizer, garbage
        self.rng, self.calls = np.random.default_rng(0), 0

    def generate(self, requests, greedy=False):
        out = []
        for r in requests:
            self.calls += 1
            text = self.task.random_message(r.agent, r.final, self.rng)
            if self.garbage and self.calls % self.garbage == 0:
                text = "x" * len(text)
            ids = tuple(self.tokenizer.encode(text + "\n"))
            out.append(Completion(text, ids, (0.0,) * len(ids), "stop",
                                  tuple(self.tokenizer.encode_prompt(r.observation))))
        return out


def vote_team(answer):
    return load_team({"name": "votes", "task": {"name": "vote_v0",
                                                "params": {"classes": 4, "noise": 0.5}},
                      "agents": {"count": 3, "id": "v{i}", "role": "voter"},
                      "policies": {"default": {"backend": "tiny", "max_new_tokens": 2}},
                      "topology": {"kind": "chain"}, "protocol": {"answer": answer}})


def played(team, garbage=0):
    tok = build_policies(team, seed=0)[team.ids[0]].tokenizer
    babble = Babble(team.task, tok, garbage)
    batch = collect(team, dict.fromkeys(team.ids, babble), episodes=6, group_size=2, seed=0)
    rows = [(b, k) for b in range(len(batch.records)) for k in range(len(batch.call_agent))]
    digits = [[tok.encode(c)[0] for c in "0123"]]
    support = pad_ids([digits if team.is_final_call(batch.agents[int(batch.call_agent[k])], 0)
                       else [] for _, k in rows])
    return batch, rows, support


def test_a_lone_answerer_is_told_the_score_of_every_answer_and_the_rest_nothing():
    team = vote_team("v2")
    batch, rows, support = played(team)
    alt = alternative_scores(team, batch, rows, support)
    assert alt.shape == (len(rows), 1, 4)
    for i, (b, k) in enumerate(rows):
        if batch.agents[int(batch.call_agent[k])] == "v2":
            label = batch.instances[b].data["label"]
            assert alt[i, 0].tolist() == [float(a == label) for a in range(4)]
        else:
            assert alt[i].isnan().all()


def test_a_voters_alternatives_change_the_majority_they_vote_in():
    team = vote_team({"vote": ["v0", "v1", "v2"]})
    batch, rows, support = played(team)
    alt = alternative_scores(team, batch, rows, support)
    checked = 0
    for i, (b, k) in enumerate(rows):
        votes = list(batch.records[b]["answers"])
        voter = int(batch.call_agent[k])
        for a in range(4):
            votes[voter] = str(a)
            expected = float(team.task.team_answer(votes) == batch.instances[b].answer)
            assert alt[i, 0, a] == expected
            checked += expected
    assert checked > 0  # some alternatives would have won


def test_ill_formed_answers_have_no_alternatives():
    team = vote_team("v2")
    batch, rows, support = played(team, garbage=2)
    alt = alternative_scores(team, batch, rows, support)
    answers = [i for i, (b, k) in enumerate(rows) if int(batch.call_agent[k]) == 2]
    bad = [i for i in answers if not batch.valid[rows[i]]]
    assert bad and len(bad) < len(answers)
    assert all(alt[i].isnan().all() for i in bad)
    assert all(not alt[i].isnan().any() for i in answers if i not in bad)


def test_the_loss_is_the_log_of_the_expected_gain_over_the_alphabet():
    # Where the alphabet holds every token: -log E_pi[R - min R], with its exact gradient;
    # one scoring answer makes it that answer's cross-entropy.
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 2, 5, generator=gen, requires_grad=True)
    scores = torch.rand(3, 2, 5, generator=gen)
    ids = torch.arange(5).expand(3, 2, 5)
    loss, where = answer_loss(torch.log_softmax(logits, -1), ids, scores)
    assert where.all()
    gain = scores - scores.amin(-1, keepdim=True)
    exact = -(torch.softmax(logits, -1) * gain).sum(-1).log()
    assert torch.allclose(loss, exact, atol=1e-5)
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    (want,) = torch.autograd.grad(exact.sum(), logits)
    assert torch.allclose(grad, want, atol=1e-5)
    one = torch.zeros(1, 1, 5)
    one[0, 0, 3] = 1.0
    told, _ = answer_loss(torch.log_softmax(logits[:1, :1], -1), ids[:1, :1], one)
    assert torch.allclose(told, -torch.log_softmax(logits[:1, :1], -1)[..., 3], atol=1e-5)


def test_no_loss_and_no_nan_where_nothing_was_scored_or_every_answer_scores_alike():
    logits = torch.zeros(3, 2, 4, requires_grad=True)
    scores = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(3, 2, 1)
    scores[0, 1] = float("nan")  # an ill-formed answer: no alternatives
    scores[1, 1] = 0.5  # every alternative scores the same
    ids = torch.arange(4).expand(3, 2, 4).clone()
    ids[2] = -1  # a row without an alphabet
    loss, where = answer_loss(torch.log_softmax(logits, -1), ids, scores)
    assert where.tolist() == [[True, False], [True, False], [False, False]]
    assert loss[~where].eq(0).all() and torch.allclose(loss[where], torch.tensor(4.0).log())
    loss.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[~where].eq(0).all()


def test_alternatives_are_scored_once_per_distinct_team_answer(monkeypatch):
    team = vote_team({"vote": ["v0", "v1", "v2"]})
    batch, rows, support = played(team)
    calls = []
    real = type(team.task).verdict
    monkeypatch.setattr(type(team.task), "verdict",
                        lambda self, inst, ans: calls.append(ans) or real(self, inst, ans))
    alternative_scores(team, batch, rows, support)
    assert 0 < len(calls) < 4 * len(rows)  # alternatives often leave the majority as it was


def test_in_a_zero_sum_game_each_side_is_told_its_own_score_with_the_other_as_played():
    team = load_team(ROOT / "scenarios" / "cipher.yaml")
    tok = build_policies(team, seed=0)["bob"].tokenizer
    babble = Babble(team.task, tok)
    batch = collect(team, dict.fromkeys(team.ids, babble), episodes=6, group_size=2, seed=0)
    rows = [(b, k) for b in range(len(batch.records)) for k in range(len(batch.call_agent))]
    digits = [[tok.encode(c)[0] for c in "0123"]]
    agents = [batch.agents[int(batch.call_agent[k])] for _, k in rows]
    support = pad_ids([digits if a in ("bob", "eve") else [] for a in agents])
    alt = alternative_scores(team, batch, rows, support)
    for i, ((b, _), agent) in enumerate(zip(rows, agents, strict=True)):
        if agent == "alice":
            assert alt[i].isnan().all()
            continue
        side = team.side_of(agent)
        played = {s: v["answer"] for s, v in batch.records[b]["sides"].items()}
        for a in range(4):
            said = {**played, side: str(a)}
            assert alt[i, 0, a] == team.task.score_sides(batch.instances[b], said)[side]
    assert (alt[~alt.isnan()] < 0).any()  # the other side's right answer costs this one


def test_each_position_of_an_all_or_nothing_answer_is_told_its_right_symbol():
    """A two-letter fact is right only as a whole: each position is told the best score it
    can be part of, every one of the 676 answers scored, so whatever the other letter
    said, position j is told that the fact's j-th letter is right and no other."""
    import string

    team = load_team({"name": "pair", "task": {"name": "relay_v0",
                                               "params": {"fact_length": 2, "source": "r0"}},
                      "agents": {"count": 2, "id": "r{i}", "role": "relay"},
                      "policies": {"default": {"backend": "tiny", "max_new_tokens": 3}},
                      "topology": {"kind": "chain"}, "protocol": {"answer": "r1"}})
    tok = build_policies(team, seed=0)["r0"].tokenizer
    batch = collect(team, dict.fromkeys(team.ids, Babble(team.task, tok)), episodes=4,
                    group_size=2, seed=0)
    rows = [(b, k) for b in range(len(batch.records)) for k in range(len(batch.call_agent))]
    letters = [tok.encode(c)[0] for c in string.ascii_lowercase]
    support = pad_ids([[letters, letters] if batch.agents[int(batch.call_agent[k])] == "r1"
                       else [] for _, k in rows])
    alt = alternative_scores(team, batch, rows, support)
    answered = 0
    for i, (b, k) in enumerate(rows):
        if batch.agents[int(batch.call_agent[k])] != "r1":
            assert alt[i].isnan().all()
            continue
        fact = batch.instances[b].answer
        assert batch.records[b]["answers"][0] != fact  # the played answer was wrong
        for j in range(2):
            assert alt[i, j].tolist() == [float(c == fact[j]) for c in string.ascii_lowercase]
        answered += 1
    assert answered == 8
