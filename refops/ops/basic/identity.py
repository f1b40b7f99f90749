"""``Identity``: ``y = x``, the do-nothing op (useful as a placeholder or fusion boundary)."""

from __future__ import annotations

from typing import Any

import torch

from ..op import BasicOperation, OperationContext

__all__ = ["Identity"]


class Identity(BasicOperation):
    """``y = x`` and ``dx = dy``: the very same tensors are passed through, never copied.

    Quantized tensors pass through unchanged too (still quantized, same object).
    """

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        return input_

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        return grad_output, []
