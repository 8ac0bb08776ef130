"""One base model, many agents: LoRA policies on one checkpoint share one copy of its weights,
each its own adapter; adapters train independently; a policy's KL reference is a frozen
adapter on the same base (the base itself at the start); checkpoints hold each adapter and
resume exactly; ``marl run --checkpoint`` and a PBT exploit work with shared bases."""

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from marl.algorithms.common import begin_rl, trainables
from marl.algorithms.config import TrainConfig
from marl.cli import app
from marl.cost.ledger import Ledger
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team
from marl.training.trainer import Trainer
from tests.marl.conftest import ROOT, kill_and_resume

pytest.importorskip("peft")

AGENTS = ("lead", "w1", "w2", "w3")
SMALL = {"warmup_source": "none", "iterations": 4, "episodes_per_iter": 2, "group_size": 2,
         "eval_every": 2, "eval_episodes": 4, "checkpoint_every": 2, "transcripts_per_iter": 0}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from marl.policies.hf_local import build_tiny_hf

    return build_tiny_hf(tmp_path_factory.mktemp("shared") / "base", hidden_size=64,
                         num_heads=2)


def gather_team(base, lora: bool = True):
    """gather_star with a policy per agent, every one on the same checkpoint."""
    data = yaml.safe_load((ROOT / "scenarios" / "gather_star.yaml").read_text())
    data["agents"] = [{"id": a, "role": "worker", "policy": a} for a in AGENTS]
    data["topology"] = {"kind": "star", "hub": "lead"}
    data["protocol"] = {"rounds": 1, "answer": "lead"}
    data["policies"] = {a: {"backend": "hf", "path": str(base), "max_new_tokens": 8,
                            **({"lora": {"r": 4}} if lora else {})} for a in AGENTS}
    return load_team(data)


def base_weight(policy) -> torch.Tensor:
    """The first attention projection's base weight (under any LoRA layer)."""
    return next(p for n, p in policy.model.model.named_parameters()
                if "q_proj" in n and "lora" not in n)


def test_four_lora_policies_hold_one_copy_of_the_base(base):
    policies = build_policies(gather_team(base))
    pointers = {base_weight(policies[a]).data_ptr() for a in AGENTS}
    assert len(pointers) == 1
    adapters = {a: {p.data_ptr() for p in policies[a].parameters()} for a in AGENTS}
    assert all(len(adapters[a] & adapters[b]) == 0 for a in AGENTS for b in AGENTS if a < b)
    full = build_policies(gather_team(base, lora=False))  # full fine-tuning: a copy each
    assert len({base_weight(full[a]).data_ptr() for a in AGENTS}) == 4


def test_an_adapters_update_leaves_the_other_adapters_and_the_base_unchanged(base):
    team = gather_team(base)
    policies = build_policies(team)
    ts = {t.name: t for t in trainables(team, policies, TrainConfig(kl_coef=0))}
    before = {a: [p.detach().clone() for p in policies[a].parameters()] for a in AGENTS}
    base_before = base_weight(policies["w1"]).detach().clone()
    t = ts["w1"]
    prompts = [policies["w1"].tokenizer.encode_prompt("you are w1 (worker). value: 3\nw1> ")]
    lp, mask = t.policy.score(prompts, [[10, 11, 12]])[:2]
    (-(lp * mask).sum()).backward()
    t.optimizer.step()
    for a in AGENTS:
        changed = [not torch.equal(p, q) for p, q in zip(policies[a].parameters(), before[a],
                                                          strict=True)]
        assert any(changed) == (a == "w1"), a
    assert torch.equal(base_weight(policies["w1"]), base_before)


def test_the_kl_reference_is_the_base_at_first_and_a_frozen_adapter_after(base):
    team = gather_team(base)
    policies = build_policies(team)
    t = next(t for t in trainables(team, policies, TrainConfig()) if t.name == "lead")
    ids = torch.tensor([[1, 20, 30, 40, 50]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    model = t.policy.model.model
    with torch.no_grad(), model.disable_adapter():
        plain = model(input_ids=ids, attention_mask=mask).logits
    with torch.no_grad():
        assert torch.allclose(t.reference.logits(ids, mask), plain)
        for p in t.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))  # as if trained
        moved = t.policy.model.logits(ids, mask)
        assert not torch.allclose(moved, plain)
        assert torch.allclose(t.reference.logits(ids, mask), plain)  # still the start
        assert not any(p.requires_grad for p in t.reference.weights())
    begin_rl([t], TrainConfig())  # the reference becomes the policy as it is now
    with torch.no_grad():
        assert torch.allclose(t.reference.logits(ids, mask), moved)
        with model.disable_adapter():
            assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, plain)


def test_a_killed_run_with_shared_bases_resumes_exactly(base, tmp_path):
    full, again = kill_and_resume(gather_team(base), TrainConfig(**SMALL), tmp_path,
                                  kill_at=3, resume_from=2)
    assert full == again


