"""Curricula: the teams of a training run's stages.

A stage overrides the scenario: ``task`` replaces entries of ``task.params`` and
``scenario`` is merged into the rest (mappings merged key by key, anything else replaced).
Every stage is validated as a scenario of its own before training starts, and must keep
the scenario's agents and policies, since the same weights train through every stage.
"""

from __future__ import annotations

from typing import Any

from marl.algorithms.config import Stage
from marl.errors import MarlError, ScenarioError
from marl.team import Team, load_team


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged into ``base``: mappings key by key, anything else replaced.

    >>> merge({"task": {"name": "t", "params": {"a": 1}}}, {"task": {"params": {"b": 2}}})
    {'task': {'name': 't', 'params': {'a': 1, 'b': 2}}}
    """
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def stage_name(curriculum: list[Stage], index: int) -> str | None:
    """The label of stage ``index`` in metrics rows (None without a curriculum)."""
    if not curriculum:
        return None
    return curriculum[index].name or f"stage_{index}"


def stage_teams(team: Team, curriculum: list[Stage]) -> list[Team]:
    """One team per stage (just ``team`` without a curriculum)."""
    if not curriculum:
        return [team]
    base = team.scenario.model_dump(mode="json", exclude_unset=True)
    teams = []
    for i, stage in enumerate(curriculum):
        data = merge(base, stage.scenario)
        if stage.task:
            data = merge(data, {"task": {"params": stage.task}})
        where = f"curriculum[{i}] ({stage_name(curriculum, i)})"
        try:
            staged = load_team(data, source=f"{team.source or team.name}, {where}")
        except ScenarioError as exc:
            raise MarlError(f"{where} makes the scenario invalid:\n{exc}") from None
        if staged.ids != team.ids or staged.scenario.policies != team.scenario.policies or [
                a.policy for a in staged.agents] != [a.policy for a in team.agents]:
            raise MarlError(f"{where} changes the agents or policies; a curriculum trains the "
                            "same policies through every stage, so a stage may change the "
                            "task, topology, protocol or costs but not agents or policies.")
        teams.append(staged)
    return teams
