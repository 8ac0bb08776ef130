"""Every scenario validation error names the offending key path, the bad value and the fix.

Each case starts from a valid scenario, changes one thing, writes it as YAML into
``tmp_path`` and loads it with :func:`marl.team.load_team`, exactly as ``marl validate`` does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from marl.cli import app
from marl.errors import Problem, ScenarioError
from marl.team import MAX_AGENTS, load_team

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))

BASE: dict[str, Any] = {
    "name": "base",
    "description": "A lead and three workers on a star; the lead answers the sum.",
    "task": {"name": "gather_v0", "params": {"values": 10}},
    "agents": [
        {"id": "lead", "role": "orchestrator", "policy": "lead", "prompt": "Add it all up."},
        {"count": 3, "start": 1, "id": "w{i}", "role": "worker", "policy": "worker"},
    ],
    "policies": {
        "lead": {"backend": "scripted", "max_new_tokens": 8},
        "worker": {"backend": "scripted", "max_new_tokens": 8},
    },
    "topology": {"kind": "star", "hub": "lead"},
    "protocol": {"rounds": 1, "answer": "lead"},
    "costs": {"model": "gpt-4o-mini", "penalty_per_1k": 0.0},
}
AGENT_IDS = ["lead", "w1", "w2", "w3"]

Mutation = Callable[[dict[str, Any]], None]


def _get(data: Any, keys: tuple[Any, ...]) -> Any:
    for key in keys:
        data = data[key]
    return data


def _parent(data: Any, keys: tuple[Any, ...]) -> Any:
    return _get(data, keys[:-1])


def setting(*keys: Any, value: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        _parent(data, keys)[keys[-1]] = value

    return mutate


def deleting(*keys: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        del _parent(data, keys)[keys[-1]]

    return mutate


def renaming(*keys: Any, to: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        parent = _parent(data, keys)
        parent[to] = parent.pop(keys[-1])

    return mutate


def appending(*keys: Any, value: Any, at: int | None = None) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        items = _get(data, keys)
        items.insert(len(items) if at is None else at, value)

    return mutate


def both(*mutations: Mutation) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        for m in mutations:
            m(data)

    return mutate


def write(tmp_path: Path, data: Any, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def mutated(tmp_path: Path, mutation: Mutation) -> Path:
    data = copy.deepcopy(BASE)
    mutation(data)
    return write(tmp_path, data)


def problems_of(path: Path) -> list[Problem]:
    with pytest.raises(ScenarioError) as info:
        load_team(path)
    problems = info.value.problems
    assert problems and all(p.message for p in problems)
    rendered = str(info.value)
    assert all(p.render(str(path)) in rendered for p in problems)
    return problems


def problem_at(problems: list[Problem], path: str) -> Problem:
    found = [p for p in problems if p.path == path]
    assert found, f"no problem at {path!r}; got {[(p.path, p.message) for p in problems]}"
    return found[0]


def line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


def test_base_scenario_is_valid(tmp_path):
    team = load_team(write(tmp_path, BASE))
    assert list(team.ids) == AGENT_IDS and team.answer_agents == ("lead",)


# (case id, mutation, problem path, fragments the message must contain)
CASES = [
    # unknown or misspelt keys: suggestion plus the valid keys
    ("top-level key", renaming("protocol", to="protocl"), "protocl",
     ["'protocl'", "Did you mean 'protocol'?", "Valid keys:", "topology", "costs"]),
    ("topology parameter", renaming("topology", "hub", to="hubb"), "topology.hubb",
     ["'hubb'", "Did you mean 'hub'?", "Valid parameters: 'hub'"]),
    ("agent key", setting("agents", 0, "rol", value="lead"), "agents[0].rol",
     ["'rol'", "Did you mean 'role'?", "Valid keys:", "prompt", "count"]),
    ("costs key", renaming("costs", "penalty_per_1k", to="penalty_per_1K"),
     "costs.penalty_per_1K", ["'penalty_per_1K'", "Did you mean 'penalty_per_1k'?", "model"]),
    ("policy key", renaming("policies", "worker", "max_new_tokens", to="max_new_token"),
     "policies.worker.max_new_token",
     ["'max_new_token'", "Did you mean 'max_new_tokens'?", "backend"]),
    ("protocol key", setting("protocol", "round", value=2), "protocol.round",
     ["'round'", "Did you mean 'rounds'?", "answer"]),
    ("topology parameter of another kind", setting("topology", "kind", value="ring"),
     "topology.hub", ["'ring'", "'hub'", "none besides agents"]),
    # wrong types: the value seen
    ("rounds not an int", setting("protocol", "rounds", value="three"), "protocol.rounds",
     ["'three'", "integer"]),
    ("agents not a list", setting("agents", value=5), "agents", ["(got 5)", "list"]),
    ("task not a mapping", setting("task", value=[1]), "task", ["[1]", "mapping"]),
    ("max_new_tokens not an int", setting("policies", "lead", "max_new_tokens", value=2.5),
     "policies.lead.max_new_tokens", ["2.5"]),
    ("answer not an id", setting("protocol", "answer", value=5), "protocol.answer",
     ["got 5", "{vote: [ids]}"]),
    ("vote not a list", setting("protocol", "answer", value={"vote": "w1"}),
     "protocol.answer.vote", ["'w1'", "list"]),
    # missing required keys
    ("missing task", deleting("task"), "task", ["missing required key 'task'"]),
    ("missing topology", deleting("topology"), "topology", ["missing required key 'topology'"]),
    ("missing answer", deleting("protocol", "answer"), "protocol.answer",
     ["missing required key 'answer'"]),
    ("missing task name", deleting("task", "name"), "task.name",
     ["missing required key 'name'"]),
    ("missing agent id", deleting("agents", 0, "id"), "agents[0].id",
     ["missing required key 'id'"]),
    # duplicate agent ids
    ("duplicate explicit id", appending("agents", value={"id": "lead", "policy": "worker"}),
     "agents[2].id", ["duplicate agent id 'lead'", "agents[0]", "unique"]),
    ("template overlaps an explicit id",
     appending("agents", value={"id": "w2", "policy": "worker"}, at=1),
     "agents[2].id", ["duplicate agent id 'w2'", "agents[1]"]),
    # references
    ("agent names an unknown policy", setting("agents", 0, "policy", value="leed"),
     "agents[0].policy", ["'leed'", "Did you mean 'lead'?", "'lead', 'worker'", "policies"]),
    ("unknown answer agent", setting("protocol", "answer", value="leed"), "protocol.answer",
     ["unknown agent 'leed'", "Did you mean 'lead'?", "'w3'"]),
    ("unknown voter", setting("protocol", "answer", value={"vote": ["lead", "w9"]}),
     "protocol.answer.vote[1]", ["unknown agent 'w9'", "'w1'", "'w3'"]),
    ("voter listed twice", setting("protocol", "answer", value={"vote": ["w1", "w2", "w1"]}),
     "protocol.answer.vote[2]", ["'w1'", "twice"]),
    ("hub not an agent", setting("topology", "hub", value="laed"), "topology.hub",
     ["'laed'", "Did you mean 'lead'?", "'w1'"]),
    # registries: task, topology kind, price model, backend
    ("unknown task", setting("task", "name", value="gathr_v0"), "task.name",
     ["'gathr_v0'", "Did you mean 'gather_v0'?", "'relay_v0'", "'vote_v0'"]),
    ("task param out of range", setting("task", "params", "values", value=1),
     "task.params.values", ["(got 1)", "greater than or equal to 2"]),
    ("task param wrong type", setting("task", "params", "values", value="ten"),
     "task.params.values", ["'ten'", "integer"]),
    ("unknown task param", setting("task", "params", "valuez", value=3), "task.params.valuez",
     ["'valuez'", "Did you mean 'values'?", "Valid keys: values"]),
    ("unknown topology kind", setting("topology", "kind", value="stra"), "topology.kind",
     ["'stra'", "Did you mean 'star'?", "'chain'", "'custom'"]),
    ("unknown price model", setting("costs", "model", value="gpt-4o-mni"), "costs.model",
     ["'gpt-4o-mni'", "Did you mean 'gpt-4o-mini'?", "'local'", "input_cost_per_token"]),
    ("unknown policy price model", setting("policies", "lead", "model", value="gpt-4o-mni"),
     "policies.lead.model", ["'gpt-4o-mni'", "Did you mean 'gpt-4o-mini'?"]),
    ("unknown backend", setting("policies", "lead", "backend", value="scriptd"),
     "policies.lead.backend", ["'scriptd'", "Did you mean 'scripted'?", "'random'"]),
    # ranges
    ("zero rounds", setting("protocol", "rounds", value=0), "protocol.rounds",
     ["(got 0)", "greater than or equal to 1"]),
    ("negative rounds", setting("protocol", "rounds", value=-2), "protocol.rounds", ["(got -2)"]),
    ("count zero", setting("agents", 1, "count", value=0), "agents[1].count",
     ["(got 0)", "greater than or equal to 1"]),
    ("no agents", setting("agents", value=[]), "agents", ["empty", "at least one agent"]),
    ("absurd count", setting("agents", 1, "count", value=100000), "agents[1].count",
     ["100000", f"limit of {MAX_AGENTS}"]),
    ("too many agents in all", appending("agents", value={"count": 255, "id": "x{i}",
                                                          "policy": "worker"}),
     "agents[2].count", ["255 agents (after 4 before it)", f"limit of {MAX_AGENTS}"]),
    ("max_new_tokens out of range", setting("policies", "lead", "max_new_tokens", value=0),
     "policies.lead.max_new_tokens", ["(got 0)"]),
    ("negative token price", setting("costs", "input_cost_per_token", value=-1e-6),
     "costs.input_cost_per_token", ["-1e-06", "greater than or equal to 0"]),
    # names that become paths
    ("scenario name escapes", setting("name", value="../../escape"), "name",
     ["invalid name '../../escape'", "becomes a file or directory name"]),
    ("hidden scenario name", setting("name", value=".hidden"), "name", ["'.hidden'"]),
    ("policy key escapes", lambda d: d["policies"].__setitem__("../p", {"backend": "random"}),
     "policies.../p", ["invalid name '../p'", "a letter then up to 31"]),
    # agent ids
    ("template id without {i}", setting("agents", 1, "id", value="w"), "agents[1].id",
     ["'w'", "{i}"]),
    ("max_new_tokens below the task's need", setting("policies", "worker", "max_new_tokens",
                                                     value=1),
     "policies.worker.max_new_tokens", ["gather_v0", "needs 4", "limit is 1",
                                        "raise it to 4"]),
    ("non-ASCII prompt", setting("agents", 0, "prompt", value="Add ü and ✓"),
     "agents[0].prompt", ["ü", "✓", "charset", "remove"]),
]  # fmt: skip


@pytest.mark.parametrize(("mutation", "path", "fragments"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error_names_field_value_and_fix(tmp_path, mutation, path, fragments):
    problem = problem_at(problems_of(mutated(tmp_path, mutation)), path)
    for fragment in fragments:
        assert fragment in problem.message, (fragment, problem.message)
    assert problem.line is not None


@pytest.mark.parametrize("bad_id", ["9lives", "has space", "dot.ted", "x" * 33, "ünï", ""])
def test_invalid_agent_id_characters(tmp_path, bad_id):
    path = mutated(tmp_path, appending("agents", value={"id": bad_id, "policy": "worker"}))
    problem = problem_at(problems_of(path), "agents[2].id")
    assert f"invalid agent id {bad_id!r}" in problem.message
    assert "letter" in problem.message


def test_invalid_agent_id_from_template(tmp_path):
    path = mutated(tmp_path, setting("agents", 1, "id", value="w {i}"))
    problem = problem_at(problems_of(path), "agents[1].id")
    assert "'w 1'" in problem.message


def test_yaml_syntax_error_reports_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ntask:\n  name: gather_v0\n   params: {values: 10}\n")
    with pytest.raises(ScenarioError) as info:
        load_team(path)
    [problem] = info.value.problems
    assert problem.line == 4 and problem.path == ""
    assert "YAML syntax error" in problem.message and "indentation" in problem.message
    assert f"{path}:4: (root): YAML syntax error" in str(info.value)


@pytest.mark.parametrize(("text", "got"), [("- a\n- b\n", "got a list"), ("", "empty file"),
                                           ("# only a comment\n", "empty file")])
def test_root_must_be_a_mapping(tmp_path, text, got):
    path = tmp_path / "root.yaml"
    path.write_text(text)
    [problem] = problems_of(path)
    assert problem.path == ""
    assert got in problem.message and "task, agents" in problem.message


def test_missing_file(tmp_path):
    [problem] = problems_of(tmp_path / "nowhere.yaml")
    assert "cannot read" in problem.message


def test_same_round_cycle_is_named(tmp_path):
    edges = [["w1", "lead"], ["lead", "w2"], ["w2", "w1"], ["w3", "lead"]]
    path = mutated(tmp_path, setting("topology", value={"kind": "custom", "edges": edges}))
    problem = problem_at(problems_of(path), "topology.edges")
    assert "cycle" in problem.message and "delay" in problem.message
    cycle = problem.message.split("cycle: ", 1)[1].split(".", 1)[0]
    names = cycle.split(" -> ")
    assert names[0] == names[-1] and set(names) == {"lead", "w1", "w2"}


def test_edge_naming_an_unknown_agent(tmp_path):
    edges = [["w1", "lead"], ["w2", "leed"], ["w3", "lead"]]
    path = mutated(tmp_path, setting("topology", value={"kind": "custom", "edges": edges}))
    problem = problem_at(problems_of(path), "topology.edges[1][1]")
    assert "'leed'" in problem.message and "Did you mean 'lead'?" in problem.message
    assert "'w3'" in problem.message


@pytest.mark.parametrize(("edge", "path", "fragments"), [
    (["w1", "lead", {"dealy": 1}], "topology.edges[0][2].dealy", ["'dealy'", "'delay'"]),
    (["w1", "lead", {"delay": -1}], "topology.edges[0][2].delay", ["-1", ">= 0"]),
    (["w1", "w1"], "topology.edges[0]", ["self-loop", "'w1'"]),
    (["w1"], "topology.edges[0]", ["['w1']", "[src, dst]"]),
])  # fmt: skip
def test_malformed_edge(tmp_path, edge, path, fragments):
    topology = {"kind": "custom", "edges": [edge]}
    problem = problem_at(problems_of(mutated(tmp_path, setting("topology", value=topology))),
                         path)
    for fragment in fragments:
        assert fragment in problem.message


def test_gather_over_a_chain_answered_by_the_first_agent(tmp_path):
    path = mutated(tmp_path, setting("topology", value={"kind": "chain"}))
    problem = problem_at(problems_of(path), "protocol.answer")
    assert "answer agent 'lead' cannot receive" in problem.message
    assert "'w1', 'w2', 'w3'" in problem.message and "gather_v0" in problem.message
    assert "add edges" in problem.message


def _relay_ring(rounds: int) -> Mutation:
    return both(setting("task", value={"name": "relay_v0", "params": {"source": "w1"}}),
                setting("topology", value={"kind": "ring"}),
                setting("protocol", "rounds", value=rounds))


def test_relay_ring_with_too_few_rounds_suggests_the_rounds_needed(tmp_path):
    problem = problem_at(problems_of(mutated(tmp_path, _relay_ring(2))), "protocol.answer")
    assert "'lead'" in problem.message and "'w1'" in problem.message
    assert "within 2 round(s)" in problem.message
    assert "raise protocol.rounds to 4" in problem.message
    assert load_team(mutated(tmp_path, _relay_ring(4))).rounds == 4


def test_relay_source_must_be_an_agent(tmp_path):
    path = mutated(tmp_path, both(_relay_ring(4), setting("task", "params", "source",
                                                          value="w7")))
    problem = problem_at(problems_of(path), "task.params.source")
    assert "'w7'" in problem.message and "'w1'" in problem.message


def test_nested_unknown_key_points_at_its_line(tmp_path):
    data = copy.deepcopy(BASE)
    data["policies"]["worker"]["max_new_token"] = data["policies"]["worker"].pop("max_new_tokens")
    data["agents"][1]["rol"] = data["agents"][1].pop("role")
    path = write(tmp_path, data)
    text = path.read_text()
    with pytest.raises(ScenarioError) as info:
        load_team(path)
    lines = {p.path: p.line for p in info.value.problems}
    assert lines == {"policies.worker.max_new_token": line_of(text, "max_new_token:"),
                     "agents[1].rol": line_of(text, "rol:")}
    where = f"{path}:{line_of(text, 'max_new_token:')}: policies.worker.max_new_token:"
    assert where in str(info.value)


def test_cross_field_problem_points_at_its_line(tmp_path):
    path = mutated(tmp_path, setting("policies", "worker", "backend", value="scriptd"))
    problem = problem_at(problems_of(path), "policies.worker.backend")
    assert problem.line == line_of(path.read_text(), "scriptd")


def test_several_structural_problems_are_all_reported(tmp_path):
    path = mutated(tmp_path, both(renaming("protocol", to="protocl"),
                                  setting("agents", 0, "rol", value="x"),
                                  setting("costs", "penalty_per_1k", value="lots"),
                                  deleting("task", "name")))
    problems = problems_of(path)
    assert {p.path for p in problems} == {"protocl", "protocol", "agents[0].rol",
                                          "costs.penalty_per_1k", "task.name"}
    assert len({p.line for p in problems}) == len(problems)


def test_several_cross_field_problems_are_all_reported(tmp_path):
    path = mutated(tmp_path, both(setting("policies", "lead", "backend", value="gpt"),
                                  setting("agents", 1, "policy", value="wroker"),
                                  setting("costs", "model", value="nope"),
                                  setting("agents", 0, "prompt", value="é"),
                                  appending("agents", value={"id": "lead", "policy": "lead"})))
    paths = {p.path for p in problems_of(path)}
    assert {"policies.lead.backend", "agents[1].policy", "costs.model", "agents[0].prompt",
            "agents[2].id"} <= paths


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenario_loads(path):
    team = load_team(path)
    assert team.source == str(path) and team.ids and team.answer_agents


def test_shipped_scenarios_exist():
    assert len(SCENARIOS) >= 13


# Regression tests for bugs found by tests/marl/test_scenario_fuzz.py and by the cases above.


def test_unknown_key_message_shows_the_key(tmp_path):
    # The pydantic template used `{key!r}`, which pydantic does not format: the message
    # said "unknown key {key!r}." instead of naming the key.
    [problem] = problems_of(mutated(tmp_path, setting("zzz", value=1)))
    assert problem.message.startswith("unknown key 'zzz'.") and "{" not in problem.message


@pytest.mark.parametrize("answer", [5, ["lead"], None])
def test_answer_type_message_shows_the_value(tmp_path, answer):
    problem = problem_at(problems_of(mutated(tmp_path, setting("protocol", "answer",
                                                               value=answer))),
                         "protocol.answer")
    assert f"got {answer!r}." in problem.message and "{{" not in problem.message


@pytest.mark.parametrize("answer", [{"agent": None}, {"vote": None}, {"agent": "lead",
                                                                      "vote": ["w1"]}])
def test_answer_needs_exactly_one_agent_or_vote(tmp_path, answer):
    # `{agent: null}` used to load with no answer agent, and the episode crashed at its end.
    problem = problem_at(problems_of(mutated(tmp_path, setting("protocol", "answer",
                                                               value=answer))),
                         "protocol.answer")
    assert "exactly one" in problem.message and repr(answer) in problem.message


def test_negative_seed_is_rejected(tmp_path):
    # A negative seed loaded, then `reset()` raised numpy's ValueError.
    problem = problem_at(problems_of(mutated(tmp_path, setting("seed", value=-1))), "seed")
    assert "(got -1)" in problem.message


@pytest.mark.parametrize(("topology", "path"), [
    ({"kind": "debate", "delay": 10**20}, "topology.delay"),
    ({"kind": "custom", "edges": [["w1", "lead", {"delay": 10**20}]]},
     "topology.edges[0][2].delay"),
])  # fmt: skip
def test_huge_delay_is_rejected(tmp_path, topology, path):
    # A delay beyond int64 raised OverflowError while compiling the delay matrix.
    problem = problem_at(problems_of(mutated(tmp_path, setting("topology", value=topology))),
                         path)
    assert str(10**20) in problem.message and "<= 1000" in problem.message


def test_file_that_is_not_utf8(tmp_path):
    # Used to raise UnicodeDecodeError.
    path = write(tmp_path, BASE)
    path.write_bytes(path.read_bytes() + b"\xff\n")
    [problem] = problems_of(path)
    assert "UTF-8" in problem.message and "0xff" in problem.message


@pytest.mark.parametrize("text", ["extra: &a [*a]\n", "costs: &c {model: *c}\n"])
def test_recursive_yaml_alias(tmp_path, text):
    # Indexing the lines of a recursive alias recursed forever (RecursionError).
    data = {k: v for k, v in BASE.items() if k not in ("costs",)}
    path = write(tmp_path, data)
    path.write_text(path.read_text() + text)
    assert problems_of(path)


def test_non_string_mapping_key(tmp_path):
    # The key path used to read `policies[3].[key]`.
    problem = problem_at(problems_of(mutated(tmp_path, setting("policies", 3, value={}))),
                         "policies.3")
    assert "key 3 must be a string" in problem.message


def test_non_ascii_role_names_the_role(tmp_path):
    # Bad characters in `role` were reported at `agents[i].prompt`.
    problems = problems_of(mutated(tmp_path, setting("agents", 1, "role", value="wörker")))
    assert "ö" in problem_at(problems, "agents[1].role").message
    assert not [p for p in problems if p.path == "agents[1].prompt"]


def test_unknown_task_param_with_other_param_problems(tmp_path):
    path = mutated(tmp_path, setting("task", "params", value={"value": 1, "values": 1}))
    problems = problems_of(path)
    assert "Did you mean 'values'?" in problem_at(problems, "task.params.value").message
    assert "(got 1)" in problem_at(problems, "task.params.values").message


def test_data_and_file_give_the_same_problems(tmp_path):
    data = copy.deepcopy(BASE)
    setting("topology", "kind", value="stra")(data)
    with pytest.raises(ScenarioError) as info:
        load_team(data)
    assert [p.path for p in info.value.problems] == ["topology.kind"]
    assert info.value.problems[0].line is None
    assert [p.path for p in problems_of(write(tmp_path, data))] == ["topology.kind"]


runner = CliRunner()


def test_cli_validate_bad_file(tmp_path):
    path = mutated(tmp_path, renaming("topology", "hub", to="hubb"))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}:" in result.output and "topology.hubb" in result.output
    assert "Did you mean 'hub'?" in result.output
    assert "Traceback" not in result.output and result.exception is not None
    assert isinstance(result.exception, SystemExit)


def test_cli_validate_reports_each_bad_file_and_checks_the_good_ones(tmp_path):
    bad = mutated(tmp_path, setting("protocol", "rounds", value="three"))
    good = SCENARIOS[0]
    result = runner.invoke(app, ["validate", str(good), str(bad)])
    assert result.exit_code == 2
    assert "protocol.rounds" in result.output and "1 of 2 file(s) invalid" in result.output
    assert good.name in result.output and "Traceback" not in result.output


def test_cli_validate_shipped_scenarios():
    result = runner.invoke(app, ["validate", *map(str, SCENARIOS)])
    assert result.exit_code == 0, result.output
    assert result.output.count("✓") == len(SCENARIOS)


@pytest.mark.parametrize(("policy", "why"), [
    ({"backend": "tiny"}, "tiny policies read the transcript"),
    ({"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1",
      "api": "completions"}, "the completions API takes one text"),
])
def test_a_chat_prompt_format_needs_a_chat_model(policy, why):
    data = yaml.safe_load((ROOT / "scenarios" / "signal.yaml").read_text())
    data["policies"]["speaker"] = {**policy, "prompt_format": "chat", "max_new_tokens": 2}
    with pytest.raises(ScenarioError) as err:
        load_team(data, "s.yaml")
    assert "policies.speaker.prompt_format: prompt_format: chat needs a chat model" in str(
        err.value) and why in str(err.value)
