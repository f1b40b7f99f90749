"""compare_modules' training script, metamorphic checks and self-consistency (#40 items 1-4, 7, 9).

Each test plants one defect that only a part of the script can show, and checks that the correct twin passes.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.testing import compare_modules
from refops.testing.modules import SCENARIOS

import _module_variants as mv

FEATURES, BATCH = 32, 16


def _linear(dtype=torch.float32):
    torch.manual_seed(0)
    return te.ops.Linear(FEATURES, FEATURES, dtype=dtype)


def _x(dtype=torch.float32):
    return torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(1), dtype=dtype)


class _TorchLinear(torch.nn.Module):
    """A plain-torch Linear with refops' parameter names; ``defect`` plants one bug."""

    def __init__(self, defect: str = "") -> None:
        super().__init__()
        torch.manual_seed(0)
        source = te.ops.Linear(FEATURES, FEATURES)
        self.weight = torch.nn.Parameter(source.weight.detach().clone())
        self.bias = torch.nn.Parameter(source.bias.detach().clone())
        self.defect = defect

    #: Calls of every instance and copy: state no copy of the module resets (a process-wide cache, say).
    calls = 0

    def forward(self, x):
        type(self).calls += 1
        if self.defect == "stateful":  # a result that depends on how many calls came before
            return torch.nn.functional.linear(x, self.weight, self.bias) * (1 + 0.01 * (type(self).calls % 5))
        if self.defect == "reads_storage_as_contiguous":
            x = torch.as_strided(x, x.shape, (x.shape[-1], 1))  # the memory, not the view
        return torch.nn.functional.linear(x, self.weight, self.bias)


def test_every_scenario_runs_by_default_and_the_report_names_each_step():
    report = compare_modules(_TorchLinear(), _linear(), (_x(),))
    report.assert_ok()
    scenarios = {c.scenario for c in report.comparisons if c.kind == "value"}
    assert scenarios == set(SCENARIOS)
    assert "training, step 3: weight.grad" in [c.name for c in report.comparisons]
    assert "microbatches, accumulated: weight.grad" in [c.name for c in report.comparisons]
    assert "the training script: one step, grad scales" in report.tier("scenarios").why


def test_one_step_alone_is_the_single_fresh_step():
    report = compare_modules(_TorchLinear(), _linear(), (_x(),), scenarios=("one step",), metamorphic=False)
    assert {c.scenario for c in report.comparisons} == {"one step"}


def test_unknown_scenarios_and_bad_flags_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown scenario"):
        compare_modules(_TorchLinear(), _linear(), (_x(),), scenarios=("warmup",))
    with pytest.raises(TypeError, match="`scenarios` must be a non-empty sequence"):
        compare_modules(_TorchLinear(), _linear(), (_x(),), scenarios="training")
    with pytest.raises(TypeError, match="`metamorphic` must be True or False"):
        compare_modules(_TorchLinear(), _linear(), (_x(),), metamorphic="yes")


def test_a_layout_bug_shows_in_the_input_layouts_scenario():
    report = compare_modules(_TorchLinear("reads_storage_as_contiguous"), _linear(), (_x(),))
    assert not report.ok
    assert set(report.first_differences().values()) == {"input layouts, non-contiguous"}


def test_state_kept_between_calls_is_caught_by_the_rerun_of_the_same_inputs():
    report = compare_modules(_TorchLinear("stateful"), _linear(), (_x(),), scenarios=("one step",))
    failing = [c for c in report.failures if c.name.startswith("same inputs twice")]
    assert failing and all(c.kind == "metamorphic" for c in failing)
    assert "reads state or memory the inputs do not determine" in failing[0].why


def test_a_second_call_with_the_same_reference_starts_from_cleared_grads():
    reference = _linear()
    compare_modules(_TorchLinear(), reference, (_x(),)).assert_ok()
    compare_modules(_TorchLinear(), reference, (_x(),)).assert_ok()  # no grad left from the first call

    class DoubledWeightGrad(_TorchLinear):
        def forward(self, x):
            y = super().forward(x)
            self.weight.register_hook(lambda g: 2 * g) if not hasattr(self, "_hooked") else None
            self._hooked = True
            return y

    report = compare_modules(DoubledWeightGrad(), reference, (_x(),))
    assert not report.ok and report.first_differences()["weight.grad"] == "one step"


