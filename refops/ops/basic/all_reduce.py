"""``AllReduce``: sum the ranks' inputs (backward: the identity)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...distributed.collectives import all_reduce, get_group_size
from ..op import BasicOperation, OperationContext

__all__ = ["AllReduce"]


class AllReduce(BasicOperation):
    """``y = sum over ranks of x`` over ``process_group`` (TE's ``te.ops.AllReduce``).

    A quantized input is dequantized first: the sum is in high precision.
    Backward is the identity: the output is assumed to feed computations that
    every rank repeats identically (as after a row tensor-parallel linear), so
    each rank already holds the full gradient. ``reduce_in_backward`` is stored,
    as in TE, which does not read it either.

    Args:
        process_group: the ``torch.distributed`` group (None: the default group).
        reduce_in_backward: kept for TE compatibility; it changes nothing.
    """

    def __init__(self, process_group: Optional[Any] = None, reduce_in_backward: bool = True) -> None:
        super().__init__()
        self.process_group = process_group
        self.process_group_size = get_group_size(process_group)
        self._reduce_in_backward = reduce_in_backward

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
        return all_reduce(input_, self.process_group)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        return grad_output, []
