"""Checks and dtype rules shared by the basic ops.

Bad input gets a clear error that names the op, the tensor and what was expected;
nothing is cast silently. The one documented cast is ``torch.autocast``: while it
is enabled for the input's device, ops compute in its dtype.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..quantization.quantized_tensor import QuantizedTensor

__all__ = [
    "autocast_dtype",
    "compute_dtype",
    "check_tensor",
    "to_compute_dtype",
    "maybe_dequantize",
    "SUPPORTED_COMPUTE_DTYPES",
]

SUPPORTED_COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def autocast_dtype(device: torch.device) -> Optional[torch.dtype]:
    """The ``torch.autocast`` dtype active for ``device``'s type, or None."""
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return None


def compute_dtype(op_name: str, input_: torch.Tensor, reference_dtype: torch.dtype) -> torch.dtype:
    """The dtype ``op_name`` computes in: the autocast dtype if active, else ``reference_dtype``.

    ``reference_dtype`` is the parameters' dtype for ops that own parameters and the
    input's dtype for the others.
    """
    dtype = autocast_dtype(input_.device) or reference_dtype
    if dtype not in SUPPORTED_COMPUTE_DTYPES:
        raise TypeError(f"{op_name}: unsupported dtype {dtype}; supported are float32, float16, bfloat16")
    return dtype


def check_tensor(
    op_name: str,
    what: str,
    tensor: torch.Tensor,
    *,
    dtype: torch.dtype,
    device: Optional[torch.device] = None,
    last_dim: Optional[int] = None,
    last_dim_name: str = "in_features",
) -> None:
    """Raise a clear error unless ``tensor`` fits: device, dtype (unless autocast), last dim."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op_name}: expected {what} to be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_meta:
        raise ValueError(f"{op_name}: {what} is on the meta device; pass a tensor with data")
    if device is not None and tensor.device != device:
        raise ValueError(
            f"{op_name}: {what} is on {tensor.device} but the parameters are on {device}; "
            "move one of them (an op built without a device, or on meta, places its parameters on the device set "
            "with torch.set_default_device, else the current CUDA device when there is one, else the CPU)"
        )
    if tensor.dtype != dtype and autocast_dtype(tensor.device) is None:
        raise TypeError(
            f"{op_name}: {what} has dtype {tensor.dtype} but the op computes in {dtype}; cast it "
            "explicitly or run under torch.autocast (refops never casts silently)"
        )
    if last_dim is not None and (tensor.dim() == 0 or tensor.shape[-1] != last_dim):
        raise ValueError(
            f"{op_name}: expected {what} with last dim {last_dim_name}={last_dim}, got shape {tuple(tensor.shape)}"
        )


def to_compute_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast for torch.autocast (already validated by :func:`check_tensor`)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def maybe_dequantize(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A plain tensor in ``dtype``: quantized tensors are dequantized, others cast (autocast) or kept."""
    if isinstance(tensor, QuantizedTensor):
        return tensor.dequantize(dtype=dtype)
    return to_compute_dtype(tensor, dtype)
