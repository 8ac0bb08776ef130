"""Benchmark the credit-assignment kernels: fast path vs plain-loop reference, same process.

    python benchmarks/kernels.py [--sizes 10000 100000 1000000] [--device cpu|cuda]
                                 [--only gae broadcast ...] [--ref-budget 30] [--threads 1]

Per kernel and size it prints the fast and reference wall time, their ratio, the fast path's
time per row (flat across sizes = linear scaling) and peak memory:

* fast peak: the peak of live tensor bytes allocated during one call, inputs excluded: on CPU
  replayed from the torch profiler's memory events (net bytes per op, frees between ops), on
  CUDA ``torch.cuda.max_memory_allocated`` growth. (Peak RSS was tried first: glibc's arena
  slack made it report gigabytes for kernels whose tensors never exceeded tens of MB.)
* ref peak: ``tracemalloc`` peak of Python objects during the reference (a separate run, since
  tracing slows it down); the reference's own lists of floats dominate it.

What a "row" is, per kernel, is printed in the table. Groups are 8 wide. A reference whose
predicted time exceeds ``--ref-budget`` seconds is not run; its time is extrapolated linearly
from the largest measured size and marked ``~``. Times are the best of up to 5 fast calls
(after a warm-up) and of up to 3 reference calls, stopping once 2 s have been spent.

The fast path runs on one thread by default (``--threads``): the reference is single-threaded,
and on a shared 2-core machine OpenMP barriers in multi-threaded ops stall for whole scheduler
time slices, which makes timings erratic. glibc is told to keep freed memory (see
``_steady_malloc``; ``--default-malloc`` skips it). Rows are rounded down to whole sequences
or trees.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from marl import kernels as K
from marl.kernels import reference as R

G = 8  # group width


@dataclass
class Case:
    name: str
    row: str  # what one row is
    make: Callable[[int, torch.device, torch.Generator], tuple]  # rows -> args
    fast: Callable
    ref: Callable | None


def _ids(n: int, dev, gen, hashed: bool = False) -> torch.Tensor:
    ids = torch.arange(n, device=dev) // G
    if hashed:  # arbitrary 63-bit group ids: forces the torch.unique path
        ids = torch.randint(-(2**62), 2**62, ((n + G - 1) // G,), generator=gen)[ids.cpu()].to(dev)
    return ids[torch.randperm(n, generator=gen).to(dev)]


def _group(baseline: str, hashed: bool = False) -> Case:
    def make(n, dev, gen):
        return torch.randn(n, generator=gen).to(dev), _ids(n, dev, gen, hashed), baseline

    ids = "hashed ids" if hashed else "dense ids"
    return Case(
        f"group_adv[{baseline}]",
        f"rollout, {ids}",
        make,
        K.group_advantages,
        R.group_advantages_ref,
    )


def _forest(n: int, dev, gen):
    per_tree = 1 + G + G * G  # MAGRPO: 3 turns, 8 branches each
    trees = max(n // per_tree, 1)
    local = torch.tensor([-1] + [0] * G + [1 + i // G for i in range(G * G)])
    par = (local + (torch.arange(trees) * per_tree)[:, None]).where(local >= 0, -1).flatten()
    return torch.randn(par.numel(), generator=gen).to(dev), par.to(dev), 0.9


def _gigpo(n: int, dev, gen):
    t = 16
    e = max(n // t, G)
    mask = torch.arange(t) < torch.randint(t // 2, t + 1, (e, 1), generator=gen)
    states = torch.randint(-(2**62), 2**62, (4,), generator=gen)  # 64-bit observation hashes
    obs = states[torch.randint(0, 4, (e, t), generator=gen)]
    return (
        torch.randn(e, t, generator=gen).to(dev),
        mask.to(dev),
        obs.to(dev),
        (torch.arange(e) // G).to(dev),
        torch.randn(e, generator=gen).to(dev),
        0.95,
        1.0,
    )


def _tokens(n: int, dev, gen, t: int = 256):
    b = max(n // t, 1)
    pos = torch.arange(t)
    start = torch.randint(0, t // 4, (b, 1), generator=gen)
    stop = torch.randint(t // 2, t + 1, (b, 1), generator=gen)
    return b, t, ((pos >= start) & (pos < stop))


def _gae(n: int, dev, gen):
    b, t, mask = _tokens(n, dev, gen)
    r, v = torch.randn(b, t, generator=gen), torch.randn(b, t, generator=gen)
    return r.to(dev), v.to(dev), mask.to(dev), 1.0, 0.95


def _broadcast(n: int, dev, gen):
    b, t, _ = _tokens(n, dev, gen)
    owner = torch.randint(-1, 4, (b, t), generator=gen)  # -1: prompt / padding
    mask = owner[..., None] == torch.arange(4)
    return torch.randn(b, 4, generator=gen).to(dev), mask.to(dev)


def _costs(n: int, dev, gen):
    e = max(n // 16, 1)  # 4 rounds x 4 agents per episode
    prompt = torch.randint(0, 20_000, (e, 4, 4), generator=gen)
    cached = prompt // 2
    completion = torch.randint(0, 2_000, (e, 4, 4), generator=gen)
    score = torch.rand(e, generator=gen)
    return (
        prompt.to(dev),
        cached.to(dev),
        completion.to(dev),
        (3e-6, 3e-7, 1.5e-5),
        0.1,
        score.to(dev),
    )


def _coalitions(n: int, dev, gen, agents: int = 6):
    return (torch.randn(n, 2**agents, generator=gen).to(dev),)


def _mc(n: int, dev, gen):
    return torch.randn(n, 2**6, generator=gen).to(dev), 64


def _difference(n: int, dev, gen):
    return torch.randn(n, generator=gen).to(dev), torch.randn(n, G, generator=gen).to(dev)


def _key(n: int, dev, gen):
    return (
        torch.randint(-(2**40), 2**40, (n,), generator=gen).to(dev),
        torch.randint(0, 4, (n,), generator=gen).to(dev),
    )


CASES = [
    _group("mean"),
    _group("mean", hashed=True),
    _group("mean_std"),
    _group("loo"),
    _group("max"),
    Case("group_key", "rollout (instance, agent)", _key, K.group_key, R.group_key_ref),
    Case("tree_returns", "tree node (8-ary, 3 turns)", _forest, K.tree_returns, R.tree_returns_ref),
    Case("gigpo", "step (T=16)", _gigpo, K.gigpo_step_advantages, R.gigpo_step_advantages_ref),
    Case("gae", "token (T=256)", _gae, K.gae, R.gae_ref),
    Case(
        "broadcast",
        "token (T=256, N=4)",
        _broadcast,
        K.broadcast_to_tokens,
        R.broadcast_to_tokens_ref,
    ),
    Case("token_costs", "(round, agent) cell", _costs, K.token_costs, R.token_costs_ref),
    Case(
        "shapley_exact", "row of 2^6 coalitions", _coalitions, K.shapley_exact, R.shapley_exact_ref
    ),
    Case("shapley_mc", "row, N=6, P=64", _mc, K.shapley_mc, None),
    Case("difference", "row, N=8", _difference, K.difference_rewards, R.difference_rewards_ref),
]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _steady_malloc() -> bool:
    """Keep freed temporaries in glibc's heap, as a long-running trainer's allocator settles.

    Otherwise glibc serves big temporaries with fresh mmaps on some calls, and page-faulting
    them adds up to ~15 ms per call at 10^6 rows: allocator noise, not kernel time.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(
        libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 1 << 30)
    )


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the profiler backend's start/stop lines, written by C++ straight to fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _fast_peak_mb(fn: Callable, args: tuple, dev: torch.device) -> float:
    """Peak growth of live tensor bytes during one call (inputs excluded)."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        fn(*args)
        return (torch.cuda.max_memory_allocated(dev) - base) / 2**20
    # CPU: replay the profiler's allocation timeline. Each op event carries its own net bytes
    # (alloc − free inside it); "[memory]" events are frees between ops (temporaries dying).
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args)
    steps = sorted(
        (
            e.time_range.start,
            e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage,
        )
        for e in prof.events()
    )
    live = peak = 0
    for _, delta in steps:
        live += delta
        peak = max(peak, live)
    return peak / 2**20


def _time(fn: Callable, args: tuple, dev: torch.device, repeats: int) -> float:
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        fn(*args)
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
        spent += time.perf_counter() - t0
        if spent > 2.0:  # slow calls: a best-of-few is precise enough
            break
    return best


def _ref_peak_mb(fn: Callable, args: tuple) -> float:
    tracemalloc.start()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def run_case(case: Case, sizes: list[int], dev: torch.device, repeats: int, budget: float):
    gen = torch.Generator().manual_seed(0)
    last_ref: tuple[int, float] | None = None
    for n in sizes:
        args = case.make(n, dev, gen)
        case.fast(*args)  # warm-up: first-call allocations, triton compilation
        fast = _time(case.fast, args, dev, repeats)
        fast_mb = _fast_peak_mb(case.fast, args, dev)
        ref_s, ref_mb, mark = None, None, ""
        if case.ref is not None:
            predicted = last_ref[1] * n / last_ref[0] if last_ref else 0.0
            if predicted <= budget:
                cpu_args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
                ref_s = _time(case.ref, cpu_args, torch.device("cpu"), 3)  # ≤ 2 s of repeats
                ref_mb = _ref_peak_mb(case.ref, cpu_args)
                last_ref = (n, ref_s)
            else:
                ref_s, mark = predicted, "~"
        yield n, fast, fast_mb, ref_s, ref_mb, mark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10**4, 10**5, 10**6])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=5, help="fast-path timing: best of N")
    ap.add_argument("--ref-budget", type=float, default=30.0, help="seconds per reference call")
    ap.add_argument("--only", nargs="*", default=None, help="kernel names to run")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    ap.add_argument("--default-malloc", action="store_true", help="skip _steady_malloc()")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    steady = not a.default_malloc and _steady_malloc()
    print(
        f"device={dev} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"triton={K.triton_kernels.available()} steady_malloc={steady}"
    )
    head = (
        f"{'kernel':<20} {'row =':<28} {'rows':>9} {'fast ms':>9} {'ref ms':>10} "
        f"{'ref/fast':>9} {'ns/row':>7} {'fast MB':>8} {'ref MB':>8}"
    )
    print(head)
    print("-" * len(head))
    for case in CASES:
        if a.only and case.name.split("[")[0] not in a.only and case.name not in a.only:
            continue
        per_row = []
        for n, fast, fast_mb, ref_s, ref_mb, mark in run_case(
            case, a.sizes, dev, a.repeats, a.ref_budget
        ):
            per_row.append(fast / n * 1e9)
            ref_ms = "n/a" if ref_s is None else f"{mark}{ref_s * 1e3:.1f}"
            ratio = "n/a" if ref_s is None else f"{mark}{ref_s / fast:.0f}x"
            ref_mem = "n/a" if ref_mb is None else f"{ref_mb:.1f}"
            print(
                f"{case.name:<20} {case.row:<28} {n:>9} {fast * 1e3:>9.2f} {ref_ms:>10} "
                f"{ratio:>9} {per_row[-1]:>7.1f} {fast_mb:>8.1f} {ref_mem:>8}",
                flush=True,
            )
        growth = per_row[-1] / per_row[0]
        print(
            f"{'':<20} linearity: ns/row at largest / smallest size = {growth:.2f} "
            f"({'linear or better' if growth <= 1.25 else 'superlinear?'})"
        )


if __name__ == "__main__":
    main()
