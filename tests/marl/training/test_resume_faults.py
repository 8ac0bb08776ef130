"""Resume against damaged and hostile checkpoints: a planted pickle runs nothing, a truncated
state or weights file gives way to the checkpoint before it (and the run then ends as an
uninterrupted one does, bit for bit), and when nothing can be read the message says so."""

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
        pickle.dump({"iteration": Planted(marker)}, f)
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
