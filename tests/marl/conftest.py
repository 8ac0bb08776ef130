import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
#: The scenarios of tasks whose messages are symbol codes (what classic baselines play).
CODE_SCENARIOS = [p for p in SCENARIOS
                  if yaml.safe_load(p.read_text())["task"]["name"] != "dataset_v0"]


@pytest.fixture
def scenario_dir() -> Path:
    return ROOT / "scenarios"


def kill_and_resume(team, cfg, tmp_path: Path, kill_at: int, resume_from: int,
                    kill_step: int | None = None, resume_step: int | None = None):
    """Train ``full`` uninterrupted; train ``killed`` until a KeyboardInterrupt after
    iteration ``kill_at`` (or after step ``kill_step``, warm-up steps included), check it
    resumes at ``resume_from`` (its last checkpoint; ``resume_step`` in steps) and finish
    it. Returns both runs' metrics rows, without the timing fields."""
    from marl.training.trainer import Trainer

    Trainer(team, cfg, tmp_path / "full").train()

    def kill(row):
        if (row["step"] == kill_step) if kill_step is not None else (
                row["phase"] == "rl" and row["iteration"] == kill_at):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Trainer(team, cfg, tmp_path / "killed").train(progress=kill)
    # The work since the last checkpoint is lost; everything up to it is kept.
    resumed = Trainer(team, cfg, tmp_path / "killed", resume=True)
    assert resumed.iteration == resume_from
    if resume_step is not None:
        assert resumed.step_count == resume_step
    resumed.train()
    return tuple([{k: v for k, v in json.loads(line).items()
                   if k not in ("wall_s", "samples_per_s")}
                  for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
                 for run in ("full", "killed"))
