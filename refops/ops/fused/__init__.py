"""Fused operations and the fusion functions that build them."""

from ..fuser import register_backward_fusion, register_forward_backward_fusion, register_forward_fusion

__all__ = ["register_backward_fusion", "register_forward_backward_fusion", "register_forward_fusion"]
