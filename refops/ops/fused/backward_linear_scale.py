"""``BackwardLinearScale``: the backward of ``BasicLinear`` + ``ConstantScale`` with ``alpha = scale``."""

from __future__ import annotations

from typing import Optional

import torch

from ..basic.basic_linear import BasicLinear
from ..basic.basic_linear_tp import refuse_tensor_parallel_mode
from ..basic.constant_scale import ConstantScale
from ..op import FusedOperation, OperationContext
from .one_rounding import gemm_requests
from .rules import Condition, FusionRule

__all__ = ["BackwardLinearScale", "RULE"]


class BackwardLinearScale(FusedOperation):
    """Backward-only: dgrad and wgrad of ``d(linear out) = scale * dy``.

    As TE, the scale is the GEMMs' alpha: ``dx = round(scale * dy W)`` and
    ``dW = round(scale * dy^T x)``, one rounding each (not ``scale * dy`` rounded first).
    """

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale) -> None:
        refuse_tensor_parallel_mode(type(self).__name__, linear, "column", "a fused scaled grad-input")
        super().__init__([linear, scale])

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[Optional[torch.Tensor], list[tuple], list[tuple[()]]]:
        linear, scale = self.basic_ops
        with gemm_requests(basic_op_ctxs[0], alpha=scale.scale, out_fp32=False):  # alpha on both GEMMs
            dx, (dw,) = linear.op_backward(basic_op_ctxs[0], grad_output)
        return dx, [(dw,), ()], [(), ()]


RULE = FusionRule(
    fused_op=BackwardLinearScale,
    patterns=((BasicLinear, ConstantScale),),
    conditions=(
        Condition("the linear is not column tensor-parallel", lambda w, r, p: w[0].tensor_parallel_mode != "column"),
    ),
    build=lambda w: BackwardLinearScale(linear=w[0], scale=w[1]),
)
