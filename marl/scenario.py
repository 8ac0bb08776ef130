"""Scenario files: the strict schema and the loader.

Loading is strict: an unknown key fails, naming the file, the key path, the closest valid
key and the valid keys; a wrong type fails with the value seen. Structure is checked here
(pydantic v2); cross-field meaning (agents, topology, answer reachability) in
:mod:`marl.team`. Every problem found is reported at once, as a :class:`ScenarioError`.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from marl.errors import Problem, ScenarioError
from orchestration.hints import did_you_mean

MAX_AGENTS = 256
#: Limits of a scenario file: characters, and values once its aliases are expanded.
MAX_FILE_CHARS = 4 * 2**20
MAX_NODES = 200_000
#: Names that become file or directory names (agent ids, policy and team keys): a letter,
#: then up to 31 letters, digits, '_' or '-'; no separator, no '..', nothing hidden.
NAME_RULE = r"^[A-Za-z][A-Za-z0-9_\-]{0,31}$"
#: A scenario's name (its default run directory): the same, up to 64 characters, dots too.
SCENARIO_NAME_RULE = r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$"
Name = Annotated[str, StringConstraints(pattern=NAME_RULE)]
RULES = {NAME_RULE: "a letter then up to 31 letters, digits, '_' or '-'",
         SCENARIO_NAME_RULE: "a letter then up to 63 letters, digits, '.', '_' or '-'"}
#: Key names that would hold a secret (``api_key``, ``openai-api-key``, ``secret``, ...).
SECRET_KEY = re.compile(r"api[_-]?key|secret|passw(or)?d|(access|auth|bearer)[_-]?token|"
                        r"authorization", re.I)


class StrictModel(BaseModel):
    """Frozen model whose unknown keys fail; :func:`problems_from` words the error with the
    closest valid key and the valid keys. (Pydantic's own check, unlike a validator that
    raises, leaves the other problems of the same mapping reported too.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentEntry(StrictModel):
    """One agent, or with ``count`` a template of many (``id`` must contain ``{i}``)."""

    id: str = Field(description="Agent id, or a template such as 'w{i}' when count is set.")
    role: str = Field("agent", description="Free-text role shown to the agent.")
    policy: str = Field("default", description="Name of an entry of `policies`.")
    prompt: str = Field("", description="Instructions prepended to the agent's prompt.")
    count: int | None = Field(None, ge=1, description="Expand into this many agents.")
    start: int = Field(0, ge=0, description="First index substituted for {i}.")


class PolicySpec(StrictModel):
    """A policy; agents naming the same policy share its parameters (and, for model
    backends, its weights)."""

    backend: str = Field("tiny", description="tiny | hf | vllm | openai | scripted | random.")
    max_new_tokens: int = Field(32, ge=1, le=4096, description="Token limit of one message.")
    model: str | None = Field(None, description="Price-table model; default: costs.model. "
                              "openai: the served model name (required; priced by costs).")
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Sample among the k likeliest tokens; 0 = all.")
    stop: list[str] = Field(default_factory=lambda: ["\n"],
                            description="A message ends before the first of these strings.")
    seed: int | None = Field(None, ge=0, description="Sampling seed; default: the run's.")
    preset: str = Field("tiny", description="tiny backend: configs/model/NAME.yaml or a path.")
    path: str | None = Field(None, description="Checkpoint directory (hf, vllm: required).")
    lora: dict[str, Any] | None = Field(None, description="hf, vllm: LoRA {r, alpha, "
                                                         "dropout, target_modules}.")
    fast: bool = Field(True, description="hf: generate with the engine's own Llama "
                                         "implementation when the architecture allows.")
    prompt_format: Literal["transcript", "chat"] = Field(
        "transcript", description="transcript: the agent's prompt as one growing text (in a "
        "chat template, one user turn); chat: a system message, a named user turn per "
        "round and the agent's own messages as assistant turns (hf, vllm, openai).")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="hf, vllm: arguments passed to the tokenizer's chat template "
        "(e.g. {enable_thinking: false}); openai: sent as the request's "
        "chat_template_kwargs (vLLM and SGLang servers read it).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights' dtype (tiny, hf, vllm).")
    device: str = Field("cpu", description="cpu, cuda, cuda:1, ...")
    engine: dict[str, Any] | None = Field(None, description="vllm: settings passed to "
                                          "vllm.LLM (max_model_len, kv_cache_memory_bytes, "
                                          "gpu_memory_utilization, tensor_parallel_size, "
                                          "enforce_eager, dtype).")
    base_url: str | None = Field(None, description="openai: the endpoint, e.g. "
                                 "http://127.0.0.1:8000/v1 (required).")
    api_key_env: str | None = Field(None, description="openai: NAME of the environment "
                                    "variable holding the key (never the key itself).")
    allow_plain_http: bool = Field(False, description="openai: send the key over plain "
                                   "http to a host other than this machine (a trusted "
                                   "network only).")
    api: Literal["chat", "completions"] = Field("chat", description="openai: chat (the "
                                                "observation as one user message) or "
                                                "completions (as the prompt).")
    max_concurrency: int = Field(8, ge=1, le=256, description="openai: requests in flight.")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="openai: seconds per request.")
    max_retries: int = Field(5, ge=0, le=20, description="openai: retries of a request on "
                             "429, 5xx, timeouts and dropped connections.")


