"""Fused operations and the fusion rules that build them.

Importing this package registers the rules with the fuser, in TE's order
(forward: LinearBiasAdd, LinearBiasActivation, LinearScaleAdd; backward:
LinearAdd, LinearScale, ActivationBias, AddRMSNorm).
"""

from ..fuser import register_backward_fusion, register_forward_backward_fusion, register_forward_fusion
from . import (
    backward_activation_bias,
    backward_add_rmsnorm,
    backward_linear_add,
    backward_linear_scale,
    forward_linear_bias_activation,
    forward_linear_bias_add,
    forward_linear_scale_add,
)
from .backward_activation_bias import BackwardActivationBias
from .backward_add_rmsnorm import BackwardAddRMSNorm
from .backward_linear_add import BackwardLinearAdd
from .backward_linear_scale import BackwardLinearScale
from .forward_linear_bias_activation import ForwardLinearBiasActivation
from .forward_linear_bias_add import ForwardLinearBiasAdd
from .forward_linear_scale_add import ForwardLinearScaleAdd
from .rules import Condition, FusionRule

#: The rules in registration order, by pass.
FORWARD_RULES = [forward_linear_bias_add.RULE, forward_linear_bias_activation.RULE, forward_linear_scale_add.RULE]
BACKWARD_RULES = [
    backward_linear_add.RULE,
    backward_linear_scale.RULE,
    backward_activation_bias.RULE,
    backward_add_rmsnorm.RULE,
]

for _rule in FORWARD_RULES:
    register_forward_fusion(_rule.fuse)
for _rule in BACKWARD_RULES:
    register_backward_fusion(_rule.fuse)

__all__ = [
    "BackwardActivationBias",
    "BackwardAddRMSNorm",
    "BackwardLinearAdd",
    "BackwardLinearScale",
    "BACKWARD_RULES",
    "Condition",
    "FORWARD_RULES",
    "ForwardLinearBiasActivation",
    "ForwardLinearBiasAdd",
    "ForwardLinearScaleAdd",
    "FusionRule",
    "register_backward_fusion",
    "register_forward_backward_fusion",
    "register_forward_fusion",
]
