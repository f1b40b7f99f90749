"""``ReduceScatter``: sum the ranks' inputs and keep this rank's slice of dim 0 (backward: all-gather)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...distributed.collectives import gather_along_first_dim, get_group_size, reduce_scatter_along_first_dim
from ..op import BasicOperation, OperationContext

__all__ = ["ReduceScatter"]


class ReduceScatter(BasicOperation):
    """``y = (sum over ranks of x)[r * n / W : (r + 1) * n / W]`` (TE's ``te.ops.ReduceScatter``).

    Dim 0 (``n``) must be divisible by the group size ``W`` (``ValueError``
    otherwise). A quantized input is dequantized first: the sum is in high
    precision. Backward all-gathers the gradient along dim 0 (quantized
    gradients stay quantized). With one rank both are the identity.

    Args:
        process_group: the ``torch.distributed`` group (None: the default group).
    """

    def __init__(self, process_group: Optional[Any] = None) -> None:
        super().__init__()
        self.process_group = process_group
        self.process_group_size = get_group_size(process_group)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected forward kwargs {sorted(kwargs)}")
        if self.process_group_size == 1:
            return input_.detach()
        return reduce_scatter_along_first_dim(input_, self.process_group, op_name=type(self).__name__)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        if self.process_group_size == 1:
            return grad_output, []
        return gather_along_first_dim(grad_output, self.process_group), []
