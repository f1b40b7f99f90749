"""check_lifecycle against the bugs a red team re-created (issue #40, item 5), each beside a correct twin.

(a) a ``reset_parameters()`` that leaves meta tensors behind; (b) a checkpoint that drops state only a
trained module has (an amax history, recipe state); a module that cannot be deferred-initialized at all
((c), conversions, is in ``test_lifecycle_conversion.py``); and the false alarm: a TE-style module
that assigns new Parameters when it materializes is correct under TE's contract, so only a refops
extension is not kept, which fails the report under ``strict=True`` alone.
"""

from __future__ import annotations

import math

import pytest
import torch

import refops as te
from refops.testing import Status, check_lifecycle
from refops.testing.lifecycle.check import PROPERTIES
from refops.testing.lifecycle.report import Kind

HELD, VIOLATED, KEPT, NOT_KEPT = Status.HELD, Status.VIOLATED, Status.KEPT, Status.NOT_KEPT
NOT_CHECKED, NOT_APPLICABLE = Status.NOT_CHECKED, Status.NOT_APPLICABLE
CONVERSION = ["requires_grad_kept_through_conversion", "aliases_kept_through_conversion", "identity_through_conversion"]


def _x(*shape):
    return lambda device: (torch.randn(*shape, device=device),)


# ------------------------------------------------------------------ TE-style modules
class TEStyleLinear(torch.nn.Module):
    """Materializes as TE's ops do after the fix: reset_parameters() (and the first forward, through it) assigns
    NEW Parameters, copying requires_grad; nothing is cached. Correct under TE's contract.

    ``partial`` plants bug (a): on a meta-built module the bias is left on meta."""

    partial = False

    def __init__(self, in_features: int, out_features: int, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device))
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device))
        if not self.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        device = torch.get_default_device() if self.weight.is_meta else self.weight.device
        weight = torch.empty(self.weight.shape, device=device)
        torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        self.weight = torch.nn.Parameter(weight, requires_grad=self.weight.requires_grad)
        if self.partial and self.bias.is_meta:
            return
        self.bias = torch.nn.Parameter(torch.zeros(self.bias.shape, device=device),
                                       requires_grad=self.bias.requires_grad)

    def forward(self, x):
        if self.weight.is_meta or self.bias.is_meta:
            self.reset_parameters()
        return torch.nn.functional.linear(x, self.weight, self.bias)


class PartialTEStyleLinear(TEStyleLinear):
    partial = True


def test_a_te_style_module_that_replaces_its_parameters_is_ok_and_only_the_extension_is_not_kept(device):
    report = check_lifecycle(lambda d: TEStyleLinear(16, 8, device=d), device=device, inputs=_x(4, 16))
    # Before: report.ok was False, for identity_through_materialization alone (a refops extension).
    report.assert_ok()
    identity = report["identity_through_materialization"]
    assert identity.status is NOT_KEPT and identity.kind is Kind.EXTENSION
    assert identity.verdict == "not kept (refops extension)"
    assert "identity_through_materialization" in str(report) and "not kept (refops extension)" in str(report)
    assert "reset_parameters: replaced weight (id 0x" in identity.evidence
    assert report.extensions_not_kept == [identity]
    for promise in ("materializable_from_meta", "eager_values_after_reset_parameters", "requires_grad_kept",
                    "no_stale_cache_after_replacement", "checkpoint_round_trip_after_training"):
        assert report[promise].status is HELD, report[promise]
    assert report["eager_values_after_first_forward"].status is KEPT

    strict = check_lifecycle(lambda d: TEStyleLinear(16, 8, device=d), device=device, inputs=_x(4, 16), strict=True)
    assert not strict.ok
    assert [r.name for r in strict.violations] == ["identity_through_materialization"]
    assert "(strict)" in str(strict).splitlines()[0]
    with pytest.raises(AssertionError, match=r"violates 1 lifecycle property \(strict: refops extensions count\)"):
        strict.assert_ok()


def test_a_reset_parameters_that_leaves_a_tensor_on_meta_is_a_partial_materialization(device):
    report = check_lifecycle(lambda d: PartialTEStyleLinear(16, 8, device=d), device=device, inputs=_x(4, 16))
    # Before: "not applicable", taken for PyTorch's to_empty() convention.
    result = report["eager_values_after_reset_parameters"]
    assert result.status is VIOLATED
    assert result.evidence == ("reset_parameters() on the meta-built module (or on each child, for a composite) "
                               "moved weight off meta but left bias on meta: a partial materialization (a "
                               "reset_parameters() that materializes must leave nothing on meta)")
    assert not report.ok
    assert report["eager_values_after_to_empty"].status is HELD  # to_empty() then reset: nothing left on meta


