"""Quantizer round trips under each backend: every array of the quantized tensor, its dequantized
values (default and per usage) and the quantizer's state tensors are bit-identical."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from test_quantize_differential import DTYPES, assert_identical, make_input

import refops
from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)

E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2
QUANTIZERS: dict[str, Callable[[torch.device], Any]] = {
    "delayed": lambda d: Float8Quantizer(torch.tensor([4.0], device=d), torch.full((1,), 0.25, device=d), E4M3),
    "delayed_e5m2_rowwise": lambda d: Float8Quantizer(torch.tensor([0.5], device=d), torch.zeros(1, device=d), E5M2,
                                                      columnwise=False),
    "current": lambda d: Float8CurrentScalingQuantizer(E4M3, d),
    "current_pow2_e5m2": lambda d: Float8CurrentScalingQuantizer(E5M2, d, force_pow_2_scales=True),
    "mxfp8": lambda d: MXFP8Quantizer(E4M3),
    "mxfp8_2d_e5m2": lambda d: MXFP8Quantizer(E5M2, with_2d_quantization=True),
    "block_1d": lambda d: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
    "block_2d_e5m2": lambda d: Float8BlockQuantizer(E5M2, rowwise=True, columnwise=True, force_pow_2_scales=False),
    "nvfp4": lambda d: NVFP4Quantizer(),
    "nvfp4_rht": lambda d: NVFP4Quantizer(with_rht=True),
    "nvfp4_2d": lambda d: NVFP4Quantizer(with_2d_quantization=True),
    "nvfp4_sr_rht": lambda d: NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
    "nvfp4_4over6": lambda d: NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, nvfp4_4over6_err_mode="MSE"),
    "nvfp4_row_scaled": lambda d: NVFP4Quantizer(row_scaled_nvfp4=True),
}


def _round_trip(backend, name: str, x: torch.Tensor) -> dict[str, Any]:
    """Everything observable after ``quantizer(x)`` under ``backend``."""
    with refops.use_backend(backend):
        torch.manual_seed(0)  # stochastic rounding draws its random bytes from torch's generator
        quantizer = QUANTIZERS[name](x.device)
        qt = quantizer(x)
        seen = {f"array {n}": getattr(qt, n) for n in type(qt)._array_names()}
        seen["dequantize()"] = qt.dequantize()
        for usage in ("rowwise", "columnwise"):
            if qt.has_usage(usage):
                seen[f"dequantize({usage})"] = qt.dequantize(dtype=torch.float32, usage=usage)
        for attr, value in vars(quantizer).items():
            if isinstance(value, torch.Tensor):
                seen[f"quantizer.{attr}"] = value
    return seen


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,mode", [((4, 64, 256), "plain"), ((128, 384), "edge")])
def test_quantizer_round_trip(fastpath_backend, reference_backend, cuda, name, dtype, shape, mode):
    if "rht" in name and dtype != torch.bfloat16:
        pytest.skip("the RHT needs bf16 input")
    x = make_input(shape, dtype, cuda, mode, seed=20)
    ref = _round_trip(reference_backend, name, x)
    fast = _round_trip(fastpath_backend, name, x)
    assert ref.keys() == fast.keys()
    for key in ref:
        assert_identical(ref[key], fast[key], f"{name} {dtype} {shape} {mode}: {key}")
