"""The trainer as a library (what populations drive): build from given policies, step,
save / restore into another trainer, and settings changed between steps."""

import pytest
import torch

from marl.algorithms.config import TrainConfig
from marl.errors import ConfigError, MarlError
from marl.team import load_team
from marl.training.trainer import MUTABLE, Trainer
from tests.marl.conftest import ROOT


def cfg(**kw) -> TrainConfig:
    base = dict(episodes_per_iter=2, group_size=4, eval_every=3, eval_episodes=4,
                checkpoint_every=100, warmup_steps=2, warmup_episodes=4,
                transcripts_per_iter=0)
    return TrainConfig(**{**base, **kw})


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("wall_s", "samples_per_s")}


@pytest.fixture(scope="module")
def signal():
    return load_team(ROOT / "scenarios" / "signal.yaml")


@pytest.mark.parametrize("algorithm", ["magrpo", "ppo"])
def test_restore_into_another_trainer_continues_exactly(signal, tmp_path, algorithm):
    c = cfg(algorithm=algorithm, **({"baseline": "mean", "kl_coef": 0.0}
                                    if algorithm == "ppo" else {}))
    a = Trainer(signal, c, tmp_path / "a", log=lambda m: None)
    for _ in range(4):  # two warm-up steps, two iterations
        a.step()
    a.set(lr=3e-3, temperature=0.7)
    checkpoint = a.save(tmp_path / "elsewhere" / "ckpt")
    expected = [comparable(a.step()) for _ in range(3)]
    # Another directory: the KL reference and the changed settings travel in the checkpoint.
    b = Trainer(signal, c, tmp_path / "b", log=lambda m: None)
    b.restore(checkpoint)
    assert (b.iteration, b.warmed, b.changed) == (2, 2, {"lr": 3e-3, "temperature": 0.7})
    assert [comparable(b.step()) for _ in range(3)] == expected


def test_settings_change_between_steps(signal, tmp_path):
    t = Trainer(signal, cfg(warmup_steps=0), tmp_path / "run", log=lambda m: None)
    t.set(lr=0.02, entropy_coef=0.2, clip_low=0.1, clip_high=0.4, temperature=0.5,
          penalty_per_1k=2.0)
    assert {g["lr"] for o in t.learner.optimizers() for g in o.param_groups} == {0.02}
    assert (t.cfg.entropy_coef, t.cfg.clip_low, t.cfg.clip_high) == (0.2, 0.1, 0.4)
    assert t.learner.cfg is t.cfg
    assert {tr.policy.sampling.temperature for tr in t.learner.trainables} == {0.5}
    row = t.step()
    # 2 USD-free reward units per 1k tokens: every episode pays for its ~170 tokens.
    assert row["reward_mean"] == pytest.approx(
        row["score_mean"] - 2.0 * row["tokens_per_episode"] / 1000, abs=1e-6)


def test_a_new_topology_keeps_the_weights(tmp_path):
    team = load_team(ROOT / "scenarios" / "gather_star.yaml")
    t = Trainer(team, cfg(warmup_steps=0), tmp_path / "run", log=lambda m: None)
    policies = dict(t.policies)
    weights = [p.detach().clone() for tr in t.learner.trainables for p in tr.policy.parameters()]
    t.set(topology={"kind": "chain", "order": ["w1", "w2", "w3", "lead"]})
    assert sorted(t.team.graph.edges) == [("w1", "w2"), ("w2", "w3"), ("w3", "lead")]
    assert t.learner.team is t.team
    assert all(t.policies[a] is policies[a] for a in team.ids)
    now = [p.detach() for tr in t.learner.trainables for p in tr.policy.parameters()]
    assert all(torch.equal(x, y) for x, y in zip(weights, now, strict=True))
    row = t.step()
    # In the chain w2 reads w1 (it read no one in the star), and w3 reads only w2.
    assert row["tokens_per_agent"]["w2"] > row["tokens_per_agent"]["w1"]


def test_the_trainer_trains_the_policies_it_is_given(signal, tmp_path):
    from marl.runner import build_policies

    policies = build_policies(signal, seed=5)
    t = Trainer(signal, cfg(warmup_steps=0), tmp_path / "run", policies=policies,
                log=lambda m: None)
    assert t.policies is policies
    before = [p.detach().clone() for p in policies["speaker"].parameters()]
    t.step()
    assert any(not torch.equal(x, y) for x, y in
               zip(before, policies["speaker"].parameters(), strict=True))


@pytest.mark.parametrize(("settings", "error", "names"), [
    ({"gamma": 0.9}, MarlError, ["gamma", *MUTABLE]),
    ({"lr": -1.0}, ConfigError, ["lr", "greater than 0"]),
    ({"temperature": 0}, MarlError, ["temperature", "> 0"]),
    ({"lr": 0.01, "temperature": "hot"}, MarlError, ["temperature", "'hot'"]),
    ({"topology": {"kind": "star", "hub": "nobody"}}, MarlError, ["set()", "nobody"]),
    ({"penalty_per_1k": -1}, MarlError, ["penalty_per_1k"]),
])
def test_bad_settings_name_the_problem_and_change_nothing(signal, tmp_path, settings, error,
                                                          names):
    t = Trainer(signal, cfg(warmup_steps=0), tmp_path / "run", log=lambda m: None)
    before = (t.cfg, t.team, dict(t.changed))
    with pytest.raises(error) as info:
        t.set(**settings)
    assert all(name in str(info.value) for name in names), str(info.value)
    assert (t.cfg, t.team, t.changed) == before
