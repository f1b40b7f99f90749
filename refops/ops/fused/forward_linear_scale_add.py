"""``ForwardLinearScaleAdd``: ``e += scale * x W^T`` (BasicLinear + ConstantScale + in-place AddExtraInput)."""

from __future__ import annotations

from ..basic.add_extra_input import AddExtraInput
from ..basic.basic_linear import BasicLinear
from ..basic.basic_linear_tp import refuse_tensor_parallel_mode
from ..basic.constant_scale import ConstantScale
from .forward_linear_bias_add import ComputeThenAddInPlace
from .rules import Condition, FusionRule

__all__ = ["ForwardLinearScaleAdd", "RULE"]


class ForwardLinearScaleAdd(ComputeThenAddInPlace):
    """Forward-only: ``e += scale * x W^T``; the GEMM's alpha is the scale, the output is ``e``."""

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale, add: AddExtraInput) -> None:
        refuse_tensor_parallel_mode(type(self).__name__, linear, "row", "accumulating the output into an extra input")
        super().__init__([linear, scale, add])


RULE = FusionRule(
    fused_op=ForwardLinearScaleAdd,
    patterns=((BasicLinear, ConstantScale, AddExtraInput),),
    conditions=(
        Condition("the linear is not row tensor-parallel", lambda w, r, p: w[0].tensor_parallel_mode != "row"),
        Condition("the add is in place", lambda w, r, p: w[-1]._in_place),
    ),
    build=lambda w: ForwardLinearScaleAdd(linear=w[0], scale=w[1], add=w[2]),
)