def test_nn_linear_whose_reset_leaves_everything_on_meta_makes_no_claim(device):
    report = check_lifecycle(lambda d: torch.nn.Linear(16, 8, device=d), device=device, inputs=_x(4, 16))
    report.assert_ok()
    reset = report["eager_values_after_reset_parameters"]
    assert reset.status is NOT_APPLICABLE and "leaves every tensor of Linear on meta" in reset.evidence
    assert report["materializable_from_meta"].status is HELD
    assert "to_empty() + reset_parameters()" in report["materializable_from_meta"].evidence
    # Under strict only the extension of materializing at the first forward is missing.
    strict = check_lifecycle(lambda d: torch.nn.Linear(16, 8, device=d), device=device, inputs=_x(4, 16), strict=True)
    assert [r.name for r in strict.violations] == ["eager_values_after_first_forward"]


class SkipsMetaOnReset(te.ops.BasicLinear):
    """A refops op whose reset_parameters() does nothing on meta: refops' own contract says it must materialize."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


def test_a_refops_op_is_held_to_materialize_through_reset_parameters_even_if_nothing_moves(device):
    report = check_lifecycle(lambda d: SkipsMetaOnReset(16, 8, device=d), device=device, inputs=_x(4, 16))
    result = report["eager_values_after_reset_parameters"]
    assert result.status is VIOLATED
    assert result.evidence.endswith("left weight on meta")


class LeavesEverythingOnMeta(torch.nn.Module):
    """What a TE module looks like to the check (its class lives in the transformer_engine package), whose
    reset_parameters() forgot the meta path."""

    def __init__(self, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(8, device=device))
        if not self.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            torch.nn.init.ones_(self.weight)

    def forward(self, x):
        return x * self.weight


@pytest.mark.parametrize("as_te", [False, True], ids=["plain", "te_package"])
def test_a_te_module_is_held_to_te_s_contract_a_plain_one_to_pytorch_s(as_te, device):
    module_name = "transformer_engine.pytorch.ops.fake" if as_te else __name__
    cls = type("LeavesEverythingOnMeta", (LeavesEverythingOnMeta,), {"__module__": module_name})
    report = check_lifecycle(cls, device=device, inputs=_x(2, 8))
    status = report["eager_values_after_reset_parameters"].status
    assert status is (VIOLATED if as_te else NOT_APPLICABLE), report["eager_values_after_reset_parameters"]
    declared = check_lifecycle(cls, device=device, inputs=_x(2, 8), materializes_through_reset_parameters=False)
    assert declared["eager_values_after_reset_parameters"].status is NOT_APPLICABLE  # PyTorch's convention, said


# ------------------------------------------------------------------ cannot be deferred at all
class NoResetAndNoLazyForward(torch.nn.Module):
    """Can be built on meta, but nothing ever gives it values: no reset_parameters(), a forward that raises."""

    def __init__(self, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8, device=device))

    def forward(self, x):
        return x * self.weight


class NoResetButLazyForward(NoResetAndNoLazyForward):
    """The correct twin: its first forward materializes the weight (in place)."""

    def forward(self, x):
        if self.weight.is_meta:
            value = torch.nn.Parameter(torch.ones(8, device=x.device), requires_grad=self.weight.requires_grad)
            torch.utils.swap_tensors(self.weight, value)
        return x * self.weight


def test_a_module_that_cannot_be_deferred_initialized_is_a_violation(device):
    report = check_lifecycle(NoResetAndNoLazyForward, device=device, inputs=_x(2, 8))
    # Before: every materialization path "not applicable", and report.ok.
    result = report["materializable_from_meta"]
    assert result.status is VIOLATED and not report.ok
    assert result.evidence.startswith("a meta-built module cannot be initialized: reset_parameters: neither "
                                      "NoResetAndNoLazyForward nor any of its submodules defines reset_parameters()")
    assert "first_forward: NoResetAndNoLazyForward does not materialize through the first forward" in result.evidence
    assert "RuntimeError" in result.evidence

    twin = check_lifecycle(NoResetButLazyForward, device=device, inputs=_x(2, 8))
    twin.assert_ok()
    assert twin["materializable_from_meta"].evidence.startswith("the first forward of the meta-built module leaves "
                                                                "no tensor on meta")


def test_without_inputs_a_module_with_no_reset_cannot_be_judged(device):
    report = check_lifecycle(NoResetAndNoLazyForward, device=device)
    assert report["materializable_from_meta"].status is NOT_CHECKED
    assert "needs inputs" in report["materializable_from_meta"].evidence


# ------------------------------------------------------------------ checkpoints after training
class AmaxScaledLinear(torch.nn.Module):
    """Delayed scaling in miniature: every training forward rounds its input on a grid derived from an amax
    history, then records the input's amax in it. ``save_history=False`` plants bug (b): the history is a
    non-persistent buffer, left out of the checkpoint; untrained, every module's history is zeros anyway."""

    save_history = True

    def __init__(self, device=None):
        super().__init__()
        self.linear = torch.nn.Linear(16, 8, device=device)
        self.register_buffer("amax_history", torch.zeros(4, device=device), persistent=self.save_history)

    def reset_parameters(self) -> None:
        self.linear.reset_parameters()
        self.amax_history.zero_()

    def forward(self, x):
        amax = self.amax_history.max()
        scale = torch.where(amax > 0, 8.0 / amax, torch.ones_like(amax))
        rounded = x + (torch.round(x * scale) / scale - x).detach()
        if self.training:
            with torch.no_grad():
                self.amax_history.copy_(torch.roll(self.amax_history, 1))
                self.amax_history[0] = x.abs().max()
        return self.linear(rounded)


