"""PPO: critics, GAE targets, parameter updates, exact resume, and two toy problems."""

from __future__ import annotations

import copy
import dataclasses
import io
import string

import pytest
import torch

from marl.algorithms.config import TrainConfig
from marl.algorithms.ppo import PPO, ValueNet, joint_observation, predict
from marl.errors import MarlError
from marl.policies.generation import left_pad
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team
from marl.tokenizer import CharTokenizer
from tests.marl.conftest import kill_and_resume

SIGNAL = {
    "name": "signal_tiny",
    "task": {"name": "signal_v0", "params": {"candidates": 4, "word_length": 3}},
    "agents": [{"id": "speaker", "role": "speaker", "policy": "speaker"},
               {"id": "listener", "role": "listener", "policy": "listener"}],
    "policies": {"speaker": {"backend": "tiny", "max_new_tokens": 4},
                 "listener": {"backend": "tiny", "max_new_tokens": 3}},
    "topology": {"kind": "chain"},
    "protocol": {"rounds": 1, "answer": "listener"},
    "costs": {"model": "gpt-4o-mini", "penalty_per_1k": 0.0},
}
# One policy shared by two agents that each speak twice.
GATHER = {
    "name": "gather_pair",
    "task": {"name": "gather_v0", "params": {"values": 4}},
    "agents": [{"id": "a", "role": "worker"}, {"id": "b", "role": "aggregator"}],
    "policies": {"default": {"backend": "tiny", "max_new_tokens": 3}},
    "topology": {"kind": "chain"},
    "protocol": {"rounds": 2, "answer": "b"},
}


def config(**overrides) -> TrainConfig:
    return TrainConfig(**{"algorithm": "ppo", "group_size": 1, "sft_coef": 0.0,
                          "warmup_steps": 0, **overrides})


def setup(scenario: dict, episodes: int = 4, **overrides):
    team = load_team(scenario)
    policies = build_policies(team, seed=0)
    learner = PPO(team, policies, config(**overrides))
    return team, policies, learner, collect(team, policies, episodes, 1, seed=0)


def snapshot(learner: PPO) -> dict[str, torch.Tensor]:
    params = {f"{t.name}.{n}": p for t in learner.trainables
              for n, p in t.policy.module.named_parameters()}
    params |= {f"critic.{c.name}.{n}": p for c in learner.critics
               for n, p in c.net.named_parameters()}
    return {k: v.detach().clone() for k, v in params.items()}


def valid_values(learner: PPO, batch) -> list[torch.Tensor]:
    out = []
    for c in learner.critics:
        x = learner.inputs(c, batch)
        v = learner.values(c, x)
        lengths = torch.tensor([len(y) for y in x.completions])
        out.append(v[torch.arange(v.shape[1]) < lengths[:, None]])
    return out


@pytest.mark.parametrize(("scenario", "critic", "n_critics"), [
    (SIGNAL, "independent", 2), (SIGNAL, "central", 1), (GATHER, "independent", 1)])
def test_update_changes_policy_and_critic_parameters(scenario, critic, n_critics):
    _, _, learner, batch = setup(scenario, critic=critic, epochs=2, minibatches=2)
    assert len(learner.critics) == n_critics
    before = snapshot(learner)
    stats = learner.update(batch, seed=0)
    after = snapshot(learner)
    changed = [name for name, old in before.items() if not torch.equal(old, after[name])]
    assert changed == list(before), set(before) - set(changed)
    for key in ("loss", "pg_loss", "value_loss", "entropy", "grad_norm", "skipped",
                "sft_coef"):
        assert isinstance(stats[key], float) and torch.isfinite(torch.tensor(stats[key])), key
    assert stats["skipped"] == 0.0
    assert all(torch.isfinite(v).all() for v in valid_values(learner, batch))


def test_central_critic_reads_every_private_line_and_earlier_messages():
    _, _, _, batch = setup(SIGNAL, critic="central")
    speaker_obs, listener_obs = batch.observations[0]
    target = speaker_obs.split("\n")[0].split("). ")[1]  # "target: abc"
    assert target not in listener_obs  # the listener's own prompt hides the target
    for k in (0, 1):
        text = joint_observation(batch, 0, k)
        assert target in text and listener_obs.split("\n")[0] in text
        assert text.endswith(batch.observations[0][k])
    message = batch.records[0]["transcript"][0]["message"]
    said = joint_observation(batch, 0, 1).split("[said]\n")[1].split("\n[acting]")[0]
    assert said == f"speaker> {message}"
    assert "[said]\n[acting]" in joint_observation(batch, 0, 0)  # nothing said before


def test_value_of_a_token_depends_only_on_the_context_and_earlier_tokens():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = ValueNet(vocab_size=20)
    contexts, completions = [[1, 5, 6], [1, 7]], [[8, 9, 10], [11]]
    v = predict(net, contexts, completions, pad_id=0, device=torch.device("cpu"))
    assert v.shape == (2, 3) and not v[1, 1:].any()
    alone = predict(net, contexts[1:], completions[1:], 0, torch.device("cpu"))
    torch.testing.assert_close(v[1, :1], alone[0])  # padding does not change a value
    changed = predict(net, contexts, [[8, 12, 10], [11]], 0, torch.device("cpu"))
    assert torch.equal(changed[0, :2], v[0, :2]) and changed[0, 2] != v[0, 2]
    full = net(torch.tensor([[1, 5, 6, 8, 9, 10]]), torch.ones(1, 6, dtype=torch.bool))
    torch.testing.assert_close(v[0], full[0, 2:5])  # V(s_t) is read one before token t


