import pytest
import torch

from marl.policies.base import Policy
from marl.policies.generation import Sampling
from marl.policies.lm import LMPolicy
from marl.policies.scripted import ScriptedPolicy
from marl.policies.tiny import TinyCausalLM, TinyConfig, TinyLM
from marl.rollout import PolicyError, collect
from marl.team import load_team
from marl.tokenizer import CharTokenizer
from tests.marl.conftest import ROOT


@pytest.fixture(scope="module")
def team():
    return load_team(ROOT / "scenarios" / "gather_star.yaml")


def tiny_policies(team, stop=("\n",), max_new_tokens=8):
    torch.manual_seed(0)
    made = {}
    for name in team.scenario.policies:
        model = TinyLM(TinyConfig())
        made[name] = LMPolicy(TinyCausalLM(model), CharTokenizer(),
                              Sampling(max_new_tokens=max_new_tokens, stop=stop), module=model)
    return {a.id: made[a.policy] for a in team.agents}


def test_batch_shapes_groups_and_rewards(team):
    batch = collect(team, tiny_policies(team), episodes=3, group_size=4, seed=0)
    b, k, n = 12, 4, 4  # 3 workers + lead, one round
    assert batch.tokens.shape[:2] == (b, k) and batch.logprobs.shape == batch.tokens.shape
    assert batch.agent_mask.shape == (*batch.tokens.shape, n)
    assert batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    targets = [r["target"] for r in batch.records]
    assert all(len(set(targets[g * 4:(g + 1) * 4])) == 1 for g in range(3))
    assert batch.ledger["prompt"].shape == (b, 1, n)
    torch.testing.assert_close(batch.reward, batch.score - batch.token_penalty)
    assert set(batch.score.tolist()) <= {0.0, 1.0}


def test_agent_mask_marks_only_each_agents_own_generated_tokens(team):
    policies = tiny_policies(team)
    batch = collect(team, policies, episodes=2, group_size=2, seed=1)
    am = batch.agent_mask
    for k, agent in enumerate(batch.call_agent.tolist()):
        others = [n for n in range(len(batch.agents)) if n != agent]
        assert not am[:, k, :, others].any()  # never another agent's slot
        assert torch.equal(am[:, k, :, agent], batch.mask[:, k])
    # The marked tokens are exactly what the agent generated: its message is their text,
    # and none of them comes from the observation (prompt ids are kept apart).
    tok = CharTokenizer()
    for b, record in enumerate(batch.records):
        for k, m in enumerate(record["transcript"]):
            ids = batch.tokens[b, k][batch.mask[b, k]].tolist()
            assert tok.decode(ids).startswith(m["message"])
            prompt = list(batch.prompt_ids[b][k])
            assert prompt[0] == tok.bos_id and ids != prompt[-len(ids):] or not ids


def test_logprobs_at_sampling_equal_scoring(team):
    policies = tiny_policies(team)
    batch = collect(team, policies, episodes=2, group_size=2, seed=2)
    worker = policies["w1"]
    slots = batch.slots(["w1", "w2", "w3"]).tolist()
    prompts = [batch.prompt_ids[b][k] for b in range(4) for k in slots]
    comps = [batch.tokens[b, k][batch.mask[b, k]].tolist() for b in range(4) for k in slots]
    lp, m = worker.score(prompts, comps)
    sampled = torch.cat([batch.logprobs[b, k][batch.mask[b, k]] for b in range(4)
                         for k in slots])
    torch.testing.assert_close(lp[m], sampled, atol=1e-4, rtol=1e-4)


def test_same_seed_same_batch(team):
    a = collect(team, tiny_policies(team), episodes=2, group_size=3, seed=7)
    b = collect(team, tiny_policies(team), episodes=2, group_size=3, seed=7)
    c = collect(team, tiny_policies(team), episodes=2, group_size=3, seed=8)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert a.records == b.records
    assert not torch.equal(a.tokens, c.tokens)


def test_group_members_sample_differently(team):
    batch = collect(team, tiny_policies(team), episodes=1, group_size=4, seed=0)
    assert len({tuple(batch.tokens[i].flatten().tolist()) for i in range(4)}) > 1


def test_scripted_calls_are_not_trainable(team):
    policies = tiny_policies(team)
    oracle = ScriptedPolicy(team.task)
    for w in ("w1", "w2", "w3"):
        policies[w] = oracle
    batch = collect(team, policies, episodes=2, group_size=1, seed=0)
    worker_slots = batch.slots(["w1", "w2", "w3"])
    assert not batch.mask[:, worker_slots].any()
    assert batch.mask[:, batch.slots(["lead"])].any()


def test_empty_generation_is_flagged_not_fatal(team):
    batch = collect(team, tiny_policies(team, stop=tuple("0123456789?abcdefghijklmnopqrstuvwxyz"
                                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ !\n.,")),
                    episodes=2, group_size=1, seed=0)
    flags = [m["flags"] for r in batch.records for m in r["transcript"]]
    assert any(f.get("empty") for f in flags)


class Broken(Policy):
    def generate(self, requests, greedy=False):
        raise RuntimeError("backend exploded")


class Short(Policy):
    def generate(self, requests, greedy=False):
        return []


@pytest.mark.parametrize(("policy", "message"), [(Broken(), "backend exploded"),
                                                 (Short(), "returned 0 completions")])
def test_failing_policy_gives_a_clear_error(team, policy, message):
    policies = tiny_policies(team)
    policies["lead"] = policy
    with pytest.raises(PolicyError, match=f"policy 'lead' .*{message}"):
        collect(team, policies, episodes=1, group_size=2, seed=0)


def test_generation_cut_at_the_token_limit_is_reported(team):
    batch = collect(team, tiny_policies(team, stop=(), max_new_tokens=3), episodes=1, seed=0)
    finishes = [m["finish"] for m in batch.records[0]["transcript"]]
    assert finishes == ["length"] * 4
    assert int(batch.mask.sum()) == 4 * 3