class ForgetsAmaxHistory(AmaxScaledLinear):
    save_history = False


def test_a_checkpoint_that_drops_state_only_training_moves_is_caught_after_training(device):
    report = check_lifecycle(ForgetsAmaxHistory, device=device, inputs=_x(4, 16))
    assert report["checkpoint_round_trip"].status is HELD  # the untrained round trip cannot see it
    result = report["checkpoint_round_trip_after_training"]
    assert result.status is VIOLATED
    assert result.evidence.startswith("3 training steps (forward, backward, SGD step) moved 2 state entries "
                                      "(linear.bias, linear.weight); after the round trip: output of step 4 #0 "
                                      "differs (max |diff| ")
    assert "grad at step 4 of linear.weight differs" in result.evidence

    twin = check_lifecycle(AmaxScaledLinear, device=device, inputs=_x(4, 16))
    twin.assert_ok()
    assert twin["checkpoint_round_trip_after_training"].evidence.startswith(
        "3 training steps (forward, backward, SGD step) moved 3 state entries (amax_history, linear.bias, "
        "linear.weight); a fresh module loaded from the checkpoint, and one loaded from that module's own "
        "checkpoint saved before its first forward, compute step 4 like the original")


class ForgetsRecipeState(te.ops.BasicLinear):
    """A refops op whose checkpoint leaves out its recipe state (delayed scaling's amax history and scales)."""

    def get_extra_state(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8)


class UnderDelayedScaling(torch.nn.Module):
    """``build(device)``'s refops ops, every forward under delayed scaling; with quantized weights, built inside
    ``quantized_model_init``."""

    def __init__(self, build, device=None, quantized_weights=True):
        super().__init__()
        with te.quantized_model_init(enabled=quantized_weights, recipe=te.recipe.DelayedScaling()):
            self.ops = build(device)

    def forward(self, x):
        with te.autocast(recipe=te.recipe.DelayedScaling()):
            return self.ops(x)


def _norm_linear_bias(linear):
    return lambda d: te.ops.Sequential(te.ops.LayerNorm(16, device=d), linear(16, 8, device=d), te.ops.Bias(8, device=d))


def test_recipe_state_left_out_of_a_refops_checkpoint_is_caught_after_training(device):
    report = check_lifecycle(lambda d: UnderDelayedScaling(_norm_linear_bias(ForgetsRecipeState), d, False),
                             device=device, inputs=_x(32, 16))
    # Untrained, the fresh module's recipe state is the saved one anyway: the round trip is exact.
    assert report["checkpoint_round_trip"].status is HELD
    result = report["checkpoint_round_trip_after_training"]
    assert result.status is VIOLATED and "output of step 4 #0 differs" in result.evidence
    assert "_extra_state" not in result.evidence.split(";")[0]  # the training moved no recipe state it saves

    twin = check_lifecycle(lambda d: UnderDelayedScaling(_norm_linear_bias(te.ops.BasicLinear), d, False),
                           device=device, inputs=_x(32, 16))
    assert twin["checkpoint_round_trip_after_training"].status is HELD
    assert "ops.1._extra_state" in twin["checkpoint_round_trip_after_training"].evidence


# ------------------------------------------------------------------ refops' own ops hold everything
REFOPS_UNDER_DELAYED_SCALING = {
    "Linear": lambda d: te.ops.Linear(16, 8, device=d),
    "Sequential": lambda d: te.ops.Sequential(te.ops.LayerNorm(16, device=d), te.ops.Linear(16, 32, device=d),
                                              te.ops.GELU(), te.ops.Linear(32, 8, device=d)),
    "LayerNorm": lambda d: te.ops.LayerNorm(16, device=d),
}


@pytest.mark.parametrize("name", list(REFOPS_UNDER_DELAYED_SCALING))
def test_refops_ops_under_delayed_scaling_hold_every_property_including_the_extensions(name, device):
    build = REFOPS_UNDER_DELAYED_SCALING[name]
    report = check_lifecycle(lambda d: UnderDelayedScaling(build, d), device=device, inputs=_x(32, 16), strict=True)
    expected = {p: KEPT if prop.kind is Kind.EXTENSION else HELD for p, prop in PROPERTIES.items()}
    expected.update({p: NOT_CHECKED for p in CONVERSION})  # conversions: test_lifecycle_conversion.py, into refops ops
    assert report.statuses == expected, str(report)
    if name != "LayerNorm":  # a linear's recipe state moved in training, and the checkpoint brings it back
        assert "_extra_state" in report["checkpoint_round_trip_after_training"].evidence
    report.assert_ok()
