"""TransformerEngine linear-layer bugs: a bias applied twice, a backward override that reads the wrong operand,
and recipe state that does not follow a change of the amax history length.

The first two are opaque plain-torch modules against refops' ops; the last two are refops' ``BasicLinear``
with the defect injected inside the candidate only (as :mod:`.module_refops_caches` does).
"""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.testing import compare_modules

from .cases import RecallCase
from .module_fp8_linear import _dequantize, _quantize

FEATURES_IN, FEATURES_OUT, BATCH = 64, 32, 32


# ------------------------------------------------------------ TE #1569: return_bias applied anyway
class LayerNormLinearReturningBias(torch.nn.Module):
    """``LayerNormLinear(return_bias=True)`` and its caller: the layer hands the bias back for the caller's
    fused bias-add (Megatron's bias-dropout-add), so its own GEMM must not add it; ``applies_bias`` is the bug."""

    def __init__(self, applies_bias: bool) -> None:
        super().__init__()
        self.add_module("0", torch.nn.LayerNorm(FEATURES_IN))
        self.add_module("1", torch.nn.Linear(FEATURES_IN, FEATURES_OUT))
        self.applies_bias = applies_bias

    def layer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        norm, linear = getattr(self, "0"), getattr(self, "1")
        z = torch.nn.functional.layer_norm(x, (FEATURES_IN,), norm.weight, norm.bias, norm.eps)
        return torch.nn.functional.linear(z, linear.weight, linear.bias if self.applies_bias else None), linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, bias = self.layer(x)
        return y + bias  # the caller's bias-add


def _compare_return_bias(applies_bias: bool) -> Any:
    torch.manual_seed(0)
    reference = te.ops.Sequential(te.ops.LayerNorm(FEATURES_IN), te.ops.Linear(FEATURES_IN, FEATURES_OUT))
    return compare_modules(LayerNormLinearReturningBias(applies_bias), reference, (torch.randn(BATCH, FEATURES_IN),))


# ------------------------------------------------------------ TE #3141: dequantized backward override
class _DequantizedBackwardLinear(torch.autograd.Function):
    """FP8 forward (current scaling, E4M3); backward in high precision from the forward's dequantized
    operands (``backward_override="dequantized"``). ``save_original_input`` (the bug) keeps the original
    input for the wgrad instead, which the override was meant to exclude."""

    @staticmethod
    def forward(ctx, x, weight, bias, save_original_input):
        xq, x_scale_inv = _quantize(x, 448.0)
        wq, w_scale_inv = _quantize(weight, 448.0)
        x_dq, w_dq = _dequantize(xq, x_scale_inv), _dequantize(wq, w_scale_inv)
        ctx.save_for_backward(x if save_original_input else x_dq, w_dq)
        return (x_dq @ w_dq.t() + bias).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x_saved, w_dq = ctx.saved_tensors
        return (dy @ w_dq).to(dy.dtype), (dy.t() @ x_saved.float()).to(dy.dtype), dy.sum(0), None


class DequantizedBackwardLinear(torch.nn.Module):
    def __init__(self, save_original_input: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES_OUT, FEATURES_IN) / FEATURES_IN**0.5)
        self.bias = torch.nn.Parameter(torch.randn(FEATURES_OUT) * 0.1)
        self.save_original_input = save_original_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _DequantizedBackwardLinear.apply(x, self.weight, self.bias, self.save_original_input)


def _compare_dequantized_backward(save_original_input: bool) -> Any:
    torch.manual_seed(0)
    recipe = te.recipe.Float8CurrentScaling(backward_override="dequantized")
    return compare_modules(DequantizedBackwardLinear(save_original_input), te.ops.Linear(FEATURES_IN, FEATURES_OUT),
                           (torch.randn(BATCH, FEATURES_IN),), recipe=recipe)


