"""A scenario resolved into a team: agents expanded, topology built and compiled, task,
prices and policies looked up, and every cross-field invariant checked before anything
runs. Problems are collected and reported together, each with its key path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import networkx as nx
from pydantic import ValidationError

from marl.cost.prices import price_table, token_price
from marl.errors import MarlError, Problem, ScenarioError
from marl.policies import API_BACKENDS, BACKENDS
from marl.policies.api_settings import check_api_fields
from marl.policies.tiny_config import TinyConfig
from marl.scenario import (
    MAX_AGENTS,
    NAME_RULE,
    PolicySpec,
    Scenario,
    line_of,
    parse_scenario,
    problems_from,
    read_yaml,
)
from marl.tasks import Task, task_class
from marl.tokenizer import CHARSET
from orchestration.compile import CompiledTopology, compile_topology, knowledge, rounds_needed
from orchestration.cost import TokenPrice
from orchestration.hints import did_you_mean, listing
from orchestration.topologies import TopologyError, build

AGENT_ID = re.compile(NAME_RULE)


@dataclass(frozen=True)
class Agent:
    id: str
    role: str
    policy: str
    prompt: str


@dataclass(frozen=True, eq=False)  # compared and hashed by identity
class Team:
    """Everything the environment, cost model and runner need, checked and resolved."""

    scenario: Scenario
    source: str | None
    agents: tuple[Agent, ...]
    graph: nx.DiGraph
    topo: CompiledTopology
    task: Task
    answer_agents: tuple[str, ...]
    prices: dict[str, TokenPrice]
    models: dict[str, str]
    #: Teams of a competitive scenario (``teams:``), name -> agents; a cooperative scenario
    #: is one side, named after the scenario, holding every agent.
    sides: dict[str, tuple[str, ...]]
    #: Who answers for each side.
    side_answers: dict[str, tuple[str, ...]]

    @property
    def competitive(self) -> bool:
        return len(self.sides) > 1

    def side_of(self, agent_id: str) -> str:
        return next(name for name, members in self.sides.items() if agent_id in members)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(a.id for a in self.agents)

    @property
    def rounds(self) -> int:
        return self.scenario.protocol.rounds

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def penalty_per_1k(self) -> Decimal:
        return self.scenario.costs.penalty_per_1k

    def agent(self, agent_id: str) -> Agent:
        return self.agents[self.topo.index[agent_id]]

    def max_new_tokens(self, agent_id: str) -> int:
        return self.scenario.policies[self.agent(agent_id).policy].max_new_tokens

    def backend(self, agent_id: str) -> str:
        return self.scenario.policies[self.agent(agent_id).policy].backend

    def to_yaml(self) -> str:
        """The scenario as YAML (the keys it was given), which :func:`load_team` reads back
        to the same team: what a run directory keeps as ``scenario.yaml``."""
        import yaml

        return yaml.safe_dump(self.scenario.model_dump(mode="json", exclude_unset=True),
                              sort_keys=False)

    def is_final_call(self, agent_id: str, rnd: int) -> bool:
        return rnd == self.rounds - 1 and agent_id in self.answer_agents


def load_team(scenario: str | Path | dict[str, Any] | Scenario, source: str | None = None) -> Team:
    """Load, validate and resolve a scenario given as a path, parsed data, or a model."""
    lines: dict[tuple, int] = {}
    if isinstance(scenario, (str, Path)):
        source = str(scenario)
        data, lines = read_yaml(scenario)
        scenario = parse_scenario(data, source, lines)
    elif isinstance(scenario, dict):
        scenario = parse_scenario(scenario, source)
    problems: list[Problem] = []
    team = _resolve(scenario, source, problems)
    if problems:
        fixed = [Problem(p.path, p.message, p.line or line_of(lines, _loc(p.path)))
                 for p in problems]
        raise ScenarioError(source, fixed)
    assert team is not None
    return team


def _loc(path: str) -> tuple:
    parts: list[int | str] = []
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        parts.append(int(index) if index else name)
    return tuple(parts)


def _expand_agents(scn: Scenario, problems: list[Problem]) -> list[Agent]:
    agents: list[Agent] = []
    where: dict[str, str] = {}
    for i, entry in enumerate(scn.agents):
        path = f"agents[{i}]"
        if entry.count is None:
            ids = [entry.id]
        elif "{i}" not in entry.id:
            problems.append(Problem(f"{path}.id", f"a template with count needs '{{i}}' in its "
                                    f"id (e.g. 'w{{i}}'), got {entry.id!r}."))
            continue
        elif len(agents) + entry.count > MAX_AGENTS:  # checked before any id is made
            problems.append(Problem(f"{path}.count", f"{entry.count} agents (after "
                                    f"{len(agents)} before it) exceed the limit of "
                                    f"{MAX_AGENTS}; use a smaller count."))
            continue
        else:
            ids = [entry.id.replace("{i}", str(entry.start + k)) for k in range(entry.count)]
        for agent_id in ids:
            if not AGENT_ID.match(agent_id):
                problems.append(Problem(f"{path}.id", f"invalid agent id {agent_id!r}: use a "
                                        "letter then up to 31 letters, digits, '_' or '-'."))
            elif agent_id in where:
                problems.append(Problem(f"{path}.id", f"duplicate agent id {agent_id!r} "
                                        f"(also {where[agent_id]}); agent ids must be unique."))
            else:
                where[agent_id] = path
                agents.append(Agent(agent_id, entry.role, entry.policy, entry.prompt))
        if entry.policy not in scn.policies:
            names = list(scn.policies)
            problems.append(Problem(f"{path}.policy", f"unknown policy {entry.policy!r}."
                                    f"{did_you_mean(entry.policy, names)} Defined policies: "
                                    f"{listing(names)}; add it under `policies`."))
        for field, text in (("role", entry.role), ("prompt", entry.prompt)):
            bad = sorted({c for c in text if c not in CHARSET})
            if bad:
                problems.append(Problem(f"{path}.{field}", f"characters {''.join(bad)!r} are "
                                        "outside the environment's charset (printable ASCII); "
                                        "remove them."))
    if not agents and not problems:
        problems.append(Problem("agents", "the team is empty; list at least one agent."))
    if len(agents) > MAX_AGENTS:
        problems.append(Problem("agents", f"{len(agents)} agents exceed the limit of "
                                f"{MAX_AGENTS}; use fewer agents."))
    return agents


def price_model(scn: Scenario, policy: str) -> str:
    """The price-table entry of a policy's agents: its own ``model``, else ``costs.model``.
    An API policy's ``model`` is the name the server serves, not a price-table entry, so
    API teams are priced by ``costs`` (``costs.model`` and its overrides)."""
    spec = scn.policies[policy]
    if spec.backend in API_BACKENDS:
        return scn.costs.model
    return spec.model or scn.costs.model


def _check_policies(scn: Scenario, problems: list[Problem]) -> None:
    models = list(price_table())
    for name, spec in scn.policies.items():
        if spec.backend not in BACKENDS:
            valid = list(BACKENDS)
            problems.append(Problem(f"policies.{name}.backend", f"unknown backend "
                                    f"{spec.backend!r}.{did_you_mean(spec.backend, valid)} "
                                    f"Valid backends: {listing(valid)}."))
        if spec.model is not None and spec.backend not in API_BACKENDS and (
                spec.model not in models):
            problems.append(_unknown_model(f"policies.{name}.model", spec.model))
        problems.extend(_check_backend_fields(f"policies.{name}", spec))
        if spec.backend in API_BACKENDS:
            problems.extend(check_api_fields(f"policies.{name}", spec))
    if scn.costs.model not in models:
        problems.append(_unknown_model("costs.model", scn.costs.model))


#: Fields that apply to some backends only; setting one on another backend is an error.
BACKEND_FIELDS: dict[str, tuple[str, ...]] = {
    "lora": ("hf", "vllm"),
    **dict.fromkeys(("preset", "fast"), ("tiny", "hf")),
    "engine": ("vllm",),
    "chat_template_kwargs": ("hf", "vllm", *API_BACKENDS),
    **dict.fromkeys(("path", "dtype", "device", "top_k"), ("tiny", "hf", "vllm")),
    **dict.fromkeys(("base_url", "api_key_env", "allow_plain_http", "api", "max_concurrency",
                     "timeout_s", "max_retries"), API_BACKENDS),
}
#: Model settings that scripted and random policies have always tolerated (a scenario can
#: switch a policy to scripted and keep its preset); only an API backend refuses them.
_LENIENT = ("preset", "path", "fast", "dtype", "device", "top_k")


def _check_backend_fields(path: str, spec: PolicySpec) -> list[Problem]:
    """Fields that only some backends use, and the paths they name."""
    out = []
    for field in sorted(spec.model_fields_set & BACKEND_FIELDS.keys()):
        owners = BACKEND_FIELDS[field]
        tolerated = field in _LENIENT and spec.backend not in API_BACKENDS
        if getattr(spec, field) is None or spec.backend in owners or tolerated or (
                spec.backend not in BACKENDS):  # an unknown backend is reported already
            continue
        out.append(Problem(f"{path}.{field}", f"`{field}` applies to the "
                           f"{' and '.join(owners)} backend{'s' if len(owners) > 1 else ''} "
                           f"only, not {spec.backend!r}; remove `{field}` or set backend: "
                           f"{owners[0]}."))
    if spec.prompt_format == "chat" and (spec.backend in ("tiny", "scripted", "random")
                                         or spec.api == "completions"):
        why = ("the completions API takes one text" if spec.api == "completions"
               else f"{spec.backend} policies read the transcript")
        out.append(Problem(f"{path}.prompt_format", f"prompt_format: chat needs a chat model "
                           f"(hf or vllm with a chat template, or openai with api: chat); {why}. "
                           "Remove it or change the backend."))
    if spec.backend in ("hf", "vllm") and spec.path is None:
        out.append(Problem(f"{path}.path", f"the {spec.backend} backend needs `path`: a local "
                           "checkpoint directory holding config.json and the weights."))
    if spec.path is not None and spec.backend in ("tiny", "hf", "vllm") and not Path(
            spec.path).is_dir():
        out.append(Problem(f"{path}.path", f"no such directory {spec.path!r}; give a checkpoint "
                           "directory (relative paths are read from the working directory)."))
    if spec.backend == "tiny" and spec.path is None:
        try:
            TinyConfig.from_preset(spec.preset)
        except MarlError as exc:
            out.append(Problem(f"{path}.preset", str(exc)))
    return out


def _unknown_model(path: str, model: str) -> Problem:
    models = list(price_table())
    return Problem(path, f"unknown price model {model!r}.{did_you_mean(model, models)} Models "
                   f"in the bundled table: {listing(models, limit=20)}; or set "
                   "costs.input_cost_per_token / output_cost_per_token yourself.")


def _build_task(scn: Scenario, agents: list[Agent], answer: list[str],
                sides: dict[str, tuple[str, ...]], problems: list[Problem]) -> Task | None:
    try:
        cls = task_class(scn.task.name)
    except MarlError as exc:
        problems.append(Problem("task.name", str(exc)))
        return None
    try:
        params = cls.Params.model_validate(scn.task.params)
    except ValidationError as exc:
        problems.extend(problems_from(exc, cls.Params, prefix=("task", "params")))
        return None
    missing = [h for h in ("message_length", "answer_length") if not cls.provides(h)]
    if cls.messages == "codes" and missing:
        problems.append(Problem("task.name", f"{cls.id} declares messages 'codes' (fixed-width) "
                                f"but does not define {' and '.join(missing)}; define "
                                f"{'them' if len(missing) > 1 else 'it'}, or set messages = "
                                "'text' on the class for free-form messages."))
        return None
    if cls.competitive != (scn.teams is not None):
        problems.append(Problem("teams", f"{cls.id} is a competitive task: give two or more "
                                "teams (teams: {red: {agents: [...], answer: ...}, ...})."
                                if cls.competitive else f"{cls.id} is a cooperative task "
                                "(one team); teams need a competitive task such as cipher_v0."))
        return None
    return cls(params, [a.id for a in agents], answer, sides, {a.id: a.role for a in agents})


def _build_topology(scn: Scenario, ids: list[str],
                    problems: list[Problem]) -> tuple[nx.DiGraph, CompiledTopology] | None:
    try:
        graph = build(scn.topology.kind, ids, **scn.topology.params)
        return graph, compile_topology(graph)
    except TopologyError as exc:
        problems.append(Problem(f"topology.{exc.key or 'kind'}", str(exc)))
        return None


def _answer_agents(spec: Any, path: str, ids: list[str] | tuple[str, ...],
                   problems: list[Problem]) -> list[str]:
    """The agents of an answer spec that exist and are listed once."""
    path += ".vote" if spec.vote is not None else ""
    good = []
    for i, a in enumerate(spec.agents):
        at = f"{path}[{i}]" if spec.vote is not None else path
        if a not in ids:
            problems.append(Problem(at, f"unknown agent {a!r}.{did_you_mean(a, ids)} Agents: "
                                    f"{listing(ids)}."))
        elif a in good:
            problems.append(Problem(at, f"agent {a!r} is listed twice; each voter votes once."))
        else:
            good.append(a)
    return good


def _check_sides(scn: Scenario, ids: list[str], problems: list[Problem]
                 ) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """Sides and their answer agents: the scenario's teams, or one side of everyone."""
    if scn.teams is None:
        if scn.protocol.answer is None:
            problems.append(Problem("protocol.answer", "missing required key 'answer': name "
                                    "the agent that answers (answer: lead) or the voters "
                                    "(answer: {vote: [a, b]}); a competitive scenario gives "
                                    "teams instead."))
            return {scn.name: tuple(ids)}, {scn.name: ()}
        answer = _answer_agents(scn.protocol.answer, "protocol.answer", ids, problems)
        return {scn.name: tuple(ids)}, {scn.name: tuple(answer)}
    if scn.protocol.answer is not None:
        problems.append(Problem("protocol.answer", "with teams, each team names its own "
                                "answer (teams.<name>.answer); remove protocol.answer."))
    if len(scn.teams) < 2:
        problems.append(Problem("teams", f"a competitive scenario needs two or more teams, "
                                f"got {len(scn.teams)}; without opponents, drop teams and "
                                "use protocol.answer."))
    sides, answers, owner = {}, {}, {}
    for name, spec in scn.teams.items():
        members = []
        for i, a in enumerate(spec.agents):
            at = f"teams.{name}.agents[{i}]"
            if a not in ids:
                problems.append(Problem(at, f"unknown agent {a!r}.{did_you_mean(a, ids)} "
                                        f"Agents: {listing(ids)}."))
            elif a in owner:
                problems.append(Problem(at, f"agent {a!r} is already on team {owner[a]!r}; "
                                        "every agent plays for one team."))
            else:
                owner[a] = name
                members.append(a)
        sides[name] = tuple(members)
        answers[name] = tuple(_answer_agents(spec.answer, f"teams.{name}.answer", members,
                                             problems))
    lost = [a for a in ids if a not in owner]
    if lost:
        problems.append(Problem("teams", f"{listing(lost)} on no team; every agent plays for "
                                "exactly one team."))
    return sides, answers


