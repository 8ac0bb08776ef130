"""Pretrained models as team members: the format warm-up (for models trained from scratch)
skips hf and vllm policies by default, so a model that already plays keeps playing."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from marl.cli import app
from tests.marl.conftest import ROOT

pytest.importorskip("transformers")

SMALL = ["--set", "iterations=10", "--set", "eval_every=10", "--set", "eval_episodes=32"]


@pytest.fixture(scope="module")
def player(tmp_path_factory):
    """A local HF Llama per policy that plays signal (greedy eval 1.0), made for this test by
    imitating the oracle (a fixture standing in for a pretrained model), and a scenario
    naming them with ``backend: hf``."""
    from marl.algorithms.config import TrainConfig
    from marl.policies.hf_local import build_tiny_hf
    from marl.team import load_team
    from marl.training.trainer import Trainer

    root = tmp_path_factory.mktemp("pretrained")
    base = build_tiny_hf(root / "base", hidden_size=64, num_heads=2)
    data = yaml.safe_load((ROOT / "scenarios" / "signal.yaml").read_text())
    for spec in data["policies"].values():
        spec.update(backend="hf", path=str(base))
    cfg = TrainConfig(warmup_source="oracle", warmup_pretrained=True, warmup_steps=120,
                      iterations=1, eval_every=20, eval_episodes=32)
    trainer = Trainer(load_team(data), cfg, root / "made", log=lambda m: None)
    assert trainer.train()["best"]["eval_success_rate"] == 1.0
    for name, spec in data["policies"].items():
        spec["path"] = str(root / "made" / "checkpoints" / "best" / name)
    (root / "signal_hf.yaml").write_text(yaml.safe_dump(data))
    return root / "signal_hf.yaml"


def evaluations(out) -> list[tuple[str, int, float]]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["phase"], r["step"], r["eval_success_rate"]) for r in rows
            if "eval_success_rate" in r]


def test_a_pretrained_team_is_not_warmed_up_and_keeps_playing(player, tmp_path):
    res = CliRunner().invoke(app, ["train", str(player), "--out", str(tmp_path / "t"), *SMALL])
    assert res.exit_code == 0, res.output
    assert "no format warm-up for listener, speaker: pretrained" in res.output
    assert evaluations(tmp_path / "t") == [("rl", 10, 1.0)]


def test_the_warm_up_of_a_pretrained_team_is_asked_for_and_undoes_its_play(player, tmp_path):
    res = CliRunner().invoke(app, ["train", str(player), "--out", str(tmp_path / "t"), *SMALL,
                                   "--set", "warmup_pretrained=true", "--set", "warmup_steps=20"])
    assert res.exit_code == 0, res.output
    assert "20 warm-up steps on the random policy's messages (listener, speaker)" in res.output
    warm = [e for e in evaluations(tmp_path / "t") if e[0] == "warmup"]
    # the team that played at 1.0 now plays its warm-up habits: both agents say them every
    # time, and its success is theirs by coincidence (2 of 4 objects on this seed)
    assert [step for _, step, _ in warm] == [10, 20] and warm[-1][2] <= 0.5
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    last = next(r for r in rows if r.get("warmup_step") == 20)
    assert min(last["habit_agreement"].values()) == 1.0


def test_only_the_models_trained_from_scratch_warm_up_in_a_mixed_team(player, tmp_path):
    data = yaml.safe_load(player.read_text())
    data["policies"]["speaker"] = {"backend": "tiny", "max_new_tokens": 2}
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["train", str(path), "--out", str(tmp_path / "t"), *SMALL,
                                   "--set", "warmup_steps=4"])
    assert res.exit_code == 0, res.output
    assert "4 warm-up steps on the random policy's messages (speaker)" in res.output
    assert "no format warm-up for listener" in res.output
    from safetensors.torch import load_file

    before = load_file(data["policies"]["listener"]["path"] + "/model.safetensors")
    after = load_file(tmp_path / "t" / "checkpoints" / "warmup" / "listener" /
                      "model.safetensors")
    assert all((before[k] == after[k]).all() for k in before)  # the listener sat it out
