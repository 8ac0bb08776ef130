"""The ``vllm`` backend on vLLM's CPU build: generation, weight sync, training.

The model is a tiny Llama built here, with a head size (64 / 2 = 32) that vLLM's CPU
kernels accept; CI installs the ``vllm`` extra, so these tests always run there.
"""

import json
import os

import pytest
import torch
import yaml
from typer.testing import CliRunner

from marl.cli import app
from marl.policies import Request, build_policy
from marl.policies.factory import sampling_of
from marl.policies.hf_local import build_tiny_hf
from marl.policies.lm import LMPolicy
from marl.rollout import collect
from marl.runner import build_policies
from marl.scenario import PolicySpec
from marl.team import load_team
from tests.marl.conftest import ROOT

if not os.environ.get("CI"):  # CI installs the extra: there a missing vLLM fails
    pytest.importorskip("vllm", reason="the vllm extra: pip install -e '.[vllm]'")
SIGNAL = ROOT / "scenarios" / "signal.yaml"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_hf(tmp_path_factory.mktemp("vllm") / "llama", hidden_size=64,
                         num_heads=2)


@pytest.fixture(scope="module")
def policy(model_dir):
    team = load_team(SIGNAL)
    spec = PolicySpec(backend="vllm", path=str(model_dir), max_new_tokens=6, stop=[])
    return build_policy(spec, team.task, seed=0)


def _requests(n=6):
    return [Request("speaker", f"you are speaker (speaker). object {i}\n[round 1]\nspeaker>")
            for i in range(n)]


def _ours(policy):
    """Our own engine on the training model the vLLM policy trains."""
    return LMPolicy(policy.model, policy.tokenizer, policy.sampling, seed=0,
                    module=policy.module)


def test_greedy_completions_equal_the_training_models(policy):
    theirs = policy.generate(_requests(), greedy=True)
    ours = _ours(policy).generate(_requests(), greedy=True)
    assert [c.token_ids for c in theirs] == [c.token_ids for c in ours]
    assert all(len(c.token_ids) == 6 and c.finish == "length" for c in theirs)
    # The loss's log-probs are the training model's; vLLM's agree to float error.
    assert policy.stats()["vllm_logprob_mismatch"] < 1e-3


def test_an_update_is_pushed_into_the_engine(policy):
    saved = {k: v.clone() for k, v in policy.module.state_dict().items()}
    before = [c.token_ids for c in policy.generate(_requests(), greedy=True)]
    policy.stats()
    opt = torch.optim.SGD(policy.parameters(), lr=5.0)
    scored = policy.score([list(c.prompt_ids) for c in policy.generate(_requests())],
                          [[7, 8, 9]] * 6)[0]
    (-scored.sum()).backward()
    opt.step()
    try:
        after = policy.generate(_requests(), greedy=True)
        assert policy.stats()["vllm_weight_syncs"] == 1.0
        assert [c.token_ids for c in after] != before  # the step changed greedy output...
        ours = _ours(policy).generate(_requests(), greedy=True)
        assert [c.token_ids for c in after] == [c.token_ids for c in ours]  # ...in both
    finally:  # the other tests of this module share the policy
        policy.module.load_state_dict(saved)


def test_sampling_is_seeded(policy):
    runs = []
    for _ in range(2):
        policy.reseed(5)
        runs.append([c.token_ids for c in policy.generate(_requests(8))])
    assert runs[0] == runs[1] and len({tuple(r) for r in runs[0]}) > 1


def test_a_large_seeded_batch_samples(policy):
    """256 prompts at once: vLLM would split them into chunks, which its CPU build cannot
    do with seeded sampling; the backend's engine defaults keep prompts whole."""
    out = policy.generate(_requests(256))
    assert len(out) == 256 and all(c.token_ids for c in out)


def test_settings_for_other_backends_are_refused(model_dir, tmp_path):
    bad = SIGNAL.read_text().replace("backend: tiny", f"backend: vllm, path: {model_dir}, "
                                     "max_retries: 2", 1)
    (tmp_path / "bad.yaml").write_text(bad)
    res = CliRunner().invoke(app, ["validate", str(tmp_path / "bad.yaml")])
    assert res.exit_code == 2 and "`max_retries` applies to the openai backend only" in res.output


def lora_debate(model_dir, agents=("a", "b", "c")):
    """A debate (every agent acts in every round) of vllm LoRA policies on one base."""
    data = yaml.safe_load((ROOT / "scenarios" / "gather_star.yaml").read_text())
    data["agents"] = [{"id": a, "role": "worker", "policy": a} for a in agents]
    data["topology"] = {"kind": "debate"}
    data["protocol"] = {"rounds": 2, "answer": agents[0]}
    data["policies"] = {a: {"backend": "vllm", "path": str(model_dir), "max_new_tokens": 6,
                            "lora": {"r": 4}} for a in agents}
    return load_team(data)


