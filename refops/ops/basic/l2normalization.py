"""``L2Normalization``: scale each vector over the last dim to unit L2 norm (no parameters)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...kernels import current_backend
from .._common import check_tensor, compute_dtype, maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["L2Normalization"]


class L2Normalization(BasicOperation):
    """``y = x * rsqrt(sum(x^2) + eps)`` over the last dim, used e.g. for query-key normalization.

    Backward: ``dx = r * (dy - x * sum(x * dy) / (sum(x^2) + eps))`` with
    ``r = rsqrt(sum(x^2) + eps)`` saved from the forward as ``rsqrt_norm``.

    Dtypes: computes in the ``torch.autocast`` dtype when active, else the input's
    dtype; the reductions run in fp32 and the result is rounded once. A quantized
    input or grad-output is dequantized first; the output is high precision.

    Args:
        eps: added to the sum of squares.
        seq_length, micro_batch_size: only used by TransformerEngine to warm up
            JIT kernels; accepted and recorded, without effect here.
    """

    def __init__(
        self,
        *,
        eps: float = 1e-6,
        seq_length: Optional[int] = None,
        micro_batch_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.seq_length = seq_length
        self.micro_batch_size = micro_batch_size

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
        dtype = compute_dtype(name, input_, input_.dtype)
        check_tensor(name, "input", input_, dtype=input_.dtype)
        if input_.dim() == 0:
            raise ValueError(f"{name}: expected input with at least one dim, got a 0-d tensor")
        x = maybe_dequantize(input_, dtype)
        y, rsqrt_norm = current_backend().l2_normalize_forward(x, eps=self.eps)
        if ctx.requires_grad:
            ctx.save_for_backward(x, rsqrt_norm)
        ctx.dtype = dtype
        return y

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        x, rsqrt_norm = ctx.saved_tensors
        dy = maybe_dequantize(grad_output, ctx.dtype)
        return current_backend().l2_normalize_backward(dy, x, rsqrt_norm, eps=self.eps), []

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
