"""``torch.compile`` of refops ops: each fuser runs eagerly, as a graph break.

See ``docs/te-ops.md#under-torchcompile``.

Dynamo cannot trace what a fuser does. Under a recipe it builds quantized tensors, and tracing their
construction (``torch.Tensor._make_wrapper_subclass``) died inside Dynamo (``InternalTorchDynamoError``);
delayed scaling keeps its amax history in Python state that the end of backward updates. Without a recipe,
the fuser's autograd function writes the fuser's own state, which Dynamo refuses inside an
``autograd.Function`` under ``fullgraph=True``. So a fuser reached while compiling is called through a
``torch.compiler.disable``d function: the code around it still compiles, the fuser runs as it does in eager
mode (the same bits, under every recipe and none), and ``fullgraph=True`` fails with Dynamo's error quoting
:data:`EAGER_REASON`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .fuser import OperationFuser

__all__ = ["EAGER_REASON", "run_fuser_eagerly"]

#: What ``torch.compile(..., fullgraph=True)`` reports (Dynamo quotes it as the graph break's reason).
EAGER_REASON = (
    "refops does not support compiling its fused ops (te.ops.Sequential, Linear, ...) into a graph, under any "
    "recipe or none: each OperationFuser runs eagerly as a graph break. Drop fullgraph=True (the model then "
    "compiles around the refops ops with eager's numerics) or run the model eagerly; see "
    "docs/te-ops.md#under-torchcompile"
)


@torch.compiler.disable(reason=EAGER_REASON)
def run_fuser_eagerly(fuser: "OperationFuser", *args: Any, **kwargs: Any) -> Any:
    """Call ``fuser`` outside the graph being compiled: Dynamo does not trace into it, autograd links it."""
    return fuser(*args, **kwargs)