def _check_flow(scn: Scenario, task: Task, topo: CompiledTopology,
                problems: list[Problem]) -> None:
    """Every answer agent must be able to learn what the task needs within the rounds."""
    rounds = scn.protocol.rounds
    needed = task.required_sources()
    known = knowledge(topo, rounds)
    for a in task.answer_agents:
        missing = sorted(needed - known[a], key=topo.index.__getitem__)
        if not missing:
            continue
        more = rounds_needed(topo, a, needed, limit=max(4 * len(topo.agents), rounds + 1))
        fix = (f"raise protocol.rounds to {more}" if more else
               f"add edges so that a path leads from {listing(missing, 3)} to {a!r}")
        problems.append(Problem("protocol.answer", f"answer agent {a!r} cannot receive the "
                                f"information of {listing(missing, 5)} within {rounds} round(s), "
                                f"but {task.id} needs it; {fix}."))


def _check_backends(scn: Scenario, task: Task, problems: list[Problem]) -> None:
    """A scripted or random policy needs the task's oracle or random policy."""
    hooks = {"scripted": "oracle", "random": "random_message"}
    for name, spec in scn.policies.items():
        hook = hooks.get(spec.backend)
        if hook and not task.provides(hook):
            kind = "scripted oracle" if hook == "oracle" else "random policy"
            problems.append(Problem(f"policies.{name}.backend", f"{task.id} has no {kind} "
                                    f"(Task.{hook}), which backend {spec.backend!r} plays; "
                                    "choose a model backend."))


