"""Basic operations: each owns its parameters and knows its forward and backward."""

from .basic_linear import BasicLinear
from .bias import Bias

__all__ = ["BasicLinear", "Bias"]
