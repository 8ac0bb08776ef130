"""Triton twins vs the plain-loop references, run by the Triton interpreter on CPU tensors.

The kernels are decorated lazily per value of TRITON_INTERPRET and use only triton builtins
(no ``@jit`` library helpers such as ``tl.sum``), so setting the variable per test works even
when triton was imported earlier in the process. A second test compiles every kernel ahead of
time for an H100/H200 (sm_90) without a GPU, which catches type errors the interpreter forgives.
"""

from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from marl.kernels import BASELINES, group_advantages, triton_kernels  # noqa: E402
from marl.kernels import reference as ref  # noqa: E402

TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def close(fast: torch.Tensor, slow: torch.Tensor) -> None:
    assert fast.dtype == slow.dtype
    tol = TOL[fast.dtype]
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol, equal_nan=True)


LAYOUTS = {
    "one_group": lambda n, g: torch.zeros(n, dtype=torch.long),
    "singletons": lambda n, g: torch.randperm(n, generator=g) - 5,
    "ragged": lambda n, g: torch.randint(-4, 9, (n,), generator=g),
    "huge": lambda n, g: torch.randint(-3, 3, (n,), generator=g) * 2**61,
}


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_group_advantages(baseline: str, dtype: torch.dtype, layout: str) -> None:
    gen = torch.Generator().manual_seed(BASELINES.index(baseline))
    for n in (1, 50, 1500):  # 1500 > one block: atomics from several programs meet
        r = (torch.randn(n, generator=gen) * 2).to(dtype)
        g = LAYOUTS[layout](n, gen)
        fast = triton_kernels.group_advantages(r, g, baseline)
        close(fast, ref.group_advantages_ref(r, g, baseline))


@pytest.mark.usefixtures("interpret")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy inf − inf
@pytest.mark.parametrize("baseline", BASELINES)
def test_group_advantages_non_finite_matches_torch(baseline: str) -> None:
    r = torch.tensor([1.0, math.nan, 2.0, 5.0, 6.0, math.inf, -math.inf, 0.0])
    g = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    fast = triton_kernels.group_advantages(r, g, baseline)
    close(fast, group_advantages(r, g, baseline))
    assert fast[[3, 4]].isfinite().all()


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8, torch.float32])
def test_broadcast_to_tokens(dtype: torch.dtype, mask_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    for b, t, n in ((1, 1, 1), (3, 700, 5), (2, 0, 3)):
        adv = torch.randn(b, n, generator=gen).to(dtype)
        if b * n > 2:
            adv[1, 2] = math.nan  # must stay on agent 2's tokens of row 1
        mask = (torch.rand(b, t, n, generator=gen) < 0.4).to(mask_dtype)
        fast = triton_kernels.broadcast_to_tokens(adv, mask)
        close(fast, ref.broadcast_to_tokens_ref(adv, mask))


_ADV_SIG = "*fp64 *i64 *fp64 *i32 *fp64 *fp64 i32 fp32"
KERNEL_CASES = [
    ("_seg_stats", "*fp32 *i64 *fp32 *i32 *fp32 i32", {"WITH_MAX": True, "BLOCK": 1024}),
    ("_seg_sqdev", "*bf16 *i64 *fp32 *i32 *fp32 i32", {"BLOCK": 1024}),
    *[("_seg_adv", _ADV_SIG, {"MODE": m, "BLOCK": 1024}) for m in range(4)],
    ("_broadcast", "*fp32 *u8 *bf16 i32 i32", {"N": 3, "BLOCK": 1024}),
]


@pytest.mark.parametrize(("name", "types", "consts"), KERNEL_CASES)
def test_kernels_compile_for_sm90(name, types, consts, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fn = triton_kernels._kernel(name)
    names = fn.arg_names
    sig = dict(zip(names, types.split(), strict=False)) | {k: "constexpr" for k in consts}
    constexprs = {(names.index(k),): v for k, v in consts.items()}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    target = GPUTarget("cuda", 90, 32)
    try:
        compiled = triton.compile(src, target=target, options=triton_kernels._OPTS)
    except RuntimeError as err:  # e.g. a triton wheel without the NVIDIA backend or ptxas
        pytest.skip(f"cannot compile for sm_90 here: {err}")
    assert "ptx" in compiled.asm
