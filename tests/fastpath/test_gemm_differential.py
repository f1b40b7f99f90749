"""Fast-path GEMMs against the reference backend on the same GPU.

Plain operands: cuBLAS in the operands' dtype (fp32 accumulation, reduced-precision
reductions off) vs the reference's IEEE fp32 GEMM, within one output rounding plus
the worst-case difference of two fp32 accumulation orders (:func:`assert_one_rounding_apart`).
Per-tensor FP8 and FP8 block-scaled operands: ``torch._scaled_mm`` vs the exact fp32
product of the dequantized values, within E4M3 tolerance; every other quantized operand:
the backend's dequantization then cuBLAS, within the recipe's tolerance. The GEMM path
taken must be the one ``GEMM_PATHS`` lists.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

import refops
from fastpath.backend import FastpathKernels
from fastpath.gemm import (
    _REDUCED_PRECISION_FLAGS,
    GEMM_PATHS,
    GemmPath,
    _fp32_accumulation,
    _reduction_setting,
    gemm_path,
)
from refops.kernels import ReferenceKernels
from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from refops.testing import RECIPE_NAMES, quantization_tols
from refops.testing.tensor_report import compare_tensors

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def make(shape, dtype, device, *, seed=0, scale=1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


def run_both(reference_backend, fastpath_backend, *args: Any, **kwargs: Any):
    with refops.use_backend(reference_backend) as ref:
        expected = ref.gemm(*args, **kwargs)
    with refops.use_backend(fastpath_backend) as fast:
        actual = fast.gemm(*args, **kwargs)
    torch.cuda.synchronize()
    return actual, expected


def assert_close(actual, expected, what, *, rtol, atol) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    result = compare_tensors(what, actual, expected, tier="tolerance", rtol=rtol, atol=atol)
    if not result.passed:
        i = result.first_mismatches[0]
        raise AssertionError(f"{result}; at {i}: fastpath {actual[i].item()!r} vs reference {expected[i].item()!r}")


U32 = 2.0 ** -24  # unit roundoff of fp32


def accumulation_bound(a: torch.Tensor, b: torch.Tensor, *, alpha: float = 1.0,
                       out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Element-wise bound on |fast - reference| of ``alpha * a @ b (+ out)`` in fp32, before the output rounding.

    Both sides sum the same K exact-or-once-rounded products in fp32, in different orders
    (cuBLAS's tiles and split-K vs the reference's SGEMM). Any order of a K-term dot product
    in IEEE fp32 is within gamma_K * sum_k |a_ik b_kj| (gamma_K ~ K u, Higham, "Accuracy and
    Stability of Numerical Algorithms", 3.1) of the exact value: K u for the reference, and
    2 K u for the fast path, whose tensor cores may align addends by truncation (an error of
    up to one ulp instead of half). Each side then rounds up to twice more (times alpha, plus
    out): 4 u of the magnitude. So |fast32 - ref32| <= (3 K + 4) u (|alpha| |a| @ |b| + |out|).
    A worst case: it grows like K sum|a b| while real order noise grows like sqrt(K). For
    K <= 128 (most cases here) it is a fraction of an fp16 ulp on elements of typical
    magnitude, where a reduced-precision reduction (fp16 partial sums, each off by up to
    2^-11 of the partial sum; disabled in the fast path) shows up as 2 or more ulps; at
    K = 1024 it allows a few ulps.
    """
    a64, b64 = a.detach().double().cpu().abs(), b.detach().double().cpu().abs()
    magnitude = abs(alpha) * (a64 @ b64)
    if out is not None:
        magnitude = magnitude + out.detach().double().cpu().abs()
    return (3 * a64.shape[1] + 4) * U32 * magnitude


def spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance between consecutive ``dtype`` values at each of ``values`` (float64): its ulp."""
    finfo = torch.finfo(dtype)
    magnitude = values.abs().clamp_min(finfo.smallest_normal)  # subnormals are evenly spaced
    return torch.exp2(torch.floor(torch.log2(magnitude))) * finfo.eps


def assert_one_rounding_apart(actual: torch.Tensor, expected: torch.Tensor, bound32: torch.Tensor,
                              what: str) -> None:
    """``|actual - expected| <= bound32 + (ulp(actual) + ulp(expected)) / 2`` element-wise.

    Both are fp32 values at most ``bound32`` apart, each rounded once to the output dtype
    (half an ulp each): two roundings of nearly equal values can land one ulp apart, so a
    1-ulp difference is expected and allowed, a 2-ulp one (beyond bound32) is not.
    """
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    bound = bound32 + 0.5 * (spacing(a, actual.dtype) + spacing(e, actual.dtype))
    bad = ((a - e).abs() > bound) | (torch.isnan(a) != torch.isnan(e))
    if bad.any():
        i = tuple(int(j) for j in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {a.numel()} elements differ by more than one {actual.dtype} rounding "
            f"plus fp32 accumulation-order error; first at {i}: fastpath {a[i].item()!r} vs reference "
            f"{e[i].item()!r} (|diff| {abs(a[i] - e[i]).item():.3e} > bound {bound[i].item():.3e}, "
            f"of which fp32 accumulation {bound32[i].item():.3e})")


# -------------------------------------------------------------------- plain
@pytest.mark.parametrize("m,k,n", [(64, 128, 32), (17, 33, 9), (1, 256, 1), (256, 1024, 256)], ids=str)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_plain_gemm(dtype, trans_a, trans_b, m, k, n, cuda, reference_backend, fastpath_backend):
    a = make((k, m) if trans_a else (m, k), dtype, cuda)
    b = make((n, k) if trans_b else (k, n), dtype, cuda, seed=1)
    kw = dict(trans_a=trans_a, trans_b=trans_b, out_dtype=dtype)
    y, y_ref = run_both(reference_backend, fastpath_backend, a, b, **kw)
    bound32 = accumulation_bound(a.t() if trans_a else a, b.t() if trans_b else b)
    assert_one_rounding_apart(y, y_ref, bound32, f"{dtype} gemm")
    assert gemm_path(a, b, trans_a=trans_a, trans_b=trans_b) == "cublas"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_fp32_result_of_16bit_operands_reads_them_directly(dtype, alpha, cuda, reference_backend, fastpath_backend,
                                                          monkeypatch):
    """The one-rounding fusions ask for fp32 results of 16-bit GEMMs: cuBLAS reads the 16-bit operands and
    writes fp32 (no fp32 GEMM of upcast operands), within fp32 accumulation order of the reference."""
    import fastpath.gemm as fast_gemm

    calls = []
    real = fast_gemm._mm_fp32_out
    monkeypatch.setattr(fast_gemm, "_mm_fp32_out", lambda a2, b2: calls.append(a2.dtype) or real(a2, b2))
    a, b = make((64, 256), dtype, cuda), make((96, 256), dtype, cuda, seed=1)
    y, y_ref = run_both(reference_backend, fastpath_backend, a, b, trans_b=True, out_dtype=torch.float32, alpha=alpha)
    assert calls == [dtype] and y.dtype == torch.float32
    assert_one_rounding_apart(y, y_ref, accumulation_bound(a, b.t(), alpha=alpha), f"{dtype} -> fp32 gemm")
    with refops.use_backend(reference_backend):
        qx = quantizer("mxfp8", "input", cuda)(a.to(torch.bfloat16))
        qw = quantizer("mxfp8", "weight", cuda)(b.to(torch.bfloat16))
    calls.clear()
    y, y_ref = run_both(reference_backend, fastpath_backend, qx, qw, trans_b=True, out_dtype=torch.float32)
    assert calls == [torch.bfloat16] and y.dtype == torch.float32
    # MXFP8 values are exact in bf16 (3 mantissa bits times a power of two): only the order of the sums differs.
    assert_one_rounding_apart(y, y_ref, accumulation_bound(qx.dequantize().float(), qw.dequantize().float().t()),
                              "mxfp8 -> fp32 gemm")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_plain_gemm_alpha_out_accumulate(dtype, cuda, reference_backend, fastpath_backend):
    a, b = make((48, 64), dtype, cuda), make((80, 64), dtype, cuda, seed=1)
    y, y_ref = run_both(reference_backend, fastpath_backend, a, b, trans_b=True, out_dtype=dtype, alpha=0.5)
    assert_one_rounding_apart(y, y_ref, accumulation_bound(a, b.t(), alpha=0.5), "alpha=0.5")
    start = make((48, 80), dtype, cuda, seed=2)
    out, out_ref = start.clone(), start.clone()
    with refops.use_backend(reference_backend) as ref:
        returned_ref = ref.gemm(a, b, trans_b=True, out_dtype=dtype, alpha=2.0, out=out_ref, accumulate=True)
    with refops.use_backend(fastpath_backend) as fast:
        returned = fast.gemm(a, b, trans_b=True, out_dtype=dtype, alpha=2.0, out=out, accumulate=True)
    assert returned is out and returned_ref is out_ref
    assert_one_rounding_apart(out, out_ref, accumulation_bound(a, b.t(), alpha=2.0, out=start), "out += 2 a b^T")
    out = torch.full((48, 80), float("nan"), dtype=dtype, device=cuda)
    with refops.use_backend(fastpath_backend) as fast:
        fast.gemm(a, b, trans_b=True, out_dtype=dtype, out=out)
    # y_ref * 2 is the reference's a b^T exactly: scaling by a power of two commutes with rounding.
    assert_one_rounding_apart(out, y_ref * 2, accumulation_bound(a, b.t()), "out = a b^T (NaN in out ignored)")


def test_plain_gemm_into_fp32_main_grad(cuda, reference_backend, fastpath_backend):
    """bf16 operands accumulated into an fp32 buffer (wgrad into main_grad): the reference's arithmetic."""
    dy, x = make((128, 64), torch.bfloat16, cuda), make((128, 32), torch.bfloat16, cuda, seed=1)
    main, main_ref = torch.ones(64, 32, device=cuda), torch.ones(64, 32, device=cuda)
    with refops.use_backend(reference_backend) as ref:
        ref.gemm(dy, x, trans_a=True, out_dtype=torch.float32, out=main_ref, accumulate=True)
    with refops.use_backend(fastpath_backend) as fast:
        fast.gemm(dy, x, trans_a=True, out_dtype=torch.float32, out=main, accumulate=True)
    bound32 = accumulation_bound(dy.t(), x, out=torch.ones(64, 32))
    assert_one_rounding_apart(main, main_ref, bound32, "main_grad += dy^T x")


