"""Curricula: the teams of a training run's stages.

A stage overrides the scenario: ``task`` replaces entries of ``task.params`` and
``scenario`` is merged into the rest (see :func:`merge`).
Every stage is validated as a scenario of its own before training starts, and must keep
the scenario's agents and policies, since the same weights train through every stage.
"""

from __future__ import annotations

from typing import Any

from marl.algorithms.config import Stage
from marl.errors import MarlError, ScenarioError
from marl.team import Team, load_team


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged into ``base``: mappings key by key, anything else replaced. A
    mapping that names another ``kind`` (a topology) or ``name`` (a task) than the one it
    overrides replaces it whole: the old one's parameters mean nothing to the new one.

    >>> merge({"task": {"name": "t", "params": {"a": 1}}}, {"task": {"params": {"b": 2}}})
    {'task': {'name': 't', 'params': {'a': 1, 'b': 2}}}
    >>> merge({"topology": {"kind": "star", "hub": "x"}}, {"topology": {"kind": "chain"}})
    {'topology': {'kind': 'chain'}}
    """
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and not any(
                k in value and k in old and value[k] != old[k] for k in ("kind", "name")):
            out[key] = merge(old, value)
        else:
            out[key] = value
    return out


def stage_name(curriculum: list[Stage], index: int) -> str | None:
    """The label of stage ``index`` in metrics rows (None without a curriculum)."""
    if not curriculum:
        return None
    return curriculum[index].name or f"stage_{index}"


def promoted(stage: Stage, success: float | None, iterations: int) -> bool:
    """Whether ``stage``'s rule is met after ``iterations`` in it, with the eval success
    rate ``success`` (None: no evaluation this iteration).

    >>> promoted(Stage(promote_at=0.8), 0.8, 3), promoted(Stage(promote_at=0.8), None, 3)
    (True, False)
    >>> promoted(Stage(after=5), None, 5)
    True
    """
    return (stage.promote_at is not None and success is not None
            and success >= stage.promote_at) or (stage.after is not None
                                                 and iterations >= stage.after)


def variant(team: Team, overrides: dict[str, Any], where: str) -> Team:
    """``team``'s scenario with ``overrides`` merged in (see :func:`merge`), validated; it
    must keep the agents and their policies, since the same weights go on training."""
    data = merge(team.scenario.model_dump(mode="json", exclude_unset=True), overrides)
    try:
        changed = load_team(data, source=f"{team.source or team.name}, {where}")
    except ScenarioError as exc:
        raise MarlError(f"{where} makes the scenario invalid:\n{exc}") from None
    if changed.ids != team.ids or changed.scenario.policies != team.scenario.policies or [
            a.policy for a in changed.agents] != [a.policy for a in team.agents]:
        raise MarlError(f"{where} changes the agents or policies; the same policies train "
                        "on, so it may change the task, topology, protocol or costs but not "
                        "agents or policies.")
    return changed


def stage_teams(team: Team, curriculum: list[Stage]) -> list[Team]:
    """One team per stage (just ``team`` without a curriculum)."""
    if not curriculum:
        return [team]
    teams = []
    for i, stage in enumerate(curriculum):
        overrides = dict(stage.scenario)
        if stage.task:
            overrides = merge(overrides, {"task": {"params": stage.task}})
        teams.append(variant(team, overrides, f"curriculum[{i}] ({stage_name(curriculum, i)})"))
    return teams
