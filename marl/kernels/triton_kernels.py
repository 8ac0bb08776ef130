"""Triton twins of the segment-reduction and token-broadcast kernels.

Same signatures and semantics as :func:`marl.kernels.advantages.group_advantages` and
:func:`marl.kernels.broadcast.broadcast_to_tokens` (no autograd: the public functions only route
CUDA tensors that do not require grad here). This module imports without triton installed; the
kernels are compiled on first use, once per value of ``TRITON_INTERPRET``, so tests can run them
on CPU tensors by setting ``TRITON_INTERPRET=1`` at any time before calling them. (That works
even if triton was imported first because the kernels use only triton builtins: library
helpers such as ``tl.sum`` are ``@jit`` functions fixed at import time.)

Group sums use atomics: on a GPU the summation order, hence the last bits, may vary run to run.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional; available() reports it
    triton = tl = None

_BLOCK = 1024
_MODES = {"mean": 0, "mean_std": 1, "loo": 2, "max": 3}


@functools.cache
def available() -> bool:
    """True when triton can be imported (it may still lack a GPU: see ``TRITON_INTERPRET``)."""
    return importlib.util.find_spec("triton") is not None


def _seg_stats(
    r_ptr, idx_ptr, sum_ptr, cnt_ptr, max_ptr, n, WITH_MAX: tl.constexpr, BLOCK: tl.constexpr
):
    """Per-group sum, count (and max) by atomics; one program per BLOCK rows."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    r = tl.load(r_ptr + offs, mask=m, other=0.0).to(sum_ptr.dtype.element_ty)
    g = tl.load(idx_ptr + offs, mask=m, other=0)
    tl.atomic_add(sum_ptr + g, r, mask=m)
    tl.atomic_add(cnt_ptr + g, tl.full([BLOCK], 1, tl.int32), mask=m)
    if WITH_MAX:
        tl.atomic_max(max_ptr + g, r, mask=m)


def _seg_sqdev(r_ptr, idx_ptr, sum_ptr, cnt_ptr, sq_ptr, n, BLOCK: tl.constexpr):
    """Per-group Σ(r − mean)²: a second pass, as one-pass Σr² cancels catastrophically."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    r = tl.load(r_ptr + offs, mask=m, other=0.0).to(sum_ptr.dtype.element_ty)
    g = tl.load(idx_ptr + offs, mask=m, other=0)
    c = tl.maximum(tl.load(cnt_ptr + g, mask=m, other=1), 1).to(r.dtype)
    d = r - tl.load(sum_ptr + g, mask=m, other=0.0) / c
    tl.atomic_add(sq_ptr + g, d * d, mask=m)


def _seg_adv(
    r_ptr,
    idx_ptr,
    sum_ptr,
    cnt_ptr,
    aux_ptr,
    out_ptr,
    n,
    eps,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Fused gather of the group statistics and the baseline formula selected by MODE."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    r = tl.load(r_ptr + offs, mask=m, other=0.0).to(sum_ptr.dtype.element_ty)
    g = tl.load(idx_ptr + offs, mask=m, other=0)
    s = tl.load(sum_ptr + g, mask=m, other=0.0)
    cnt = tl.load(cnt_ptr + g, mask=m, other=1).to(r.dtype)
    d = r - s / tl.maximum(cnt, 1.0)
    if MODE == 0:
        adv = d
    elif MODE == 1:
        var = tl.load(aux_ptr + g, mask=m, other=0.0) / tl.maximum(cnt - 1.0, 1.0)
        adv = d / (tl.sqrt(var) + eps)
    elif MODE == 2:
        adv = d * cnt / tl.maximum(cnt - 1.0, 1.0)
    else:
        adv = r - tl.load(aux_ptr + g, mask=m, other=0.0)
    # NaN for a group whose sum is not finite (|NaN| < inf is False too).
    adv = tl.where(tl.abs(s) < float("inf"), adv, float("nan"))
    tl.store(out_ptr + offs, adv.to(out_ptr.dtype.element_ty), mask=m)


def _broadcast(
    adv_ptr,
    mask_ptr,
    out_ptr,
    n_tokens,
    seq_len,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[b, t] = Σ_n [mask[b, t, n] ≠ 0]·adv[b, n] for a BLOCK of flat tokens b·T + t."""
    # int64 offsets: B·T·N passes 2^31 long before memory runs out.
    tok = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = tok < n_tokens
    row = tok // seq_len
    acc = tl.full([BLOCK], 0, dtype=adv_ptr.dtype.element_ty)
    # Unrolled over the (few) agents: builtins only, so the interpreter runs it too.
    for n in tl.static_range(N):
        claim = tl.load(mask_ptr + tok * N + n, mask=ok, other=0)
        a = tl.load(adv_ptr + row * N + n, mask=ok, other=0.0)
        # where, not multiply: a NaN advantage must not leak into tokens its agent did not write.
        acc += tl.where(claim != 0, a, 0.0)
    tl.store(out_ptr + tok, acc.to(out_ptr.dtype.element_ty), mask=ok)


