"""Resume against damaged and hostile run directories: a planted pickle runs nothing; a
truncated state, weights or adapter file gives way to the checkpoint before it (and the run
then ends as an uninterrupted one does, bit for bit); a torn line in the middle of
metrics.jsonl is repaired; when nothing can be read, or config.yaml was edited into
nonsense, the message says so; resume keeps the run's own settings."""

import json
import os
import pickle

import pytest
from typer.testing import CliRunner

from marl.algorithms.config import TrainConfig
from marl.cli import app
from marl.errors import MarlError
from marl.team import load_team
from marl.training.trainer import Trainer
from tests.marl.conftest import ROOT

CFG = TrainConfig(warmup_steps=2, warmup_episodes=4, iterations=6, episodes_per_iter=2,
                  group_size=2, eval_every=3, eval_episodes=4, checkpoint_every=2,
                  keep_checkpoints=3, transcripts_per_iter=0)


def rows(out) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k not in ("wall_s", "samples_per_s")}
            for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """An uninterrupted run, and the scenario's team."""
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    out = tmp_path_factory.mktemp("full") / "run"
    Trainer(team, CFG, out, log=lambda m: None).train()
    return team, rows(out)


def killed(team, out, at: int = 4) -> None:
    """A run killed after iteration ``at`` (its checkpoints: iterations 2, 3 (the best
    evaluation) and 4, and the end of the warm-up)."""
    def kill(row):
        if row["phase"] == "rl" and row["iteration"] == at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Trainer(team, CFG, out, log=lambda m: None).train(progress=kill)


