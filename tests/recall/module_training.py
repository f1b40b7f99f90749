"""Opaque candidates whose bug lives in training mechanics: dropout's backward and gradient accumulation."""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.testing import compare_modules

from .cases import RecallCase

FEATURES, BATCH, P = 32, 16, 0.25


class _DropoutFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, backward_scale_is_p):
        keep = (torch.rand_like(x) >= p).to(x.dtype)
        ctx.save_for_backward(keep)
        ctx.backward_scale = p if backward_scale_is_p else 1.0 / (1.0 - p)
        return x * keep / (1.0 - p)

    @staticmethod
    def backward(ctx, dy):
        (keep,) = ctx.saved_tensors
        return dy * keep * ctx.backward_scale, None, None


class LinearDropout(torch.nn.Sequential):
    """``Linear`` then a hand-written dropout; ``backward_scale_is_p`` scales the grad by p (the bug)."""

    def __init__(self, backward_scale_is_p: bool) -> None:
        super().__init__(torch.nn.Linear(FEATURES, FEATURES))
        self.backward_scale_is_p = backward_scale_is_p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self[0](x)
        return _DropoutFunction.apply(y, P, self.backward_scale_is_p) if self.training else y


def _compare_dropout(backward_scale_is_p: bool) -> Any:
    torch.manual_seed(0)
    reference = te.ops.Sequential(te.ops.Linear(FEATURES, FEATURES), te.ops.Dropout(P))
    return compare_modules(LinearDropout(backward_scale_is_p), reference, (torch.randn(BATCH, FEATURES),))


class _MainGradLinearFunction(torch.autograd.Function):
    """Megatron-style fused wgrad accumulation: dW goes into ``weight.main_grad``, autograd gets zeros."""

    @staticmethod
    def forward(ctx, x, weight, module):
        ctx.save_for_backward(x, weight)
        ctx.module = module
        return x @ weight.t()

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        # The flag says "main_grad owns this grad", not "an add already happened": gating the add on it
        # drops every microbatch after the first (the bug).
        if not (ctx.module.gate_on_flag and weight.grad_added_to_main_grad):
            weight.main_grad.add_(dy.t() @ x)
        weight.grad_added_to_main_grad = True
        return dy @ weight, torch.zeros_like(weight), None


class MainGradLinear(torch.nn.Module):
    def __init__(self, gate_on_flag: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES, FEATURES) / FEATURES**0.5)
        self.gate_on_flag = gate_on_flag
        _add_main_grad(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _MainGradLinearFunction.apply(x, self.weight, self)


def _add_main_grad(weight: torch.nn.Parameter) -> None:
    weight.main_grad = torch.zeros_like(weight)
    weight.grad_added_to_main_grad = False


def _compare_main_grad(gate_on_flag: bool) -> Any:
    torch.manual_seed(0)
    candidate = MainGradLinear(gate_on_flag)
    reference = te.ops.Linear(FEATURES, FEATURES, bias=False, accumulate_into_main_grad=True)
    _add_main_grad(reference.weight)
    return compare_modules(candidate, reference, (torch.randn(BATCH, FEATURES),))


def _main_grad_after_two_microbatches(gate_on_flag: bool) -> torch.Tensor:
    torch.manual_seed(0)
    module = MainGradLinear(gate_on_flag)
    for _ in range(2):
        module(torch.randn(BATCH, FEATURES)).sum().backward()
    return module.weight.main_grad


CASES = [
    RecallCase("dropout_backward_scaled_by_p", "https://github.com/NVIDIA/apex/pull/816", "module",
               "dropout's backward scales the kept grads by p instead of 1/(1-p)",
               lambda: _compare_dropout(True), lambda: _compare_dropout(False)),
    RecallCase("main_grad_accumulates_first_microbatch_only", "https://github.com/AMD-AGI/Primus/pull/1046",
               "module", "fused wgrad accumulation gates main_grad.add_ on grad_added_to_main_grad, a per-step "
               "flag, so only the first microbatch's weight grad reaches main_grad",
               lambda: _compare_main_grad(True), lambda: _compare_main_grad(False),
               lambda: not torch.equal(_main_grad_after_two_microbatches(True), _main_grad_after_two_microbatches(False))),
]