# ------------------------------------------------------------ TE #1985, #2044: amax history length changed
class HistoryKeepingLinear(te.ops.BasicLinear):
    """``BasicLinear`` whose recipe state is reset only when the recipe type changes, as TE's op fuser did
    before #1985: a new ``amax_history_len`` alone leaves the old history (and the quantizers) in place."""

    def __init__(self, fixed: bool) -> None:
        super().__init__(FEATURES_IN, FEATURES_OUT)
        self.fixed = fixed

    def reset_recipe_state(self, *, recipe: Any) -> None:
        current = self.recipe
        if (not self.fixed and current is not None and type(current) is type(recipe)
                and getattr(current, "amax_history_len", None) != getattr(recipe, "amax_history_len", None)):
            return
        super().reset_recipe_state(recipe=recipe)


class StaleAmaxPointerLinear(te.ops.BasicLinear):
    """``BasicLinear`` that, once #1985 resets its state, reallocates the amax history but keeps its old
    quantizers (TE #2044): their amax is a view into the old history, so the amaxes they record never reach
    the history the scale update reads, and the scales stop moving."""

    def __init__(self, fixed: bool) -> None:
        super().__init__(FEATURES_IN, FEATURES_OUT)
        self.fixed = fixed

    def reset_recipe_state(self, *, recipe: Any) -> None:
        old = None if self._quantizers is None else dict(self._quantizers)
        super().reset_recipe_state(recipe=recipe)
        if not self.fixed and old is not None and type(self.recipe) is type(recipe):
            self._quantizers.update(old)  # the quantizers still point at the old amax history


def _train_then_compare_history(op_class: type, fixed: bool) -> Any:
    torch.manual_seed(0)
    candidate = te.ops.Sequential(op_class(fixed))
    reference = te.ops.Sequential(te.ops.BasicLinear(FEATURES_IN, FEATURES_OUT))
    with torch.no_grad():
        reference[0].weight.copy_(candidate[0].weight)
    long_history = te.recipe.DelayedScaling(amax_history_len=16)
    # Two steps under a long history, the first on a large-magnitude batch, the same for both sides.
    for scale in (64.0, 1.0):
        x, dy = scale * torch.randn(BATCH, FEATURES_IN), torch.randn(BATCH, FEATURES_OUT)
        for model in (candidate, reference):
            with te.autocast(recipe=long_history):
                model(x).backward(dy)
            model.zero_grad(set_to_none=True)
    # The user shortens the history (a recipe change mid-training) and checks the model under it.
    return compare_modules(candidate, reference, (torch.randn(BATCH, FEATURES_IN),),
                           recipe=te.recipe.DelayedScaling(amax_history_len=1))


CASES = [
    RecallCase("return_bias_applied_in_gemm_too", "https://github.com/NVIDIA/TransformerEngine/pull/1569", "module",
               "LayerNormLinear(return_bias=True) still adds the bias in its GEMM while returning it for the "
               "caller's bias-add: the bias counts twice, in the output and in its grad",
               lambda: _compare_return_bias(True), lambda: _compare_return_bias(False)),
    RecallCase("dequantized_backward_reads_original_input", "https://github.com/NVIDIA/TransformerEngine/pull/3141",
               "module", "under backward_override='dequantized', save_original_input=True makes the wgrad use "
               "the original input instead of the forward's dequantized FP8 operand",
               lambda: _compare_dequantized_backward(True), lambda: _compare_dequantized_backward(False)),
    RecallCase("recipe_state_kept_after_amax_history_len_change",
               "https://github.com/NVIDIA/TransformerEngine/pull/1985", "module",
               "te.ops reset their delayed-scaling state only when the recipe type changes: a shorter "
               "amax_history_len keeps the old history, whose stale large amax sets the scale",
               lambda: _train_then_compare_history(HistoryKeepingLinear, False),
               lambda: _train_then_compare_history(HistoryKeepingLinear, True)),
    RecallCase("quantizers_record_into_reallocated_amax_history",
               "https://github.com/NVIDIA/TransformerEngine/pull/2044", "module",
               "after an amax_history_len change the op reallocates its amax history but its quantizers keep "
               "pointers into the old one: the recorded amaxes are lost and the delayed scales stop updating",
               lambda: _train_then_compare_history(StaleAmaxPointerLinear, False),
               lambda: _train_then_compare_history(StaleAmaxPointerLinear, True)),
]
