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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from marl.policies.kv_reuse import KVStore, Reuse, Stored, stem_groups, stem_length


class CausalLM(Protocol):
    """What the sampling loop needs from a model. Inputs are left-padded."""

    device: torch.device

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor,
                max_new_tokens: int) -> tuple[torch.Tensor, Any]:
        """``ids, mask: (B, P)`` -> logits of the last position ``(B, V)`` and a cache with
        room for ``max_new_tokens`` more positions."""

    def decode(self, ids: torch.Tensor, mask: torch.Tensor,
               cache: Any) -> tuple[torch.Tensor, Any]:
        """``ids: (B, T)`` after the ``C`` cached positions (``T = 1`` while sampling),
        ``mask: (B, C + T)`` -> logits of the last position ``(B, V)`` and the cache."""

    def expand(self, cache: Any, index: torch.Tensor) -> Any:
        """The cache of rows ``index (B',)`` (repeats allowed) of a prefilled batch."""

    def gather(self, reuse: Reuse, room: int) -> Any | None:
        """A cache of ``reuse.width`` columns, plus room for ``room`` more, holding the
        stored K/V that ``reuse`` points at; None when this cache kind cannot be cut."""

    def logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` -> ``(B, T, V)`` without a cache (differentiable; used to score)."""

    def prefix(self, ids: torch.Tensor, mask: torch.Tensor, room: int) -> tuple[torch.Tensor, Any]:
        """As :meth:`prefill`, but differentiable and always on the trained model."""

    def extend(self, ids: torch.Tensor, mask: torch.Tensor,
               cache: Any) -> tuple[torch.Tensor, Any]:
        """``ids: (B, T)`` after the cached positions, ``mask: (B, P + T)`` -> logits
        ``(B, T, V)`` (differentiable) and the cache."""

    def weights(self) -> list[torch.nn.Parameter]:
        """The parameters that train, in a fixed order (a frozen copy's: the same shapes,
        in the same order)."""

    def frozen(self) -> CausalLM:
        """A copy of the current weights that does not train (the KL term's reference)."""


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
    #: Positions the model ran before sampling (padding included), and prompt tokens whose
    #: K/V came from a stored cache instead.
    prefilled: int = 0
    reused: int = 0


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
             generator: torch.Generator | None = None,
             store: KVStore | None = None) -> Generated:
    """Sample up to ``s.max_new_tokens`` tokens for every prompt, in one batch.

    Each distinct prompt is prefilled once and its cache shared by every row that repeats
    it (the G rollouts of a group start from the same prompt); a long stem that all the
    prompts share (the G listener prompts of a group differ only in the message they
    read) is prefilled once. Given a ``store``, prompts start from the K/V of earlier calls
    kept there, and this call's cache is added to it.
    """
    b, steps = len(prompts), s.max_new_tokens
    distinct: dict[tuple[int, ...], int] = {}
    rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    tokens = torch.full((b, steps), pad_id, dtype=torch.long, device=model.device)
    logprobs = torch.zeros((b, steps), device=model.device)
    gen_mask = torch.zeros((b, steps), dtype=torch.bool, device=model.device)
    done = torch.zeros(b, dtype=torch.bool, device=model.device)
    finish = ["length"] * b
    logits, mask, cache, prefilled, reused = _start(model, list(distinct), steps, pad_id, store)
    width, fed = mask.shape[1], 0
    if len(distinct) < b:
        index = torch.tensor(rows, device=model.device)
        logits, mask, cache = logits[index], mask[index], model.expand(cache, index)
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
        fed += 1
    if store is not None:
        store.add(_stored(cache, prompts, tokens, gen_mask, width, fed))
    return Generated(tokens, logprobs, gen_mask, finish, prefilled, reused)


def _start(model: CausalLM, prompts: list[tuple[int, ...]], steps: int, pad_id: int,
           store: KVStore | None) -> tuple[torch.Tensor, torch.Tensor, Any, int, int]:
    """Logits of each prompt's last position ``(B, V)``, the left-padded mask ``(B, W)``
    and a cache with room for ``steps`` more positions; plus the positions run and the
    tokens reused from ``store``. Starts from ``store`` when that runs fewer positions than
    a prefill, else from the prompts' common stem when that pays (:func:`_stem`)."""
    plan = store.plan(prompts, model.device) if store is not None else None
    stem = 0
    if plan is None and (stem := stem_length(prompts)):
        plan = _stem(model.prefill, prompts, stem, model.device)
    cache = model.gather(plan[0], plan[1] + steps) if plan is not None else None
    if cache is None:
        ids, mask = left_pad(prompts, pad_id, model.device)
        logits, cache = model.prefill(ids, mask, steps)
        return logits, mask, cache, stem + ids.numel(), 0
    ids, mask = _rest(prompts, *plan, pad_id, model.device)
    logits, cache = model.decode(ids, mask, cache)
    return logits, mask, cache, stem + ids.numel(), 0 if stem else sum(plan[0].length)


def _stem(run: Callable[..., tuple[torch.Tensor, Any]], prompts: list[tuple[int, ...]],
          n: int, device: torch.device) -> tuple[Reuse, int] | None:
    """Run the prompts' common stem, their first ``n`` tokens (:func:`stem_length`), once
    with ``run`` (a model's ``prefill`` or ``prefix``); return how the prompts reuse its
    K/V, as :meth:`KVStore.plan` does."""
    stem = prompts[0][:n]
    ids = torch.tensor([stem], dtype=torch.long, device=device)
    _, cache = run(ids, torch.ones_like(ids, dtype=torch.bool), 0)
    store = KVStore(keep=1, version=0)
    store.add(Stored(cache, [stem], [0]))
    return store.plan(prompts, device)


def _rest(prompts: Sequence[tuple[int, ...]], reuse: Reuse, suffix: int, pad_id: int,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``suffix`` last tokens of every prompt ``(B, S)``, and the mask ``(B, W + S)``
    over the reused columns (right-aligned) and those tokens: left-padded, no holes."""
    ids, new = left_pad([p[k:] for p, k in zip(prompts, reuse.length, strict=True)], pad_id,
                        device)
    cols = torch.arange(reuse.width, device=device)
    old = cols >= reuse.width - torch.tensor(reuse.length, device=device)[:, None]
    return ids, torch.cat([old, new], dim=1)


def _stored(cache: Any, prompts: Sequence[Sequence[int]], tokens: torch.Tensor,
            gen_mask: torch.Tensor, width: int, fed: int) -> Stored:
    """What each row's final cache holds: its prompt, left-padded in ``width`` columns, then
    the first ``fed`` generated tokens (the last sampled token never runs) up to its end."""
    ends = gen_mask.sum(1).clamp(max=fed).tolist()
    tokens = tokens.tolist()
    seqs = [tuple(p) + tuple(tokens[i][: ends[i]]) for i, p in enumerate(prompts)]
    return Stored(cache, seqs, [width - len(p) for p in prompts])


def completion_text(tokens: Sequence[int], decode: Callable[[list[int]], str],
                    stop: Sequence[str]) -> str:
    """The message: decoded text cut before the first stop string."""
    text = decode(list(tokens))
    cut = min((text.find(x) for x in stop if x in text), default=len(text))
    return text[:cut]


def score(model: CausalLM, prompts: Sequence[Sequence[int]],
          completions: Sequence[Sequence[int]], *, pad_id: int, temperature: float = 1.0,
          entropy: bool = False, reference: CausalLM | None = None,
          support: torch.Tensor | None = None, lump_support: bool | torch.Tensor = False
          ) -> tuple[torch.Tensor, ...]:
    """Log-probs of given completions under the current parameters (differentiable).

    Returns ``logprobs, mask: (B, L)`` aligned with the completions (left-aligned, padded
    to the longest), plus the per-token entropy ``(B, L)`` of the same distribution when
    ``entropy``, plus, given a ``reference`` model, the exact per-token
    ``KL(π || π_ref) = Σ_v π(v) (log π(v) − log π_ref(v))`` over the whole vocabulary
    ``(B, L)`` (differentiable in π; the reference runs without gradients), plus, given
    ``support`` ``(B, L', A)`` (token ids, -1 for none; positions past ``L'`` have none),
    the log-prob ``(B, L, A)`` of each position's support tokens (0 where there is none).
    With ``lump_support`` (``True``, or a ``(B,)`` mask of the rows), the KL counts each
    position's support tokens as one outcome (:func:`lumped_kl`). Uses the same
    temperature convention as :func:`generate`.

    Rows that repeat a prompt share its forward pass: the distinct prompts run once (a
    stem they all share, once, when that pays), and every completion continues from its
    prompt's (differentiable) cache.
    """
    # Grouped once for both passes (the policy's and the reference's).
    groups = stem_groups([tuple(p) for p in prompts]) if any(completions) else []
    logall, targets = _log_dist(model, prompts, completions, pad_id, temperature, groups)
    out_mask = torch.arange(targets.shape[1], device=logall.device) < torch.tensor(
        [len(c) for c in completions], device=logall.device)[:, None]
    out = logall.gather(-1, targets[..., None])[..., 0].masked_fill(~out_mask, 0.0)
    result = [out, out_mask]
    if entropy:
        result.append(-(logall.exp() * logall).sum(-1).masked_fill(~out_mask, 0.0))
    if reference is not None:
        with torch.no_grad():
            ref, _ = _log_dist(reference, prompts, completions, pad_id, temperature, groups)
        if support is not None and (lump_support is True or torch.is_tensor(lump_support)):
            rows = torch.ones(len(support), dtype=torch.bool) if lump_support is True \
                else lump_support.bool()
            kl = lumped_kl(logall, ref, support.masked_fill(~rows.cpu()[:, None, None], -1))
        else:
            kl = (logall.exp() * (logall - ref)).sum(-1)
        result.append(kl.masked_fill(~out_mask, 0.0))
    if support is not None:
        result.append(support_logprobs(logall, support).masked_fill(~out_mask[..., None], 0.0))
    return tuple(result)


def support_logprobs(logall: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """``logall (B, L, V)`` at each position's ``support (B, L', A)`` token ids: ``(B, L, A)``
    (-1 pads, and positions from ``L'`` on, give 0).

    >>> logall = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
    >>> support_logprobs(logall, torch.tensor([[[0, 1], [2, -1]]])).exp()
    tensor([[[0.5000, 0.2500],
             [0.8000, 1.0000]]])
    """
    ids = _support_ids(support, logall)
    return logall.gather(-1, ids.clamp(min=0)).masked_fill(ids < 0, 0.0)


def lumped_kl(logp: torch.Tensor, logq: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Per-position ``KL(p || q)`` ``(B, L)`` of log-distributions ``(B, L, V)`` with each
    position's ``support (B, L', A)`` tokens (-1 pads) counted as one outcome: the KL of
    the format (how much mass the alphabet gets, and how the rest is spread), blind to
    which symbol is chosen. Positions without support get the whole distribution's KL.

    >>> p = torch.log(torch.tensor([[[0.7, 0.1, 0.2]]]))
    >>> q = torch.log(torch.tensor([[[0.1, 0.7, 0.2]]]))
    >>> lumped_kl(p, q, torch.tensor([[[0, 1]]]))  # both give 0.8 to the alphabet {0, 1}
    tensor([[0.]])
    >>> torch.allclose(lumped_kl(p, q, torch.tensor([[[-1, -1]]])), (p.exp() * (p - q)).sum(-1))
    True
    """
    ids = _support_ids(support, logp)
    inside = torch.zeros(logp.shape, dtype=torch.int32, device=logp.device).scatter_add_(
        -1, ids.clamp(min=0), (ids >= 0).int()) > 0
    has = inside.any(-1, keepdim=True)
    outside = (logp.exp() * (logp - logq)).masked_fill(inside, 0.0).sum(-1)

    def mass(logd: torch.Tensor) -> torch.Tensor:  # log of the support's mass (0 where none)
        return torch.where(has, logd.masked_fill(~inside, float("-inf")), 0.0).logsumexp(-1)

    lp, lq = mass(logp), mass(logq)
    return outside + torch.where(has[..., 0], lp.exp() * (lp - lq), 0.0)


def _support_ids(support: torch.Tensor, logall: torch.Tensor) -> torch.Tensor:
    """``support (B, L', A)`` cut or padded (-1) to ``logall``'s ``L`` positions."""
    b, n, _ = logall.shape
    ids = support[:, :n].to(logall.device)
    if ids.shape[1] < n:
        ids = torch.cat([ids, ids.new_full((b, n - ids.shape[1], ids.shape[2]), -1)], 1)
    return ids


def _log_dist(model: CausalLM, prompts: Sequence[Sequence[int]],
              completions: Sequence[Sequence[int]], pad_id: int, temperature: float,
              groups: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-distributions ``(B, n, V)`` before each completion token (temperature-scaled)
    and the tokens ``(B, n)``, left-aligned. With two or more ``groups`` of rows
    (:func:`stem_groups`: prompts that part early and then share long stems in groups, as
    the agents of one shared policy do) the rows are scored group by group."""
    n = max(len(c) for c in completions)
    if len(groups) < 2:
        return _log_dist_group(model, prompts, completions, pad_id, temperature)
    logall = targets = None
    for group in groups:
        if not (m := max(len(completions[i]) for i in group)):
            continue  # no token to score: the rows keep a uniform, masked distribution
        part, tokens = _log_dist_group(model, [prompts[i] for i in group],
                                       [completions[i] for i in group], pad_id, temperature)
        uniform = -math.log(part.shape[-1])
        if logall is None:
            logall = part.new_full((len(prompts), n, part.shape[-1]), uniform)
            targets = tokens.new_full((len(prompts), n), pad_id)
        index = torch.tensor(group, device=part.device)
        logall = logall.index_copy(0, index, F.pad(part, (0, 0, 0, n - m), value=uniform))
        targets = targets.index_copy(0, index, F.pad(tokens, (0, n - m), value=pad_id))
    return logall, targets


def _log_dist_group(model: CausalLM, prompts: Sequence[Sequence[int]],
                    completions: Sequence[Sequence[int]], pad_id: int,
                    temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_log_dist` for prompts scored in one call."""
    n = max(len(c) for c in completions)
    distinct: dict[tuple[int, ...], int] = {}
    rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    stem = stem_length(list(distinct)) if n else 0
    if n == 0 or (len(distinct) == len(rows) and not stem):
        logits, targets = _logits_whole(model, prompts, completions, pad_id, n)
    elif stem and 2 * len(distinct) > len(rows):
        # Most rows have a prompt of their own (a listener's G prompts differ in the message
        # read): the stem runs once, then every row its rest and completion.
        logits, targets = _logits_after_stem(model, [tuple(p) for p in prompts], stem,
                                             completions, pad_id, n)
    else:
        logits, targets = _logits_shared(model, list(distinct), rows, completions, pad_id, n)
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    return F.log_softmax(logits, -1), targets


def _logits_whole(model: CausalLM, prompts: Sequence[Sequence[int]],
                  completions: Sequence[Sequence[int]], pad_id: int,
                  n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``(B, n, V)`` before each completion token and the tokens ``(B, n)``
    (left-aligned), from one pass over every prompt + completion."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    ids, mask = left_pad(seqs, pad_id, model.device)
    if n == 0:
        return ids.new_zeros((len(seqs), 0, 1), dtype=torch.float), ids[:, :0]
    # Only the last n positions can predict completion tokens: slice before the softmax.
    logits = model.logits(ids, mask)[:, -n - 1 : -1]
    lengths = torch.tensor([len(c) for c in completions], device=ids.device)
    # Completion i occupies the last len(c_i) columns; move it to the front.
    shift = (torch.arange(n, device=ids.device) + (n - lengths)[:, None]).clamp(max=n - 1)
    logits = logits.gather(1, shift[..., None].expand(-1, -1, logits.shape[-1]))
    return logits, ids[:, -n:].gather(1, shift)


def _logits_shared(model: CausalLM, distinct: list[tuple[int, ...]], rows: list[int],
                   completions: Sequence[Sequence[int]], pad_id: int,
                   n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`_logits_whole`, running each distinct prompt once: ``rows[i]`` is row
    i's prompt in ``distinct``."""
    ids, mask = left_pad(distinct, pad_id, model.device)
    last, cache = model.prefix(ids, mask, n)
    index = torch.tensor(rows, device=model.device)
    cache = model.expand(cache, index)
    targets, filled = _targets(completions, pad_id, n, model.device)
    first = last[index][:, None]  # (B, 1, V): predicts each completion's first token
    if n == 1:
        return first, targets
    # Completions are right-padded after their prompt; padding is never attended to by a
    # real token, since it only ever follows one.
    after, _ = model.extend(targets[:, :-1], torch.cat([mask[index], filled[:, :-1]], 1),
                            cache)
    return torch.cat([first, after], 1), targets


