"""Rollout throughput: our batched engine vs transformers' ``generate``, and where time goes.

    python benchmarks/rollout.py [--batch 256] [--new-tokens 32] [--episodes 256] [--group 8]

In one process, on the same batch of prompts (observations of a shipped scenario):
1. generated tokens/s of the engine's sampling loop on a tiny HF Llama (the ``tiny``
   preset's dimensions, built locally) vs ``model.generate`` on that same model, and (with
   the ``vllm`` extra; ``--no-vllm`` leaves it out) vLLM's engine on that checkpoint;
2. the same for the built-in ``tiny`` backend vs ``model.generate`` on the HF twin;
3. a full ``collect`` of ``--episodes`` episodes with tiny policies, timing the model
   forward (prefill + decode) against the whole rollout wall time: the rest is env,
   routing, ledger, tokenising and padding;
4. a full ``collect`` of a multi-round scenario (``--multi-round``, default relay_ring:
   four rounds) with each agent's KV cache reused across its turns vs re-prefilled every
   call: wall time and prompt positions the model ran, with their ratios (messages stop at
   a newline, as in play; both runs produce the same rollout).
Generations 1-3 run the full ``--new-tokens`` (no stop) so that token counts match.
With ``--group G`` each distinct observation appears G times in a batch, as the G rollouts
of a task instance do in training (the engine prefills each distinct prompt once; HF
``generate`` prefills every row).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from marl.policies.generation import Sampling, generate, left_pad
from marl.policies.hf import load_hf
from marl.policies.hf_local import build_tiny_hf
from marl.policies.lm import LMPolicy
from marl.policies.scripted import ScriptedPolicy
from marl.policies.tiny import TinyCausalLM, TinyConfig, TinyLM
from marl.rollout import collect
from marl.team import load_team
from marl.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parents[1]


class Recorder(ScriptedPolicy):
    """The task's oracle, remembering every observation it was given."""

    def __init__(self, task):
        super().__init__(task)
        self.seen: list[str] = []

    def generate(self, requests, greedy=False):
        self.seen += [r.observation for r in requests]
        return super().generate(requests, greedy)


def batch_prompts(scenario: str, n: int, group: int = 1) -> list[list[int]]:
    """``n`` real observations of a scripted team playing ``scenario``: the first
    ``ceil(n / group)`` of them, each repeated ``group`` times in a row."""
    team = load_team(ROOT / "scenarios" / scenario)
    oracle = Recorder(team.task)
    distinct = -(-n // group)
    collect(team, dict.fromkeys(team.ids, oracle), episodes=distinct, seed=0)
    seen = [CharTokenizer().encode_prompt(o) for o in oracle.seen[:distinct]]
    return [p for p in seen for _ in range(group)][:n]


def engine_tps(model, prompts, new_tokens: int, reps: int) -> float:
    s = Sampling(max_new_tokens=new_tokens, stop=())
    gen = torch.Generator().manual_seed(0)
    generate(
        model, prompts[:8], s, pad_id=0, eos_id=None, decode=CharTokenizer().decode, generator=gen
    )  # warm-up
    start = time.perf_counter()
    for _ in range(reps):
        out = generate(
            model, prompts, s, pad_id=0, eos_id=None, decode=CharTokenizer().decode, generator=gen
        )
    return reps * int(out.mask.sum()) / (time.perf_counter() - start)


@torch.inference_mode()
def hf_generate_tps(hf_model, prompts, new_tokens: int, reps: int) -> float:
    ids, mask = left_pad(prompts, 0)
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        top_k=0,
        pad_token_id=0,
        eos_token_id=None,
    )
    hf_model.generate(input_ids=ids[:8], attention_mask=mask[:8].long(), **kwargs)
    start = time.perf_counter()
    for _ in range(reps):
        out = hf_model.generate(input_ids=ids, attention_mask=mask.long(), **kwargs)
    generated = out.shape[1] - ids.shape[1]
    return reps * generated * len(prompts) / (time.perf_counter() - start)


def vllm_engine(model_dir: Path):
    """vLLM's engine on the same checkpoint (None without the vllm extra)."""
    try:
        from marl.policies.vllm_engine import ENGINE_DEFAULTS, import_vllm

        vllm = import_vllm()
    except Exception:  # the extra is not installed: the column is left out
        return None
    return vllm.LLM(model=str(model_dir), seed=0, **ENGINE_DEFAULTS)


