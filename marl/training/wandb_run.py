"""A Weights & Biases run for ``marl train --wandb``: online with an API key, else offline."""

from __future__ import annotations

import os
from pathlib import Path

from marl.algorithms.config import TrainConfig
from marl.errors import MarlError
from marl.team import Team


def wandb_run(cfg: TrainConfig, out: Path, team: Team):
    """A started wandb run named after the team, algorithm and seed, logging into ``out``."""
    try:
        import wandb
    except ImportError:
        raise MarlError("--wandb needs the wandb package: pip install 'llm-marl[wandb]'.") from None
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").exists()
    mode = os.environ.get("WANDB_MODE") or ("online" if has_key else "offline")
    return wandb.init(project=cfg.wandb_project, dir=str(out), mode=mode,
                      name=f"{team.name}-{cfg.algorithm}-s{cfg.seed}", config=cfg.model_dump())