def test_the_callers_random_state_is_untouched_and_dropout_draws_the_same_mask_on_every_side():
    def reference():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.Linear(FEATURES, FEATURES), te.ops.Dropout(0.25))

    candidate, ref, x = _DropoutWrapper(1.0), reference(), _x()
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    compare_modules(candidate, ref, (x,)).assert_ok()
    assert torch.equal(torch.random.get_rng_state(), before)
    wrong = compare_modules(_DropoutWrapper(1.5), reference(), (_x(),))  # a 1.5x output, mask noise no cover
    assert not wrong.ok and wrong.first_differences()["output"] == "one step"


class _DropoutWrapper(torch.nn.Sequential):
    """``Linear`` then a dropout that draws its mask as refops does (fp32 uniforms >= p), times ``scale``."""

    def __init__(self, scale: float) -> None:
        super().__init__(_TorchLinear())
        self.scale = scale

    def forward(self, x):
        y = self[0](x)
        if not self.training:
            return y
        keep = (torch.rand(y.shape, dtype=torch.float32) >= 0.25).to(y.dtype)
        return y * keep / 0.75 * self.scale


def test_a_candidate_that_raises_mid_script_fails_with_where_and_what():
    class RaisesInEval(_TorchLinear):
        def forward(self, x):
            if not torch.is_grad_enabled():
                raise RuntimeError("no cached weight for inference")
            return super().forward(x)

    report = compare_modules(RaisesInEval(), _linear(), (_x(),))
    failure = report["the candidate ran the script"]
    assert not failure.passed and "training, eval forward after step 1" in failure.why
    assert "RuntimeError: no cached weight for inference" in failure.why


@pytest.mark.parametrize("variant", ["variant-fp8-sequential-truncation", "variant-tf32", "variant-split-k"])
def test_correct_candidates_pass_under_an_all_ones_output_grad(variant):
    recipe = te.recipe.Float8CurrentScaling()
    for dtype in (torch.float32, torch.bfloat16):
        reference, candidate = _linear(dtype), _linear(dtype)
        report = compare_modules(candidate, reference, (_x(dtype),), recipe=recipe,
                                 candidate_context=mv.in_backend(variant, recipe),
                                 grad_output=torch.ones(BATCH, FEATURES, dtype=dtype))
        assert report.ok, str(report)


def test_no_failing_line_shows_zero_mismatches_without_saying_why():
    class Scaled(_TorchLinear):
        def forward(self, x):
            return super().forward(x) * 1.05

    report = compare_modules(Scaled(), _linear(), (_x(),), scenarios=("one step",))
    for line in map(str, report.failures):
        assert "mismatches=0/" not in line


def test_grads_scaled_by_a_power_of_two_scale_exactly_under_current_scaling():
    recipe = te.recipe.Float8CurrentScaling()
    report = compare_modules(_linear(), _linear(), (_x(),), recipe=recipe, copy_parameters=False)
    scaled = [c for c in report.comparisons if c.name.startswith("dy x 2^3")]
    assert scaled and all(c.passed and c.kind == "metamorphic" for c in scaled)


def test_the_power_of_two_grad_check_does_not_run_in_float16_and_says_why():
    # fp16's normal range starts at 2^-14: a scaled output grad moves the backward's intermediates across it,
    # so exact scaling is not a property of correct fp16 code.
    report = compare_modules(_linear(torch.float16), _linear(torch.float16), (_x(torch.float16),),
                             scenarios=("one step",))
    assert not [c for c in report.comparisons if c.name.startswith("dy x 2^3")]
    assert "not run: dy x 2^3: in float16" in report.tier("metamorphic").why, str(report)
    assert [c for c in report.comparisons if c.name.startswith("same inputs twice")]
