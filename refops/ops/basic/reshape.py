"""``Reshape``: view the input with another shape."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from .._common import maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["Reshape"]


class Reshape(BasicOperation):
    """``y = torch.reshape(x, shape)``; one dim may be ``-1`` (inferred).

    Backward reshapes ``dy`` to the input's shape saved by the forward. Values are
    never changed. A quantized input (or grad-output) is dequantized exactly to
    its nominal dtype first, so the result is a plain tensor (TE keeps a
    per-tensor FP8 tensor quantized through a view; the values are the same).

    Args:
        shape: the output shape, an int or an iterable of ints.
    """

    def __init__(self, shape: Iterable[int] | int) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        name = type(self).__name__
        if any(not isinstance(d, int) or isinstance(d, bool) or d < -1 for d in shape):
            raise ValueError(f"{name}: shape must be ints >= -1, got {shape!r}")
        if sum(d == -1 for d in shape) > 1:
            raise ValueError(f"{name}: at most one dim may be -1, got {shape!r}")
        self._shape: tuple[int, ...] = shape

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        name = type(self).__name__
        try:
            output = maybe_dequantize(input_, input_.dtype).reshape(self._shape)
        except RuntimeError as error:
            raise ValueError(f"{name}: cannot reshape input of shape {tuple(input_.shape)} to {self._shape}") from error
        ctx.input_shape = input_.shape
        return output

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        return maybe_dequantize(grad_output, grad_output.dtype).reshape(ctx.input_shape), []

    def extra_repr(self) -> str:
        return f"shape={self._shape}"
