"""Helpers shared by the NVFP4 numerics tests: input dtypes, byte dumps, rowwise quantize and decode."""

from __future__ import annotations

import torch

from refops.kernels.reference.quant_nvfp4 import nvfp4_dequantize, nvfp4_quantize

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def hexes(t: torch.Tensor) -> list[int]:
    return [int(b) for b in t.flatten().tolist()]


def row_only(x, **kw):
    return nvfp4_quantize(x, rowwise=True, columnwise=False, **kw)


def dequant_rowwise(r, shape, dtype=torch.float32):
    return nvfp4_dequantize(
        r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=shape, dtype=dtype, e4m3_max=r.e4m3_max
    )
