"""Quantized parameters in checkpoints: one pickle-free uint8 tensor each, bit-exact.

``state_dict()`` stores a ``QuantizedTensor`` parameter as the encoding of its
plain tensors (data, scales, quantizer state) and metadata (see
:mod:`refops.ops.extra_state`), so checkpoints load with
``torch.load(weights_only=True)`` and rebuild every byte. Loading places the
rebuilt tensor into the existing parameter object (or assigns it with
``assign=True``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..quantization.quantized_tensor import QuantizedTensor
from .extra_state import decode_extra_state, encode_extra_state

__all__ = ["encode_quantized_parameter", "decode_quantized_parameter", "is_encoded_quantized_parameter"]

_KEY = "refops.quantized_tensor"


def encode_quantized_parameter(tensor: QuantizedTensor) -> torch.Tensor:
    """One uint8 tensor holding ``tensor`` bit for bit."""
    arrays, metadata = tensor.to_plain_tensors()
    return encode_extra_state({_KEY: {"metadata": metadata, "arrays": arrays}})


def is_encoded_quantized_parameter(value: Any) -> bool:
    """Whether ``value`` came from :func:`encode_quantized_parameter` (cheap check first)."""
    if not isinstance(value, torch.Tensor) or isinstance(value, QuantizedTensor):
        return False
    if value.dtype != torch.uint8 or value.dim() != 1 or value.numel() < 16:
        return False
    try:
        return _KEY in decode_extra_state(value)
    except (ValueError, TypeError):
        return False


def decode_quantized_parameter(value: torch.Tensor, device: Optional[torch.device] = None) -> QuantizedTensor:
    """Inverse of :func:`encode_quantized_parameter`, on ``device``."""
    payload = decode_extra_state(value)[_KEY]
    return QuantizedTensor.from_plain_tensors(payload["arrays"], payload["metadata"], device=device)
