import itertools
import json
import sys

import numpy as np
import pytest
import yaml

from marl.env import TeamEnv
from marl.errors import MarlError, ScenarioError
from marl.policies import Request
from marl.policies.scripted import ScriptedPolicy
from marl.rollout import collect
from marl.runner import run
from marl.tasks import TASKS, task_class
from marl.team import load_team
from tests.marl.conftest import CODE_SCENARIOS, ROOT, SCENARIOS


@pytest.mark.parametrize("name", ["signal", "signal_pick", "signal_star", "gather_star",
                                  "gather_chain", "gather_tree", "gather_layered", "relay_chain",
                                  "relay_ring", "relay_custom"])
def test_oracle_is_perfect(name):
    result = run(load_team(ROOT / "scenarios" / f"{name}.yaml"), 60, seed=11, policy="scripted")
    assert all(e["success"] for e in result.episodes)


@pytest.mark.parametrize(("name", "chance", "tol"), [
    ("signal", 1 / 4, 0.07), ("signal_pick", 1 / 4, 0.07), ("signal_star", 1 / 6, 0.06),
    ("gather_star", 1 / 37, 0.03),
    ("vote_complete", 1 / 2, 0.08), ("relay_chain", 0.0, 0.01)])
def test_random_policy_sits_near_chance(name, chance, tol):
    result = run(load_team(ROOT / "scenarios" / f"{name}.yaml"), 300, seed=4, policy="random")
    rate = sum(e["success"] for e in result.episodes) / 300
    assert abs(rate - chance) <= tol


def test_debate_beats_a_lone_noisy_agent():
    team = load_team(ROOT / "scenarios" / "vote_debate.yaml")  # 5 agents, 3 classes, noise .4
    result = run(team, 400, seed=2, policy="scripted")
    rate = sum(e["success"] for e in result.episodes) / 400
    assert rate > (1 - 0.4) + 0.08


def test_oracle_answers_from_its_observation_only():
    # Workers that say nothing leave the lead's oracle guessing: success falls to ~chance.
    env = TeamEnv(load_team(ROOT / "scenarios" / "gather_star.yaml"), seed=0)
    lead = ScriptedPolicy(env.team.task)
    wins = 0
    for _ in range(200):
        env.reset()
        obs, *_ = env.step({a: "????????" for a in env.scheduled})
        answer = lead.generate([Request("lead", obs["lead"], final=True)])[0].text
        _, rewards, *_ = env.step({"lead": answer})
        wins += rewards["lead"] == 1.0
    assert wins < 40


@pytest.mark.parametrize(("task_id", "answer"), [("gather_v1", "17"), ("gather_v0", "7")])
def test_gather_answers_the_sum_or_the_sum_modulo_values(task_id, answer):
    task = task_class(task_id)(task_class(task_id).Params(values=10), ["a", "b", "c"], ["c"])
    obs = "you are c (lead). value: 9\n[round 1]\na> 3??\nb> ?5?\nc answer> "
    assert task.oracle("c", obs, final=True) == answer
    assert task.answer_length == len(answer)
    instance = task.sample(np.random.default_rng(0))
    total = sum(instance.data["values"])
    assert instance.answer == (f"{total:02d}" if task_id == "gather_v1" else str(total % 10))


@pytest.mark.parametrize("path", CODE_SCENARIOS, ids=lambda p: p.stem)
def test_private_texts_have_fixed_length(path):
    task = load_team(path).task
    lengths = {tuple(len(t) for t in task.sample(np.random.default_rng(s)).private.values())
               for s in range(30)}
    assert len(lengths) == 1


@pytest.mark.parametrize("task_id", list(TASKS))
def test_task_card(task_id):
    cls = task_class(task_id)
    assert cls.id == task_id
    card = sys.modules[cls.__module__].__doc__
    name, version = task_id.rsplit("_v", 1)
    assert card.startswith(f"{name}_v") and f"\n    v{version}: " in card
    for section in ("Agents", "Private information", "Messages", "Answer", "Reward",
                    "Version history"):
        assert f"\n{section}\n" in card


