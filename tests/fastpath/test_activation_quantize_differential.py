"""Fast-path fused activation + quantize kernels (``fastpath.activation_quantize``) against the reference's
composition of the same seam methods, on the GPU.

Every quantized byte, ``scale_inv``, delayed-scaling accumulator, rounded output and amax must be bit-identical
(integer views: NaN payloads count). The bias grads are fp32 column sums in the kernel's order, not torch's, and
are held to the bound of fp32 summation itself (:func:`assert_dbias_within_fp32_summation`). Shapes cover whole
and partial 128x128 tiles, one row, one column, 1-D and 3-D tensors; inputs carry NaN, signed zeros, subnormals
and values that saturate the FP8 formats. The GPU tests skip with the reason when CuPy or a GPU is missing; the
tests at the end run on any machine.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from test_quantize_differential import DTYPES, assert_identical, make_input, run_both

import refops
from fastpath import _cuda
from fastpath import activation_quantize as aq
from fastpath.backend import FastpathKernels
from fastpath.elementwise import UNARY_ACTIVATIONS
from refops.kernels import ReferenceKernels

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
#: (FP8 format, rowwise, columnwise): row-wise only, both, column-wise only, in both formats.
CASTS = [(E4M3, True, False), (E4M3, True, True), (E5M2, False, True), (E5M2, True, True)]
#: 1-D, one element, odd widths (scalar paths), partial tiles on both axes, whole tiles, 3-D.
SHAPES = [(37,), (1, 1), (7, 18), (3, 5, 40), (130, 260), (257, 24), (128, 256)]
ACCUMULATOR = 0.5


def _ids(value: Any) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], torch.dtype):
        return f"{str(value[0]).removeprefix('torch.float8_')}-{'r' if value[1] else ''}{'c' if value[2] else ''}"
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return str(value)


def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    """Wide-range values with NaN, zeros, subnormals and huge values (the quantize tests' "edge" mode)."""
    return make_input(shape, dtype, device, "edge", seed=seed)


def assert_dbias_within_fp32_summation(fast: torch.Tensor, ref: torch.Tensor, summands: torch.Tensor,
                                       what: str) -> None:
    """Both are ``RN_dtype`` of an fp32 sum over the rows of ``summands`` (``(..., n)``), in two orders.

    Recursive fp32 summation of ``r`` terms in any order is within ``(r - 1) u sum|g|`` of the exact sum
    (``u = 2^-24``; Higham, Accuracy and Stability of Numerical Algorithms, 4.2), so the two fp32 sums are within
    twice that of each other; each is then rounded once to the output dtype, which moves it by at most half an
    ulp there, and the two rounded results by at most 2 ulps of the larger (the rounding of a sum near a binade
    boundary). NaN must be NaN on both sides; infinities must agree.
    """
    assert fast.shape == ref.shape and fast.dtype == ref.dtype, what
    g = summands.detach().double().reshape(-1, summands.shape[-1])
    rows = g.shape[0]
    a, e = fast.double(), ref.double()
    assert torch.equal(torch.isnan(a), torch.isnan(e)), f"{what}: NaN in different columns"
    finite = torch.isfinite(a) & torch.isfinite(e)
    assert torch.equal(a[~finite & ~torch.isnan(a)], e[~finite & ~torch.isnan(e)]), f"{what}: infinities differ"
    info = torch.finfo(fast.dtype)
    ulp = info.eps * torch.maximum(a.abs(), e.abs()).clamp_min(info.tiny)
    bound = 2 * ulp + 2 * max(rows - 1, 0) * 2.0**-24 * torch.nan_to_num(g.abs().sum(dim=0), posinf=0.0)
    bad = finite & ((a - e).abs() > bound)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {a.numel()} bias-grad columns differ beyond fp32 "
                             f"summation; first at {i}: fastpath {a[i].item()!r} vs reference {e[i].item()!r} "
                             f"(bound {bound[i].item():.3e})")


def cast_kwargs(cast: tuple, device: torch.device, scale: float = 3.7) -> dict[str, Any]:
    fp8_dtype, rowwise, columnwise = cast
    return dict(scale=torch.tensor([scale], device=device), fp8_dtype=fp8_dtype, rowwise=rowwise,
                columnwise=columnwise, amax_accumulator=torch.tensor([ACCUMULATOR], device=device))


