"""Where each element's code and scale live in a quantized tensor, for every scheme and usage.

:func:`refops.testing.check_quantizer` compares a candidate's codes and scales
with the reference's element by element, so that a mismatch can be reported
with the input value it came from. This module maps the stored layouts
(``docs/recipes/index.md#stored-layouts``) back to the nominal ``(M, K)`` view:

* per-tensor FP8: row-wise ``_data`` ``(M, K)``, column-wise ``_transpose``
  ``(K, M)``, one fp32 ``_scale_inv``;
* MXFP8: both usages ``(M, K)`` (not transposed), E8M0 bytes per 1x32 / 32x1 block;
* FP8 block: column-wise data transposed, fp32 scales in the GEMM-ready layout;
* NVFP4: two E2M1 codes per byte (low nibble first), column-wise transposed,
  E4M3 block-scale bytes per 16 elements, plus a global fp32 amax.

Scale tensors are compared over their valid region only: padding is unspecified
(``docs/recipes/index.md#stored-layouts``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ...formats import E2M1_VALUES, e8m0_to_fp32, unpack_e2m1
from ...layouts import (
    FP8_BLOCK_SIZE,
    MXFP8_BLOCK_SIZE,
    NVFP4_BLOCK_SIZE,
    float8_block_scale_valid_shape,
    mxfp8_scale_valid_shape,
    nvfp4_scale_valid_shape,
    rows_cols,
)
from ...quantization import Float8BlockwiseQTensor, Float8Tensor, MXFP8Tensor, NVFP4Tensor, QuantizedTensor
from ...quantization.quantizer import torch_fp8_dtype

__all__ = ["usage_fields", "element_codes", "element_scales", "describe_code", "describe_scale", "as_bits"]


def _scale_valid_shape(qt: QuantizedTensor, usage: str) -> tuple[int, ...]:
    """The unpadded shape of ``qt``'s scale tensor for ``usage`` (the region every element's scale is in)."""
    col = usage == "columnwise"
    if isinstance(qt, Float8Tensor):
        return (1,)
    if isinstance(qt, MXFP8Tensor):
        return mxfp8_scale_valid_shape(qt.shape, columnwise=col)
    if isinstance(qt, Float8BlockwiseQTensor):
        return float8_block_scale_valid_shape(qt.shape, columnwise=col, block_scaling_dim=2 if qt._is_2D_scaled else 1)
    if isinstance(qt, NVFP4Tensor):
        return nvfp4_scale_valid_shape(qt.shape, columnwise=col)
    raise TypeError(f"check_quantizer: no layout known for {type(qt).__name__}")


def usage_fields(qt: QuantizedTensor, usage: str) -> dict[str, Optional[torch.Tensor]]:
    """``{"data", "scale_inv"[, "amax"]}`` of one usage, scales cut to their valid region (None when absent)."""
    if isinstance(qt, Float8Tensor):
        data = qt._data if usage == "rowwise" else qt._transpose
        return {"data": data, "scale_inv": qt._scale_inv.reshape(1)}
    data, scale = getattr(qt, f"_{usage}_data"), getattr(qt, f"_{usage}_scale_inv")
    if scale is not None:
        rows, cols = _scale_valid_shape(qt, usage)
        scale = scale[:rows, :cols]
    fields = {"data": data, "scale_inv": scale}
    if isinstance(qt, NVFP4Tensor):
        fields["amax"] = getattr(qt, f"_amax_{usage}")
    return fields


def valid_scale(qt: QuantizedTensor, usage: str, scale: torch.Tensor) -> torch.Tensor:
    """A candidate's scale tensor cut to the valid region (it may be padded or exact); a scalar becomes ``(1,)``."""
    shape = _scale_valid_shape(qt, usage)
    if len(shape) == 1:
        return scale.reshape(-1)[:1] if scale.numel() >= 1 else scale.reshape(-1)
    if scale.dim() != 2 or scale.shape[0] < shape[0] or scale.shape[1] < shape[1]:
        raise ValueError(f"scale of shape {tuple(scale.shape)} does not cover the valid region {shape}")
    return scale[: shape[0], : shape[1]]


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of ``t`` as integers (1-byte dtypes as uint8, fp32 as int32, 2-byte as int16)."""
    t = t.detach().contiguous()
    if t.element_size() == 1:
        return t.view(torch.uint8)
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def element_codes(qt: QuantizedTensor, usage: str, data: torch.Tensor) -> torch.Tensor:
    """The code of every element in the nominal ``(M, K)`` view, from ``data`` laid out as ``qt``'s ``usage``.

    NVFP4 data may be packed (two codes a byte) or one code a byte.
    """
    m, k = rows_cols(qt.shape)
    col = usage == "columnwise"
    data = as_bits(data) if data.element_size() == 1 else data
    transposed = col and not isinstance(qt, MXFP8Tensor)
    rows, cols = (k, m) if transposed else (m, k)
    if isinstance(qt, NVFP4Tensor) and data.numel() * 2 == rows * cols:
        data = unpack_e2m1(data.reshape(rows, cols // 2))
    codes = data.reshape(rows, cols)
    return codes.t() if transposed else codes


def element_scales(qt: QuantizedTensor, usage: str, scale: torch.Tensor) -> torch.Tensor:
    """The scale (as stored: bits) that applies to every element of the nominal ``(M, K)`` view."""
    m, k = rows_cols(qt.shape)
    bits = as_bits(scale)
    if isinstance(qt, Float8Tensor):
        return bits.reshape(1, 1).expand(m, k)
    col = usage == "columnwise"
    if isinstance(qt, MXFP8Tensor):
        b = MXFP8_BLOCK_SIZE
        return bits.repeat_interleave(b, dim=0)[:m] if col else bits.repeat_interleave(b, dim=1)[:, :k]
    if isinstance(qt, NVFP4Tensor):
        per = bits.repeat_interleave(NVFP4_BLOCK_SIZE, dim=1)
        return per[:, :m].t() if col else per[:, :k]
    b = FP8_BLOCK_SIZE
    if qt._is_2D_scaled:
        tiles = bits.t() if col else bits
        return tiles.repeat_interleave(b, dim=0).repeat_interleave(b, dim=1)[:m, :k]
    if col:
        return bits.repeat_interleave(b, dim=0)[:m]
    return bits.t().repeat_interleave(b, dim=1)[:, :k]


def _code_value(qt: QuantizedTensor, code: int) -> float:
    if isinstance(qt, NVFP4Tensor):
        return (-1.0 if code & 8 else 1.0) * E2M1_VALUES[code & 7]
    dtype = torch_fp8_dtype(qt._fp8_dtype)
    return torch.tensor([code], dtype=torch.uint8).view(dtype).float().item()


def describe_code(qt: QuantizedTensor, code: Optional[int]) -> str:
    """``0x38 (1.0)``: the code and the value it encodes."""
    if code is None:
        return "-"
    return f"0x{code:02x} ({_code_value(qt, code):g})"


def describe_scale(qt: QuantizedTensor, bits: Optional[int], nbytes: int) -> str:
    """A stored scale as its value: fp32 values as floats, E8M0 and E4M3 bytes with their byte."""
    if bits is None:
        return "-"
    if nbytes == 4:
        return f"{torch.tensor([bits], dtype=torch.int32).view(torch.float32).item():.9g}"
    if isinstance(qt, MXFP8Tensor):
        return f"2^{bits - 127} (e8m0 0x{bits:02x})" if bits != 255 else "NaN (e8m0 0xff)"
    value = torch.tensor([bits], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()
    return f"{value:g} (e4m3 0x{bits:02x})"


def decode_scale_bits(qt: QuantizedTensor, scale: torch.Tensor) -> torch.Tensor:
    """The reference's 1-byte scales decoded to fp32 (for a candidate that returns decoded scales)."""
    if isinstance(qt, MXFP8Tensor):
        return e8m0_to_fp32(as_bits(scale))
    return as_bits(scale).view(torch.float8_e4m3fn).float()
