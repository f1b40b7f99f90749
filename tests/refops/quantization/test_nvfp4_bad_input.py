"""NVFP4 quantize / dequantize (refops/kernels/reference/quant_nvfp4.py): rejected shapes, dtypes and option mixes."""

from __future__ import annotations

import pytest
import torch

from refops.kernels.reference.quant_nvfp4 import dequantize_nvfp4, quantize_nvfp4


@pytest.mark.parametrize(
    "shape, kwargs, match",
    [
        ((16, 24), {}, "multiple of 16"),
        ((24, 32), {}, "M .* multiple of 16"),
        ((24, 32), dict(columnwise=False, with_2d_quantization=True), "M .* multiple of 16"),
        ((16,), {}, "2D tensor"),
        ((16, 32), dict(rowwise=False, columnwise=False), "at least one"),
        ((16, 32), dict(with_rht=True), "bfloat16"),
        ((16, 32), dict(use_4over6=True, stochastic_rounding=True), "4over6 .* stochastic"),
        ((16, 32), dict(use_4over6=True, with_rht=True, columnwise=False), "4over6 .* Hadamard"),
        ((16, 32), dict(use_4over6=True, e4m3_max_4over6=300), "256 or 448"),
        ((16, 32), dict(use_4over6=True, err_mode="max"), "MAE"),
        ((16, 32), dict(row_scaled=True, with_rht=True, columnwise=False), "row-scaled .* RHT"),
        ((16, 32), dict(row_scaled=True, with_2d_quantization=True), "row-scaled .* 2D"),
        ((16, 32), dict(row_scaled=True, stochastic_rounding=True), "row-scaled .* SR"),
        ((16, 32), dict(with_2d_quantization=True, with_rht=True, columnwise=False), "2D .* RHT"),
    ],
)
def test_quantize_rejects_bad_input(shape, kwargs, match, device):
    with pytest.raises(ValueError, match=match):
        quantize_nvfp4(torch.randn(shape, device=device), **kwargs)


def test_quantize_rejects_bad_dtype(device):
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        quantize_nvfp4(torch.ones(16, 32, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        quantize_nvfp4(torch.ones(16, 32, dtype=torch.float64, device=device))


def test_dequantize_rejects_bad_shapes(device):
    r = quantize_nvfp4(torch.randn(16, 32, device=device))
    with pytest.raises(ValueError, match="uint8 data of shape"):
        dequantize_nvfp4(r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=(16, 64), out_dtype=torch.float32)
    with pytest.raises(ValueError, match="scales covering"):
        dequantize_nvfp4(r.rowwise_data, r.rowwise_scale[:8], r.rowwise_amax, shape=(16, 32), out_dtype=torch.float32)
    with pytest.raises(ValueError, match="amax must hold"):
        dequantize_nvfp4(r.rowwise_data, r.rowwise_scale, torch.ones(3), shape=(16, 32), out_dtype=torch.float32)