class TaskSpec(StrictModel):
    """The task the team plays: a built-in id and its parameters."""

    name: str = Field(description="Task id, e.g. gather_v0.")
    params: dict[str, Any] = Field(default_factory=dict, description="The task's parameters.")


class TopologySpec(BaseModel):
    """``kind`` plus that generator's own parameters (checked by the generator)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str = Field(description="star | chain | ring | complete | debate | tree | ...")

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class AnswerSpec(StrictModel):
    """Who answers: one agent (``answer: lead``) or a majority vote (``{vote: [a, b]}``)."""

    agent: str | None = Field(None, description="The agent whose final message is the "
                              "answer (written as a plain id: answer: lead).")
    vote: list[str] | None = Field(None, min_length=1, description="Voters; the majority "
                                   "answer wins, ties going to the earliest voter.")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"agent": data}
        if not isinstance(data, dict):
            raise PydanticCustomError(
                "answer_type", "expected an agent id or {vote: [ids]}, got {got}.",
                {"got": repr(data)},
            )
        if (data.get("agent") is None) == (data.get("vote") is None):
            raise PydanticCustomError(
                "answer_shape", "give exactly one of an agent id or {vote: [ids]}, got {got}.",
                {"got": repr(data)},
            )
        return data

    @property
    def agents(self) -> list[str]:
        return [self.agent] if self.agent is not None else list(self.vote or [])


class ProtocolSpec(StrictModel):
    """How long an episode lasts and who gives the team's answer."""

    rounds: int = Field(1, ge=1, le=1000, description="Rounds; every agent acts once a round.")
    answer: AnswerSpec | None = Field(None, description="Agent id or {vote: [ids]} giving the "
                                      "team answer (with teams: each team's own answer).")

    @field_validator("answer", mode="before")
    @classmethod
    def _not_null(cls, v: Any) -> Any:
        if v is None:  # written out as null: not the same as leaving it out for teams
            raise PydanticCustomError(
                "answer_type", "expected an agent id or {vote: [ids]}, got {got}.",
                {"got": "None"})
        return v


class TeamSpec(StrictModel):
    """One side of a competitive scenario: its agents and who answers for it."""

    agents: list[str] = Field(min_length=1, description="Agent ids on this team.")
    answer: AnswerSpec = Field(description="Agent id or {vote: [ids]} giving the team's answer.")


