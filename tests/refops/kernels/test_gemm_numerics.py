"""refops.gemm_numerics: the exact and hopper GEMM numerics, and the GemmOperand seam (issue #26).

The context itself (entering, leaving, threads, misuse) needs no mmaemu: ``test_gemm_numerics_context.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import refops
from refops import ops
from refops.kernels import GemmOperand, HopperGemmError, get_backend, gemm_numerics
from refops.kernels.gemm_numerics import SPLIT_ACCUMULATOR, gemm_role
from refops.kernels.reference.gemm_hopper import round_to_tf32
from refops.recipe import DelayedScaling, Float8CurrentScaling

mmaemu = pytest.importorskip("mmaemu")

E4M3, E5M2 = refops.DType.kFloat8E4M3, refops.DType.kFloat8E5M2


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def fp8(shape, seed, fp8_dtype=E4M3, delayed=False):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * (1 + seed % 3)
    if delayed:
        scale = torch.tensor([2.0 ** (seed % 5)])
        q = refops.Float8Quantizer(scale, torch.zeros(1), fp8_dtype)
    else:
        q = refops.Float8CurrentScalingQuantizer(fp8_dtype)
    return q(x)


def ref_gemm(a, b, numerics, **kwargs):
    with gemm_numerics(numerics):
        return get_backend("reference").gemm(a, b, **kwargs)


def test_roles_follow_te_layouts_and_recipes():
    assert gemm_role(None, trans_a=False, trans_b=True) == "fprop"
    assert gemm_role(None, trans_a=False, trans_b=False) == "dgrad"
    assert gemm_role(None, trans_a=True, trans_b=False) == "wgrad"
    with pytest.raises(ValueError, match="role"):
        gemm_role("forward", trans_a=False, trans_b=True)
    # DelayedScaling has no fp8_gemm_* fields: TE's modules hard-code the same choice (_2X_ACC_FPROP = False,
    # _2X_ACC_DGRAD = _2X_ACC_WGRAD = True)
    recipe = Float8CurrentScaling()
    for role in ("fprop", "dgrad", "wgrad"):
        assert getattr(recipe, f"fp8_gemm_{role}").use_split_accumulator == SPLIT_ACCUMULATOR[role]


# ------------------------------------------------------------------ hopper against mmaemu
CASES = {  # role: (a shape, b shape, trans_a, trans_b, a format, b format)
    "fprop": ((32, 64), (48, 64), False, True, E4M3, E4M3),
    "dgrad": ((32, 48), (48, 64), False, False, E5M2, E4M3),
    "wgrad": ((32, 48), (32, 64), True, False, E5M2, E4M3),
}


@pytest.mark.parametrize("delayed", [False, True], ids=["current", "delayed"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("role", sorted(CASES))
def test_hopper_mode_is_mmaemu_with_the_roles_accumulation(role, out_dtype, delayed):
    sa, sb, ta, tb, fa, fb = CASES[role]
    a, b = fp8(sa, 1, fa, delayed), fp8(sb, 2, fb, delayed)
    got = ref_gemm(a, b, "hopper", trans_a=ta, trans_b=tb, out_dtype=out_dtype)
    # mmaemu called directly: mat1 (M, K) row-major, mat2 (K, N) column-major, bytes with the contracted dim last
    mat1 = (a._transpose if ta else a._data).reshape(-1, sa[0] if ta else sa[1]).view(
        torch.float8_e5m2 if fa == E5M2 else torch.float8_e4m3fn)
    mat2 = (b._data if tb else b._transpose).reshape(-1, sb[1] if tb else sb[0]).view(
        torch.float8_e5m2 if fb == E5M2 else torch.float8_e4m3fn).t()
    fast = role == "fprop"
    want = mmaemu.scaled_mm(mat1, mat2, a._scale_inv.reshape(()), b._scale_inv.reshape(()), out_dtype=out_dtype,
                            use_fast_accum=fast, splitk=1)
    assert torch.equal(bits(got), bits(want))
    other = mmaemu.scaled_mm(mat1, mat2, a._scale_inv.reshape(()), b._scale_inv.reshape(()), out_dtype=out_dtype,
                             use_fast_accum=not fast, splitk=1)
    explicit = ref_gemm(a, b, "hopper", trans_a=ta, trans_b=tb, out_dtype=out_dtype,
                        role="dgrad" if fast else "fprop")
    assert torch.equal(bits(explicit), bits(other))


def test_fast_accumulation_matters_on_a_long_k():
    a, b = fp8((16, 1024), 3), fp8((16, 1024), 4)
    fprop = ref_gemm(a, b, "hopper", trans_b=True, out_dtype=torch.float32, role="fprop")
    dgrad = ref_gemm(a, b, "hopper", trans_b=True, out_dtype=torch.float32, role="dgrad")
    exact = ref_gemm(a, b, "exact", trans_b=True, out_dtype=torch.float32)
    assert not torch.equal(fprop, dgrad)
    assert (fprop != exact).float().mean() > 0.5
    exact64 = a.dequantize(dtype=torch.float64) @ b.dequantize(dtype=torch.float64).t()
    # the split accumulator is the closer of the two, and both are close
    assert (dgrad - exact64).abs().max() <= (fprop - exact64).abs().max()
    torch.testing.assert_close(fprop.double(), exact64, rtol=1e-2, atol=1e-2 * exact64.abs().max().item())


def test_hopper_mode_takes_gemm_operands_directly_and_exact_mode_too():
    a, b = fp8((16, 32), 5), fp8((16, 32), 6)
    oa, ob = a.gemm_operand("rowwise"), b.gemm_operand("rowwise")
    assert isinstance(oa, GemmOperand) and oa.format == "float8" and oa.shape == (16, 32) and oa.contracted == 32
    for numerics in ("exact", "hopper"):
        assert torch.equal(ref_gemm(oa, ob, numerics, trans_b=True, out_dtype=torch.float32),
                           ref_gemm(a, b, numerics, trans_b=True, out_dtype=torch.float32))


def test_alpha_and_accumulate_are_applied_in_fp32_after_the_tensor_core():
    a, b = fp8((16, 32), 7), fp8((16, 32), 8)
    base = ref_gemm(a, b, "hopper", trans_b=True, out_dtype=torch.float32)
    out = torch.full((16, 16), 0.5)
    got = ref_gemm(a, b, "hopper", trans_b=True, out_dtype=torch.float32, alpha=2.0, out=out.clone(), accumulate=True)
    assert torch.equal(got, base * 2.0 + 0.5)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_a_bias_is_added_to_the_tensor_core_s_fp32_result_before_the_one_rounding(out_dtype):
    """The bias keyword of gemm (the fused Linear+Bias forward) reaches hopper mode too: tensor core result in
    fp32, plus the bias in fp32, one rounding; never dropped."""
    a, b = fp8((16, 32), 9), fp8((16, 32), 10)
    bias = torch.randn(16, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    wide = ref_gemm(a, b, "hopper", trans_b=True, out_dtype=torch.float32)
    got = ref_gemm(a, b, "hopper", trans_b=True, out_dtype=out_dtype, bias=bias)
    assert torch.equal(bits(got), bits((wide + bias.float()).to(out_dtype)))
    assert not torch.equal(got.float(), ref_gemm(a, b, "hopper", trans_b=True, out_dtype=out_dtype).float())


# ------------------------------------------------------------------ refusals
def test_k_not_a_multiple_of_16_is_refused_in_hopper_mode_only():
    a, b = fp8((16, 24), 9), fp8((16, 24), 10)
    with pytest.raises(HopperGemmError, match="multiple of 16"):
        ref_gemm(a, b, "hopper", trans_b=True, out_dtype=torch.float32)
    ref_gemm(a, b, "exact", trans_b=True, out_dtype=torch.float32)  # exact mode computes it


def test_other_formats_are_refused_naming_the_scope():
    x = torch.randn(32, 64)
    a = refops.MXFP8Quantizer(E4M3)(x)
    with pytest.raises(HopperGemmError, match="per-tensor FP8"):
        ref_gemm(a, a, "hopper", trans_b=True, out_dtype=torch.float32)


def test_a_quantized_operand_with_a_plain_one_is_refused():
    a = fp8((16, 32), 11)
    with pytest.raises(HopperGemmError, match="one operand is quantized"):
        ref_gemm(a, torch.randn(16, 32), "hopper", trans_b=True, out_dtype=torch.float32)


def test_e5m2_by_e5m2_is_an_mmaemu_rejection_reported_as_hopper_gemm_error():
    a, b = fp8((16, 32), 12, E5M2), fp8((16, 32), 13, E5M2)
    with pytest.raises(HopperGemmError, match="mmaemu cannot compute"):
        ref_gemm(a, b, "hopper", trans_b=True, out_dtype=torch.float32)


def test_split_k_auto_says_when_mmaemu_cannot_decide():
    a, b = fp8((32, 64), 14), fp8((48, 64), 15)
    with refops.gemm_numerics("hopper", split_k="auto"):
        with pytest.raises(HopperGemmError, match="SplitKUnknownError"):
            get_backend("reference").gemm(a, b, trans_b=True, out_dtype=torch.float32)


def test_a_missing_mmaemu_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mmaemu", None)  # `import mmaemu` now fails, as without the package
    a, b = fp8((16, 32), 16), fp8((16, 32), 17)
    with pytest.raises(HopperGemmError, match=r"pip install 'refops\[hopper\]'"):
        ref_gemm(a, b, "hopper", trans_b=True, out_dtype=torch.float32)
    ref_gemm(a, b, "exact", trans_b=True, out_dtype=torch.float32)  # exact mode never needs it


# ------------------------------------------------------------------ TF32
def test_tf32_rounding_is_round_to_nearest_even_on_10_mantissa_bits():
    one_ulp = 2.0 ** -10  # the TF32 spacing just above 1
    x = torch.tensor([1.0 + one_ulp / 2,             # a tie, even neighbour below -> 1
                      1.0 + 3 * one_ulp / 2,         # a tie, even neighbour above -> 1 + 2 ulp
                      1.0 + one_ulp / 2 + 2.0 ** -23,  # just above the tie -> 1 + 1 ulp
                      -(1.0 + 3 * one_ulp / 2),
                      float("inf"), float("nan"), 0.0])
    got = round_to_tf32(x)
    assert got[:4].tolist() == [1.0, 1.0 + 2 * one_ulp, 1.0 + one_ulp, -(1.0 + 2 * one_ulp)]
    assert got[4] == float("inf") and torch.isnan(got[5]) and got[6] == 0.0
    assert (bits(round_to_tf32(torch.randn(1000))) & 0x1FFF).eq(0).all()


def test_fp32_gemms_in_hopper_mode_multiply_tf32_operands():
    a = torch.tensor([[1.0 + 2.0 ** -11 + 2.0 ** -20, 1.0]])  # rounds up to 1 + 2^-10 in TF32
    b = torch.tensor([[1.0], [2.0 ** -12]])
    exact = ref_gemm(a, b, "exact", out_dtype=torch.float32)
    hopper = ref_gemm(a, b, "hopper", out_dtype=torch.float32)
    assert exact.item() == (1.0 + 2.0 ** -11 + 2.0 ** -20) + 2.0 ** -12
    assert hopper.item() == (1.0 + 2.0 ** -10) + 2.0 ** -12
    bf16 = torch.randn(4, 8, dtype=torch.bfloat16)
    assert torch.equal(ref_gemm(bf16, bf16.t(), "hopper", out_dtype=torch.bfloat16),
                       ref_gemm(bf16, bf16.t(), "exact", out_dtype=torch.bfloat16))  # no TF32 for 16-bit operands


# ------------------------------------------------------------------ a module under hopper numerics
@pytest.mark.parametrize("recipe", [Float8CurrentScaling, DelayedScaling])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_module_under_hopper_numerics_differs_from_exact_in_the_last_bits(recipe, dtype):
    results = {}
    for numerics in ("exact", "hopper"):
        torch.manual_seed(0)
        model = ops.Sequential(ops.Linear(64, 128, dtype=dtype), ops.GELU(), ops.Linear(128, 32, dtype=dtype))
        x = torch.randn(32, 64, dtype=dtype, requires_grad=True)
        with refops.gemm_numerics(numerics):
            with refops.autocast(recipe=recipe()):
                y = model(x)
            y.float().square().sum().backward()
        results[numerics] = [y.detach(), x.grad, model[0].weight.grad, model[2].weight.grad]
    for i, (exact, hopper) in enumerate(zip(results["exact"], results["hopper"])):
        assert hopper.dtype == exact.dtype and torch.isfinite(hopper).all()
        scale = exact.float().abs().max().item()
        diff = (hopper.float() - exact.float()).abs()
        # The GEMMs differ in their last bits; re-quantizing to FP8 downstream turns a few of those into
        # one-code flips, which the backward carries further: small on average, a few % at most.
        assert diff.mean().item() <= 2e-3 * scale
        assert diff.max().item() <= (1e-2 if i == 0 else 1e-1) * scale
    assert not all(torch.equal(e, h) for e, h in zip(results["exact"], results["hopper"]))


# ------------------------------------------------------------------ the seam
def test_refops_kernels_imports_without_refops_quantization():
    code = (
        "import importlib.util, sys, types\n"
        "spec = importlib.util.find_spec('refops')\n"
        "pkg = types.ModuleType('refops'); pkg.__path__ = list(spec.submodule_search_locations)\n"
        "sys.modules['refops'] = pkg  # refops/__init__ imports everything; import the kernels on their own\n"
        "import refops.kernels, refops.kernels.reference.gemm_hopper\n"
        "bad = sorted(m for m in sys.modules if m.startswith('refops.quantization'))\n"
        "assert not bad, bad\n"
        "assert refops.kernels.GemmOperand and refops.kernels.gemm_numerics() == 'exact'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_no_module_of_refops_kernels_imports_refops_quantization():
    import pathlib
    import re

    root = pathlib.Path(refops.__file__).parent / "kernels"
    pattern = re.compile(r"^\s*(from\s+(refops|\.+)\.?quantization|import\s+refops\.quantization)", re.M)
    offenders = [str(p) for p in root.rglob("*.py") if pattern.search(p.read_text())]
    assert not offenders


def test_the_conformance_cli_finds_gemm_numerics():
    from refops.testing.conformance import gemm_numerics_function

    assert gemm_numerics_function() is refops.gemm_numerics