@functools.cache
def _jitted(name: str, interpret: bool):
    """Compile lazily: ``triton.jit`` reads TRITON_INTERPRET at decoration time."""
    del interpret  # part of the cache key only
    return triton.jit(globals()[name])


def _kernel(name: str):
    if triton is None:
        raise ModuleNotFoundError(
            "marl.kernels.triton_kernels needs triton: pip install 'llm-marl[triton]'"
        )
    return _jitted(name, os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))


# No FMA contraction: keeps results within rounding of the torch path (these kernels are
# memory-bound, so fusion buys nothing), and says so explicitly, which silences triton 3.9's
# TRITON_DEFAULT_FP_FUSION warning.
_OPTS = {"enable_fp_fusion": False}


def group_advantages(
    rewards: Tensor, group_ids: Tensor, baseline: str = "mean", eps: float = 1e-4
) -> Tensor:
    """Triton twin of :func:`marl.kernels.advantages.group_advantages` (same contract)."""
    from marl.kernels.advantages import _check, dense_group_index

    _check(rewards, group_ids, baseline)
    idx, n_groups = dense_group_index(group_ids)
    n = rewards.numel()
    out = torch.empty_like(rewards)
    if n == 0:
        return out
    acc = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    r = rewards.contiguous()
    idx = idx.contiguous()
    total = torch.zeros(n_groups, dtype=acc, device=r.device)
    cnt = torch.zeros(n_groups, dtype=torch.int32, device=r.device)
    aux = torch.full((n_groups,), -math.inf, dtype=acc, device=r.device)
    grid = (-(-n // _BLOCK),)
    with_max = baseline == "max"
    _kernel("_seg_stats")[grid](
        r, idx, total, cnt, aux, n, WITH_MAX=with_max, BLOCK=_BLOCK, **_OPTS
    )
    if baseline == "mean_std":
        aux.zero_()
        _kernel("_seg_sqdev")[grid](r, idx, total, cnt, aux, n, BLOCK=_BLOCK, **_OPTS)
    mode = _MODES[baseline]
    _kernel("_seg_adv")[grid](
        r, idx, total, cnt, aux, out, n, eps, MODE=mode, BLOCK=_BLOCK, **_OPTS
    )
    return out


def broadcast_to_tokens(adv: Tensor, agent_mask: Tensor) -> Tensor:
    """Triton twin of :func:`marl.kernels.broadcast.broadcast_to_tokens` (same contract)."""
    from marl.kernels.broadcast import _check

    _check(adv, agent_mask)
    b, t, n = agent_mask.shape
    out = torch.empty(b, t, dtype=adv.dtype, device=adv.device)
    if out.numel() == 0:
        return out
    mask = agent_mask.contiguous()
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)  # i1 pointers are awkward; same bytes
    # Half-precision advantages are summed in float32, like the torch path.
    a = adv.contiguous() if adv.dtype == torch.float64 else adv.float().contiguous()
    block = 1024
    grid = (-(-b * t // block),)
    _kernel("_broadcast")[grid](a, mask, out, b * t, t, N=n, BLOCK=block, **_OPTS)
    return out
