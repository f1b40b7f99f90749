"""``ConstantScale``: multiply by a fixed number."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from .._common import maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["ConstantScale"]


class ConstantScale(BasicOperation):
    """``y = scale * x`` and ``dx = scale * dy``; ``scale`` is a Python number, not a parameter.

    Dtypes: the output has the input's dtype (TransformerEngine does not apply
    ``torch.autocast`` here: scaling is not a matmul-like op). A quantized input
    or grad-output is dequantized to its nominal dtype first.

    Args:
        scale: the constant, kept as ``self.scale`` (fused ops read it).
    """

    def __init__(self, scale: float) -> None:
        super().__init__()
        if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
            raise TypeError(f"{type(self).__name__}: scale must be a Python number, got {type(scale).__name__}")
        self.scale = scale

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        return maybe_dequantize(input_, input_.dtype) * self.scale

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        return maybe_dequantize(grad_output, grad_output.dtype) * self.scale, []

    def extra_repr(self) -> str:
        return f"scale={self.scale}"
