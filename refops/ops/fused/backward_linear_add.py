"""``BackwardLinearAdd``: the dgrad of ``BasicLinear`` accumulated into an in-place ``MakeExtraOutput``'s grad."""

from __future__ import annotations

from typing import Optional

import torch

from ..basic.basic_linear import BasicLinear
from ..basic.basic_linear_tp import refuse_tensor_parallel_mode
from ..basic.make_extra_output import MakeExtraOutput
from ..op import FusedOperation, OperationContext
from .one_rounding import add_grad_and_round, backward_fp32
from .rules import Condition, FusionRule

__all__ = ["BackwardLinearAdd", "RULE", "BackwardThenAddExtraOutputGrad"]


class BackwardThenAddExtraOutputGrad(FusedOperation):
    """Backward-only fusions of ``MakeExtraOutput`` + an op: the op's backward, then the extra grad added.

    They consume the contexts the unfused forwards filled. As TE's kernels (GEMM
    with beta = 1, ``rmsnorm_bwd_add``), the op's ``dx`` stays in fp32 until the
    extra grad is added, then is rounded once.
    """

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[Optional[torch.Tensor], list[tuple], list[tuple[()]]]:
        add, op = self.basic_ops
        dx, grads = backward_fp32(op, basic_op_ctxs[1], grad_output)
        (grad_extra,) = basic_op_grad_extra_outputs[0]
        dx = add_grad_and_round(dx, grad_extra, dtype=basic_op_ctxs[1].dtype, in_place=add._in_place)
        return dx, [(), tuple(grads)], [(), ()]


class BackwardLinearAdd(BackwardThenAddExtraOutputGrad):
    """Backward-only: ``dx = g + dy W`` where ``g`` is the extra output's grad (updated in place)."""

    def __init__(self, *, backward_add: MakeExtraOutput, linear: BasicLinear) -> None:
        refuse_tensor_parallel_mode(
            type(self).__name__, linear, "column", "accumulating the grad-input into an extra output's grad"
        )
        super().__init__([backward_add, linear])


RULE = FusionRule(
    fused_op=BackwardLinearAdd,
    patterns=((MakeExtraOutput, BasicLinear),),
    conditions=(
        Condition("the extra output is in place", lambda w, r, p: w[0]._in_place),
        Condition("the linear is not column tensor-parallel", lambda w, r, p: w[1].tensor_parallel_mode != "column"),
    ),
    build=lambda w: BackwardLinearAdd(backward_add=w[0], linear=w[1]),
)
