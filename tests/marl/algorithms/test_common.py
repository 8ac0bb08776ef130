"""Training samples: demonstrations only where the oracle knows the answer."""

import torch

from marl.algorithms.common import samples_for, score_rows, trainables
from marl.algorithms.config import TrainConfig
from marl.policies.scripted import ScriptedPolicy
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team
from tests.marl.conftest import ROOT


def listener_demos(scripted_speaker: bool) -> tuple[list[str], list[str]]:
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    policies = build_policies(team, seed=0)
    if scripted_speaker:
        policies["speaker"] = ScriptedPolicy(team.task)
    batch = collect(team, policies, episodes=8, group_size=4, seed=0)
    listener = next(t for t in trainables(team, policies, TrainConfig()) if t.name == "listener")
    s = samples_for(listener, team, batch, torch.zeros(len(batch.records), 2), with_demos=True)
    sent = [r["transcript"][0]["message"] for r in batch.records]
    return sent, [listener.policy.tokenizer.decode(d) for d in s.demos]


def test_listener_demos_decode_the_code_it_heard():
    sent, demos = listener_demos(scripted_speaker=True)
    assert demos == [f"{'abcd'.index(m)}\n" for m in sent]


def test_no_listener_demos_for_noise():
    # An untrained speaker babbles: no valid code arrives, so the oracle would only guess.
    sent, demos = listener_demos(scripted_speaker=False)
    assert not any(len(m) == 1 and m in "abcd" for m in sent)
    assert demos == [""] * len(sent)


def test_score_rows_runs_duplicates_once_with_the_same_gradient():
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    policies = build_policies(team, seed=0)
    t = next(t for t in trainables(team, policies, TrainConfig()) if t.name == "speaker")
    a, b = [1, 5, 6, 7], [1, 5, 8]
    prompts, completions = [a, b, a, a, b], [[9, 3], [4], [9, 3], [2], [4]]
    calls = []
    real = t.policy.score
    t.policy.score = lambda p, c, **kw: calls.append(len(p)) or real(p, c, **kw)
    weights = torch.tensor([[1.0, 2.0], [3.0, 0.0], [-1.0, 0.5], [2.0, 0.0], [0.5, 0.0]])
    lp, mask = score_rows(t, prompts, completions)
    assert calls == [3]  # three distinct pairs
    (lp * weights * mask).sum().backward()
    fast = [p.grad.clone() for p in t.policy.parameters()]
    t.optimizer.zero_grad()
    lp2, mask2 = real(prompts, completions)
    (lp2 * weights * mask2).sum().backward()
    assert torch.equal(mask, mask2)
    assert torch.allclose(lp, lp2, atol=1e-6)
    for g, h in zip(fast, (p.grad for p in t.policy.parameters()), strict=True):
        assert torch.allclose(g, h, rtol=1e-4, atol=1e-5 * float(h.abs().max()))