def test_marl_run_plays_the_trained_adapters_of_a_checkpoint(base, tmp_path):
    team = gather_team(base)
    scenario = tmp_path / "lora.yaml"
    scenario.write_text(team.to_yaml())
    runner = CliRunner()
    res = runner.invoke(app, ["train", str(scenario), "--out", str(tmp_path / "t"),
                              *[f"--set={k}={v}" for k, v in SMALL.items()]])
    assert res.exit_code == 0, res.output
    saved = tmp_path / "t" / "checkpoints" / "iter_000004" / "w1"
    config = json.loads((saved / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base)
    assert not (saved / "model.safetensors").exists()  # the adapter alone
    res = runner.invoke(app, ["run", str(scenario), "--episodes", "4", "--checkpoint",
                              str(tmp_path / "t" / "checkpoints" / "iter_000004"),
                              "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    played = build_policies(team, checkpoint=tmp_path / "t" / "checkpoints" / "iter_000004")
    trained = {n: t for n, t in zip(AGENTS, played.values(), strict=False)}
    assert any(p.abs().sum() > 0 for p in trained["w1"].parameters())  # B moved from zero


def test_a_population_of_lora_teams_exploits(base, ray_local, tmp_path):
    from populations.config import PBTConfig
    from populations.pbt import run_pbt

    scenario = tmp_path / "lora.yaml"
    scenario.write_text(gather_team(base).to_yaml())
    cfg = PBTConfig.model_validate({
        "members": 2, "budget_steps": 12, "perturbation_interval": 2, "quantile_fraction": 0.5,
        "objective": "net_reward", "mutations": {"penalty_per_1k": [0.5, 2.0],
                                                  "lr": {"min": 1e-4, "max": 1e-2, "log": True}},
        "train": {k: v for k, v in SMALL.items() if k != "iterations"}})
    population = run_pbt(scenario, cfg, tmp_path / "pop", log=lambda m: None)
    assert population["exploits"] > 0
    assert [m["steps"] for m in population["members"]] == [12, 12]


def test_adapters_on_one_base_generate_together_as_they_do_apart(base, monkeypatch):
    """Four adapters acting in the same layer (a debate) decode in one mixed batch: each
    policy's samples, log-probs and ledger are those it gets alone."""
    import marl.rollout as rollout

    data = yaml.safe_load(gather_team(base).to_yaml())
    data["topology"] = {"kind": "debate"}
    data["protocol"] = {"rounds": 2, "answer": "lead"}
    for i, a in enumerate(AGENTS):  # settings of their own: lengths, temperatures
        data["policies"][a].update(max_new_tokens=4 + 2 * i, temperature=0.8 + 0.2 * i)
    team = load_team(data)
    policies = build_policies(team)
    with torch.no_grad():  # adapters that differ (LoRA's B starts at zero)
        g = torch.Generator().manual_seed(0)
        for n, p in policies["lead"].model.shared.model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    together = []
    generate_together = rollout.generate_together
    monkeypatch.setattr(rollout, "generate_together", lambda ps, reqs, greedy: (
        together.append(len(ps)), generate_together(ps, reqs, greedy))[1])

    def played(mix: bool, greedy: bool):
        before = {a: policies[a].reused_tokens for a in AGENTS}
        batch = collect(team, policies, 3, 2, seed=5, greedy=greedy, mix_adapters=mix)
        return batch, {a: policies[a].reused_tokens - before[a] for a in AGENTS}

    for greedy in (False, True):
        apart, reused_apart = played(False, greedy)
        assert together == []
        mixed, reused = played(True, greedy)
        assert together == [4, 4] and torch.equal(mixed.tokens, apart.tokens)
        assert torch.allclose(mixed.logprobs, apart.logprobs, atol=1e-5)
        assert Ledger(mixed.rows).per_episode() == Ledger(apart.rows).per_episode()
        # the second round reuses the first's K/V; together, a policy that ends first has
        # its last token run too (the others still decode), so it may reuse one more
        assert all(reused[a] >= reused_apart[a] > 0 for a in AGENTS)
        together.clear()


def test_the_influence_bonus_trains_lora_agents_on_a_shared_base(base, tmp_path):
    """influence_coef on pretrained policies: the bonus spans the checkpoint's vocabulary,
    is logged and moves every agent's adapter."""
    trainer = Trainer(gather_team(base), TrainConfig(**{**SMALL, "influence_coef": 1.0}),
                      tmp_path, log=lambda m: None)
    before = {t.name: [p.detach().clone() for p in t.policy.parameters()]
              for t in trainer.learner.trainables}
    row = trainer.step()
    assert 0 < row["influence"] <= 1
    for t in trainer.learner.trainables:
        assert any(not torch.equal(a, b) for a, b in zip(before[t.name], t.policy.parameters(),
                                                          strict=True))
