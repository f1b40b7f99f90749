"""NVFP4 stochastic rounding (refops/kernels/reference/quant_nvfp4.py) with caller-supplied random bytes.

One random byte per element: reproducible with the same bytes, truncation toward zero with zero bytes,
better than round-to-nearest on average, and validation of the byte tensors.
"""

from __future__ import annotations

import pytest
import torch

from refops.formats import E2M1_VALUES, e2m1_to_fp32, unpack_e2m1
from refops.kernels.reference.nvfp4_scales import nvfp4_block_encode_multiplier, nvfp4_global_scale
from refops.kernels.reference.quant_nvfp4 import quantize_nvfp4

from _nvfp4_helpers import dequant_rowwise, row_only


def _rand_bytes(shape, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g, device="cpu").to(device)


def test_sr_reproducible_with_same_bytes(device):
    x = torch.randn(32, 48, device=device)
    kw = dict(stochastic_rounding=True)
    b_row, b_col = _rand_bytes((32, 48), device, 1), _rand_bytes((48, 32), device, 2)
    r1 = quantize_nvfp4(x, random_bytes_rowwise=b_row, random_bytes_columnwise=b_col, **kw)
    r2 = quantize_nvfp4(x, random_bytes_rowwise=b_row.clone(), random_bytes_columnwise=b_col.clone(), **kw)
    assert torch.equal(r1.rowwise_data, r2.rowwise_data) and torch.equal(r1.columnwise_data, r2.columnwise_data)
    r3 = quantize_nvfp4(x, random_bytes_rowwise=_rand_bytes((32, 48), device, 3), random_bytes_columnwise=b_col, **kw)
    assert not torch.equal(r1.rowwise_data, r3.rowwise_data)
    rn = quantize_nvfp4(x)  # scales do not depend on the rounding mode
    assert torch.equal(r1.rowwise_scale, rn.rowwise_scale) and torch.equal(r1.columnwise_scale, rn.columnwise_scale)


def test_sr_zero_bytes_truncate_toward_zero(device):
    # u = 0 -> t = |v| -> floor(|v| / step) * step: the largest grid value <= |v| (capped at 6).
    x = torch.randn(16, 64, device=device)
    zero_bytes = torch.zeros(16, 64, dtype=torch.uint8, device=device)
    r = row_only(x, stochastic_rounding=True, random_bytes_rowwise=zero_bytes)
    rn = row_only(x)
    s_enc, s_dec = nvfp4_global_scale(rn.rowwise_amax)
    s_b = rn.rowwise_scale[:16, :4].view(torch.float8_e4m3fn)
    v = x.view(16, 4, 16) * nvfp4_block_encode_multiplier(s_b, s_dec)[..., None]
    grid = torch.tensor(E2M1_VALUES, device=device)
    truncated = grid[(grid[None, :] <= v.abs().reshape(-1, 1)).sum(dim=1) - 1].view(16, 64)
    got = e2m1_to_fp32(unpack_e2m1(r.rowwise_data))
    assert torch.equal(got.abs(), truncated)
    assert torch.equal(torch.signbit(got), torch.signbit(x))


def test_sr_mean_beats_round_to_nearest(device):
    x = torch.randn(64, 64, device=device)
    rn_err = (dequant_rowwise(row_only(x), x.shape) - x).square().mean().sqrt()
    total = torch.zeros_like(x)
    for seed in range(50):
        q = row_only(x, stochastic_rounding=True, random_bytes_rowwise=_rand_bytes((64, 64), device, seed))
        total += dequant_rowwise(q, x.shape)
    sr_err = (total / 50 - x).square().mean().sqrt()
    assert sr_err < rn_err


def test_sr_random_bytes_validation(device):
    x = torch.randn(16, 32, device=device)

    def zeros(*shape):
        return torch.zeros(shape, dtype=torch.uint8, device=device)

    with pytest.raises(ValueError, match="random_bytes_rowwise"):
        row_only(x, stochastic_rounding=True)
    with pytest.raises(ValueError, match=r"uint8 of shape \(16, 32\)"):
        row_only(x, stochastic_rounding=True, random_bytes_rowwise=zeros(32, 16))
    with pytest.raises(ValueError, match="random_bytes_columnwise"):
        quantize_nvfp4(x, stochastic_rounding=True, random_bytes_rowwise=zeros(16, 32))
    with pytest.raises(ValueError, match="not used"):
        row_only(x, random_bytes_rowwise=zeros(16, 32))