def vllm_tps(llm, prompts, new_tokens: int, reps: int) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True,
                            temperature=1.0, seed=0)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(batch[:8], params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    for _ in range(reps):
        out = llm.generate(batch, params, use_tqdm=False)
    generated = sum(len(o.outputs[0].token_ids) for o in out)
    return reps * generated / (time.perf_counter() - start)


class Timed:
    """Wraps a CausalLM and accumulates the seconds spent in its forward passes."""

    def __init__(self, inner):
        self.inner, self.device, self.seconds = inner, inner.device, 0.0

    def _timed(self, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.seconds += time.perf_counter() - start
        return out

    def prefill(self, *args):
        return self._timed(self.inner.prefill, *args)

    def decode(self, *args):
        return self._timed(self.inner.decode, *args)

    def expand(self, *args):
        return self._timed(self.inner.expand, *args)

    def gather(self, *args):
        return self._timed(self.inner.gather, *args)

    def logits(self, *args):
        return self.inner.logits(*args)


def rollout_share(episodes: int, group: int) -> tuple[float, float, float]:
    team = load_team(ROOT / "scenarios" / "gather_star.yaml")
    torch.manual_seed(0)
    timed, made = [], {}
    for name, spec in team.scenario.policies.items():
        model = Timed(TinyCausalLM(TinyLM(TinyConfig())))
        timed.append(model)
        # Every message runs to the scenario's token limit, so the count is known.
        made[name] = LMPolicy(
            model, CharTokenizer(), Sampling(max_new_tokens=spec.max_new_tokens, stop=())
        )
    policies = {a.id: made[a.policy] for a in team.agents}
    collect(team, policies, episodes=4, seed=1)  # warm-up
    for t in timed:
        t.seconds = 0.0
    start = time.perf_counter()
    batch = collect(team, policies, episodes=max(1, episodes // group), group_size=group,
                    seed=0)
    wall = time.perf_counter() - start
    forward = sum(t.seconds for t in timed)
    return wall, forward, int(batch.mask.sum()) / wall


def reuse_gain(scenario: str, episodes: int, group: int, reuse: bool) -> tuple[float, int]:
    """Wall time of ``collect`` on ``scenario`` with tiny policies, and the positions they
    prefilled; with or without KV reuse across turns (same seed: the same rollout)."""
    team = load_team(ROOT / "scenarios" / scenario)
    torch.manual_seed(0)
    made = {}
    for name, spec in team.scenario.policies.items():
        model = TinyLM(TinyConfig())
        made[name] = LMPolicy(TinyCausalLM(model), CharTokenizer(),
                              Sampling(max_new_tokens=spec.max_new_tokens), module=model,
                              reuse_cache=reuse)
    policies = {a.id: made[a.policy] for a in team.agents}
    collect(team, policies, episodes=4, seed=1)  # warm-up
    before = sum(p.prefill_tokens for p in made.values())
    start = time.perf_counter()
    collect(team, policies, episodes=max(1, episodes // group), group_size=group, seed=0)
    wall = time.perf_counter() - start
    return wall, sum(p.prefill_tokens for p in made.values()) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--multi-round", default="relay_ring.yaml",
                        help="scenario of the KV-reuse comparison (several rounds)")
    parser.add_argument("--group", type=int, default=1,
                        help="rows per distinct observation (8: MAGRPO's default group)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1 keeps timings stable on a busy machine)",
    )
    parser.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=True,
                        help="add vLLM's engine on the same checkpoint (the vllm extra)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    all_prompts = batch_prompts("gather_star.yaml", max(args.batch), args.group)
    cfg = TinyConfig()
    tmp = tempfile.TemporaryDirectory()
    model_dir = build_tiny_hf(
        Path(tmp.name) / "hf",
        hidden_size=cfg.n_embd,
        num_layers=cfg.n_layer,
        num_heads=cfg.n_head,
        intermediate_size=cfg.mlp_ratio * cfg.n_embd,
    )
    hf_lm, _ = load_hf(model_dir)
    hf_lm.model.eval()
    llm = vllm_engine(model_dir) if args.vllm else None
    tiny = TinyCausalLM(TinyLM(cfg).eval())
    mean_prompt = sum(map(len, all_prompts)) / len(all_prompts)
    print(
        f"gather_star observations (mean {mean_prompt:.0f} tokens, each repeated "
        f"{args.group}x), {args.new_tokens} new tokens each, {torch.get_num_threads()} "
        "thread(s); tokens/s and ratio to "
        "transformers' generate on the same HF model"
    )
    print(f"{'batch':>5} {'HF generate':>12} {'engine on HF model':>22} {'tiny backend':>18}"
          + (f" {'vLLM on HF model':>20}" if llm is not None else " (vLLM: not installed)"))
    for size in args.batch:
        prompts = all_prompts[:size]
        hf_ref = hf_generate_tps(hf_lm.model, prompts, args.new_tokens, args.reps)
        hf_ours = engine_tps(hf_lm, prompts, args.new_tokens, args.reps)
        tiny_ours = engine_tps(tiny, prompts, args.new_tokens, args.reps)
        theirs = vllm_tps(llm, prompts, args.new_tokens, args.reps) if llm is not None else 0
        print(
            f"{size:5d} {hf_ref:12,.0f} {hf_ours:14,.0f} ({hf_ours / hf_ref:4.2f}x) "
            f"{tiny_ours:10,.0f} ({tiny_ours / hf_ref:4.2f}x)"
            + (f" {theirs:12,.0f} ({theirs / hf_ref:4.2f}x)" if llm is not None else "")
        )
    wall, forward, tps = rollout_share(args.episodes, args.group)
    print(
        f"collect({args.episodes} episodes of gather_star in groups of {args.group}, tiny "
        f"policies): {wall:.2f} s, "
        f"{tps:,.0f} generated tokens/s; model forward {forward:.2f} s, outside the "
        f"forward {100 * (wall - forward) / wall:.1f}%"
    )
    (on, on_tokens), (off, off_tokens) = (
        reuse_gain(args.multi_round, args.episodes, args.group, reuse) for reuse in (True, False))
    print(
        f"collect({args.episodes} episodes of {args.multi_round} in groups of {args.group}, "
        f"tiny policies): KV reuse across turns {on:.2f} s, {on_tokens:,} positions "
        f"prefilled; without {off:.2f} s, {off_tokens:,}; ratio {off / on:.2f}x time, "
        f"{off_tokens / on_tokens:.2f}x fewer positions"
    )


if __name__ == "__main__":
    main()
