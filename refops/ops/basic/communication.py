"""What the communication ops share: a process group, and the identity when it has one rank."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..collectives import check_same_shape_across_ranks, get_group_size
from ..op import BasicOperation, OperationContext

__all__ = ["CommunicationOperation"]


class CommunicationOperation(BasicOperation):
    """A basic op that only moves or sums data over ``process_group``; no parameters, no quantizers.

    Subclasses say what crosses the ranks in :meth:`communicate_forward` and
    :meth:`communicate_backward`; with a group of one rank both directions are the
    identity (the forward returns a detached input, as TE's ops do).
    """

    def __init__(self, process_group: Optional[Any] = None) -> None:
        super().__init__()
        self.process_group = process_group
        self.process_group_size = get_group_size(process_group, owner=f"{type(self).__name__}: process_group")

    def communicate_forward(self, input_: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def communicate_backward(self, grad_output: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        if self.process_group_size == 1:
            return input_.detach()
        check_same_shape_across_ranks(input_, self.process_group, what=f"{type(self).__name__}: the input")
        return self.communicate_forward(input_)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        if self.process_group_size == 1:
            return grad_output, []
        return self.communicate_backward(grad_output), []
