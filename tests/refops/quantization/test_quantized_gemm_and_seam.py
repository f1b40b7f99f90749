"""Quantized GEMM operands in ReferenceKernels.gemm, and quantizers going through the kernel seam."""

from __future__ import annotations

import pytest
import torch

import refops
from refops.kernels import ReferenceKernels, current_backend
from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
)

QUANTIZERS = {
    "current": lambda: Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu"),
    "mxfp8": lambda: MXFP8Quantizer(DType.kFloat8E4M3),
    "block1d": lambda: Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
    "block2d": lambda: Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=2),
    "nvfp4": lambda: NVFP4Quantizer(),
}


def _q(name: str, shape: tuple[int, int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    x[0] *= 100  # different block amaxes along rows and columns, so the two usages differ
    return QUANTIZERS[name]()(x)


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("trans_a, trans_b", [(False, True), (False, False), (True, False), (True, True)])
def test_gemm_reads_the_usage_blocked_along_the_contraction(name: str, trans_a: bool, trans_b: bool) -> None:
    m, k, n = 64, 96, 32
    a = _q(name, (k, m) if trans_a else (m, k), 1)
    b = _q(name, (n, k) if trans_b else (k, n), 2)
    a_hat = a.dequantize(usage="columnwise" if trans_a else "rowwise")
    b_hat = b.dequantize(usage="rowwise" if trans_b else "columnwise")
    expected = (a_hat.t() if trans_a else a_hat) @ (b_hat.t() if trans_b else b_hat)
    y = current_backend().gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=torch.float32)
    assert type(y) is torch.Tensor and torch.equal(y, expected)
    out = torch.zeros(m, n, dtype=torch.bfloat16)
    current_backend().gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=torch.bfloat16, out=out)
    assert torch.equal(out, expected.to(torch.bfloat16))


def test_the_usage_choice_matters_for_mxfp8() -> None:
    # guard: the two MXFP8 usages dequantize differently here, so the test above discriminates
    a = _q("mxfp8", (64, 96), 1)
    assert not torch.equal(a.dequantize(usage="rowwise"), a.dequantize(usage="columnwise"))


def test_gemm_with_a_missing_usage_is_a_clear_error() -> None:
    rowwise_only = MXFP8Quantizer(DType.kFloat8E4M3, columnwise=False)(torch.randn(64, 32))
    with pytest.raises(ValueError, match="without columnwise data"):
        current_backend().gemm(torch.randn(64, 64), rowwise_only, out_dtype=torch.float32)
    y = current_backend().gemm(torch.randn(16, 32), rowwise_only, trans_b=True, out_dtype=torch.float32)
    assert y.shape == (16, 64)


class _CountingKernels(ReferenceKernels):
    """A backend that records which quantization kernels ran (and could replace them)."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def amax(self, x):
        self.calls.append("amax")
        return super().amax(x)

    def compute_scale_from_amax(self, amax, **kwargs):
        self.calls.append("compute_scale_from_amax")
        return super().compute_scale_from_amax(amax, **kwargs)

    def quantize_float8(self, x, scale, **kwargs):
        self.calls.append("quantize_float8")
        return super().quantize_float8(x, scale, **kwargs)

    def dequantize_float8(self, data, scale_inv, **kwargs):
        self.calls.append("dequantize_float8")
        return super().dequantize_float8(data, scale_inv, **kwargs)

    def quantize_mxfp8(self, x, **kwargs):
        self.calls.append("quantize_mxfp8")
        return super().quantize_mxfp8(x, **kwargs)

    def dequantize_mxfp8(self, data, scale_inv, **kwargs):
        self.calls.append("dequantize_mxfp8")
        return super().dequantize_mxfp8(data, scale_inv, **kwargs)

    def quantize_float8_block(self, x, **kwargs):
        self.calls.append("quantize_float8_block")
        return super().quantize_float8_block(x, **kwargs)

    def dequantize_float8_block(self, data, scale_inv, **kwargs):
        self.calls.append("dequantize_float8_block")
        return super().dequantize_float8_block(data, scale_inv, **kwargs)

    def quantize_nvfp4(self, x, **kwargs):
        self.calls.append("quantize_nvfp4")
        return super().quantize_nvfp4(x, **kwargs)

    def dequantize_nvfp4(self, data, scale_inv, amax, **kwargs):
        self.calls.append("dequantize_nvfp4")
        return super().dequantize_nvfp4(data, scale_inv, amax, **kwargs)


@pytest.mark.parametrize("name, expected", [
    ("current", ["amax", "compute_scale_from_amax", "quantize_float8", "dequantize_float8"]),
    ("mxfp8", ["quantize_mxfp8", "dequantize_mxfp8"]),
    ("block1d", ["quantize_float8_block", "dequantize_float8_block"]),
    ("nvfp4", ["quantize_nvfp4", "dequantize_nvfp4"]),
])
def test_quantizers_call_the_active_backend(name: str, expected: list[str]) -> None:
    backend = _CountingKernels()
    quantizer: Quantizer = QUANTIZERS[name]()
    with refops.use_backend(backend):
        quantizer(torch.randn(32, 64)).dequantize()
    assert backend.calls == expected
