"""``marl run`` with each backend named in a scenario: the real building and loading paths."""

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from marl.cli import app
from marl.policies.lm import LMPolicy
from marl.policies.tiny import TinyConfig, TinyLM, save_tiny
from marl.rollout import collect
from marl.runner import build_policies, run
from marl.team import load_team
from tests.marl.conftest import ROOT

runner = CliRunner()


def scenario_with(tmp_path, **policy) -> str:
    data = yaml.safe_load((ROOT / "scenarios" / "signal.yaml").read_text())
    data["policies"] = {"speaker": {**policy, "max_new_tokens": 6},
                        "listener": {**policy, "max_new_tokens": 4}}
    path = tmp_path / "signal.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_tiny_policies_are_built_per_policy_and_shared_by_agents():
    team = load_team(ROOT / "scenarios" / "gather_star.yaml")
    policies = build_policies(team, seed=0)
    assert all(isinstance(p, LMPolicy) for p in policies.values())
    assert policies["w1"] is policies["w2"] is policies["w3"]
    assert policies["lead"] is not policies["w1"]


def test_run_tiny_scenario_reports_tokens_per_second(tmp_path):
    res = runner.invoke(app, ["run", scenario_with(tmp_path, backend="tiny"), "--episodes", "8",
                              "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["tokens_per_s"] > 0 and "generated tokens/s" in res.output
    assert summary["tokens_per_episode"]["completion"] <= 6 + 4


def test_checkpoint_weights_are_used(tmp_path):
    team = load_team(scenario_with(tmp_path, backend="tiny"))
    torch.manual_seed(123)
    trained = TinyLM(TinyConfig())  # stands in for weights written by training
    save_tiny(trained, tmp_path / "ckpt" / "speaker")
    save_tiny(TinyLM(TinyConfig()), tmp_path / "ckpt" / "listener")
    fresh = build_policies(team, seed=0)
    loaded = build_policies(team, seed=0, checkpoint=tmp_path / "ckpt")
    for p, q in zip(loaded["speaker"].module.parameters(), trained.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not torch.equal(next(fresh["speaker"].module.parameters()),
                           next(trained.parameters()))
    a = collect(team, loaded, episodes=4, seed=0)
    b = collect(team, fresh, episodes=4, seed=0)
    speaker = a.slots(["speaker"])
    assert not torch.equal(a.logprobs[:, speaker], b.logprobs[:, speaker])


def test_checkpoint_without_a_policy_is_refused(tmp_path):
    """A checkpoint missing a model policy's weights would play it fresh: refused."""
    save_tiny(TinyLM(TinyConfig()), tmp_path / "ckpt" / "speaker")
    res = runner.invoke(app, ["run", scenario_with(tmp_path, backend="tiny"), "--checkpoint",
                              str(tmp_path / "ckpt"), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "no weights for policy 'listener' (it holds 'speaker')" in res.output
    assert not (tmp_path / "run").exists()
    # a backend that needs no weights plays from the same checkpoint
    res = runner.invoke(app, ["run", scenario_with(tmp_path, backend="tiny"), "--checkpoint",
                              str(tmp_path / "ckpt"), "--policy", "scripted", "--episodes", "2",
                              "--out", str(tmp_path / "run2")])
    assert res.exit_code == 0, res.output


def test_missing_checkpoint_dir_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["run", scenario_with(tmp_path, backend="tiny"), "--checkpoint",
                              str(tmp_path / "nope"), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "no such directory" in res.output
    assert "Traceback" not in res.output


def test_run_hf_scenario(tmp_path):
    pytest.importorskip("transformers")
    from marl.policies.hf_local import build_tiny_hf

    model = build_tiny_hf(tmp_path / "hf")
    path = scenario_with(tmp_path, backend="hf", path=str(model))
    result = run(load_team(path), 4, seed=0)
    assert len(result.episodes) == 4
    assert all(m.get("finish") in ("eos", "stop", "length")
               for e in result.episodes for m in e["transcript"])
    again = run(load_team(path), 4, seed=0)
    assert [e["transcript"] for e in again.episodes] == [e["transcript"]
                                                         for e in result.episodes]


@pytest.mark.parametrize(("policy", "path", "message"), [
    ({"backend": "hf"}, "policies.speaker.path", "needs `path`"),
    ({"backend": "tiny", "preset": "huge"}, "policies.speaker.preset", "unknown model preset"),
    ({"backend": "tiny", "lora": {"r": 4}}, "policies.speaker.lora", "hf and vllm backends only"),
    ({"backend": "hf", "path": "/no/such/dir"}, "policies.speaker.path", "no such directory"),
    ({"backend": "tiny", "top_p": 0}, "policies.speaker.top_p", "greater than 0"),
])
def test_policy_spec_errors_name_the_field(tmp_path, policy, path, message):
    res = runner.invoke(app, ["validate", scenario_with(tmp_path, **policy)])
    assert res.exit_code == 2 and path in res.output and message in res.output
