"""Batched sampling with a KV cache, shared by every model backend.

A backend wraps its network in a :class:`CausalLM` adapter (prefill a left-padded batch,
then decode one token at a time against the cache); :func:`generate` runs the sampling
loop: temperature, top-k, top-p, per-sequence stop on end-of-sequence or stop strings, and
the log-prob of each sampled token. Log-probs are under the temperature-scaled full
distribution ``softmax(logits / T)`` (top-k/top-p only restrict what is sampled), which is
exactly what :func:`score` recomputes for training. ``temperature == 0`` is greedy, with
log-probs under ``T = 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F


class CausalLM(Protocol):
    """What the sampling loop needs from a model. Inputs are left-padded."""

    device: torch.device

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor,
                max_new_tokens: int) -> tuple[torch.Tensor, Any]:
        """``ids, mask: (B, P)`` -> logits of the last position ``(B, V)`` and a cache with
        room for ``max_new_tokens`` more positions."""

    def decode(self, ids: torch.Tensor, mask: torch.Tensor,
               cache: Any) -> tuple[torch.Tensor, Any]:
        """``ids: (B, 1)``, ``mask: (B, P + t + 1)`` -> logits ``(B, V)`` and the cache."""

    def logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` -> ``(B, T, V)`` without a cache (differentiable; used to score)."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ("\n",)


@dataclass
class Generated:
    """``tokens, logprobs, mask: (B, L)``; mask marks generated tokens (stop included)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    #: Per sequence: "eos", "stop" or "length".
    finish: list[str]


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``ids, mask: (B, max_len)``.

    >>> ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [0, 7]], [[True, True], [False, True]])
    """
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, n - len(s):] = torch.as_tensor(s, dtype=torch.long)
            mask[i, n - len(s):] = True
    return ids.to(device), mask.to(device)


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k / nucleus (top-p) set with -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (keeps at least one).
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits


def _pick(logits: torch.Tensor, s: Sampling,
          generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns ``tokens (B,)`` and their log-probs ``(B,)``."""
    logits = logits.float()
    if s.temperature <= 0:
        tok = logits.argmax(-1)
        return tok, F.log_softmax(logits, -1).gather(-1, tok[:, None])[:, 0]
    scaled = logits / s.temperature
    probs = _filter(scaled, s.top_k, s.top_p).softmax(-1)
    tok = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return tok, F.log_softmax(scaled, -1).gather(-1, tok[:, None])[:, 0]


@torch.inference_mode()
def generate(model: CausalLM, prompts: Sequence[Sequence[int]], s: Sampling, *, pad_id: int,
             eos_id: int | None, decode: Callable[[list[int]], str],
             generator: torch.Generator | None = None) -> Generated:
    """Sample up to ``s.max_new_tokens`` tokens for every prompt, in one batch."""
    b, steps = len(prompts), s.max_new_tokens
    ids, mask = left_pad(prompts, pad_id, model.device)
    tokens = torch.full((b, steps), pad_id, dtype=torch.long, device=model.device)
    logprobs = torch.zeros((b, steps), device=model.device)
    gen_mask = torch.zeros((b, steps), dtype=torch.bool, device=model.device)
    done = torch.zeros(b, dtype=torch.bool, device=model.device)
    finish = ["length"] * b
    logits, cache = model.prefill(ids, mask, steps)
    for t in range(steps):
        tok, lp = _pick(logits, s, generator)
        tok = tok.masked_fill(done, pad_id)
        tokens[:, t], logprobs[:, t], gen_mask[:, t] = tok, lp.masked_fill(done, 0.0), ~done
        if eos_id is not None:
            hit = (tok == eos_id) & ~done
            for i in hit.nonzero()[:, 0].tolist():
                finish[i] = "eos"
            done |= hit
        if s.stop:
            for i in (~done).nonzero()[:, 0].tolist():
                text = decode(tokens[i, : t + 1].tolist())
                if any(stop in text for stop in s.stop):
                    finish[i], done[i] = "stop", True
        if t == steps - 1 or bool(done.all()):
            break
        # Finished rows keep stepping on a pad token; their outputs are masked out.
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits, cache = model.decode(tok[:, None], mask, cache)
    return Generated(tokens, logprobs, gen_mask, finish)


def completion_text(tokens: Sequence[int], decode: Callable[[list[int]], str],
                    stop: Sequence[str]) -> str:
    """The message: decoded text cut before the first stop string."""
    text = decode(list(tokens))
    cut = min((text.find(x) for x in stop if x in text), default=len(text))
    return text[:cut]


def score(model: CausalLM, prompts: Sequence[Sequence[int]],
          completions: Sequence[Sequence[int]], *, pad_id: int, temperature: float = 1.0,
          entropy: bool = False) -> tuple[torch.Tensor, ...]:
    """Log-probs of given completions under the current parameters (differentiable).

    Returns ``logprobs, mask: (B, L)`` aligned with the completions (left-aligned, padded
    to the longest), plus the per-token entropy ``(B, L)`` of the same distribution when
    ``entropy``. Uses the same temperature convention as :func:`generate`.
    """
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    ids, mask = left_pad(seqs, pad_id, model.device)
    logits = model.logits(ids, mask).float()
    if temperature > 0:
        logits = logits / temperature
    n = max(len(c) for c in completions)
    if n == 0:
        empty = torch.zeros((len(seqs), 0), device=logits.device)
        return (empty, empty.bool(), empty) if entropy else (empty, empty.bool())
    # Only the last n positions can predict completion tokens: slice before the softmax.
    logall = F.log_softmax(logits[:, -n - 1 : -1], -1)  # (B, n, V)
    logp = logall.gather(-1, ids[:, -n:, None])[..., 0]
    lengths = torch.tensor([len(c) for c in completions], device=logp.device)
    # Completion i occupies the last len(c_i) columns; move it to the front.
    shift = (torch.arange(n, device=logp.device) + (n - lengths)[:, None]).clamp(max=n - 1)
    out_mask = torch.arange(n, device=logp.device) < lengths[:, None]
    out = logp.gather(1, shift).masked_fill(~out_mask, 0.0)
    if not entropy:
        return out, out_mask
    ent = -(logall.exp() * logall).sum(-1).gather(1, shift).masked_fill(~out_mask, 0.0)
    return out, out_mask, ent
