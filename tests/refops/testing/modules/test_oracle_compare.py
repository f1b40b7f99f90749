"""refops.testing.compare_modules / compare_backends: the oracle compares, reports and asserts."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.testing import compare_backends, compare_modules, compare_tensors, make_recipe, sqnr_db


def _refops_mlp(device, dtype=torch.float32):
    return te.ops.Sequential(
        te.ops.LayerNorm(64, device=device, dtype=dtype),
        te.ops.Linear(64, 128, device=device, dtype=dtype),
        te.ops.GELU(),
        te.ops.Linear(128, 64, device=device, dtype=dtype),
    )


def _torch_mlp(device):
    """The same model in plain torch: same parameter names, so the oracle can map them."""
    return torch.nn.Sequential(
        torch.nn.LayerNorm(64, device=device),
        torch.nn.Linear(64, 128, device=device),
        torch.nn.GELU(approximate="tanh"),
        torch.nn.Linear(128, 64, device=device),
    )


def test_a_plain_torch_candidate_matches_the_reference(device):
    x = torch.randn(16, 64, device=device)
    report = compare_modules(_torch_mlp(device), _refops_mlp(device), (x,))
    report.assert_ok()
    assert report["output"].max_abs_error < 1e-4
    assert report["1.weight.grad"].passed and report["input[0].grad"].passed
    assert report["output (SQNR)"].sqnr_db > 60


def test_a_wrong_candidate_is_caught_with_evidence(device):
    candidate = _torch_mlp(device)
    x = torch.randn(16, 64, device=device)
    report = compare_modules(candidate, _refops_mlp(device), (x,))
    report.assert_ok()
    with torch.no_grad():
        candidate[3].bias[5] += 0.5  # a bug after the parameters were copied
    report = compare_modules(candidate, _refops_mlp(device), (x,), copy_parameters=False)
    assert not report.ok
    output = report["output"]
    assert output.num_mismatches >= 16 and all(index[1] in range(64) for index in output.first_mismatches)
    with pytest.raises(AssertionError, match="output"):
        report.assert_ok()


@pytest.mark.parametrize("recipe_name", ["fp8_delayed_scaling", "fp8_current_scaling", "mxfp8", "nvfp4"])
def test_refops_against_itself_under_a_recipe_is_exact_where_it_must_be(recipe_name, device):
    recipe = make_recipe(recipe_name)

    def build():
        torch.manual_seed(0)
        with te.quantized_model_init(recipe=recipe):
            return _refops_mlp(device, torch.bfloat16)

    x = torch.randn(128, 64, device=device, dtype=torch.bfloat16)
    candidate, reference = build(), build()
    with te.autocast(recipe=recipe):  # materialize both, then compare from identical parameters
        candidate(x), reference(x)
    report = compare_modules(candidate, reference, (x,), recipe=recipe)
    report.assert_ok()
    quantized = [c for c in report.comparisons if "[" in c.name and c.tier == "exact"]
    assert quantized, "quantized weight bytes must be compared bit-exactly"
    if recipe_name == "fp8_delayed_scaling":
        assert any(c.name.endswith("amax_history") for c in report.comparisons)


def test_compare_backends_reference_against_itself(device):
    x = torch.randn(32, 64, device=device)
    report = compare_backends(_refops_mlp, (x,), candidate_backend="reference")
    report.assert_ok()
    assert report["output"].max_abs_error == 0.0


def test_tensor_tiers():
    a = torch.tensor([1.0, 2.0, float("nan"), -0.0])
    exact = compare_tensors("t", a, torch.tensor([1.0, 2.0, float("nan"), 0.0]), tier="exact")
    assert not exact.passed and exact.first_mismatches == ((3,),)  # -0.0 vs +0.0 is a bit difference
    close = compare_tensors("t", a, torch.tensor([1.0, 2.01, float("nan"), 0.0]), tier="tolerance", rtol=0.01)
    assert close.passed and close.max_abs_error == pytest.approx(0.01)
    noisy = torch.tensor([1.0, 2.0, 3.0]) + 0.1
    assert compare_tensors("t", noisy, torch.tensor([1.0, 2.0, 3.0]), tier="sqnr", sqnr_floor_db=20).passed
    assert not compare_tensors("t", noisy, torch.tensor([1.0, 2.0, 3.0]), tier="sqnr", sqnr_floor_db=40).passed
    assert sqnr_db(torch.ones(3), torch.ones(3)) == float("inf")
    shape = compare_tensors("t", torch.ones(2), torch.ones(3), tier="exact")
    assert not shape.passed and "shape" in shape.criterion
    with pytest.raises(ValueError, match="unknown tier"):
        compare_tensors("t", a, a, tier="approximately")


_TIE_AMAX, _TIE_VALUE = 8.076315879821777, 0.01915420964360237  # docs/recipes/current-scaling.md's tie


def _quantize_dividing(t):
    """The issue's bug: ``t / (amax / 448)`` instead of ``t * (448 / amax)``."""
    scale_inv = (t.abs().amax().float() / 448.0).reshape(1)
    return (t.float() / scale_inv).clamp(-448, 448).to(torch.float8_e4m3fn), scale_inv