# ---------------------------------------------------------- quantized operands
def quantizer(recipe_name: str, role: str, device: torch.device):
    """A fresh quantizer with both usages: E4M3 for x/w, E5M2 for grads (HYBRID) on per-tensor FP8."""
    fp8 = DType.kFloat8E5M2 if role == "grad" else DType.kFloat8E4M3
    if recipe_name in ("fp8_delayed_scaling", "fp8_current_scaling"):
        return Float8CurrentScalingQuantizer(fp8, device)
    if recipe_name == "mxfp8":
        return MXFP8Quantizer(DType.kFloat8E4M3)
    if recipe_name == "fp8_block_scaling":
        return Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True,
                                    block_scaling_dim=2 if role == "weight" else 1)
    if recipe_name == "nvfp4_4over6":
        return NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256)
    return NVFP4Quantizer()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_quantized_linear_gemms(recipe_name, dtype, cuda, reference_backend, fastpath_backend):
    """fprop y = x W^T, dgrad dx = dy W, wgrad dW = dy^T x with the recipe's operands."""
    if recipe_name.startswith("nvfp4") and dtype != torch.bfloat16:
        pytest.skip("NVFP4 is tested in bf16 only (as in TE)")
    tokens, hidden, ffn = 128, 256, 128
    x, w = make((tokens, hidden), dtype, cuda), make((ffn, hidden), dtype, cuda, seed=1, scale=0.1)
    dy = make((tokens, ffn), dtype, cuda, seed=2, scale=0.1)
    with refops.use_backend(reference_backend):  # the operands: identical bytes for both GEMMs
        qx = quantizer(recipe_name, "input", cuda)(x)
        qw = quantizer(recipe_name, "weight", cuda)(w)
        qdy = quantizer(recipe_name, "grad", cuda)(dy)
    tols = quantization_tols(recipe_name)
    expected_path = GEMM_PATHS[recipe_name].path
    for what, a, b, kw, k in [
        ("fprop", qx, qw, dict(trans_b=True), hidden),
        ("dgrad", qdy, qw, {}, ffn),
        ("wgrad", qdy, qx, dict(trans_a=True), tokens),
    ]:
        y, y_ref = run_both(reference_backend, fastpath_backend, a, b, out_dtype=dtype, **kw)
        scale = y_ref.float().abs().amax().item()
        assert_close(y, y_ref, f"{recipe_name} {what}", rtol=tols["rtol"], atol=tols["atol"] * max(scale, 1e-3))
        assert gemm_path(a, b, **kw) == expected_path, what


