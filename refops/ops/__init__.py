"""Fusible operations, with TransformerEngine's names (``te.ops``)."""

from .basic import *  # noqa: F401,F403
from .basic import __all__ as _basic_all
from .fuser import register_backward_fusion, register_forward_backward_fusion, register_forward_fusion
from .linear import Linear
from .op import BasicOperation, FusedOperation, FusibleOperation
from .sequential import Sequential
from . import fused  # noqa: E402  (registers the fusion functions; must come last)

__all__ = [
    *_basic_all,
    "BasicOperation",
    "FusedOperation",
    "FusibleOperation",
    "Linear",
    "Sequential",
    "fused",
    "register_backward_fusion",
    "register_forward_backward_fusion",
    "register_forward_fusion",
]