def test_lora_policies_share_a_base_and_an_engine_and_generate_with_their_adapters(
        model_dir, monkeypatch):
    """Multi-LoRA on vLLM: one HF base and one engine for three adapters, which generate
    in one call, each prompt with its own adapter (greedy: what the training model says);
    an update reaches the engine as that adapter's new version, and only that one."""
    import marl.policies.vllm_engine as engine

    team = lora_debate(model_dir)
    policies = build_policies(team)
    shared = policies["a"].model.shared
    assert {id(policies[a].model.shared) for a in "abc"} == {id(shared)}
    with torch.no_grad():  # adapters that differ (LoRA's B starts at zero)
        g = torch.Generator().manual_seed(0)
        for n, p in shared.model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    ours = {a: LMPolicy(policies[a].model, policies[a].tokenizer, policies[a].sampling,
                        module=policies[a].module) for a in "abc"}
    calls = []
    together = engine.generate_together
    monkeypatch.setattr(engine, "generate_together", lambda ps, reqs, greedy=False: (
        calls.append(len(ps)), together(ps, reqs, greedy))[1])

    def both():
        return (collect(team, policies, 2, 2, seed=1, greedy=True).tokens,
                collect(team, ours, 2, 2, seed=1, greedy=True, mix_adapters=False).tokens)

    theirs, mine = both()
    assert torch.equal(theirs, mine) and calls == [3, 3]  # two rounds, three adapters a call
    assert shared.engine is not None and policies["a"]._llm is None  # the one engine
    assert {a: policies[a].stats()["vllm_weight_syncs"] for a in "abc"} == dict.fromkeys(
        "abc", 1.0)
    with torch.no_grad():
        for p in policies["b"].parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    after, mine = both()
    assert torch.equal(after, mine) and not torch.equal(after, theirs)
    assert {a: policies[a].stats()["vllm_weight_syncs"] for a in "abc"} == {
        "a": 0.0, "b": 1.0, "c": 0.0}


def test_marl_train_trains_lora_adapters_with_vllm_rollouts(model_dir, tmp_path):
    team = lora_debate(model_dir, agents=("a", "b"))
    (tmp_path / "lora.yaml").write_text(team.to_yaml())
    out = tmp_path / "run"
    res = CliRunner().invoke(app, [
        "train", str(tmp_path / "lora.yaml"), "--out", str(out), "--set", "iterations=2",
        "--set", "episodes_per_iter=2", "--set", "group_size=2", "--set", "eval_every=2",
        "--set", "eval_episodes=2"])
    assert res.exit_code == 0, res.output
    rl = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rl[-1]["engine"]["b"]["vllm_weight_syncs"] >= 1
    saved = out / "checkpoints" / "iter_000002" / "b"
    assert (saved / "adapter_config.json").is_file()
    assert not (saved / "model.safetensors").exists()  # the adapter alone
    res = CliRunner().invoke(app, ["run", str(tmp_path / "lora.yaml"), "--episodes", "2",
                                   "--checkpoint", str(saved.parent), "--out",
                                   str(tmp_path / "r")])
    assert res.exit_code == 0, res.output


def test_marl_train_learns_with_vllm_rollouts(model_dir, tmp_path):
    scenario = SIGNAL.read_text().replace(
        "backend: tiny", f"backend: vllm, path: {model_dir}, stop: []")
    (tmp_path / "signal_vllm.yaml").write_text(scenario)
    out = tmp_path / "run"
    res = CliRunner().invoke(app, [
        "train", str(tmp_path / "signal_vllm.yaml"), "--out", str(out), "--set", "iterations=2",
        "--set", "episodes_per_iter=4", "--set", "group_size=2", "--set", "eval_every=2",
        "--set", "eval_episodes=4", "--set", "warmup_steps=1", "--set", "warmup_episodes=4"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 2 and rl[-1]["grad_norm"] > 0
    for name in ("speaker", "listener"):
        engine = rl[-1]["engine"][name]
        assert engine["vllm_weight_syncs"] >= 1  # every update reached the engine
        assert engine["vllm_logprob_mismatch"] < 1e-3
    from safetensors.torch import load_file

    start = load_file(model_dir / "model.safetensors")
    trained = load_file(out / "checkpoints" / "iter_000002" / "speaker" / "model.safetensors")
    assert any(not torch.equal(start[k], trained[k]) for k in start)  # the speaker learnt


def test_sampling_settings_reach_vllm(policy):
    s = sampling_of(PolicySpec(backend="vllm", path=str(policy.path), temperature=0.7,
                               top_p=0.9, top_k=5, max_new_tokens=3, stop=["x"]))
    assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens, s.stop) == (
        0.7, 0.9, 5, 3, ("x",))


def test_the_ledger_of_vllm_rollouts_with_a_chat_template_counts_the_models_ids(tmp_path):
    """vLLM generates from the ids our tokenizer renders (chat turns, template and BOS):
    each ledger row holds exactly those, and every id it generated."""
    import yaml

    from marl.rollout import collect
    from marl.runner import build_policies

    chat_dir = build_tiny_hf(tmp_path / "chat", hidden_size=64, num_heads=2,
                             chat_template=True)
    data = yaml.safe_load((ROOT / "scenarios" / "relay_ring.yaml").read_text())
    data["policies"]["default"].update(backend="vllm", path=str(chat_dir), max_new_tokens=6,
                                       prompt_format="chat")
    team = load_team(data)
    batch = collect(team, build_policies(team), episodes=2, seed=0)
    rows = {(r.episode, r.agent, r.round): r for r in batch.rows}
    for b in range(2):
        for k in range(len(batch.call_agent)):
            row = rows[(b, team.ids[int(batch.call_agent[k])], int(batch.call_round[k]))]
            assert row.prompt_tokens == len(batch.prompt_ids[b][k])
            assert row.completion_tokens == int(batch.mask[b, k].sum())
            assert batch.prompt_ids[b][k][0] == 1  # <bos>, from the template
