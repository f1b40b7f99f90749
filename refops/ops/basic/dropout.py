"""``Dropout``: zero random entries during training and rescale the rest."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from .._common import compute_dtype, maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["Dropout"]


class Dropout(BasicOperation):
    """``y = x * mask`` with ``mask = Bernoulli(1 - p) / (1 - p)`` elementwise, in training mode.

    Backward: ``dx = dy * mask`` with the forward's mask. In eval mode
    (``op.eval()``) and for ``p == 0`` the op is the identity and returns its input
    unchanged (a quantized input stays quantized). In training a quantized input
    or grad-output is dequantized first.

    The mask is drawn with torch's RNG on the input's device (so
    ``torch.manual_seed`` makes it reproducible) and is stored in the compute
    dtype, so ``1 / (1 - p)`` is rounded like the output.

    Dtypes: computes in the ``torch.autocast`` dtype when active, else the input's
    dtype.

    Args:
        p: the probability of zeroing an entry, ``0 <= p < 1`` (kept as
            ``self.dropout_probability``).
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(p, numbers.Real) or isinstance(p, bool):
            raise TypeError(f"{name}: p must be a Python number, got {type(p).__name__}")
        if not 0 <= p < 1:
            raise ValueError(f"{name}: the dropout probability p must satisfy 0 <= p < 1, got {p}")
        self.dropout_probability = float(p)

    def _is_identity(self) -> bool:
        return not self.training or self.dropout_probability == 0

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
        ctx.is_identity = self._is_identity()
        if ctx.is_identity:
            return input_
        dtype = compute_dtype(name, input_, input_.dtype)
        x = maybe_dequantize(input_, dtype)
        keep_probability = 1 - self.dropout_probability
        # The mask from fp32 uniforms of torch's generator, whatever x's dtype: one generator state gives one
        # mask in every dtype, so a float64 twin and a candidate replaying the state draw the same (docs/oracle.md).
        uniform = torch.rand(x.shape, dtype=torch.float32, device=x.device)
        mask = (uniform >= self.dropout_probability).to(x.dtype) * (1 / keep_probability)
        if ctx.requires_grad:
            ctx.save_for_backward(mask)
        ctx.dtype = dtype
        return x * mask

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        if ctx.is_identity:
            return grad_output, []
        (mask,) = ctx.saved_tensors
        return maybe_dequantize(grad_output, ctx.dtype) * mask, []

    def extra_repr(self) -> str:
        return f"p={self.dropout_probability}"