@pytest.mark.parametrize(("name", "noise"), [
    ("signal", "zz"), ("signal_pick", "zzz"), ("gather_star", "????????"),
    ("relay_chain", "????"), ("vote_debate", None)])
def test_demonstrations_skip_the_oracles_guesses(name, noise):
    """Where the answer's inputs are noise, the oracle guesses and there is no demonstration;
    where they arrived, the demonstration is the oracle's action."""
    team = load_team(ROOT / "scenarios" / f"{name}.yaml")
    task, oracle = team.task, ScriptedPolicy(team.task)
    finals = {}
    for garble in (False, True):
        env = TeamEnv(team, seed=0)
        obs, infos = env.reset()
        while env.agents:
            acts = {}
            for a in env.scheduled:
                final = infos[a]["final_call"]
                acts[a] = oracle.generate([Request(a, obs[a], final=final)])[0].text
                if final:
                    finals[garble] = (a, obs[a])
                elif garble and noise is not None:
                    acts[a] = noise
            obs, _, _, _, infos = env.step(acts)
    agent, seen = finals[False]
    assert task.demonstration(agent, seen, True) == task.oracle(agent, seen, True)
    agent, seen = finals[True]
    if noise is None:  # a voter always knows its own label: never a guess
        assert task.demonstration(agent, seen, True) == task.oracle(agent, seen, True)
    else:
        assert task.demonstration(agent, seen, True) is None
        assert task.oracle(agent, seen, True)  # the oracle itself still answers


@pytest.mark.parametrize(("speaker", "fragments"), [
    ("listner", ["task.params.speaker", "unknown agent 'listner'", "listener"]),
    ("listener", ["task.params.speaker", "also an answer agent", "lewis_v0"])])
def test_lewis_speaker_problems_name_the_field(speaker, fragments):
    data = yaml.safe_load((ROOT / "scenarios" / "signal.yaml").read_text())
    data["task"]["params"]["speaker"] = speaker
    with pytest.raises(ScenarioError) as err:
        load_team(data)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(("path", "policy"),
                         [*((p, "scripted") for p in CODE_SCENARIOS),
                          *((p, "random") for p in SCENARIOS)],
                         ids=lambda x: getattr(x, "stem", x))
def test_oracle_and_random_messages_are_valid(path, policy):
    result = run(load_team(path), 12, seed=3, policy=policy)
    calls = [m for e in result.episodes for m in e["transcript"]]
    assert all(m["valid"] for m in calls)
    assert all(m["oracle_agrees"] for m in calls) == (policy == "scripted")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_episode_records_carry_the_instance(path):
    team = load_team(path)
    episode = run(team, 1, seed=0, policy="random").episodes[0]
    assert episode["split"] == team.task.eval_split and episode["instance"]
    json.dumps(episode["instance"])  # plain data, for analyses that never parse prompts


@pytest.mark.parametrize(("task_id", "params", "message", "final", "valid"), [
    ("lewis_v0", {"objects": 4}, "c", False, True),
    ("lewis_v0", {"objects": 4}, "?", False, True),
    ("lewis_v0", {"objects": 4}, "cc", False, False),
    ("lewis_v0", {"objects": 4}, "C", False, False),
    ("lewis_v0", {"objects": 4}, "3", True, True),
    ("lewis_v0", {"objects": 4}, "4", True, False),
    ("lewis_v0", {"objects": 4}, "03", True, False),
    ("lewis_v0", {"objects": 4}, "", True, False),
    ("signal_v0", {}, "abc", False, True),
    ("signal_v0", {}, "ab", False, False),
    ("gather_v1", {"values": 100}, "07??", False, True),
    ("gather_v1", {"values": 100}, "0?7?", False, False),
    ("gather_v1", {"values": 100}, "198", True, True),
    ("gather_v1", {"values": 100}, "199", True, False),
    ("gather_v1", {"values": 100}, "18", True, False),
    ("vote_v0", {"classes": 3}, "2", False, True),
    ("vote_v0", {"classes": 3}, "x", True, False),
    ("relay_v0", {"fact_length": 3}, "kqz", True, True),
    ("relay_v0", {"fact_length": 3}, "kq", False, False),
    ("ref_v0", {}, "ah", False, True),
    ("ref_v0", {}, "ai", False, False),
    ("ref_v0", {}, "33", True, True),
    ("ref_v0", {}, "34", True, False),
    ("ref_v0", {}, "3", True, False),
])
def test_valid_message_checks_the_format(task_id, params, message, final, valid):
    cls = task_class(task_id)
    task = cls(cls.Params(**params), ["a", "b"], ["b"])
    assert task.valid_message("a" if not final else "b", message, final) is valid


