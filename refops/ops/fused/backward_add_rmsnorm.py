"""``BackwardAddRMSNorm``: RMSNorm backward plus the grad of the residual branch, in one op."""

from __future__ import annotations

from ..basic.make_extra_output import MakeExtraOutput
from ..basic.rms_norm import RMSNorm
from .backward_linear_add import BackwardThenAddExtraOutputGrad
from .rules import Condition, FusionRule

__all__ = ["BackwardAddRMSNorm", "RULE"]


class BackwardAddRMSNorm(BackwardThenAddExtraOutputGrad):
    """Backward-only: ``dx = RMSNorm'(dy) + g`` where ``g`` is the extra output's grad (zeros if None)."""

    def __init__(self, *, add: MakeExtraOutput, rmsnorm: RMSNorm) -> None:
        super().__init__([add, rmsnorm])


RULE = FusionRule(
    fused_op=BackwardAddRMSNorm,
    patterns=((MakeExtraOutput, RMSNorm),),
    conditions=(Condition("the extra output is not in place", lambda w, r, p: not w[0]._in_place),),
    build=lambda w: BackwardAddRMSNorm(add=w[0], rmsnorm=w[1]),
)