class Planted:
    """Runs a shell command when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_planted_pickle_is_refused_and_runs_nothing(full, tmp_path):
    team, expected = full
    out = tmp_path / "run"
    killed(team, out)
    marker = tmp_path / "pwned"
    with open(out / "checkpoints" / "iter_000004" / "state.pt", "wb") as f:
        pickle.dump({"iteration": Planted(marker)}, f, protocol=2)
    notes = []
    resumed = Trainer(team, CFG, out, resume=True, log=notes.append)
    assert not marker.exists()
    assert any("holds more than tensors and plain data" in n for n in notes)
    assert resumed.iteration == 3  # from the checkpoint before
    resumed.train()
    assert rows(out) == expected


@pytest.mark.parametrize("damaged", ["state.pt", "speaker/model.safetensors"])
def test_a_truncated_newest_checkpoint_gives_way_to_the_one_before(full, tmp_path, damaged):
    team, expected = full
    out = tmp_path / "run"
    killed(team, out)
    target = out / "checkpoints" / "iter_000004" / damaged
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 3])
    notes = []
    resumed = Trainer(team, CFG, out, resume=True, log=notes.append)
    assert resumed.iteration == 3 and any("cannot be read" in n for n in notes)
    resumed.train()
    assert rows(out) == expected


def test_a_torn_line_in_the_middle_of_the_metrics_is_repaired(full, tmp_path):
    """A cut-off row with a whole one appended onto it (what an older version could leave
    after a full disk): resume drops the torn part, keeps the glued row, and says so."""
    team, expected = full
    out = tmp_path / "run"
    killed(team, out)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[3] = lines[3][: len(lines[3]) // 2] + lines[4]  # row 4 torn, row 5 glued on
    del lines[4]
    (out / "metrics.jsonl").write_text("".join(lines))
    notes = []
    resumed = Trainer(team, CFG, out, resume=True, log=notes.append)
    assert any(":4: dropped a damaged line (kept the whole row after it)" in n for n in notes)
    resumed.train()
    assert rows(out) == expected[:3] + expected[4:]  # only the torn row is gone


def test_a_truncated_lora_adapter_gives_way_to_the_checkpoint_before(tmp_path):
    pytest.importorskip("peft")
    from marl.policies.hf_local import build_tiny_hf
    from tests.marl.policies.test_shared import SMALL, gather_team

    team = gather_team(build_tiny_hf(tmp_path / "base", hidden_size=64, num_heads=2))
    cfg = TrainConfig(**{**SMALL, "checkpoint_every": 1, "keep_checkpoints": 2})
    Trainer(team, cfg, tmp_path / "full", log=lambda m: None).train()
    out = tmp_path / "run"
    Trainer(team, cfg, out, log=lambda m: None).train()
    adapter = out / "checkpoints" / "iter_000004" / "w2" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])
    notes = []
    resumed = Trainer(team, CFG.model_copy(update=cfg.model_dump()), out, resume=True,
                      log=notes.append)
    assert resumed.iteration == 3 and any("cannot be read" in n for n in notes)
    resumed.train()
    assert rows(out) == rows(tmp_path / "full")


def test_a_checkpoint_caught_between_its_two_renames_is_put_back(full, tmp_path):
    """Killed while replacing `best`: the old version was moved aside and the new one not
    yet moved in (and a half-written one is lying about): resume puts the old one back."""
    team, expected = full
    out = tmp_path / "run"
    killed(team, out)
    root = out / "checkpoints"
    before = (root / "best" / "state.pt").read_bytes()
    (root / "best").rename(root / ".best.k2x9q.old")
    (root / ".iter_000005.a8d1r.tmp" / "speaker").mkdir(parents=True)
    notes = []
    resumed = Trainer(team, CFG, out, resume=True, log=notes.append)
    assert (root / "best" / "state.pt").read_bytes() == before
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
    assert any("restored" in n for n in notes) and any("half-written" in n for n in notes)
    resumed.train()
    assert rows(out) == expected


def test_no_readable_checkpoint_is_a_clear_error(full, tmp_path):
    team, _ = full
    out = tmp_path / "run"
    killed(team, out)
    for state in (out / "checkpoints").glob("*/state.pt"):
        state.write_bytes(b"not a checkpoint")
    res = CliRunner().invoke(app, ["train", str(ROOT / "scenarios" / "signal.yaml"), "--out",
                                   str(out), "--resume"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "none of the 4 kept checkpoints" in res.output and "to start over" in res.output
    with pytest.raises(MarlError):
        Trainer(team, CFG, out, resume=True, log=lambda m: None)


SETS = ["--set", "warmup_steps=2", "--set", "warmup_episodes=4", "--set", "iterations=4",
        "--set", "episodes_per_iter=2", "--set", "group_size=2", "--set", "eval_every=2",
        "--set", "eval_episodes=4", "--set", "checkpoint_every=2"]


@pytest.fixture
def stopped(tmp_path, monkeypatch):
    """A `marl train` run of 4 iterations interrupted after iteration 3 (its last
    checkpoint: iteration 2)."""
    import marl.training.trainer as trainer

    out = tmp_path / "run"
    step = trainer.Trainer.step

    def interrupted(self):
        row = step(self)
        if row["phase"] == "rl" and row["iteration"] == 3:
            raise KeyboardInterrupt
        return row

    monkeypatch.setattr(trainer.Trainer, "step", interrupted)
    res = CliRunner().invoke(app, ["train", str(ROOT / "scenarios" / "signal.yaml"), "--out",
                                   str(out), *SETS])
    assert res.exit_code == 130, res.output
    monkeypatch.setattr(trainer.Trainer, "step", step)
    return out


def resume(out, *extra):
    return CliRunner().invoke(app, ["train", str(ROOT / "scenarios" / "signal.yaml"),
                                    "--out", str(out), "--resume", *extra])


def test_resume_continues_the_run_with_its_own_settings(stopped):
    res = resume(stopped)  # no --set: the run's 4 iterations, not the default 1200
    assert res.exit_code == 0, res.output
    assert [r["iteration"] for r in rows(stopped) if r["phase"] == "rl"] == [1, 2, 3, 4]


def test_resume_refuses_a_changed_setting_and_changes_nothing(stopped):
    before = (stopped / "config.yaml").read_text(), (stopped / "metrics.jsonl").read_text()
    res = resume(stopped, "--set", "lr=0.5", "--set", "iterations=2")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "lr: 0.001 in config.yaml, 0.5 given" in res.output
    assert "iterations: 4 in config.yaml, 2 given" in res.output
    assert ((stopped / "config.yaml").read_text(), (stopped / "metrics.jsonl").read_text()
            ) == before


def test_resume_may_extend_the_run_and_records_it(stopped):
    res = resume(stopped, *SETS, "--set", "iterations=6")
    assert res.exit_code == 0, res.output
    assert "resuming with iterations: 4 -> 6 (recorded in config.yaml)" in res.output
    assert "iterations: 6" in (stopped / "config.yaml").read_text()
    assert [r["iteration"] for r in rows(stopped) if r["phase"] == "rl"] == [1, 2, 3, 4, 5, 6]


def test_a_config_yaml_edited_into_nonsense_is_a_clear_error(stopped):
    (stopped / "config.yaml").write_text("lr: -1\niterations: many\n")
    res = resume(stopped)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "config.yaml" in res.output and "lr" in res.output
