"""``ForwardLinearBiasAdd``: ``BasicLinear`` [+ ``Bias``] accumulated in place into an extra input."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..basic.add_extra_input import AddExtraInput
from ..basic.basic_linear import BasicLinear
from ..basic.basic_linear_tp import refuse_tensor_parallel_mode
from ..basic.bias import Bias
from ..op import FusedOperation, OperationContext
from .rules import Condition, FusionRule

__all__ = ["ForwardLinearBiasAdd", "RULE", "ComputeThenAddInPlace"]


class ComputeThenAddInPlace(FusedOperation):
    """Forward-only fusions that end in an in-place ``AddExtraInput``: run the compute ops, then add.

    Contract as for every forward-only fusion: each basic op's context holds what
    its own forward saves. The reference computes the composition; a fast path
    may accumulate inside the GEMM (beta = 1, alpha = scale).
    """

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: list[tuple[torch.Tensor, ...]],
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, list[tuple[()]]]:
        *compute, add = self.basic_ops
        y = input_
        prev_q = prev_op_grad_output_quantizer
        for op, ctx, kwargs in zip(compute, basic_op_ctxs, basic_op_kwargs):
            y = op.op_forward(ctx, y, prev_op_grad_output_quantizer=prev_q, next_op_input_quantizer=None, **kwargs)
            prev_q = op.get_grad_output_quantizer()
        y, _ = add.fuser_forward(
            [basic_op_ctxs[-1]],
            y,
            basic_op_extra_inputs=[basic_op_extra_inputs[-1]],
            prev_op_grad_output_quantizer=prev_q,
            next_op_input_quantizer=next_op_input_quantizer,
            basic_op_kwargs=[basic_op_kwargs[-1]],
        )
        return y, [() for _ in self.basic_ops]


class ForwardLinearBiasAdd(ComputeThenAddInPlace):
    """Forward-only: ``e += x W^T (+ b)`` where ``e`` is the extra input; the output *is* ``e``."""

    def __init__(self, *, linear: BasicLinear, bias: Optional[Bias], add: AddExtraInput) -> None:
        refuse_tensor_parallel_mode(type(self).__name__, linear, "row", "accumulating the output into an extra input")
        super().__init__([linear, add] if bias is None else [linear, bias, add])


RULE = FusionRule(
    fused_op=ForwardLinearBiasAdd,
    patterns=((BasicLinear, Bias, AddExtraInput), (BasicLinear, AddExtraInput)),
    conditions=(
        Condition("the linear is not row tensor-parallel", lambda w, r, p: w[0].tensor_parallel_mode != "row"),
        Condition("the add is in place", lambda w, r, p: w[-1]._in_place),
    ),
    build=lambda w: ForwardLinearBiasAdd(linear=w[0], bias=w[1] if len(w) == 3 else None, add=w[-1]),
)
