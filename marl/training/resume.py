"""``marl train --resume`` continues a run as it was configured: the settings come from the
run's own ``config.yaml``, not from the command line's defaults. A setting given again on
the command line must agree with it, except the ones that only extend the run (more
iterations, a longer time budget) and the logging switches, which are applied, reported,
and recorded in ``config.yaml`` when the run goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from marl.algorithms.config import TrainConfig
from marl.errors import ConfigError
from marl.overrides import validated

#: Settings a resumed run may be given anew: a larger budget, and where it logs.
EXTENDING = ("iterations", "time_budget_s")
LOGGING = ("wandb", "wandb_project")


def resumed_config(out: Path, given: TrainConfig) -> tuple[TrainConfig, list[str]]:
    """The settings of the run in ``out`` (its ``config.yaml``), with what ``given`` (the
    command line's config; only the settings it was explicitly given count) may change;
    and a line for each change. Anything else given that differs is a
    :class:`ConfigError` naming it, both values and what to do."""
    path = out / "config.yaml"
    if not path.is_file():
        return given, []  # killed before its first step wrote the file: nothing to keep
    try:
        saved: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML ({getattr(exc, 'problem', exc)}); "
                          "restore it, or start a new run with another --out.") from None
    saved.pop("scenario", None)
    own = validated(TrainConfig, saved, "training config", str(path))
    changes, refused = {}, []
    for key in sorted(given.model_fields_set):
        before, after = getattr(own, key), getattr(given, key)
        if before == after:
            continue
        if key in LOGGING or (key in EXTENDING and _extends(before, after)):
            changes[key] = after
        else:
            refused.append(f"{key}: {before!r} in {path.name}, {after!r} given")
    if refused:
        raise ConfigError(f"--resume continues the run in {out} as it was configured, and "
                          "these settings differ from its config.yaml:\n  "
                          + "\n  ".join(refused) + "\nDrop them to resume (only more "
                          "iterations or a longer time budget can be given), or start a new "
                          "run with another --out.")
    notes = [f"{k}: {getattr(own, k)!r} -> {v!r}" for k, v in changes.items()]
    return own.model_copy(update=changes), notes


def _extends(before: Any, after: Any) -> bool:
    """A budget that grows (None: unlimited)."""
    if after is None:
        return True
    return before is not None and after >= before