class _DividingFp8Linear(torch.nn.Module):
    """A plain-torch FP8 current-scaling linear with the division bug; returns plain tensors."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(out_features))
        self.operands = {}

    def forward(self, x):
        (xd, xs), (wd, ws) = _quantize_dividing(x), _quantize_dividing(self.weight)
        self.operands = {"input": (xd, xs), "weight": (wd, ws)}
        xq = x + (xd.float() * xs - x).detach()  # straight-through: grads in high precision
        wq = self.weight + (wd.float() * ws - self.weight).detach()
        return xq @ wq.t() + self.bias


class _ExposingDividingFp8Linear(_DividingFp8Linear):
    def refops_quantized_operands(self):
        return self.operands


def _tie_input():
    x = torch.randn(16, 64)
    x[0, 0], x[0, 1] = _TIE_AMAX, _TIE_VALUE  # the amax, and a value whose scaled product is a tie
    return x


def test_the_report_says_the_bytes_tier_did_not_run_for_a_plain_tensor_candidate_and_why():
    recipe = te.recipe.Float8CurrentScaling()
    report = compare_modules(_DividingFp8Linear(64, 32), te.ops.Linear(64, 32), (_tie_input(),), recipe=recipe,
                             grad_output=torch.ones(16, 32), tier="tolerance", scenarios=("one step",))
    assert report.ok  # in one step the bug is within the GEMM tolerance: the tolerance tiers cannot see it...
    bytes_tier = report.tier("bytes (exact)")
    assert not bytes_tier.ran and bytes_tier.count == 0  # ...and the report says no byte was compared
    assert "refops_quantized_operands()" in bytes_tier.why and "check_quantizer" in bytes_tier.why
    assert "the reference quantized: grad_output, input, weight" in bytes_tier.why
    assert report.tier("tolerance").ran and report.tier("SQNR").ran and not report.tier("recipe state (exact)").ran
    assert not report.tier("numerics").ran and "tier='tolerance' was asked" in report.tier("numerics").why
    assert "NOT RUN bytes (exact)" in str(report)


def test_exposed_quantized_operands_are_compared_exactly_and_the_division_bug_is_caught():
    recipe = te.recipe.Float8CurrentScaling()
    report = compare_modules(_ExposingDividingFp8Linear(64, 32), te.ops.Linear(64, 32), (_tie_input(),),
                             recipe=recipe, grad_output=torch.ones(16, 32), scenarios=("one step",))
    assert not report.ok
    assert report.tier("bytes (exact)").ran and report.tier("bytes (exact)").count == 4
    assert [c.name for c in report.failures] == ["operand input[rowwise data]"]
    assert report["operand input[rowwise data]"].first_mismatches == ((0, 1),)  # the tie, one byte off
    assert report["operand weight[rowwise data]"].passed and report["operand input[rowwise scale_inv]"].passed


def test_tiers_of_a_passing_quantized_comparison():
    recipe = make_recipe("mxfp8")

    def build():
        torch.manual_seed(0)
        with te.quantized_model_init(recipe=recipe):
            return te.ops.Linear(64, 64, dtype=torch.bfloat16)

    x = torch.randn(32, 64, dtype=torch.bfloat16)
    report = compare_modules(build(), build(), (x,), recipe=recipe)
    report.assert_ok()
    assert report.tier("bytes (exact)").ran and "quantized parameters" in report.tier("bytes (exact)").why
    plain = compare_modules(_torch_mlp("cpu"), _refops_mlp("cpu"), (torch.randn(4, 64),))
    assert plain.tier("bytes (exact)").why == "no recipe: nothing is quantized"


def test_a_refops_candidate_under_another_backend_has_every_operand_compared_byte_for_byte():
    def mlp(device):
        return te.ops.Sequential(te.ops.Linear(64, 64, device=device), te.ops.GELU(), te.ops.Linear(64, 64, device=device))

    report = compare_backends(mlp, (torch.randn(32, 64),), recipe=make_recipe("mxfp8"), candidate_backend="reference")
    report.assert_ok()
    names = {c.name for c in report.comparisons if c.name.startswith("operand ")}
    for op in ("0", "2"):
        for role in ("input", "weight", "grad_output"):
            assert f"operand {op}.{role}[rowwise data]" in names and f"operand {op}.{role}[rowwise scale_inv]" in names
    assert report.tier("bytes (exact)").ran and report.tier("bytes (exact)").count == len(names) == 24


def _register_rounded_gemm_backend() -> str:
    """A backend whose GEMM results are rounded through bf16: everything downstream of the first GEMM differs a
    little from the reference, as it does on a GPU that sums in another order."""
    from refops.kernels import ReferenceKernels, register_backend

    class RoundedGemm(ReferenceKernels):
        name = "test-rounded-gemm"

        def gemm(self, a, b, **kwargs):
            out = super().gemm(a, b, **kwargs)
            return out.to(torch.bfloat16).to(out.dtype)

    register_backend(RoundedGemm.name, RoundedGemm)
    return RoundedGemm.name


def _linear_gelu_linear(device):
    return te.ops.Sequential(te.ops.Linear(64, 64, device=device), te.ops.GELU(), te.ops.Linear(64, 64, device=device))


def test_operands_quantized_from_different_tensors_are_not_compared_byte_for_byte_and_the_report_says_so():
    report = compare_backends(_linear_gelu_linear, (torch.randn(32, 64),), recipe=make_recipe("mxfp8"),
                              candidate_backend=_register_rounded_gemm_backend(), sqnr_floor_db=10)
    names = {c.name for c in report.comparisons if c.name.startswith("operand ")}
    assert "operand 0.input[rowwise data]" in names and "operand 2.weight[rowwise data]" in names  # same sources
    assert "operand 2.input[rowwise data]" not in names  # the GELU of a rounded GEMM: another tensor
    assert all(c.passed for c in report.comparisons if c.name in names)
    why = report.tier("bytes (exact)").why
    assert "quantized different high-precision tensors" in why and "2.input" in why


def test_delayed_scaling_slots_fed_by_different_tensors_are_held_to_the_criterion_the_rest_bit_for_bit():
    report = compare_backends(_linear_gelu_linear, (torch.randn(32, 64),), recipe=make_recipe("fp8_delayed_scaling"),
                              candidate_backend=_register_rounded_gemm_backend(), tier="sqnr", sqnr_floor_db=10)
    by_name = {c.name: c for c in report.comparisons}
    # The first Linear quantizes the model's input and its weight: the same tensors, so the whole state is exact.
    assert by_name["0.basic_ops.0.forward.scale"].tier == "exact" and by_name["0.basic_ops.0.forward.scale"].passed
    # The second Linear's input is the GELU of a rounded GEMM: its slot (0) is held to the SQNR floor, its weight
    # slot (1) stays exact.
    inexact = by_name["2.basic_ops.0.forward.amax_history[slots 0, fed by unequal tensors]"]
    assert inexact.tier == "sqnr" and inexact.passed and inexact.max_abs_error > 0  # they do differ
    assert by_name["2.basic_ops.0.forward.amax_history"].tier == "exact"
    assert by_name["2.basic_ops.0.forward.amax_history"].passed
    report.assert_ok()
    assert "fed by unequal tensors" in report.tier("recipe state (exact)").why