def _logits_after_stem(model: CausalLM, prompts: list[tuple[int, ...]], stem: int,
                       completions: Sequence[Sequence[int]], pad_id: int,
                       n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`_logits_whole`, running the prompts' common ``stem`` tokens once
    (:func:`_stem`), then, in one pass, every row's ``S`` last prompt tokens and its
    completion."""
    plan = _stem(model.prefix, prompts, stem, model.device)
    cache = model.gather(plan[0], plan[1] + n) if plan is not None else None
    if cache is None:
        return _logits_whole(model, prompts, completions, pad_id, n)
    rest, mask = _rest(prompts, *plan, pad_id, model.device)  # (B, S)
    targets, filled = _targets(completions, pad_id, n, model.device)
    ids = torch.cat([rest, targets[:, :-1]], 1)
    logits, _ = model.extend(ids, torch.cat([mask, filled[:, :-1]], 1), cache)
    return logits[:, rest.shape[1] - 1 :], targets


def _targets(completions: Sequence[Sequence[int]], pad_id: int, n: int,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The completions right-padded to ``n`` ``(B, n)``, and which tokens are real."""
    targets = torch.tensor([list(c) + [pad_id] * (n - len(c)) for c in completions],
                           dtype=torch.long, device=device)
    filled = torch.arange(n, device=device) < torch.tensor(
        [len(c) for c in completions], device=device)[:, None]
    return targets, filled
