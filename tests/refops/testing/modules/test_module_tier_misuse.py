"""compare_modules' misuse errors (#29) and its report (#25 item 3): each error names compare_modules, the
argument and what was expected, before anything runs."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.testing import compare_modules


def _linear(i=64, o=32):
    return te.ops.Sequential(te.ops.Linear(i, o))


def test_a_parameter_of_another_shape_is_named_with_both_shapes_before_anything_runs():
    calls = []
    candidate = torch.nn.Sequential(torch.nn.Linear(64, 16))
    candidate.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=r"compare_modules: parameter '0.weight' has shape \(16, 64\) in the "
                                         r"candidate and \(32, 64\) in the reference"):
        compare_modules(candidate, _linear(), (torch.randn(4, 64),))
    assert not calls


def test_inputs_given_as_a_tensor_is_an_error():
    with pytest.raises(TypeError, match=r"compare_modules: `inputs` must be a sequence .*\(x,\); got a Tensor "
                                        r"of shape \(4, 64\)"):
        compare_modules(torch.nn.Sequential(torch.nn.Linear(64, 32)), _linear(), torch.randn(4, 64))


@pytest.mark.parametrize("which", ["candidate", "reference"])
def test_a_module_that_is_not_an_nn_module_is_an_error(which):
    modules = {"candidate": torch.nn.Sequential(torch.nn.Linear(64, 32)), "reference": _linear()}
    modules[which] = lambda x: x
    with pytest.raises(TypeError, match=f"compare_modules: `{which}` must be a torch.nn.Module, got function"):
        compare_modules(modules["candidate"], modules["reference"], (torch.randn(4, 64),))


def test_mismatched_parameter_names_are_listed():
    candidate = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False))
    with pytest.raises(ValueError, match=r"compare_modules: .*parameter names must match.*only the reference has "
                                         r"\['0.bias'\]"):
        compare_modules(candidate, _linear(), (torch.randn(4, 64),))


def test_an_unknown_tier_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"compare_modules: unknown `tier` 'approximately'; the tiers are "
                                         r"'numerics', 'tolerance', 'sqnr', 'exact'"):
        compare_modules(torch.nn.Sequential(torch.nn.Linear(64, 32)), _linear(), (torch.randn(4, 64),),
                        tier="approximately")


def test_tier_exact_compares_bit_for_bit_and_is_not_the_sqnr_tier():
    x = torch.randn(8, 64)
    candidate = torch.nn.Sequential(torch.nn.Linear(64, 32))
    report = compare_modules(candidate, _linear(), (x,), tier="exact")
    assert report["output"].tier == "exact" and report.tier("values (exact)").ran
    torch.manual_seed(0)
    a = _linear()
    torch.manual_seed(0)
    same = compare_modules(a, _linear(), (x,), tier="exact")
    assert same.ok and same["output"].criterion == "bit-exact values"


def test_the_default_output_grad_is_zero_mean_random_and_the_same_every_call():
    from refops.testing.modules.scenarios import default_grad

    g1, g2 = default_grad((64, 32), torch.float32, "cpu"), default_grad((64, 32), torch.float32, "cpu")
    assert torch.equal(g1, g2) and abs(g1.mean().item()) < 0.05 and 0.9 < g1.std().item() < 1.1


def test_the_report_gives_the_deciding_criterion_distances_to_float64_and_bit_identical_shares():
    x = torch.randn(32, 64)
    report = compare_modules(torch.nn.Sequential(torch.nn.Linear(64, 32)), _linear(), (x,))
    assert report.ok
    out = report["output"]
    assert out.tier == "numerics" and out.criterion.startswith("passed by the ")
    assert out.candidate_to_float64_db > 100 and out.reference_to_float64_db > 100
    assert 0.0 <= out.bit_identical_share <= 1.0 and "bit-identical=" in str(out)
    assert "to float64: cand" in out.criterion
