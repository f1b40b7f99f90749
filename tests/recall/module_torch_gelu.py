"""A GELU whose backward mishandles a non-contiguous output grad (pytorch/pytorch#107876).

On CPU, PyTorch's oneDNN (ideep) eltwise backward assumed the output grad had the input's memory
layout: when the GELU's output was transposed downstream (``gelu(x).transpose(-1, -2)`` in a loss),
the grad arrived non-contiguous and the input grad came out wrong. The fix (pytorch/pytorch#108038)
gives the kernel a grad buffer in the layout it expects and reorders back. Re-created here as a
hand-written GELU kernel (the tanh approximation, evaluated op by op as refops' reference does)
whose backward reads the output grad's memory in row-major order; the twin makes it contiguous first.

(torch's own fused ``gelu(x, approximate="tanh")`` is not used: its kernel rounds the formula otherwise
and, where 1 + tanh cancels (x = -5.09 in the row-spread scenario), gives -0.0 where refops gives
-1.52e-7 (float64: -1.20e-7); the default ``compare_modules`` fails torch's GELU itself there.)
"""

from __future__ import annotations

import math
from typing import Any

import torch

import refops as te
from refops.testing import compare_modules

from .cases import RecallCase

FEATURES, BATCH = 64, 32
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _row_major_strides(shape: torch.Size) -> tuple[int, ...]:
    return torch.empty(shape, device="meta").stride()


def _gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation, written out op by op."""
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


class _GeluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, grad_read_as_row_major):
        ctx.save_for_backward(x)
        ctx.grad_read_as_row_major = grad_read_as_row_major
        return _gelu(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        if ctx.grad_read_as_row_major:  # the kernel walks dy's memory as if laid out like x (the bug)
            dy = dy.as_strided(dy.shape, _row_major_strides(dy.shape), dy.storage_offset())
        else:
            dy = dy.contiguous()
        with torch.enable_grad():
            leaf = x.detach().requires_grad_()
            (dx,) = torch.autograd.grad(_gelu(leaf), leaf, dy)
        return dx, None


class HandWrittenGelu(torch.nn.Module):
    def __init__(self, grad_read_as_row_major: bool) -> None:
        super().__init__()
        self.grad_read_as_row_major = grad_read_as_row_major

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GeluFunction.apply(x, self.grad_read_as_row_major)


def _compare(grad_read_as_row_major: bool) -> Any:
    torch.manual_seed(0)
    return compare_modules(HandWrittenGelu(grad_read_as_row_major), te.ops.GELU(), (torch.randn(BATCH, FEATURES),))


def _input_grad_with_transposed_output(grad_read_as_row_major: bool) -> torch.Tensor:
    """The issue's repro: the loss reads the GELU's output transposed, so its grad arrives non-contiguous."""
    torch.manual_seed(0)
    x = (torch.randn(4, 6, 6) * 10).requires_grad_()
    target = torch.randn(4, 6, 6) * 10
    y = HandWrittenGelu(grad_read_as_row_major)(x).transpose(-1, -2)
    torch.mean((y - target) ** 2).backward()
    return x.grad


CASES = [
    RecallCase("gelu_backward_reads_strided_grad_as_contiguous", "https://github.com/pytorch/pytorch/issues/107876",
               "module", "GELU's CPU backward takes a non-contiguous output grad (the output transposed downstream) "
               "as laid out like the input, so the input grad is wrong",
               lambda: _compare(True), lambda: _compare(False),
               lambda: not torch.equal(_input_grad_with_transposed_output(True),
                                       _input_grad_with_transposed_output(False))),
]
