"""DTensors as quantization sees them: recognized without importing ``torch.distributed.tensor``, and refused.

refops' quantizers compute on plain tensors. A process that never imported ``torch.distributed.tensor``
holds no DTensor, so the check is one dictionary lookup there (every quantization and every parameter
placement asks).
"""

from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["dtensor_class", "is_dtensor", "refuse_dtensor_input"]


def dtensor_class() -> Optional[type]:
    """``DTensor`` if ``torch.distributed.tensor`` is loaded (else nothing can be a DTensor)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a ``torch.distributed.tensor.DTensor`` (cheap when DTensor was never imported)."""
    cls = dtensor_class()
    return cls is not None and isinstance(tensor, cls)


def refuse_dtensor_input(quantizer: Any, tensor: Any) -> None:
    """A quantizer is given a DTensor: a ``TypeError`` saying what to do instead.

    refops' quantizers compute on plain tensors; on a DTensor, a per-tensor scale would be computed
    from an implicitly replicated amax, and the result would not be a sharded quantized tensor.
    """
    if is_dtensor(tensor):
        raise TypeError(
            f"{type(quantizer).__name__}: cannot quantize a DTensor ({tensor.placements}); quantize its local "
            "shard (tensor.to_local()), with the amax reduced over the mesh's group where the scheme has a "
            "whole-tensor scale (with_amax_reduction=True, amax_reduction_group=...), or keep DTensor "
            "computations in high precision (docs/distributed.md)"
        )
