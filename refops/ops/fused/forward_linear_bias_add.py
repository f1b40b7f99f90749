"""``ForwardLinearBiasAdd``: ``BasicLinear`` [+ ``Bias``] accumulated in place into an extra input."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..basic.add_extra_input import AddExtraInput, check_same_layout
from ..basic.basic_linear import BasicLinear
from ..basic.basic_linear_tp import refuse_tensor_parallel_mode
from ..basic.bias import Bias
from ..op import FusedOperation, OperationContext
from .one_rounding import epilogue_fp32, linear_forward_fp32
from .rules import Condition, FusionRule

__all__ = ["ForwardLinearBiasAdd", "RULE", "ComputeThenAddInPlace"]


class ComputeThenAddInPlace(FusedOperation):
    """Forward-only fusions that end in an in-place ``AddExtraInput``: run the compute ops, then add.

    Contract as for every forward-only fusion: each basic op's context holds what
    its own forward saves. As TE's GEMM (alpha = scale, bias epilogue, beta = 1),
    the product, bias, scale and extra input are summed in fp32 and rounded once.
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
        linear, *epilogues, add = self.basic_ops
        y = linear_forward_fp32(linear, basic_op_ctxs[0], input_,
                                prev_op_grad_output_quantizer=prev_op_grad_output_quantizer, kwargs=basic_op_kwargs[0])
        dtype = basic_op_ctxs[0].dtype
        for i, op in enumerate(epilogues, start=1):  # bias and/or alpha, on the fp32 accumulator
            y = epilogue_fp32(op, basic_op_ctxs[i], y, dtype=dtype,
                              prev_op_grad_output_quantizer=linear.get_grad_output_quantizer())
        (extra,) = basic_op_extra_inputs[-1]
        check_same_layout(type(add).__name__, "the extra input", extra,
                          torch.empty((), dtype=dtype, device=y.device).expand(y.shape), "the input")
        output = extra.detach()
        output += y  # beta = 1: fp32 sum, one rounding on store (a quantized extra input is re-quantized)
        y = output
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
