"""``AllGather``: concatenate the ranks' inputs along dim 0 (backward: reduce-scatter the gradient)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...distributed.collectives import gather_along_first_dim, get_group_size, reduce_scatter_along_first_dim
from ..op import BasicOperation, OperationContext

__all__ = ["AllGather"]


class AllGather(BasicOperation):
    """``y = cat(x_0, ..., x_{W-1})`` along dim 0 over ``process_group`` (TE's ``te.ops.AllGather``).

    A quantized input is gathered in quantized form (data and scales, see
    :mod:`refops.distributed.quantized_gather`); a plain one bit for bit.
    Backward: the gradient is dequantized, summed over the ranks and each rank
    keeps its own slice of dim 0 (reduce-scatter). With one rank both are the identity.

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
        return gather_along_first_dim(input_, self.process_group)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        if self.process_group_size == 1:
            return grad_output, []
        return reduce_scatter_along_first_dim(grad_output, self.process_group, op_name="AllGather backward"), []