def launched_kernels(monkeypatch) -> list[str]:
    """Names of the activation_quantize.cu kernels looked up from now on (each launch looks its kernel up)."""
    names: list[str] = []
    real = aq._kernel

    def record(activation, name, index):
        names.append(name)
        return real(activation, name, index)

    monkeypatch.setattr(aq, "_kernel", record)
    return names


# ------------------------------------------------------------------ delayed scaling: act + amax + cast
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("cast", CASTS, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", UNARY_ACTIVATIONS)
def test_activation_cast_float8(activation, dtype, cast, shape, cuda, reference_backend, fastpath_backend,
                                monkeypatch):
    x = inputs(shape, dtype, cuda, seed=1)
    launched = launched_kernels(monkeypatch)
    (ref, _, ref_kw), (fast, _, fast_kw) = run_both(reference_backend, fastpath_backend, "activation_cast_float8",
                                                    x, activation, **cast_kwargs(cast, cuda))
    what = f"activation_cast_float8 {activation} {dtype} {_ids(cast)} {shape}"
    assert launched == [f"act_cast_t_fwd_{activation}_{aq._SUFFIX[dtype]}"], what  # the fused kernel, not super()
    assert_identical(ref, fast, what)
    assert_identical(ref_kw["amax_accumulator"], fast_kw["amax_accumulator"], what + " amax_accumulator")


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("cast", CASTS, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", UNARY_ACTIVATIONS)
def test_activation_backward_cast_float8(activation, dtype, cast, shape, cuda, reference_backend, fastpath_backend):
    x, dy = inputs(shape, dtype, cuda, seed=2), inputs(shape, dtype, cuda, seed=3)
    (ref, _, ref_kw), (fast, _, fast_kw) = run_both(
        reference_backend, fastpath_backend, "activation_backward_cast_float8", dy, x, activation,
        **cast_kwargs(cast, cuda))
    what = f"activation_backward_cast_float8 {activation} {dtype} {_ids(cast)} {shape}"
    assert_identical(ref, fast, what)
    assert_identical(ref_kw["amax_accumulator"], fast_kw["amax_accumulator"], what + " amax_accumulator")


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("cast", CASTS, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["gelu", "relu", "silu", "sigmoid"])
def test_activation_backward_dbias_cast_float8(activation, dtype, cast, shape, cuda, reference_backend,
                                               fastpath_backend):
    x, dy = inputs(shape, dtype, cuda, seed=4), inputs(shape, dtype, cuda, seed=5)
    (ref, _, ref_kw), (fast, _, fast_kw) = run_both(
        reference_backend, fastpath_backend, "activation_backward_dbias_cast_float8", dy, x, activation,
        out_dtype=dtype, **cast_kwargs(cast, cuda))
    what = f"activation_backward_dbias_cast_float8 {activation} {dtype} {_ids(cast)} {shape}"
    assert_identical(ref[:4], fast[:4], what)
    assert_identical(ref_kw["amax_accumulator"], fast_kw["amax_accumulator"], what + " amax_accumulator")
    with refops.use_backend(reference_backend):  # delayed scaling sums the unrounded fp32 values
        v = reference_backend.activation_backward(dy.float(), x.float(), activation)
    assert_dbias_within_fp32_summation(fast[4], ref[4], v, what + " dbias")


@pytest.mark.parametrize("scale_value", [1.0, 2.0 ** -7, 448.0 / 3.0, 0.0, float("inf"), 1e-39])
@pytest.mark.parametrize("accumulator_value", [None, 0.0, 7.0, float("nan")])
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_cast_scales_and_accumulators(backward, scale_value, accumulator_value, cuda, reference_backend,
                                      fastpath_backend):
    x = make_input((64, 96), torch.bfloat16, cuda, "inf", seed=6, transposed=True)
    kwargs: dict[str, Any] = dict(scale=torch.tensor([scale_value], device=cuda), fp8_dtype=E4M3, rowwise=True,
                                  columnwise=True)
    if accumulator_value is not None:
        kwargs["amax_accumulator"] = torch.tensor([accumulator_value], device=cuda)
    args = (make_input((64, 96), torch.bfloat16, cuda, "edge", seed=7), x) if backward else (x,)
    method = "activation_backward_cast_float8" if backward else "activation_cast_float8"
    (ref, _, ref_kw), (fast, _, fast_kw) = run_both(reference_backend, fastpath_backend, method, *args, "gelu",
                                                    **kwargs)
    assert_identical(ref, fast, f"{method} scale={scale_value}")
    if accumulator_value is not None:
        assert_identical(ref_kw["amax_accumulator"], fast_kw["amax_accumulator"], "amax_accumulator")


# ------------------------------------------------------------------ current scaling: act + amax (+ dbias)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", UNARY_ACTIVATIONS)
def test_activation_amax_forward_and_backward(activation, dtype, shape, cuda, reference_backend, fastpath_backend,
                                              monkeypatch):
    x, dy = inputs(shape, dtype, cuda, seed=8), inputs(shape, dtype, cuda, seed=9)
    launched = launched_kernels(monkeypatch)
    (ref, _, _), (fast, _, _) = run_both(reference_backend, fastpath_backend, "activation_amax", x, activation,
                                         out_dtype=dtype)
    assert_identical(ref, fast, f"activation_amax {activation} {dtype} {shape}")
    (ref, _, _), (fast, _, _) = run_both(reference_backend, fastpath_backend, "activation_backward_amax", dy, x,
                                         activation, out_dtype=dtype)
    assert_identical(ref, fast, f"activation_backward_amax {activation} {dtype} {shape}")
    sfx = aq._SUFFIX[dtype]
    assert launched == [f"act_amax_fwd_{activation}_{sfx}", f"act_amax_bwd_{activation}_{sfx}"]


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["gelu", "relu", "silu", "sigmoid"])
def test_activation_backward_dbias_amax(activation, dtype, shape, cuda, reference_backend, fastpath_backend):
    x, dy = inputs(shape, dtype, cuda, seed=10), inputs(shape, dtype, cuda, seed=11)
    (ref, _, _), (fast, _, _) = run_both(reference_backend, fastpath_backend, "activation_backward_dbias_amax", dy,
                                         x, activation, out_dtype=dtype)
    what = f"activation_backward_dbias_amax {activation} {dtype} {shape}"
    assert_identical(ref[:2], fast[:2], what)
    # Current scaling sums the values rounded to the compute dtype: the reference's dx.
    assert_dbias_within_fp32_summation(fast[2], ref[2], ref[0], what + " dbias")


@pytest.mark.parametrize("method", ["activation_cast_float8", "activation_amax", "activation_backward_dbias_amax",
                                    "activation_backward_dbias_cast_float8"])
def test_non_contiguous_and_unaligned_inputs(method, cuda, reference_backend, fastpath_backend):
    """A transposed view and a view at an odd element offset (pointer not 16-byte aligned)."""
    base = make_input((64, 136), torch.bfloat16, cuda, "edge", seed=12)
    views = {"transposed": base[:, :64].t(), "offset": base.reshape(-1)[1:1 + 65 * 128].reshape(65, 128)}
    for name, x in views.items():
        backward = "backward" in method
        dy = make_input(tuple(x.shape), torch.bfloat16, cuda, "plain", seed=13)
        args = (dy, x) if backward else (x,)
        if "cast" in method:
            kwargs = cast_kwargs((E4M3, True, True), cuda)
            if backward:
                kwargs["out_dtype"] = torch.bfloat16
        else:
            kwargs = {"out_dtype": torch.bfloat16}
        (ref, _, _), (fast, _, _) = run_both(reference_backend, fastpath_backend, method, *args, "gelu", **kwargs)
        exact = ref[:-1] if "dbias" in method else ref
        assert_identical(exact, fast[:len(exact)], f"{method}, {name} input")
        if "dbias" in method:  # summed from the rounded dx (current scaling) or the fp32 values (delayed)
            with refops.use_backend(reference_backend):
                v = reference_backend.activation_backward(dy.float(), x.float(), "gelu")
            summands = ref[0] if "amax" in method else v
            assert_dbias_within_fp32_summation(fast[-1], ref[-1], summands, f"{method}, {name} input, dbias")


def test_gated_activations_run_the_composition(cuda, reference_backend, fastpath_backend, monkeypatch):
    """Gated activations are not fused: the fast path composes its own activation and cast kernels, bit for bit."""
    launched = launched_kernels(monkeypatch)
    x = make_input((32, 64), torch.bfloat16, cuda, "plain", seed=14)
    (ref, _, _), (fast, _, _) = run_both(reference_backend, fastpath_backend, "activation_cast_float8", x, "swiglu",
                                         **cast_kwargs((E4M3, True, True), cuda))
    assert_identical(ref, fast, "activation_cast_float8 swiglu")
    assert launched == []


# ------------------------------------------------------------------ any machine (no GPU)
def test_fused_groups_match_the_source():
    """activation_quantize.FUSED_GROUPS numbers the `#if FUSED_ENABLED(k)` blocks of activation_quantize.cu, and
    every unary activation has its block (the gated ones stay unfused)."""
    source = (_cuda.KERNEL_DIR / aq.KERNEL_FILE).read_text()
    found = dict(re.findall(r"#if FUSED_ENABLED\((\d+)\)\nDEFINE_FUSED\((\w+),", source))
    assert {name: int(k) for k, name in found.items()} == aq.FUSED_GROUPS
    assert set(aq.FUSED_GROUPS) == set(UNARY_ACTIVATIONS)


METHODS = {
    "activation_cast_float8": lambda dy, x, kw: ((x, "gelu"), kw),
    "activation_backward_cast_float8": lambda dy, x, kw: ((dy, x, "gelu"), kw),
    "activation_backward_dbias_cast_float8": lambda dy, x, kw: ((dy, x, "gelu"), {**kw, "out_dtype": x.dtype}),
    "activation_amax": lambda dy, x, kw: ((x, "gelu"), {"out_dtype": x.dtype}),
    "activation_backward_amax": lambda dy, x, kw: ((dy, x, "gelu"), {"out_dtype": x.dtype}),
    "activation_backward_dbias_amax": lambda dy, x, kw: ((dy, x, "gelu"), {"out_dtype": x.dtype}),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_cpu_tensors_fall_back_to_the_reference(method):
    """On CPU every fused method is the reference's composition, bit for bit (no CuPy needed)."""
    cpu = torch.device("cpu")
    x, dy = make_input((6, 32), torch.bfloat16, cpu, "edge"), make_input((6, 32), torch.bfloat16, cpu, seed=1)
    results = []
    for backend in (FastpathKernels(), ReferenceKernels()):
        kw = dict(scale=torch.tensor([3.0]), fp8_dtype=E4M3, rowwise=True, columnwise=True,
                  amax_accumulator=torch.tensor([ACCUMULATOR]))
        args, kwargs = METHODS[method](dy, x, kw)
        results.append((getattr(backend, method)(*args, **kwargs), kwargs.get("amax_accumulator")))
    assert_identical(results[1][0], results[0][0], method)
    assert_identical(results[1][1], results[0][1], method + " amax_accumulator")


def test_fused_module_compiles_like_the_activation_kernels(monkeypatch):
    """The fused kernels must compute the activation kernels' bits: same NVRTC options (FMA contraction on,
    subnormals kept), one activation's group at a time, shared headers inlined."""
    from test_nvrtc_compile import _fake_cupy

    from fastpath.elementwise import ACTIVATION_COMPILE_OPTIONS

    calls: dict = {}
    _fake_cupy(monkeypatch, calls)
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    aq._module.cache_clear()
    try:
        aq._module("gelu", 1)
    finally:
        aq._module.cache_clear()  # the fake module must not outlive this test
    assert calls["filename"] == aq.KERNEL_FILE and calls["device"] == 1
    assert calls["source"].startswith(f"#define FUSED_GROUP {aq.FUSED_GROUPS['gelu']}\n")
    assert '#include "' not in calls["source"] and "struct Gelu" in calls["source"]
    assert all(o in calls["options"] for o in ACTIVATION_COMPILE_OPTIONS), calls["options"]