@pytest.mark.parametrize("recipe_name", ["fp8_current_scaling", "mxfp8"])
def test_quantized_gemm_alpha_and_accumulate(recipe_name, cuda, reference_backend, fastpath_backend):
    x, w = make((64, 128), torch.bfloat16, cuda), make((32, 128), torch.bfloat16, cuda, seed=1)
    with refops.use_backend(reference_backend):
        qx, qw = quantizer(recipe_name, "input", cuda)(x), quantizer(recipe_name, "weight", cuda)(w)
    tols = quantization_tols(recipe_name)
    start = make((64, 32), torch.float32, cuda, seed=3)
    out, out_ref = start.clone(), start.clone()
    with refops.use_backend(reference_backend) as ref:
        ref.gemm(qx, qw, trans_b=True, out_dtype=torch.float32, alpha=0.25, out=out_ref, accumulate=True)
    with refops.use_backend(fastpath_backend) as fast:
        fast.gemm(qx, qw, trans_b=True, out_dtype=torch.float32, alpha=0.25, out=out, accumulate=True)
    assert_close(out, out_ref, f"{recipe_name}: out += 0.25 x W^T", rtol=tols["rtol"], atol=tols["atol"])


@pytest.mark.parametrize("recipe_name", ["fp8_current_scaling", "mxfp8", "nvfp4"])
def test_nd_quantized_operands_flatten_like_the_reference(recipe_name, cuda, reference_backend, fastpath_backend):
    """A 3-D quantized input (a LayerNorm output with the input's leading dims) is (rows, last dim)."""
    x, w = make((2, 64, 256), torch.bfloat16, cuda), make((128, 256), torch.bfloat16, cuda, seed=1, scale=0.1)
    dy = make((2, 64, 128), torch.bfloat16, cuda, seed=2, scale=0.1)
    with refops.use_backend(reference_backend):
        qx, qw = quantizer(recipe_name, "input", cuda)(x), quantizer(recipe_name, "weight", cuda)(w)
        qdy = quantizer(recipe_name, "grad", cuda)(dy)
    tols = quantization_tols(recipe_name)
    for what, a, b, kw in [("fprop", qx, qw, dict(trans_b=True)), ("wgrad", qdy, qx, dict(trans_a=True)),
                           ("dgrad", qdy, qw, {})]:
        y, y_ref = run_both(reference_backend, fastpath_backend, a, b, out_dtype=torch.bfloat16, **kw)
        scale = y_ref.float().abs().amax().item()
        assert_close(y, y_ref, f"{recipe_name} 3-D {what}", rtol=tols["rtol"], atol=tols["atol"] * max(scale, 1e-3))
        assert gemm_path(a, b, **kw) == GEMM_PATHS[recipe_name].path, what


def test_fp8_shapes_cublas_cannot_take_are_dequantized(cuda, reference_backend, fastpath_backend):
    """Dims not multiples of 16, and E5M2 x E5M2, take dequantize + cuBLAS and still match."""
    x, w = make((24, 40), torch.bfloat16, cuda), make((8, 40), torch.bfloat16, cuda, seed=1)
    with refops.use_backend(reference_backend):
        qx, qw = quantizer("fp8_current_scaling", "input", cuda)(x), quantizer("fp8_current_scaling", "w", cuda)(w)
        g1 = quantizer("fp8_current_scaling", "grad", cuda)(make((32, 64), torch.bfloat16, cuda, seed=2))
        g2 = quantizer("fp8_current_scaling", "grad", cuda)(make((48, 64), torch.bfloat16, cuda, seed=3))
    tols = quantization_tols("fp8_current_scaling")
    for what, a, b in [("24x40x8", qx, qw), ("e5m2 x e5m2", g1, g2)]:
        assert gemm_path(a, b, trans_b=True) == "dequantize+cublas", what
        y, y_ref = run_both(reference_backend, fastpath_backend, a, b, trans_b=True, out_dtype=torch.bfloat16)
        assert_close(y, y_ref, what, rtol=tols["rtol"], atol=tols["atol"])


def test_missing_usage_raises_the_reference_error(cuda, reference_backend, fastpath_backend):
    q = quantizer("fp8_current_scaling", "input", cuda)
    q.set_usage(rowwise=True, columnwise=False)
    with refops.use_backend(reference_backend):
        qx = q(make((32, 64), torch.bfloat16, cuda))
    errors = []
    for backend in (reference_backend, fastpath_backend):
        with refops.use_backend(backend) as kernels, pytest.raises(ValueError) as info:
            kernels.gemm(qx, qx, trans_a=True, out_dtype=torch.bfloat16)
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "columnwise" in errors[0]


