"""Training samples: demonstrations only where the oracle knows the answer."""

import torch

from marl.algorithms.common import samples_for, trainables
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
