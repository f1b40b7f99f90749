"""refops: a readable reference for fused-operation pipelines and low-precision recipes.

``import refops as te`` reads like TransformerEngine code: ``te.ops.Linear(...)``.
"""

from . import ops
from .kernels import use_backend
from .trace import trace

__version__ = "0.1.0"

__all__ = ["ops", "trace", "use_backend", "__version__"]
