"""An emulated MXFP8 linear whose backward requires a contiguous output grad (pytorch/ao#4470).

torchao's ``mx_mm.backward`` reshaped the output grad and handed it to the dim0 MXFP8 cast, which
asserts a contiguous input; a same-shape reshape of a non-contiguous grad (the output transposed or
sliced downstream) is a no-op view, so such a grad reached the cast and the backward crashed. The
fix makes the grad contiguous first. Re-created as an opaque MXFP8 linear in plain torch: every GEMM
operand is quantized the way TE's recipe does (fprop x and W row-wise; dgrad dy row-wise and W
column-wise; wgrad dy and x column-wise) with :func:`.quantizer_ao_mx.mx_cast`, and dequantized.
"""

from __future__ import annotations

import types
from typing import Any

import torch

import refops as te
from refops.testing import compare_modules

from .cases import RecallCase
from .quantizer_ao_mx import mx_cast
from .quantizer_mxfp8 import _pow2

FEATURES_IN, FEATURES_OUT, BATCH = 64, 32, 32
_ROWWISE = types.SimpleNamespace(rowwise_usage=True, columnwise_usage=False)
_COLUMNWISE = types.SimpleNamespace(rowwise_usage=False, columnwise_usage=True)


def mx_fake_quantize(t: torch.Tensor, columnwise: bool) -> torch.Tensor:
    """The values MXFP8 keeps of a 2-D ``t``: blocks of 32 along its rows, or along its columns."""
    data, exponent = mx_cast(t, _COLUMNWISE if columnwise else _ROWWISE)
    scale = _pow2(exponent.to(torch.int32))
    m, k = t.shape
    if columnwise:  # scales (M/32, K)
        return (data.float().reshape(m // 32, 32, k) * scale.unsqueeze(1)).reshape(m, k)
    return (data.float().reshape(m, k // 32, 32) * scale.unsqueeze(-1)).reshape(m, k)


class _MxLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, makes_grad_contiguous):
        ctx.save_for_backward(x, weight)
        ctx.makes_grad_contiguous = makes_grad_contiguous
        y = mx_fake_quantize(x, False) @ mx_fake_quantize(weight, False).t()
        return y + bias

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        if ctx.makes_grad_contiguous:
            dy = dy.contiguous()
        dy = dy.reshape(-1, dy.shape[-1])  # a no-op view for a 2-D grad, contiguous or not
        if not dy.is_contiguous():  # the dim0 cast kernel's check (the bug: nothing made it contiguous)
            raise RuntimeError("to_mx: the dim0 cast expects a contiguous input")
        dx = mx_fake_quantize(dy, False) @ mx_fake_quantize(weight, True)
        dw = mx_fake_quantize(dy, True).t() @ mx_fake_quantize(x, True)
        return dx, dw, dy.sum(0), None


class MxLinear(torch.nn.Module):
    def __init__(self, makes_grad_contiguous: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(FEATURES_OUT, FEATURES_IN) / FEATURES_IN**0.5)
        self.bias = torch.nn.Parameter(torch.randn(FEATURES_OUT) * 0.1)
        self.makes_grad_contiguous = makes_grad_contiguous

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _MxLinearFunction.apply(x, self.weight, self.bias, self.makes_grad_contiguous)


def _compare(makes_grad_contiguous: bool) -> Any:
    torch.manual_seed(0)
    candidate = MxLinear(makes_grad_contiguous)
    return compare_modules(candidate, te.ops.Linear(FEATURES_IN, FEATURES_OUT), (torch.randn(BATCH, FEATURES_IN),),
                           recipe=te.recipe.MXFP8BlockScaling())


def _backward_with_transposed_output_raises(makes_grad_contiguous: bool) -> bool:
    """The PR's regression test: the output consumed transposed, so its grad arrives non-contiguous."""
    torch.manual_seed(0)
    x = torch.randn(BATCH, FEATURES_IN, requires_grad=True)
    try:
        MxLinear(makes_grad_contiguous)(x).t().backward(torch.randn(FEATURES_OUT, BATCH))
    except RuntimeError:
        return True
    return False


CASES = [
    RecallCase("mxfp8_backward_requires_contiguous_grad", "https://github.com/pytorch/ao/pull/4470", "module",
               "the MXFP8 linear's backward hands a non-contiguous output grad (the output transposed "
               "downstream) to a cast that requires a contiguous input, and the backward raises",
               lambda: _compare(False), lambda: _compare(True),
               lambda: _backward_with_transposed_output_raises(False)
               and not _backward_with_transposed_output_raises(True)),
]