def ref_task(**params):
    cls = task_class("ref_v0")
    return cls(cls.Params(**params), ["speaker", "listener"], ["listener"])


def test_ref_holds_out_objects_that_training_never_samples():
    task = ref_task(attributes=2, values=4, holdout=0.25)
    rng = np.random.default_rng(0)
    train = {tuple(task.draw(rng, "train").data["meaning"]) for _ in range(400)}
    held = {tuple(task.draw(rng, "holdout").data["meaning"]) for _ in range(100)}
    assert len(train) == 12 and len(held) == 4 and not train & held
    for i in range(2):  # every value of every attribute is seen in training
        assert {m[i] for m in train} == set(range(4))
    assert task.splits == ("train", "holdout")
    assert ref_task(holdout=0.0).splits == ("train",)
    with pytest.raises(MarlError, match="splits: 'train'"):
        ref_task(holdout=0.0).draw(rng, "holdout")


def test_ref_oracle_code_is_compositional_or_holistic():
    task = ref_task(attributes=2, values=4, message_length=3, vocab=8)
    assert task.encode((2, 3)) == "cda" and task.decode("cda") == (2, 3)
    assert ref_task(attributes=3, values=4, message_length=3, vocab=4).compositional
    small = ref_task(attributes=2, values=4, message_length=4, vocab=2)
    assert not small.compositional
    codes = {small.encode(m) for m in itertools.product(range(4), repeat=2)}
    assert len(codes) == 16 and all(small.decode(c) is not None for c in codes)


def test_ref_oracle_is_perfect_on_both_splits_and_random_is_at_chance():
    team = load_team(ROOT / "scenarios" / "ref.yaml")
    policies = {a: ScriptedPolicy(team.task) for a in team.ids}
    for split in team.task.splits:
        batch = collect(team, policies, 40, seed=1, split=split)
        assert bool(batch.success.all())
        assert {r["instance"]["split"] for r in batch.records} == {split}
    result = run(team, 400, seed=2, policy="random")
    assert abs(sum(e["success"] for e in result.episodes) / 400 - 1 / 16) < 0.03


@pytest.mark.parametrize(("params", "field", "message"), [
    ({"message_length": 1, "vocab": 8}, "task.params.message_length", "cannot name 4^2"),
    ({"holdout": 0.9}, "task.params.holdout", "every value"),
])
def test_ref_problems_name_the_field(params, field, message):
    data = yaml.safe_load((ROOT / "scenarios" / "ref.yaml").read_text())
    data["task"]["params"].update(params)
    with pytest.raises(ScenarioError) as err:
        load_team(data)
    assert field in str(err.value) and message in str(err.value)


def test_ref_partial_credit_scores_each_attribute():
    task = ref_task(partial=True)
    instance = task.draw(np.random.default_rng(0))
    wrong_one = ("9" if instance.answer[0] != "9" else "8") + instance.answer[1]
    assert task.score(instance, instance.answer) == 1.0
    assert task.score(instance, wrong_one) == 0.5
    assert task.score(instance, "1") == 0.0


def test_the_inbox_holds_the_messages_read_and_not_the_query_being_answered():
    """Every observation an agent completes ends with its query (``a1> ``): not a message.
    A message that was blank is one (its line ends with a line break)."""
    from marl.tasks.base import inbox_messages

    team = load_team(ROOT / "scenarios" / "relay_chain.yaml")
    env = TeamEnv(team)
    obs, _ = env.reset(seed=0)
    first, second = team.ids[0], team.ids[1]
    obs, *_ = env.step({first: ""})
    assert obs[second].endswith(f"{first}> \n{second}> ")
    assert inbox_messages(obs[second], team.ids) == [(first, "")]
