"""NVFP4 numerics (refops/kernels/reference/quant_nvfp4.py): golden bytes derived by hand, structure, properties.

Hand derivations use two exact facts:
* fl(1/6) = 0x3E2AAAAB = 11184811 * 2^-26 = (1/6) * (1 + 2^-25), so b * RN(S_enc * fl(1/6)) is
  b * S_enc / 6 times (1 + 2^-25) before rounding; for a power-of-two result P the excess P * 2^-25 is
  below half an ulp (P * 2^-24) and RN gives exactly P.
* With A = 2688 (448 * 6), S_enc = RN(2688 / 2688) = 1 and S_dec = 1, so a block whose scale is a
  power of two P encodes with the exact multiplier 1 / P.

RHT, 4over6, stochastic rounding, bad input and the swizzle / GEMM reference are covered by the
other ``test_nvfp4_*.py`` files of this directory.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refops.formats import FLT_MAX, unpack_e2m1
from refops.kernels.reference.nvfp4_scales import (
    nvfp4_block_encode_multiplier,
    nvfp4_block_scale,
    nvfp4_global_scale,
)
from refops.kernels.reference.quant_nvfp4 import dequantize_nvfp4, quantize_nvfp4

from _nvfp4_helpers import DTYPES, dequant_rowwise, hexes, row_only


# ----------------------------------------------------------------------- global and block scales
def test_global_scale_edge_cases(device):
    # A:      0     inf   2688  5.25        2^-149 (2688/A overflows)  NaN (fminf keeps FLT_MAX)
    # S_enc:  1     1     1     2688/5.25=512  FLT_MAX                 FLT_MAX
    # S_dec:  1     1     1     2^-9           RN(1/FLT_MAX) = 2^-128 (2^-128 * (1 + 2^-24) in subnormal ulps 2^-149)
    amax = torch.tensor([0.0, math.inf, 2688.0, 5.25, 2.0**-149, math.nan], device=device)
    s_enc, s_dec = nvfp4_global_scale(amax)
    assert s_enc.tolist() == [1.0, 1.0, 1.0, 512.0, FLT_MAX, FLT_MAX]
    assert s_dec.tolist() == [1.0, 1.0, 1.0, 2.0**-9, 2.0**-128, 2.0**-128]


def test_global_scale_4over6_uses_6E(device):
    # E = 256: S_enc = RN(1536 / A): A = 1536 -> 1, A = 6 -> 256, A = 0 -> 1.
    # E = 448: S_enc = RN(2688 / A): A = 1536 -> 1.75 (exact), A = 6 -> 448, A = 0 -> 1.
    amax = torch.tensor([1536.0, 6.0, 0.0], device=device)
    assert nvfp4_global_scale(amax, e4m3_max=256.0)[0].tolist() == [1.0, 256.0, 1.0]
    assert nvfp4_global_scale(amax, e4m3_max=448.0)[0].tolist() == [1.75, 448.0, 1.0]
    with pytest.raises(ValueError, match="256 or 448"):
        nvfp4_global_scale(amax, e4m3_max=300.0)


def test_block_scale_association_and_bytes(device):
    # b = 5.25, S_enc = 512: RN(512 * fl(1/6)) = 11184811 * 2^-17 (exact); times 5.25 = 234881031 * 2^-19,
    # 28 bits -> RN to 24 bits: 234881031 / 16 = 14680064.44 -> 14680064 * 2^-15 = 448.0 -> E4M3 0x7E.
    # b = 6, S_enc = 1: 6 * fl(1/6) = 1 + 2^-25 -> RN 1.0 -> 0x38.  b = 3: 0.5 -> 0x30.
    # b = inf: inf -> fminf FLT_MAX -> saturates to 448 (0x7E).  b = 0 -> 0x00.
    # b = 2^-12, S_enc = 1: ~4.07e-5 < 2^-10 (half the smallest subnormal 2^-9) -> 0x00.
    b = torch.tensor([5.25, 6.0, 3.0, math.inf, 0.0, 2.0**-12], device=device)
    s_enc = torch.tensor([512.0, 1.0, 1.0, 1.0, 1.0, 1.0], device=device)
    assert hexes(nvfp4_block_scale(b, s_enc).view(torch.uint8)) == [0x7E, 0x38, 0x30, 0x7E, 0x00, 0x00]


def test_encode_multiplier(device):
    # s_b = 0 -> 1 / (0 * S_dec) = inf -> FLT_MAX; s_b = 0.5, S_dec = 1 -> 2; s_b = 448, S_dec = 2^-9 -> 1/0.875.
    s_b = torch.tensor([0.0, 0.5, 448.0], device=device).to(torch.float8_e4m3fn)
    s_dec = torch.tensor([1.0, 1.0, 2.0**-9], device=device)
    enc = nvfp4_block_encode_multiplier(s_b, s_dec)
    assert enc[0].item() == FLT_MAX and enc[1].item() == 2.0
    assert enc[2].item() == torch.tensor(1.0 / 0.875, dtype=torch.float32).item()


# ------------------------------------------------------------------------------------ golden bytes
@pytest.mark.parametrize("dtype", DTYPES)
def test_golden_ties_signs_and_nibbles(dtype, device):
    # Global A = 2688 -> S_enc = S_dec = 1.
    # Block 0 = [2688, 448, 0 x 14]: b = 2688 -> s_b = RN(2688 * fl(1/6)) = RN(448 (1 + 2^-25)) = 448 (0x7E);
    #   enc = fl(1/448); 2688 -> ~6 -> code 7; 448 -> ~1 -> code 2.  Byte 0 = 7 | 2 << 4 = 0x27, rest 0x00.
    # Block 1 = values below, b = 6 -> s_b = 1.0 (0x38), enc = 1 so v = x exactly:
    #   6 -> 7 | .25 tie -> 0 (code 0) | .75 tie -> 1 (2) | 1.25 tie -> 1 (2) | 1.75 tie -> 2 (4) |
    #   2.5 tie -> 2 (4) | 3.5 tie -> 4 (6) | 5 tie -> 4 (6) | -.25 tie -> -0 (8) | -0.0 -> 8 |
    #   -5 -> -4 (14) | .5 -> 1 | -6 -> 15 | 1.5 -> 3 | 3 -> 5 | 0 -> 0
    #   bytes (low nibble = even element): 07 22 44 66 88 1E 3F 05
    block1 = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.0, -5, 0.5, -6, 1.5, 3, 0]
    x = torch.zeros(1, 32, dtype=dtype, device=device)
    x[0, 0], x[0, 1] = 2688.0, 448.0
    x[0, 16:] = torch.tensor(block1, dtype=dtype, device=device)
    r = row_only(x)
    assert hexes(r.rowwise_data) == [0x27] + [0] * 7 + [0x07, 0x22, 0x44, 0x66, 0x88, 0x1E, 0x3F, 0x05]
    assert tuple(r.rowwise_scale.shape) == (128, 4)
    assert hexes(r.rowwise_scale[0]) == [0x7E, 0x38, 0x00, 0x00]
    assert int(r.rowwise_scale[1:].sum()) == 0
    assert r.rowwise_amax.tolist() == [2688.0] and r.rowwise_amax.dtype == torch.float32
    # Dequant: block 1 final scale = RN(RN(1 * 2688) * fl(1/2688)) = 1, so x_hat is the E2M1 value itself.
    xh = dequant_rowwise(r, (1, 32))
    expected = [6, 0, 1, 1, 2, 2, 4, 4, -0.0, -0.0, -4, 0.5, -6, 1.5, 3, 0]
    assert xh[0, 16:].tolist() == expected
    assert torch.signbit(xh[0, 24]) and torch.signbit(xh[0, 25])


def test_golden_fp32_rounding_order(device):
    # A = 3 -> S_enc = RN(2688 / 3) = 896 (exact), S_dec = RN(1/896) = fl(1/7) * 2^-7 with
    # fl(1/7) = 9586981 * 2^-26 (just above 1/7).
    # RN(896 * fl(1/6)) = RN(78293677 * 2^-19) = 9786710 * 2^-16 = 149.33334350585938.
    # Block 0 = [3, 0..]: RN(3 * 149.3333435) = 448.00003 -> 448 (0x7E).
    # Block 1 = [0.875, 0.5, 0..]: RN(0.875 * 149.3333435) = 130.67 -> E4M3 128 (0x70).
    #   enc = RN(1 / RN(128 * S_dec)) = RN(1 / fl(1/7)) = RN(6.99999958) = 7 - 2^-21 (not 7 = S_enc / s_b).
    #   0.875 * enc = 6.12 -> 6 (code 7); 0.5 * enc = 3.5 - 2^-22 -> below the tie -> 3 (code 5): byte 0x57.
    #   (Encoding with S_enc / s_b = 7 would give 3.5 -> tie -> 4, byte 0x67.)
    # Block 2 = [1.125, 0..]: RN(1.125 * 9786710 * 2^-16) = RN(88080390 * 2^-19) = 11010049 * 2^-16
    #   = 168.0000153, just above the E4M3 tie 168 between 160 and 176 -> 176 (0x73).
    #   (Associating (b * S_enc) * fl(1/6) gives exactly 168 -> tie to even -> 160, 0x72.)
    #   1.125 * enc ~ 1.125 * 896 / 176 = 5.73 -> 6 (code 7): byte 0x07.
    x = torch.zeros(1, 48, device=device)
    x[0, 0], x[0, 16], x[0, 17], x[0, 32] = 3.0, 0.875, 0.5, 1.125
    r = row_only(x)
    assert hexes(r.rowwise_scale[0]) == [0x7E, 0x70, 0x73, 0x00]
    assert hexes(r.rowwise_data[0, ::8]) == [0x07, 0x57, 0x07]


def test_dequantize_scale_order(device):
    # One block, code 2 (= 1.0), scale byte 0x2E (E4M3 0.4375 = 1.75 * 2^-2), A = 5.
    # fl(1/2688) = fl(1/21) * 2^-7 = 12782641 * 2^-35.  RN(0.4375 * 5) = 2.1875 = 35 * 2^-4 (exact).
    # RN(35 * 12782641 * 2^-39) = RN(447392435 * 2^-39): 29 bits, 447392435 / 32 = 13981013.59 -> 13981014 * 2^-34.
    # (The exact quotient 2.1875 / 2688 = (5/3) 2^-11 rounds to 13981013 * 2^-34: TE multiplies by fl(1/2688).)
    # x_hat = RN(1.0 * that) = 13981014 * 2^-34; the zero codes decode to 0.
    data = torch.tensor([[0x02] + [0] * 7], dtype=torch.uint8, device=device)
    scale = torch.tensor([[0x2E]], dtype=torch.uint8, device=device)
    xh = dequantize_nvfp4(data, scale, torch.tensor([5.0], device=device), shape=(1, 16), out_dtype=torch.float32)
    assert xh[0, 0].item() == 13981014 * 2.0**-34 and xh[0, 1:].abs().sum().item() == 0.0


def test_zero_tensor_all_bytes_zero(device):
    # A = 0 -> S_enc = 1; b = 0 -> s_b = 0 -> enc = FLT_MAX; v = 0 * FLT_MAX = 0 -> code 0.
    r = quantize_nvfp4(torch.zeros(16, 32, device=device))
    for data, scale, amax in (
        (r.rowwise_data, r.rowwise_scale, r.rowwise_amax),
        (r.columnwise_data, r.columnwise_scale, r.columnwise_amax),
    ):
        assert int(data.sum()) == 0 and int(scale.sum()) == 0 and amax.tolist() == [0.0]
    assert tuple(r.columnwise_data.shape) == (32, 8) and tuple(r.columnwise_scale.shape) == (128, 4)


def test_nan_and_inf_inputs(device):
    # A = amax skipping NaN = inf -> 2688/inf = 0 -> S_enc = 1.
    # Block 0 = [inf, 1, -inf, 0 ...]: b = inf -> s_b = 448 (0x7E); inf * enc = inf -> code 7, -inf -> 15,
    #   1 * fl(1/448) ~ 0.0022 -> 0.  Bytes: 7 | 0 << 4 = 0x07, 15 | 0 << 4 = 0x0F.
    # Block 1 = [NaN, 3, -3, 0 ...]: b = 3 -> s_b = 0.5 (0x30), enc = 2: NaN -> code 7, 6 -> 7, -6 -> 15.
    #   Bytes: 7 | 7 << 4 = 0x77, 15 | 0 << 4 = 0x0F.
    # Block 2 = all NaN: b = 0 -> s_b = 0, enc = FLT_MAX, NaN -> 7: bytes 0x77.
    x = torch.zeros(1, 48, device=device)
    x[0, 0], x[0, 1], x[0, 2] = math.inf, 1.0, -math.inf
    x[0, 16], x[0, 17], x[0, 18] = math.nan, 3.0, -3.0
    x[0, 32:] = math.nan
    r = row_only(x)
    assert r.rowwise_amax.tolist() == [math.inf]
    assert hexes(r.rowwise_scale[0]) == [0x7E, 0x30, 0x00, 0x00]
    assert hexes(r.rowwise_data[0, :2]) == [0x07, 0x0F]
    assert hexes(r.rowwise_data[0, 8:10]) == [0x77, 0x0F]
    assert hexes(r.rowwise_data[0, 16:]) == [0x77] * 8


def test_underflowing_block_scale_saturates_codes_and_decodes_to_zero(device):
    # A = 2688 (S_enc = 1); block 1 holds +-2^-12: s_b = 0 -> enc = FLT_MAX -> +-2^-12 * FLT_MAX -> codes 7 / 15,
    # zeros stay 0.  Dequant multiplies by s_b = 0, so the block decodes to zero.
    x = torch.zeros(1, 32, device=device)
    x[0, 0] = 2688.0
    x[0, 16], x[0, 17] = 2.0**-12, -(2.0**-12)
    r = row_only(x)
    assert hexes(r.rowwise_scale[0, :2]) == [0x7E, 0x00]
    assert hexes(r.rowwise_data[0, 8:]) == [0xF7] + [0] * 7
    assert dequant_rowwise(r, (1, 32))[0, 16:].abs().sum().item() == 0.0


def test_scale_padding_shapes_zero_filled(device):
    x = torch.randn(32, 48, device=device)
    r = quantize_nvfp4(x)
    assert tuple(r.rowwise_data.shape) == (32, 24) and tuple(r.columnwise_data.shape) == (48, 16)
    # rowwise (round_up(32,128), round_up(3,4)) = (128, 4); columnwise (round_up(48,128), round_up(2,4)) = (128, 4)
    assert tuple(r.rowwise_scale.shape) == (128, 4) and tuple(r.columnwise_scale.shape) == (128, 4)
    assert (r.rowwise_scale[:32, :3] != 0).all() and int(r.rowwise_scale[32:].sum() + r.rowwise_scale[:, 3:].sum()) == 0
    assert (r.columnwise_scale[:48, :2] != 0).all()
    assert int(r.columnwise_scale[48:].sum() + r.columnwise_scale[:, 2:].sum()) == 0
    # Rowwise-only quantization needs no M % 16: M = 20, K = 80 -> scales (128, round_up(5, 4) = 8).
    r = row_only(torch.randn(20, 80, device=device))
    assert tuple(r.rowwise_scale.shape) == (128, 8) and int(r.rowwise_scale[:, 5:].sum()) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_columnwise_is_rowwise_of_transpose(dtype, device):
    x = torch.randn(32, 64, device=device).to(dtype)
    r = quantize_nvfp4(x)
    t = row_only(x.t().contiguous())
    assert torch.equal(row_only(x.t()).rowwise_data, t.rowwise_data)  # a strided input is fine
    assert torch.equal(r.columnwise_data, t.rowwise_data)
    assert torch.equal(r.columnwise_scale, t.rowwise_scale)
    assert torch.equal(r.columnwise_amax, r.rowwise_amax)


# ------------------------------------------------------------------------------------------- 2D
@pytest.mark.parametrize("dtype", DTYPES)
def test_2d_columnwise_is_exact_transpose(dtype, device):
    x = (torch.randn(48, 64, device=device) * torch.logspace(-3, 0, 64, device=device)).to(dtype)
    r = quantize_nvfp4(x, with_2d_quantization=True)
    m, k = x.shape
    row_codes, col_codes = unpack_e2m1(r.rowwise_data), unpack_e2m1(r.columnwise_data)
    assert torch.equal(col_codes, row_codes.t())
    row_s = r.rowwise_scale[:m, : k // 16]
    col_s = r.columnwise_scale[:k, : m // 16]
    assert torch.equal(row_s, row_s[::16].repeat_interleave(16, dim=0))  # 16 rows of a tile share it
    assert torch.equal(col_s, row_s[::16].t().repeat_interleave(16, dim=0))
    # The shared scale is the standard scale of the tile amax.
    s_enc, _ = nvfp4_global_scale(r.rowwise_amax)
    tile_amax = x.float().abs().view(m // 16, 16, k // 16, 16).amax(dim=(1, 3))
    assert torch.equal(row_s[::16], nvfp4_block_scale(tile_amax, s_enc).view(torch.uint8))


# ----------------------------------------------------------------------------------- row-scaled
def test_row_scaled_equals_per_row_quantization(device):
    x = torch.randn(8, 32, device=device) * torch.logspace(-4, 2, 8, device=device)[:, None]
    r = quantize_nvfp4(x, rowwise=True, columnwise=False, row_scaled=True)
    assert torch.equal(r.rowwise_amax, x.abs().amax(dim=1))
    for m in range(8):
        single = row_only(x[m : m + 1])
        assert torch.equal(r.rowwise_data[m], single.rowwise_data[0])
        assert torch.equal(r.rowwise_scale[m], single.rowwise_scale[0])
    # Each row decodes with its own amax: the error stays below ~1/6 of that row's amax.
    xh = dequantize_nvfp4(r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=x.shape, out_dtype=torch.float32)
    assert ((xh - x).abs() <= 0.2 * r.rowwise_amax[:, None]).all()
    # Columnwise uses one amax per column of x (per row of x^T).
    c = quantize_nvfp4(x.repeat(2, 1), rowwise=False, columnwise=True, row_scaled=True)
    t = row_only(x.repeat(2, 1).t().contiguous(), row_scaled=True)
    assert torch.equal(c.columnwise_amax, t.rowwise_amax) and torch.equal(c.columnwise_data, t.rowwise_data)


# -------------------------------------------------------------------------- round-trip property
def _step(a: torch.Tensor) -> torch.Tensor:
    return torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**31 - 1),
    exponents=st.lists(st.integers(-10, 0), min_size=8, max_size=8),
    dtype=st.sampled_from(DTYPES),
    with_2d=st.booleans(),
    use_4over6=st.booleans(),
)
def test_dequantize_error_within_half_quantum(seed, exponents, dtype, with_2d, use_4over6, device):
    # Blocks span 2^-10..1 of the global amax so every block scale is a normal E4M3 number; then
    # |x_hat - x| <= (half the E2M1 gap at |v|) * d, d = s_b * A / (6E) the block's decode scale.
    g = torch.Generator().manual_seed(seed)
    block_scale = torch.tensor([2.0**e for e in exponents], device="cpu").view(2, 4)
    block_scale = block_scale.repeat_interleave(16, 0).repeat_interleave(16, 1)
    x = (torch.randn(32, 64, generator=g, device="cpu") * block_scale).to(dtype).to(device)
    r = row_only(x, with_2d_quantization=with_2d, use_4over6=use_4over6)
    xh = dequant_rowwise(r, x.shape).double()
    d = r.rowwise_scale[:32, :4].view(torch.float8_e4m3fn).double() * r.rowwise_amax.double() / (6 * r.e4m3_max)
    d = d.repeat_interleave(16, dim=1)
    x64 = x.double()
    gap = _step(torch.maximum(x64.abs() / d, xh.abs() / d).clamp(max=6.0))
    assert ((xh - x64).abs() <= 0.5 * gap * d * (1 + 2.0**-10) + 1e-30).all()


# --------------------------------------------------------------------------- dequantize layouts
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_columnwise_and_nd_shapes(dtype, device):
    x = torch.randn(2, 16, 48, device=device).to(dtype)
    r = quantize_nvfp4(x.reshape(32, 48))
    row = dequantize_nvfp4(r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=x.shape, out_dtype=dtype)
    col = dequantize_nvfp4(
        r.columnwise_data, r.columnwise_scale, r.columnwise_amax, shape=x.shape, out_dtype=dtype, columnwise=True
    )
    assert row.shape == x.shape and row.dtype == dtype and col.shape == x.shape and col.dtype == dtype
    # Columnwise decodes x^T blocked along M, transposed back: the rowwise decode of x^T, transposed.
    t = row_only(x.reshape(32, 48).t().contiguous())
    t_hat = dequantize_nvfp4(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, shape=(48, 32), out_dtype=dtype)
    assert torch.equal(col, t_hat.t().reshape(x.shape))
    for x_hat in (row, col):
        assert ((x_hat.float() - x.float()).abs() <= 0.2 * r.rowwise_amax).all()