# ------------------------------------------------------- any machine (no GPU)
def test_gemm_paths_cover_every_recipe():
    assert set(GEMM_PATHS) == set(RECIPE_NAMES) | {"none"}
    assert all(isinstance(p, GemmPath) and p.path in ("cublas", "scaled_mm", "dequantize+cublas") and p.reason
               for p in GEMM_PATHS.values())
    assert GEMM_PATHS["fp8_current_scaling"].path == GEMM_PATHS["fp8_block_scaling"].path == "scaled_mm"
    assert GEMM_PATHS["mxfp8"].path == GEMM_PATHS["nvfp4"].path == "dequantize+cublas"


def _cublas_settings() -> dict[str, Any]:
    matmul = torch.backends.cuda.matmul
    settings = {name: _reduction_setting(name) for name in _REDUCED_PRECISION_FLAGS}
    settings["allow_tf32"] = matmul.allow_tf32
    settings["allow_fp16_accumulation"] = getattr(matmul, "allow_fp16_accumulation", None)
    return settings


@pytest.mark.parametrize("caller", ["defaults", "non-defaults"])
def test_plain_gemms_run_with_fp32_accumulation_and_restore_the_callers_settings(caller):
    """Inside the fast path's cuBLAS call: no TF32, no fp16/bf16 reduced-precision reduction, no fp16
    accumulation; afterwards (also after an error) exactly the caller's settings, split-K part included."""
    matmul = torch.backends.cuda.matmul
    before = _cublas_settings()
    try:
        if caller == "non-defaults":  # every switch the other way, where torch has it
            matmul.allow_tf32 = True
            for name in _REDUCED_PRECISION_FLAGS:
                setting = _reduction_setting(name)
                setattr(matmul, name, (False, False) if isinstance(setting, tuple) else False)
            if before["allow_fp16_accumulation"] is not None:
                matmul.allow_fp16_accumulation = True
        callers = _cublas_settings()
        with pytest.raises(RuntimeError, match="inside"), _fp32_accumulation():
            inside = _cublas_settings()
            raise RuntimeError("inside")
        assert inside["allow_tf32"] is False
        for name in _REDUCED_PRECISION_FLAGS:
            allow = inside[name][0] if isinstance(inside[name], tuple) else inside[name]
            assert allow is False, (name, inside[name])
            if isinstance(callers[name], tuple):  # split-K itself is left as the caller had it
                assert inside[name][1] == callers[name][1], name
        assert inside["allow_fp16_accumulation"] in (False, None)
        assert _cublas_settings() == callers
    finally:
        matmul.allow_tf32 = before["allow_tf32"]
        for name in _REDUCED_PRECISION_FLAGS:
            setattr(matmul, name, before[name])
        if before["allow_fp16_accumulation"] is not None:
            matmul.allow_fp16_accumulation = before["allow_fp16_accumulation"]


def test_one_rounding_bound_allows_one_ulp_and_rejects_four():
    """The plain-GEMM criterion on the failure it was written for: fp16 4 ulps apart at -0.327 fails."""
    expected = torch.tensor([-0.3271484375, 1.0, 1000.0], dtype=torch.float16)
    one_ulp = torch.tensor([-0.3271484375 + 2.0 ** -12, 1.0 - 2.0 ** -11, 1000.5], dtype=torch.float16)
    assert_one_rounding_apart(one_ulp, expected, torch.zeros(3, dtype=torch.float64), "1 ulp")
    four_ulps = torch.tensor([-0.326171875, 1.0, 1000.0], dtype=torch.float16)
    with pytest.raises(AssertionError, match=r"first at \(0,\): fastpath -0.326171875 vs reference -0.3271484375"):
        assert_one_rounding_apart(four_ulps, expected, torch.full((3,), 1e-4, dtype=torch.float64), "4 ulps")


def test_accumulation_bound_is_the_fp32_error_of_a_dot_product():
    """(3 K + 4) u sum |a b|: K = 2 terms 1 and 1 give 10 u * 2; alpha and out scale as the magnitude."""
    a, b = torch.ones(1, 2), torch.ones(2, 1)
    assert accumulation_bound(a, b).item() == 10 * U32 * 2
    assert accumulation_bound(-a, b, alpha=-0.5, out=torch.full((1, 1), -3.0)).item() == 10 * U32 * (1 + 3)


