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
