"""``ReduceScatter``: sum the ranks' inputs and keep this rank's slice of dim 0 (backward: all-gather)."""

from __future__ import annotations

import torch

from ..collectives import reduce_scatter_along_first_dim
from ..tensor_parallel_gather import gather_along_first_dim
from .communication import CommunicationOperation

__all__ = ["ReduceScatter"]


class ReduceScatter(CommunicationOperation):
    """``y = (sum over ranks of x)[r * n / W : (r + 1) * n / W]`` (TE's ``te.ops.ReduceScatter``).

    Dim 0 (``n``) must be divisible by the group size ``W`` (``ValueError``
    otherwise). A quantized input is dequantized first: the sum is in high
    precision. Backward all-gathers the gradient along dim 0 (quantized
    gradients stay quantized). With one rank both are the identity.

    Args:
        process_group: the ``torch.distributed`` group (None: the default group).
    """

    def communicate_forward(self, input_: torch.Tensor) -> torch.Tensor:
        return reduce_scatter_along_first_dim(input_, self.process_group, op_name=type(self).__name__)

    def communicate_backward(self, grad_output: torch.Tensor) -> torch.Tensor:
        return gather_along_first_dim(grad_output, self.process_group)
