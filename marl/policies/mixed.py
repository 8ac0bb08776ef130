"""Rollouts batched across LoRA adapters: the policies that are adapters on one shared base
(:mod:`marl.policies.shared`) and act in the same layer generate together (on vLLM, as
one multi-LoRA ``generate`` call: :mod:`marl.policies.vllm_engine`).

Each policy prefills its own prompts with its own adapter (its KV store, its shared stem),
then every decoding step runs once for all of them, each row through its own adapter
(peft's per-row ``adapter_names``). On a CPU that is what the measurement favours
(``benchmarks/adapter_batches.py``: one batch per adapter for prefills, a mixed batch for
decoding steps). Sampling stays each policy's own: its settings, its generator, drawn
exactly as :func:`marl.policies.generation.generate` draws them, so a policy's samples do
not depend on which others generate beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from marl.policies.base import Completion, Request
from marl.policies.generation import Generated, Sampling, _pick, _start, _stored
from marl.policies.lm import LMPolicy


def base_of(policy: Any) -> tuple[str, int] | None:
    """What a policy can generate together with others on (its backend and shared base),
    or None."""
    from marl.policies.vllm_engine import VLLMPolicy

    model = getattr(policy, "model", None)
    shared = getattr(model, "shared", None)
    if shared is None:
        return None
    if isinstance(policy, VLLMPolicy):
        return ("vllm", id(shared))
    if type(policy) is LMPolicy and getattr(model, "mixes", False):
        return ("hf", id(shared))
    return None


@dataclass
class _Group:
    policy: LMPolicy
    prompts: list[list[int]]
    sampling: Sampling
    rows: slice  # this policy's rows in the mixed batch


def generate_together(policies: Sequence[LMPolicy], requests: Sequence[Sequence[Request]],
                      greedy: bool = False) -> list[list[Completion]]:
    """One list of completions per policy, as each policy's ``generate`` gives them, with
    every decoding step run once for all the policies (adapters on one shared base; on
    vLLM, one ``generate`` call)."""
    from marl.policies.vllm_engine import VLLMPolicy
    from marl.policies.vllm_engine import generate_together as on_vllm

    if isinstance(policies[0], VLLMPolicy):
        return on_vllm(policies, requests, greedy)  # type: ignore[arg-type]
    groups, start = [], 0
    for policy, reqs in zip(policies, requests, strict=True):
        s = replace(policy.sampling, temperature=0.0) if greedy else policy.sampling
        groups.append(_Group(policy, policy.prompt_ids(reqs), s,
                             slice(start, start + len(reqs))))
        start += len(reqs)
    out = _generate(groups)
    completions = []
    for g, gen in zip(groups, out, strict=True):
        completions.append(g.policy.completions(g.prompts, gen, g.sampling))
    return completions


@torch.inference_mode()
def _generate(groups: list[_Group]) -> list[Generated]:
    model = groups[0].policy.model
    b = groups[-1].rows.stop
    steps = max(g.sampling.max_new_tokens for g in groups)
    pad_id = groups[0].policy.tokenizer.pad_id
    tokens = torch.full((b, steps), pad_id, dtype=torch.long, device=model.device)
    logprobs = torch.zeros((b, steps), device=model.device)
    gen_mask = torch.zeros((b, steps), dtype=torch.bool, device=model.device)
    done = torch.zeros(b, dtype=torch.bool, device=model.device)
    finish = ["length"] * b
    starts, counts = [], []
    for g in groups:  # each prefill on its own adapter, from its own store or stem
        store = g.policy._store
        if store is not None:
            store.sync(g.policy._version())
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in g.prompts]
        logits, mask, cache, prefilled, reused = _start(
            g.policy.model, list(distinct), g.sampling.max_new_tokens, pad_id, store)
        if len(distinct) < len(rows):
            index = torch.tensor(rows, device=model.device)
            logits, mask, cache = logits[index], mask[index], model.take(cache, index)
        starts.append((logits, mask, cache))
        counts.append((prefilled, reused))
    width = max(m.shape[1] for _, m, _ in starts)
    logits = torch.cat([lg for lg, _, _ in starts])
    mask = torch.cat([torch.cat([m.new_zeros((m.shape[0], width - m.shape[1])), m], 1)
                      for _, m, _ in starts])
    cache = model.join([c for _, _, c in starts], [width - m.shape[1] for _, m, _ in starts])
    adapters = [g.policy.model.adapter for g in groups for _ in g.prompts]
    active = [True] * len(groups)  # a policy samples until its own loop would end
    fed = 0
    for t in range(steps):
        for k, g in enumerate(groups):
            if not active[k]:
                continue
            r, s = g.rows, g.sampling
            tok, lp = _pick(logits[r], s, g.policy.generator)
            tok = tok.masked_fill(done[r], pad_id)
            tokens[r, t], logprobs[r, t] = tok, lp.masked_fill(done[r], 0.0)
            gen_mask[r, t] = ~done[r]
            eos_id, decode = g.policy.tokenizer.eos_id, g.policy.tokenizer.decode
            for i in range(r.start, r.stop):
                if done[i]:
                    continue
                if eos_id is not None and int(tokens[i, t]) == eos_id:
                    finish[i], done[i] = "eos", True
                elif s.stop and any(x in decode(tokens[i, : t + 1].tolist()) for x in s.stop):
                    finish[i], done[i] = "stop", True
            if t == s.max_new_tokens - 1 or bool(done[r].all()):
                active[k] = False
                done[r] = True  # what is left of its rows steps on pad tokens
        if not any(active):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits, cache = model.decode_mixed(tokens[:, t, None], mask, cache, adapters)
        fed += 1
    out = []
    for g, (prefilled, reused) in zip(groups, counts, strict=True):
        r = g.rows
        gen = Generated(tokens[r], logprobs[r], gen_mask[r], finish[r], prefilled, reused)
        store = g.policy._store
        if store is not None:
            index = torch.arange(r.start, r.stop, device=model.device)
            store.add(_stored(model.take(cache, index), g.prompts, tokens[r], gen_mask[r],
                              width, fed))
        g.policy.prefill_tokens += prefilled
        g.policy.reused_tokens += reused
        out.append(gen)
    return out