def test_cpu_operands_fall_back_to_the_reference():
    fast, ref = FastpathKernels(), ReferenceKernels()
    a, b = make((8, 16), torch.float32, "cpu"), make((4, 16), torch.float32, "cpu", seed=1)
    assert torch.equal(fast.gemm(a, b, trans_b=True, out_dtype=torch.float32),
                       ref.gemm(a, b, trans_b=True, out_dtype=torch.float32))
    qx = Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(a)
    assert gemm_path(qx, qx, trans_b=True) == "dequantize+cublas"  # not CUDA: no _scaled_mm
    assert torch.equal(fast.gemm(qx, qx, trans_b=True, out_dtype=torch.float32),
                       ref.gemm(qx, qx, trans_b=True, out_dtype=torch.float32))


# ------------------------------------------------------------ bias epilogue
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("alpha", [1.0, 0.5])
@pytest.mark.parametrize("m,k,n", [(64, 128, 96), (17, 33, 9), (256, 1024, 256)], ids=str)
def test_plain_gemm_bias_epilogue(dtype, alpha, m, k, n, cuda, reference_backend, fastpath_backend, monkeypatch):
    """``gemm(..., bias=)``: 16-bit results take cuBLAS's bias epilogue (one ``addmm``), within one rounding of
    the reference's fp32 ``alpha * a @ b + bias``."""
    calls = []
    real_addmm = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *args, **kw: calls.append(args[0] is bias) or real_addmm(*args, **kw))
    a, b = make((m, k), dtype, cuda), make((n, k), dtype, cuda, seed=1)
    bias = make((n,), dtype, cuda, seed=2, scale=4.0)
    y, y_ref = run_both(reference_backend, fastpath_backend, a, b, trans_b=True, out_dtype=dtype, alpha=alpha,
                        bias=bias)
    bound32 = accumulation_bound(a, b.t(), alpha=alpha, out=bias.expand(m, n)) + 2 * U32 * bias.double().cpu().abs()
    assert_one_rounding_apart(y, y_ref, bound32, f"{dtype} gemm + bias")
    assert (True in calls) == (dtype != torch.float32)  # fp32: the fp32 GEMM, then the bias added in fp32


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_quantized_gemm_bias(recipe_name, bias_dtype, cuda, reference_backend, fastpath_backend):
    """The fused Linear+Bias forward's GEMM: bf16 result, bias in the epilogue (``_scaled_mm(bias=)`` for
    per-tensor FP8), the same as the fast path's fp32 result plus the bias, rounded once."""
    x, w = make((128, 256), torch.bfloat16, cuda), make((128, 256), torch.bfloat16, cuda, seed=1, scale=0.1)
    bias = make((128,), bias_dtype, cuda, seed=2)
    with refops.use_backend(reference_backend):
        qx = quantizer(recipe_name, "input", cuda)(x)
        qw = quantizer(recipe_name, "weight", cuda)(w)
    tols = quantization_tols(recipe_name)
    y, y_ref = run_both(reference_backend, fastpath_backend, qx, qw, trans_b=True, out_dtype=torch.bfloat16,
                        bias=bias)
    scale = y_ref.float().abs().amax().item()
    assert_close(y, y_ref, f"{recipe_name} fprop + bias", rtol=tols["rtol"], atol=tols["atol"] * max(scale, 1e-3))
    with refops.use_backend(fastpath_backend) as fast:
        wide = fast.gemm(qx, qw, trans_b=True, out_dtype=torch.float32)
    unfused = (wide + bias.float()).to(torch.bfloat16)
    # cuBLAS's epilogue and the separate add see the same fp32 accumulator (up to accumulation order)
    assert_close(y, unfused, f"{recipe_name} fprop + bias vs fp32 + bias", rtol=2.0 ** -7, atol=1e-6 * scale)


def test_gemm_bias_of_another_size_is_the_references_error(cuda, fastpath_backend):
    a, b = make((16, 32), torch.bfloat16, cuda), make((8, 32), torch.bfloat16, cuda, seed=1)
    with pytest.raises(ValueError, match="bias must be 1-D with 8"):
        fastpath_backend.gemm(a, b, trans_b=True, out_dtype=torch.bfloat16, bias=make((7,), torch.bfloat16, cuda))