def test_zero_critic_gives_the_reward_as_return_at_every_token_and_normalised_advantages():
    _, _, learner, batch = setup(SIGNAL, episodes=6, gamma=1.0, lam=1.0)
    batch = dataclasses.replace(batch, score=torch.arange(6.0) / 5)
    for c in learner.critics:
        with torch.no_grad():
            for p in c.net.trunk.head.parameters():
                p.zero_()
    inputs = [learner.inputs(c, batch) for c in learner.critics]
    adv, returns = learner.advantages(batch, inputs)
    for x, ret in zip(inputs, returns, strict=True):
        for i, (b, _) in enumerate(x.rows):
            n = len(x.completions[i])
            torch.testing.assert_close(ret[i, :n], batch.score[b].expand(n))
            assert not ret[i, n:].any()
    assert not adv[~batch.mask].any()
    for t in learner.trainables:
        a = adv[:, batch.slots(t.agents)][batch.mask[:, batch.slots(t.agents)]]
        assert abs(float(a.mean())) < 1e-5 and abs(float(a.std(unbiased=False)) - 1) < 1e-4


def test_state_dict_round_trip_gives_identical_next_updates():
    # kl_coef 0: the KL reference is not learner state (the trainer restores it from the
    # end of the warm-up, tested by its kill-and-resume tests)
    team, policies, first, batch = setup(SIGNAL, critic="central", epochs=2, minibatches=2,
                                         sft_coef=0.5, sft_decay=0.9, entropy_coef=0.01,
                                         kl_coef=0.0)
    first.update(batch, seed=1)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # as the trainer's state.pt
    restored_policies = build_policies(team, seed=7)
    for t in first.trainables:
        with torch.no_grad():
            for p, q in zip(restored_policies[t.agents[0]].parameters(), t.policy.parameters(),
                            strict=True):
                p.copy_(q)
    second = PPO(team, restored_policies, first.cfg)
    buffer.seek(0)
    second.load_state_dict(torch.load(buffer, weights_only=False))
    batch = collect(team, policies, 4, 1, seed=2)
    assert first.update(batch, seed=2) == second.update(batch, seed=2)
    a, b = snapshot(first), snapshot(second)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("overrides", [{}, {"sft_coef": 1.0, "demo_episodes": 2}],
                         ids=["rl", "oracle-demos"])
def test_same_seed_same_update(overrides):
    stats, params = [], []
    for _ in range(2):
        _, _, learner, batch = setup(GATHER, critic="central", **overrides)
        stats.append(learner.update(batch, seed=3))
        params.append(snapshot(learner))
    assert stats[0] == stats[1]
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])


def test_central_critic_needs_one_tokenizer():
    team = load_team(SIGNAL)
    policies = build_policies(team, seed=0)
    policies["listener"] = copy.copy(policies["listener"])
    policies["listener"].tokenizer = CharTokenizer(string.ascii_lowercase)
    with pytest.raises(MarlError, match="critic: central.*speaker uses char .*listener uses"):
        PPO(team, policies, config(critic="central"))
    PPO(team, policies, config(critic="independent"))


def test_value_head_learns_a_constant_reward():
    _, _, learner, batch = setup(SIGNAL, episodes=8, lr=1e-3, epochs=2, minibatches=8)
    batch = dataclasses.replace(batch, score=torch.full_like(batch.score, 0.7))
    error = [float((v - 0.7).abs().mean()) for v in valid_values(learner, batch)]
    for i in range(10):
        learner.update(batch, seed=i)
    after = [float((v - 0.7).abs().mean()) for v in valid_values(learner, batch)]
    assert min(error) > 0.5 and max(after) < 0.05, (error, after)


def test_ppo_raises_the_probability_of_rewarded_first_letters():
    """Reward the episodes whose speaker message starts with a lowercase letter."""
    team, policies, learner, _ = setup(SIGNAL, epochs=2, minibatches=8)
    speaker = policies["speaker"]
    lower = torch.tensor(speaker.tokenizer.encode(string.ascii_lowercase))
    probe = collect(team, policies, 8, 1, seed=123)
    ids, mask = left_pad([list(probe.prompt_ids[b][0]) for b in range(8)],
                         speaker.tokenizer.pad_id)

    def p_lower() -> float:
        with torch.no_grad():
            p = speaker.model.logits(ids, mask)[:, -1].softmax(-1)
        return float(p[:, lower].sum(-1).mean())

    start = p_lower()
    for i in range(5):
        batch = collect(team, policies, 16, 1, seed=i)
        rewarded = torch.isin(batch.tokens[:, 0, 0], lower).float()
        learner.update(dataclasses.replace(batch, score=rewarded), seed=i)
    assert p_lower() > start + 0.05, (start, p_lower())


def test_trainer_kill_and_resume_equals_an_uninterrupted_run(tmp_path):
    team = load_team(SIGNAL)
    cfg = config(critic="central", iterations=4, episodes_per_iter=2, group_size=2,
                 checkpoint_every=2, eval_every=4, eval_episodes=2, sft_coef=0.5,
                 warmup_steps=2, warmup_episodes=2)
    full, again = kill_and_resume(team, cfg, tmp_path, kill_at=3, resume_from=2)
    assert again == full and len(full) == 6