def _check_lengths(scn: Scenario, team_agents: list[Agent], task: Task,
                   problems: list[Problem]) -> None:
    if task.messages != "codes":
        return  # free-form messages: any length up to max_new_tokens
    seen = set()
    for agent in team_agents:
        spec = scn.policies.get(agent.policy)
        if spec is None or agent.policy in seen:
            continue
        need = task.answer_length if agent.id in task.answer_agents else 0
        # Every policy must leave room for the oracle's messages, so that any team can be
        # run with --policy scripted or random for comparison.
        # (An answer agent of a one-round game only ever answers.)
        if agent.id not in task.answer_agents or scn.protocol.rounds > 1:
            need = max(need, task.message_length(agent.id))
        if spec.max_new_tokens < need:
            seen.add(agent.policy)
            problems.append(Problem(f"policies.{agent.policy}.max_new_tokens", f"{task.id} "
                                    f"needs {need} tokens per message from {agent.id!r} but the "
                                    f"limit is {spec.max_new_tokens}; raise it to {need}."))


def _resolve(scn: Scenario, source: str | None, problems: list[Problem]) -> Team | None:
    agents = _expand_agents(scn, problems)
    _check_policies(scn, problems)
    ids = [a.id for a in agents]
    if problems and not ids:
        return None
    sides, side_answers = _check_sides(scn, ids, problems)
    answer = [a for members in side_answers.values() for a in members]
    task = _build_task(scn, agents, answer, sides, problems)
    built = _build_topology(scn, ids, problems) if ids else None
    if task is None or built is None:
        return None
    graph, topo = built
    task_problems = task.check()
    problems.extend(task_problems)
    if not task_problems:
        _check_flow(scn, task, topo, problems)
    _check_lengths(scn, agents, task, problems)
    _check_backends(scn, task, problems)
    if problems:
        return None
    models = {a.id: price_model(scn, a.policy) for a in agents}
    prices = {a: token_price(m, scn.costs.overrides) for a, m in models.items()}
    return Team(scn, source, tuple(agents), graph, topo, task, tuple(answer), prices, models,
                sides, side_answers)


__all__ = ["AGENT_ID", "Agent", "Team", "load_team"]
