"""``AllGather``: concatenate the ranks' inputs along dim 0 (backward: reduce-scatter the gradient)."""

from __future__ import annotations

import torch

from ..collectives import reduce_scatter_along_first_dim
from ..tensor_parallel_gather import gather_along_first_dim
from .communication import CommunicationOperation

__all__ = ["AllGather"]


class AllGather(CommunicationOperation):
    """``y = cat(x_0, ..., x_{W-1})`` along dim 0 over ``process_group`` (TE's ``te.ops.AllGather``).

    A quantized input is gathered in quantized form (data and scales, see
    :mod:`refops.ops.tensor_parallel_gather`); a plain one bit for bit.
    Backward: the gradient is dequantized, summed over the ranks and each rank
    keeps its own slice of dim 0 (reduce-scatter). With one rank both are the identity.

    Args:
        process_group: the ``torch.distributed`` group (None: the default group).
    """

    def communicate_forward(self, input_: torch.Tensor) -> torch.Tensor:
        return gather_along_first_dim(input_, self.process_group)

    def communicate_backward(self, grad_output: torch.Tensor) -> torch.Tensor:
        return reduce_scatter_along_first_dim(grad_output, self.process_group, op_name="AllGather backward")
