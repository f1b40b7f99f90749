"""NVFP4 block-scale swizzle (refops/layouts.py) and the GEMM reference (gemm_nvfp4.py)."""

from __future__ import annotations

import pytest
import torch

from refops.kernels.reference.gemm_nvfp4 import nvfp4_gemm_reference
from refops.layouts import swizzle_block_scales, unswizzle_block_scales

from _nvfp4_helpers import dequant_rowwise, row_only


# ------------------------------------------------------------------------------------ swizzle
def test_swizzle_offsets_and_inverse(device):
    r, c = 256, 8
    s = torch.arange(r * c, device=device).reshape(r, c)
    flat = swizzle_block_scales(s).flatten()
    for row, col in [(0, 0), (1, 0), (32, 0), (0, 1), (0, 4), (127, 3), (128, 0), (200, 6), (255, 7)]:
        rb, i, j = row // 128, (row % 128) // 32, row % 32
        cb, l = col // 4, col % 4
        assert flat[((rb * (c // 4) + cb) * 32 + j) * 16 + 4 * i + l] == s[row, col]
    assert torch.equal(unswizzle_block_scales(swizzle_block_scales(s)), s)
    with pytest.raises(ValueError, match="padded"):
        swizzle_block_scales(torch.zeros(100, 4, dtype=torch.uint8, device=device))


# -------------------------------------------------------------------------------------- GEMM
def test_gemm_reference_matches_dequantized_matmul(device):
    x = torch.randn(32, 64, device=device)
    w = torch.randn(48, 64, device=device) * 0.1
    qx, qw = row_only(x), row_only(w, with_2d_quantization=True)
    y = nvfp4_gemm_reference(
        qx.rowwise_data, qx.rowwise_scale, qx.rowwise_amax, qw.rowwise_data, qw.rowwise_scale, qw.rowwise_amax
    )
    ref = dequant_rowwise(qx, x.shape).double() @ dequant_rowwise(qw, w.shape).double().t()
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    # Row-scaled activation: alpha becomes a per-output-row vector.
    qr = row_only(x, row_scaled=True)
    yr = nvfp4_gemm_reference(
        qr.rowwise_data, qr.rowwise_scale, qr.rowwise_amax, qw.rowwise_data, qw.rowwise_scale, qw.rowwise_amax,
        out_dtype=torch.bfloat16,
    )
    ref_r = dequant_rowwise(qr, x.shape).double() @ dequant_rowwise(qw, w.shape).double().t()
    assert yr.dtype == torch.bfloat16
    torch.testing.assert_close(yr.double(), ref_r, rtol=1e-2, atol=1e-5)
    with pytest.raises(ValueError, match="share K"):
        nvfp4_gemm_reference(
            qx.rowwise_data, qx.rowwise_scale, qx.rowwise_amax,
            qx.rowwise_data[:, :16], qw.rowwise_scale, qw.rowwise_amax,
        )