class CostSpec(StrictModel):
    """Prices (LiteLLM field names, USD per token) and the reward's token penalty."""

    model: str = Field("local", description="Entry of the bundled price table.")
    input_cost_per_token: Decimal | None = Field(None, ge=0, description="USD per uncached "
                                                 "prompt token; default: the model's price.")
    output_cost_per_token: Decimal | None = Field(None, ge=0, description="USD per completion "
                                                  "token; default: the model's price.")
    cache_read_input_token_cost: Decimal | None = Field(
        None, ge=0, description="USD per cached prompt token; default: the model's price.")
    penalty_per_1k: Decimal = Field(Decimal(0), ge=0, description="Reward lost per 1k tokens.")
    budget_usd: Decimal | None = Field(None, gt=0, description="marl run stops before a batch "
                                       "whose worst-case cost would exceed it.")

    @property
    def overrides(self) -> dict[str, Decimal | None]:
        return {"input_cost_per_token": self.input_cost_per_token,
                "output_cost_per_token": self.output_cost_per_token,
                "cache_read_input_token_cost": self.cache_read_input_token_cost}


class Scenario(StrictModel):
    """A scenario file: the team, what it plays, who reads whom, and what tokens cost."""

    name: str = Field(pattern=SCENARIO_NAME_RULE, description="Scenario name (the default "
                      "run directory is runs/NAME-ALGORITHM).")
    description: str = Field("", description="Free text.")
    task: TaskSpec = Field(description="The task: {name, params}.")
    agents: list[AgentEntry] = Field(description="Agents and agent templates (at most 256 "
                                     "agents).")
    policies: dict[Name, PolicySpec] = Field(
        default_factory=lambda: {"default": PolicySpec()},
        description="Policies by name; agents naming the same policy share it.")
    topology: TopologySpec = Field(description="Who reads whom: a generator kind and its "
                                   "parameters, or kind: custom with edges.")
    protocol: ProtocolSpec = Field(description="Rounds and the answer.")
    costs: CostSpec = Field(default_factory=CostSpec, description="Prices and the token "
                            "penalty.")
    teams: dict[Name, TeamSpec] | None = Field(
        None, description="Competitive scenarios: two or more teams, each with its agents and "
        "answer; every agent is on exactly one team and gets its team's reward.")
    seed: int = Field(0, ge=0, description="Default seed of episodes.")

    @field_validator("agents", mode="before")
    @classmethod
    def _single_template(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else v


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Field names of the model at ``loc`` below ``model`` (through optionals, lists, dicts)."""
    tp: Any = model
    for part in loc:
        inner = get_args(tp)[-1] if get_origin(tp) in (list, dict) else None
        tp = _non_none(inner or tp.model_fields[part].annotation)
    return list(tp.model_fields)


def _non_none(tp: Any) -> Any:
    """``X`` for ``X | None``, else ``tp``."""
    if get_origin(tp) in (Union, UnionType):
        return next(a for a in get_args(tp) if a is not type(None))
    return tp


def _message(err: dict[str, Any], model: type[BaseModel]) -> tuple[tuple[int | str, ...], str]:
    loc, kind, msg = tuple(err["loc"]), err["type"], err["msg"]
    if kind == "extra_forbidden":
        key, valid = str(loc[-1]), _fields_at(model, loc[:-1])
        if SECRET_KEY.search(key):  # the value is never echoed: it may be a real key
            return (*loc[:-1], key), (f"unknown key {key!r}: a secret must not be written in "
                                      "a scenario file (every run directory keeps a copy). "
                                      "Put it in an environment variable and name that "
                                      "variable in the policy's `api_key_env` (e.g. "
                                      "api_key_env: OPENAI_API_KEY).")
        if len(loc) == 1 and key in getattr(model, "removed", {}):
            return loc, f"this setting was removed: {model.removed[key]}. Drop it."
        return (*loc[:-1], key), (f"unknown key {key!r}.{did_you_mean(key, valid)} "
                                  f"Valid keys: {', '.join(valid)}.")
    if kind == "missing":
        return loc, f"missing required key {loc[-1]!r}."
    if kind == "string_pattern_mismatch":  # a name that becomes a path
        rule = RULES.get(err["ctx"]["pattern"], err["ctx"]["pattern"])
        at = (*loc[:-2], str(loc[-2])) if loc and loc[-1] == "[key]" else loc
        return at, (f"invalid name {err['input']!r}: it becomes a file or directory name, so "
                    f"use {rule}.")
    if loc and loc[-1] == "[key]":  # loc: (..., key, "[key]"); the key is a key, not an index
        return (*loc[:-2], str(loc[-2])), f"key {err['input']!r} must be a string; quote it."
    msg = msg.removeprefix("Value error, ")
    if kind in ("answer_type", "answer_shape"):
        return loc, msg
    if kind in ("model_type", "dict_type"):
        return loc, f"expected a mapping (key: value lines), got {err['input']!r}."
    return loc, f"{msg[0].lower()}{msg[1:]} (got {err['input']!r})."


def problems_from(exc: ValidationError, model: type[BaseModel],
                  prefix: tuple[int | str, ...] = (),
                  lines: dict[tuple, int] | None = None) -> list[Problem]:
    """Turn ``model``'s validation error into problems with dotted key paths under ``prefix``."""
    out = []
    for err in exc.errors():
        loc, msg = _message(err, model)
        full = (*prefix, *loc)
        out.append(Problem(_path(full), msg, line_of(lines, full)))
    return out


def line_of(lines: dict[tuple, int] | None, loc: tuple) -> int | None:
    """Line of the deepest known node on ``loc``."""
    if not lines:
        return None
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _index_lines(node: yaml.Node, loc: tuple = (), out: dict | None = None,
                 seen: set[int] | None = None) -> dict:
    out = {} if out is None else out
    seen = set() if seen is None else seen
    out.setdefault(loc, node.start_mark.line + 1)
    if id(node) in seen:  # an alias (`*a`), maybe recursive: its node is indexed already
        return out
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = (*loc, k.value)
            out[key] = k.start_mark.line + 1
            _index_lines(v, key, out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _index_lines(v, (*loc, i), out, seen)
    return out


def _check_expansion(node: yaml.Node | None, source: str) -> None:
    """Refuse a document whose aliases (``*a``) expand it past :data:`MAX_NODES` nodes, or
    into itself: a "billion laughs" file is small on disk and in memory (aliases share),
    but anything that walks it (printing a value in an error, copying it) expands it."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in busy:
            raise ScenarioError(source, [Problem("", "an alias refers to a node that holds "
                                                 "it (a recursive alias); write the data "
                                                 "out instead.", n.start_mark.line + 1)])
        busy.add(key)
        total = 1
        if isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total += sum(size(v) for v in n.value)
        if total > MAX_NODES:
            raise ScenarioError(source, [Problem("", f"the document expands to more than "
                                                 f"{MAX_NODES:,} values (through aliases, "
                                                 "*name); a scenario is far smaller: write "
                                                 "it out without nested aliases.",
                                                 n.start_mark.line + 1)])
        busy.discard(key)
        sizes[key] = total
        return total

    if node is not None:
        size(node)


def read_yaml(path: str | Path) -> tuple[Any, dict[tuple, int]]:
    """Parse a YAML file; returns the data and a key-path -> line index."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        problem = Problem("", f"cannot read the file: {exc.strerror}.")
        raise ScenarioError(source, [problem]) from None
    except UnicodeDecodeError as exc:
        problem = Problem("", f"the file is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                          f"offset {exc.start}); save it as UTF-8.")
        raise ScenarioError(source, [problem]) from None
    if len(text) > MAX_FILE_CHARS:
        raise ScenarioError(source, [Problem("", f"the file holds {len(text):,} characters, "
                                             f"more than a scenario's limit of "
                                             f"{MAX_FILE_CHARS:,}; keep data (problems, "
                                             "documents) in files the task reads.")])
    try:
        node = yaml.compose(text)
        _check_expansion(node, source)  # before anything walks the data aliases share
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        what = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(source, [Problem("", f"YAML syntax error: {what}. Check the "
                                                 "indentation and quoting there.", line)]) from None
    return data, (_index_lines(node) if node is not None else {})


def parse_scenario(data: Any, source: str | None = None,
                   lines: dict[tuple, int] | None = None) -> Scenario:
    """Validate the structure of already-parsed scenario data."""
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        keys = ", ".join(Scenario.model_fields)
        problem = Problem("", f"the file must hold a mapping with keys {keys}; got {got}.")
        raise ScenarioError(source, [problem])
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(source, problems_from(exc, Scenario, lines=lines)) from None
