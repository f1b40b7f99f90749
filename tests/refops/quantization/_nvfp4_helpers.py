"""Helpers shared by the NVFP4 numerics tests: input dtypes, byte dumps, rowwise quantize and decode."""

from __future__ import annotations

import torch

from refops.kernels.reference.quant_nvfp4 import dequantize_nvfp4, quantize_nvfp4

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def hexes(t: torch.Tensor) -> list[int]:
    return [int(b) for b in t.flatten().tolist()]


def row_only(x, **kw):
    return quantize_nvfp4(x, rowwise=True, columnwise=False, **kw)


def dequant_rowwise(r, shape, dtype=torch.float32):
    return dequantize_nvfp4(
        r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=shape, out_dtype=dtype, e4m3_max=r.e4m3_max
    )
