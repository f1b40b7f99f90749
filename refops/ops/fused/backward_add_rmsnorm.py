"""``BackwardAddRMSNorm``: RMSNorm backward plus the grad of the residual branch, in one op."""

from __future__ import annotations

from typing import Optional

import torch

from ..basic.make_extra_output import MakeExtraOutput
from ..basic.rms_norm import RMSNorm
from ..op import FusedOperation, OperationContext
from .rules import Condition, FusionRule

__all__ = ["BackwardAddRMSNorm", "RULE"]


class BackwardAddRMSNorm(FusedOperation):
    """Backward-only: ``dx = RMSNorm'(dy) + g`` where ``g`` is the extra output's grad (zeros if None).

    The reference computes the composition (norm backward, then the add).
    """

    def __init__(self, *, add: MakeExtraOutput, rmsnorm: RMSNorm) -> None:
        super().__init__([add, rmsnorm])

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[Optional[torch.Tensor], list[tuple], list[tuple[()]]]:
        add, norm = self.basic_ops
        dx, (dw,) = norm.op_backward(basic_op_ctxs[1], grad_output)
        dx, _, _ = add.fuser_backward(
            [basic_op_ctxs[0]], dx, basic_op_grad_extra_outputs=[basic_op_grad_extra_outputs[0]]
        )
        return dx, [(), (dw,)], [(), ()]


RULE = FusionRule(
    fused_op=BackwardAddRMSNorm,
    patterns=((MakeExtraOutput, RMSNorm),),
    conditions=(Condition("the extra output is not in place", lambda w, r, p: not w[0]._in_place),),
    build=lambda w: BackwardAddRMSNorm(add=w[0], rmsnorm=w[1]),
)
