"""The single-process state-dict form of a quantized weight before row blocks: one pickle-free 1-D uint8 tensor.

Checkpoints written by refops up to the sharding layer (``torch.save(model.state_dict())`` of a model built
under ``quantized_model_init``) hold each quantized weight as the extra-state encoding
(:mod:`refops.ops.extra_state`) of its plain tensors (data, scales, quantizer state) and metadata. They still
load: :func:`decode_legacy_entry` reads them, everywhere a quantized entry is read. refops no longer writes
them; :func:`encode_legacy_quantized_parameter` is kept so that tests can build such a checkpoint.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..quantization.quantized_tensor import QuantizedTensor
from .extra_state import _MAGIC, decode_extra_state, encode_extra_state

__all__ = ["encode_legacy_quantized_parameter", "decode_legacy_entry"]

_KEY = "refops.quantized_tensor"


def encode_legacy_quantized_parameter(tensor: QuantizedTensor) -> torch.Tensor:
    """``tensor`` in the legacy single-process form (for tests of old checkpoints): one uint8 tensor, bit for bit."""
    arrays, metadata = tensor.to_plain_tensors()
    return encode_extra_state({_KEY: {"metadata": metadata, "arrays": arrays}})


def _looks_encoded(value: Any) -> bool:
    """Whether ``value`` starts like a refops-encoded tensor (decoding decides whether it is one)."""
    if not isinstance(value, torch.Tensor) or isinstance(value, QuantizedTensor):
        return False
    if value.dtype != torch.uint8 or value.dim() != 1 or value.numel() < len(_MAGIC) or value.is_meta:
        return False
    return bytes(value[: len(_MAGIC)].tolist()) == _MAGIC


def decode_legacy_entry(value: Any, *, where: str, device: torch.device) -> Optional[QuantizedTensor]:
    """The quantized tensor a legacy entry ``value`` encodes (with the quantizer it was saved with), on ``device``;
    None for anything else.

    Raises ``ValueError`` naming ``where`` (op and parameter) when ``value`` is a legacy entry that cannot be
    rebuilt (truncated, corrupt).
    """
    if not _looks_encoded(value):
        return None
    try:
        payload = decode_extra_state(value)
    except Exception as error:  # any failure of a truncated or corrupt blob
        raise ValueError(f"{where}: the checkpoint entry is a truncated or corrupt refops tensor ({error})") from None
    if _KEY not in payload:
        return None
    try:
        entry = payload[_KEY]
        return QuantizedTensor.from_plain_tensors(entry["arrays"], entry["metadata"], device=device)
    except Exception as error:
        raise ValueError(
            f"{where}: the checkpoint's quantized tensor cannot be rebuilt (truncated or corrupt: {error})"
        ) from None
