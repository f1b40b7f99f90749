"""NVFP4 numerics (refops/kernels/reference/quant_nvfp4.py): golden bytes derived by hand, structure, properties.

Hand derivations use two exact facts:
* fl(1/6) = 0x3E2AAAAB = 11184811 * 2^-26 = (1/6) * (1 + 2^-25), so b * RN(S_enc * fl(1/6)) is
  b * S_enc / 6 times (1 + 2^-25) before rounding; for a power-of-two result P the excess P * 2^-25 is
  below half an ulp (P * 2^-24) and RN gives exactly P.
* With A = 2688 (448 * 6), S_enc = RN(2688 / 2688) = 1 and S_dec = 1, so a block whose scale is a
  power of two P encodes with the exact multiplier 1 / P.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refops.formats import E2M1_VALUES, FLT_MAX, e2m1_to_fp32, unpack_e2m1
from refops.kernels.reference.gemm_nvfp4 import nvfp4_gemm_reference
from refops.kernels.reference.hadamard import RHT_SIGN_VECTOR, hadamard_transform_16, rht_matrix_16
from refops.kernels.reference.nvfp4_scales import (
    nvfp4_4over6_block_scales,
    nvfp4_block_encode_multiplier,
    nvfp4_block_scale,
    nvfp4_global_scale,
)
from refops.kernels.reference.quant_nvfp4 import nvfp4_dequantize, nvfp4_quantize
from refops.kernels.reference.scale_swizzle import swizzle_block_scales, unswizzle_block_scales

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def hexes(t: torch.Tensor) -> list[int]:
    return [int(b) for b in t.flatten().tolist()]


def row_only(x, **kw):
    return nvfp4_quantize(x, rowwise=True, columnwise=False, **kw)


def dequant_rowwise(r, shape, dtype=torch.float32):
    return nvfp4_dequantize(
        r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=shape, dtype=dtype, e4m3_max=r.e4m3_max
    )


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


def test_4over6_base_scale_divides(device):
    # b = 1.125, S_enc = 896: base = RN(RN(1.125 / 6) * 896) = 0.1875 * 896 = 168 (exact).
    # s6 = Q_E4M3(168): tie between 160 (0x72, even) and 176 -> 0x72.  s4 = Q_E4M3(RN(168 * 1.5) = 252) -> 256 (0x78).
    s4, s6 = nvfp4_4over6_block_scales(torch.tensor([1.125], device=device), torch.tensor([896.0], device=device))
    assert hexes(s4.view(torch.uint8)) == [0x78] and hexes(s6.view(torch.uint8)) == [0x72]


def test_dequantize_scale_order(device):
    # One block, code 2 (= 1.0), scale byte 0x2E (E4M3 0.4375 = 1.75 * 2^-2), A = 5.
    # fl(1/2688) = fl(1/21) * 2^-7 = 12782641 * 2^-35.  RN(0.4375 * 5) = 2.1875 = 35 * 2^-4 (exact).
    # RN(35 * 12782641 * 2^-39) = RN(447392435 * 2^-39): 29 bits, 447392435 / 32 = 13981013.59 -> 13981014 * 2^-34.
    # (The exact quotient 2.1875 / 2688 = (5/3) 2^-11 rounds to 13981013 * 2^-34: TE multiplies by fl(1/2688).)
    # x_hat = RN(1.0 * that) = 13981014 * 2^-34; the zero codes decode to 0.
    data = torch.tensor([[0x02] + [0] * 7], dtype=torch.uint8, device=device)
    scale = torch.tensor([[0x2E]], dtype=torch.uint8, device=device)
    xh = nvfp4_dequantize(data, scale, torch.tensor([5.0], device=device), shape=(1, 16), dtype=torch.float32)
    assert xh[0, 0].item() == 13981014 * 2.0**-34 and xh[0, 1:].abs().sum().item() == 0.0


def test_zero_tensor_all_bytes_zero(device):
    # A = 0 -> S_enc = 1; b = 0 -> s_b = 0 -> enc = FLT_MAX; v = 0 * FLT_MAX = 0 -> code 0.
    r = nvfp4_quantize(torch.zeros(16, 32, device=device))
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
    r = nvfp4_quantize(x)
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
    r = nvfp4_quantize(x)
    t = row_only(x.t().contiguous())
    assert torch.equal(row_only(x.t()).rowwise_data, t.rowwise_data)  # a strided input is fine
    assert torch.equal(r.columnwise_data, t.rowwise_data)
    assert torch.equal(r.columnwise_scale, t.rowwise_scale)
    assert torch.equal(r.columnwise_amax, r.rowwise_amax)


# ------------------------------------------------------------------------------------------- 2D
@pytest.mark.parametrize("dtype", DTYPES)
def test_2d_columnwise_is_exact_transpose(dtype, device):
    x = (torch.randn(48, 64, device=device) * torch.logspace(-3, 0, 64, device=device)).to(dtype)
    r = nvfp4_quantize(x, with_2d=True)
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


# ------------------------------------------------------------------------------------------ RHT
def test_rht_matrix_structure(device):
    m = rht_matrix_16(random_sign_mask=True, device=device)
    assert m.dtype == torch.bfloat16 and set(m.float().abs().unique().tolist()) == {0.25}
    # Column 0 of H16 is all ones, so column 0 of diag(s) H16 / 4 is s / 4.
    assert (m[:, 0].float() * 4).tolist() == list(map(float, RHT_SIGN_VECTOR))
    assert RHT_SIGN_VECTOR == (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
    m64 = m.double()
    assert torch.equal(m64 @ m64.t(), torch.eye(16, dtype=torch.float64, device=device))  # orthogonal
    plain = rht_matrix_16(random_sign_mask=False, device=device).double()
    assert torch.equal(plain, plain.t())
    assert torch.equal(plain @ plain, torch.eye(16, dtype=torch.float64, device=device))
    h_row5 = [(-1) ** bin(5 & j).count("1") * 0.25 for j in range(16)]  # Sylvester entry (-1)^popcount(i & j)
    assert plain[5].tolist() == h_row5


def test_rht_bf16_rounding_and_te_formulation(device):
    x = torch.randn(64, 96, device=device).to(torch.bfloat16)
    y = hadamard_transform_16(x, random_sign_mask=True)
    m = rht_matrix_16(random_sign_mask=True, device=device)
    exact = (x.double().view(-1, 16) @ m.double()).view(x.shape)  # fp32 sums of these are exact
    assert y.dtype == torch.bfloat16 and torch.equal(y, exact.to(torch.float32).to(torch.bfloat16))
    assert torch.equal(y, (x.view(-1, 16) @ m).view(x.shape))  # TE's reference: bf16 matmul


def test_rht_applied_twice_returns_input(device):
    x = torch.randn(32, 64, device=device).to(torch.bfloat16)
    norm = x.float().view(-1, 16).norm(dim=1, keepdim=True)
    twice = hadamard_transform_16(hadamard_transform_16(x, random_sign_mask=False), random_sign_mask=False)
    assert ((twice.float() - x.float()).view(-1, 16).abs() <= 2.0**-7 * norm).all()
    once = hadamard_transform_16(x, random_sign_mask=True)
    back = (once.double().view(-1, 16) @ rht_matrix_16(random_sign_mask=True, device=device).double().t()).view(x.shape)
    assert ((back - x.double()).view(-1, 16).abs() <= 2.0**-8 * norm.double()).all()
    assert not torch.equal(once, hadamard_transform_16(x, random_sign_mask=False))


def test_rht_errors(device):
    with pytest.raises(ValueError, match="bfloat16"):
        hadamard_transform_16(torch.randn(2, 16, device=device), random_sign_mask=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        hadamard_transform_16(torch.randn(2, 24, device=device).bfloat16(), random_sign_mask=True)


@pytest.mark.parametrize("random_sign_mask", [True, False])
def test_rht_applies_to_columnwise_only(random_sign_mask, device):
    x = torch.randn(32, 48, device=device).to(torch.bfloat16)
    r = nvfp4_quantize(x, with_rht=True, random_sign_mask=random_sign_mask)
    plain = nvfp4_quantize(x)
    assert torch.equal(r.rowwise_data, plain.rowwise_data) and torch.equal(r.rowwise_amax, plain.rowwise_amax)
    transformed = hadamard_transform_16(x.t().contiguous(), random_sign_mask=random_sign_mask)
    ref = row_only(transformed)  # columnwise = quantize(RHT(x^T)) blocked along M
    assert torch.equal(r.columnwise_data, ref.rowwise_data) and torch.equal(r.columnwise_scale, ref.rowwise_scale)
    assert r.columnwise_amax.tolist() == [transformed.float().abs().max().item()]
    assert not torch.equal(r.columnwise_data, plain.columnwise_data)


# -------------------------------------------------------------------------------------- 4over6
@pytest.mark.parametrize("err_mode", ["MAE", "MSE"])
def test_4over6_golden_choices(err_mode, device):
    # E = 256, A = 1536 -> S_enc = S_dec = 1, and the error value is val = e2m1 * s_c exactly.
    # Block 0 = [1536, 0..]: base = 256; s6 = 256 (0x78), s4 = 384 (0x7C). map6: 1536/256 = 6 -> 7, err 0;
    #   map4: ~4 -> decodes to 4 * 384 = 1536, err 0. Tie -> map-to-6: scale 0x78, byte 0x07.
    # Blocks 1-3 have b = 6: base = 1; s6 = 1 (0x38), s4 = 1.5 (0x3C), inv4 = fl(2/3); 6 is exact in both.
    # Block 1 = [6, 4.5, 0..]: map6: 4.5 -> 4 (err 0.5). map4: 4.5 * fl(2/3) = 3.0 -> 3 -> 4.5 (err 0).
    #   err4 = 0 < err6 -> map-to-4: scale 0x3C, codes [6 (=4), 5 (=3)] -> byte 0x56.
    # Block 2 = [6, 1.25, 0..]: map6: 1.25 tie -> 1 (err 0.25); map4: 1.25 * fl(2/3) = 0.8333 -> 1 -> 1.5
    #   (err 0.25). MAE 0.25 = 0.25, MSE 0.0625 = 0.0625: tie -> map-to-6: scale 0x38, codes [7, 2] -> 0x27.
    # Block 3 = [6, 5, 1, 1, 1, 1, 0..]: map6: 5 tie -> 4 (diff -1), 1s exact; map4: 5 -> 3.33 -> 3 -> 4.5
    #   (diff -0.5), each 1 -> 0.67 -> 0.5 -> 0.75 (diff -0.25).
    #   MAE: err6 = 1 < err4 = 0.5 + 4 * 0.25 = 1.5 -> map-to-6: 0x38, codes [7, 6, 2, 2, 2, 2] -> 67 22 22.
    #   MSE: err4 = 0.25 + 4 * 0.0625 = 0.5 < err6 = 1 -> map-to-4: 0x3C, codes [6, 5, 1, 1, 1, 1] -> 56 11 11.
    x = torch.zeros(1, 64, device=device)
    x[0, 0], x[0, 16], x[0, 17], x[0, 32], x[0, 33] = 1536.0, 6.0, 4.5, 6.0, 1.25
    x[0, 48:54] = torch.tensor([6.0, 5.0, 1.0, 1.0, 1.0, 1.0], device=device)
    r = row_only(x, use_4over6=True, e4m3_max_4over6=256, err_mode=err_mode)
    assert r.e4m3_max == 256.0
    block3_scale, block3_bytes = (0x38, [0x67, 0x22, 0x22]) if err_mode == "MAE" else (0x3C, [0x56, 0x11, 0x11])
    assert hexes(r.rowwise_scale[0]) == [0x78, 0x3C, 0x38, block3_scale]
    zeros7, zeros5 = [0] * 7, [0] * 5
    assert hexes(r.rowwise_data[0]) == [0x07, *zeros7, 0x56, *zeros7, 0x27, *zeros7, *block3_bytes, *zeros5]
    # Dequant (6E = 1536): block 1 final scale RN(RN(1.5 * 1536) * fl(1/1536)) = RN(1.5 (1 + 2^-25)) = 1.5.
    xh = dequant_rowwise(r, (1, 64))
    assert xh[0, [0, 16, 17, 32, 33]].tolist() == [1536.0, 6.0, 4.5, 6.0, 1.0]


def test_4over6_2d_tile_sums_row_errors(device):
    # Tile 0 (cols 0..15), all rows have amax 6 so the tile amax is 6 (s6 = 1, s4 = 1.5 as above):
    #   row 0 = [6, 4.5 x 15]: err6 = 15 * 0.5 = 7.5, err4 = 0.
    #   rows 1..15 = [6, 1, 0..]: err6 = 0; map4: 1 * fl(2/3) = 0.667 -> 0.5 -> 0.75, err4 = 0.25 each.
    #   1D: row 0 picks map-to-4 (0x3C), rows 1..15 map-to-6 (0x38).
    #   2D: tile sums err4 = 15 * 0.25 = 3.75 < err6 = 7.5 -> every row map-to-4.
    # Tile 1 holds A = 1536 at (0, 16) so S_enc = 1 (E = 256); it ties at zero error -> map-to-6.
    x = torch.zeros(16, 32, device=device)
    x[:, 0] = 6.0
    x[0, 1:16] = 4.5
    x[1:, 1] = 1.0
    x[0, 16] = 1536.0
    one_d = row_only(x, use_4over6=True)
    assert hexes(one_d.rowwise_scale[:16, 0]) == [0x3C] + [0x38] * 15
    two_d = row_only(x, use_4over6=True, with_2d=True)
    assert hexes(two_d.rowwise_scale[:16, 0]) == [0x3C] * 16
    assert hexes(two_d.rowwise_scale[:16, 1]) == [0x78] * 16
    # rows 1..15 under map-to-4: 6 -> 4 (code 6), 1 -> 0.5 (code 1): byte 0x16.
    assert hexes(two_d.rowwise_data[1:, 0]) == [0x16] * 15


@pytest.mark.parametrize("e4m3_max", [256, 448])
def test_4over6_lowers_total_error(e4m3_max, device):
    # Map-to-6 is (up to the rounding of its base scale) the standard encoding, so picking the
    # better candidate per block must lower the total absolute error.
    x = torch.randn(32, 64, device=device) * torch.rand(32, 1, device=device)
    r = row_only(x, use_4over6=True, e4m3_max_4over6=e4m3_max)
    assert r.e4m3_max == float(e4m3_max)
    err_4over6 = (dequant_rowwise(r, x.shape) - x).abs().sum()
    err_std = (dequant_rowwise(row_only(x), x.shape) - x).abs().sum()
    assert err_4over6 < err_std


# ------------------------------------------------------------------------------ stochastic rounding
def _rand_bytes(shape, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g, device="cpu").to(device)


def test_sr_reproducible_with_same_bytes(device):
    x = torch.randn(32, 48, device=device)
    kw = dict(stochastic_rounding=True)
    b_row, b_col = _rand_bytes((32, 48), device, 1), _rand_bytes((48, 32), device, 2)
    r1 = nvfp4_quantize(x, random_bytes_rowwise=b_row, random_bytes_columnwise=b_col, **kw)
    r2 = nvfp4_quantize(x, random_bytes_rowwise=b_row.clone(), random_bytes_columnwise=b_col.clone(), **kw)
    assert torch.equal(r1.rowwise_data, r2.rowwise_data) and torch.equal(r1.columnwise_data, r2.columnwise_data)
    r3 = nvfp4_quantize(x, random_bytes_rowwise=_rand_bytes((32, 48), device, 3), random_bytes_columnwise=b_col, **kw)
    assert not torch.equal(r1.rowwise_data, r3.rowwise_data)
    rn = nvfp4_quantize(x)  # scales do not depend on the rounding mode
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
        nvfp4_quantize(x, stochastic_rounding=True, random_bytes_rowwise=zeros(16, 32))
    with pytest.raises(ValueError, match="not used"):
        row_only(x, random_bytes_rowwise=zeros(16, 32))


# ----------------------------------------------------------------------------------- row-scaled
def test_row_scaled_equals_per_row_quantization(device):
    x = torch.randn(8, 32, device=device) * torch.logspace(-4, 2, 8, device=device)[:, None]
    r = nvfp4_quantize(x, rowwise=True, columnwise=False, row_scaled=True)
    assert torch.equal(r.rowwise_amax, x.abs().amax(dim=1))
    for m in range(8):
        single = row_only(x[m : m + 1])
        assert torch.equal(r.rowwise_data[m], single.rowwise_data[0])
        assert torch.equal(r.rowwise_scale[m], single.rowwise_scale[0])
    # Each row decodes with its own amax: the error stays below ~1/6 of that row's amax.
    xh = nvfp4_dequantize(r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=x.shape, dtype=torch.float32)
    assert ((xh - x).abs() <= 0.2 * r.rowwise_amax[:, None]).all()
    # Columnwise uses one amax per column of x (per row of x^T).
    c = nvfp4_quantize(x.repeat(2, 1), rowwise=False, columnwise=True, row_scaled=True)
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
    r = row_only(x, with_2d=with_2d, use_4over6=use_4over6)
    xh = dequant_rowwise(r, x.shape).double()
    d = r.rowwise_scale[:32, :4].view(torch.float8_e4m3fn).double() * r.rowwise_amax.double() / (6 * r.e4m3_max)
    d = d.repeat_interleave(16, dim=1)
    x64 = x.double()
    gap = _step(torch.maximum(x64.abs() / d, xh.abs() / d).clamp(max=6.0))
    assert ((xh - x64).abs() <= 0.5 * gap * d * (1 + 2.0**-10) + 1e-30).all()


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "shape, kwargs, match",
    [
        ((16, 24), {}, "multiple of 16"),
        ((24, 32), {}, "M .* multiple of 16"),
        ((24, 32), dict(columnwise=False, with_2d=True), "M .* multiple of 16"),
        ((16,), {}, "2D tensor"),
        ((16, 32), dict(rowwise=False, columnwise=False), "at least one"),
        ((16, 32), dict(with_rht=True), "bfloat16"),
        ((16, 32), dict(use_4over6=True, stochastic_rounding=True), "4over6 .* stochastic"),
        ((16, 32), dict(use_4over6=True, with_rht=True, columnwise=False), "4over6 .* Hadamard"),
        ((16, 32), dict(use_4over6=True, e4m3_max_4over6=300), "256 or 448"),
        ((16, 32), dict(use_4over6=True, err_mode="max"), "MAE"),
        ((16, 32), dict(row_scaled=True, with_rht=True, columnwise=False), "row-scaled .* RHT"),
        ((16, 32), dict(row_scaled=True, with_2d=True), "row-scaled .* 2D"),
        ((16, 32), dict(row_scaled=True, stochastic_rounding=True), "row-scaled .* SR"),
        ((16, 32), dict(with_2d=True, with_rht=True, columnwise=False), "2D .* RHT"),
    ],
)
def test_quantize_rejects_bad_input(shape, kwargs, match, device):
    with pytest.raises(ValueError, match=match):
        nvfp4_quantize(torch.randn(shape, device=device), **kwargs)


def test_quantize_rejects_bad_dtype(device):
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        nvfp4_quantize(torch.ones(16, 32, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        nvfp4_quantize(torch.ones(16, 32, dtype=torch.float64, device=device))


def test_dequantize_rejects_bad_shapes(device):
    r = nvfp4_quantize(torch.randn(16, 32, device=device))
    with pytest.raises(ValueError, match="uint8 data of shape"):
        nvfp4_dequantize(r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=(16, 64), dtype=torch.float32)
    with pytest.raises(ValueError, match="scales covering"):
        nvfp4_dequantize(r.rowwise_data, r.rowwise_scale[:8], r.rowwise_amax, shape=(16, 32), dtype=torch.float32)
    with pytest.raises(ValueError, match="amax must hold"):
        nvfp4_dequantize(r.rowwise_data, r.rowwise_scale, torch.ones(3), shape=(16, 32), dtype=torch.float32)


# --------------------------------------------------------------------------- dequantize layouts
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_columnwise_and_nd_shapes(dtype, device):
    x = torch.randn(2, 16, 48, device=device).to(dtype)
    r = nvfp4_quantize(x.reshape(32, 48))
    row = nvfp4_dequantize(r.rowwise_data, r.rowwise_scale, r.rowwise_amax, shape=x.shape, dtype=dtype)
    col = nvfp4_dequantize(
        r.columnwise_data, r.columnwise_scale, r.columnwise_amax, shape=x.shape, dtype=dtype, transposed=True
    )
    assert row.shape == x.shape and row.dtype == dtype and col.shape == x.shape and col.dtype == dtype
    # Columnwise decodes x^T blocked along M, transposed back: the rowwise decode of x^T, transposed.
    t = row_only(x.reshape(32, 48).t().contiguous())
    t_hat = nvfp4_dequantize(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, shape=(48, 32), dtype=dtype)
    assert torch.equal(col, t_hat.t().reshape(x.shape))
    for x_hat in (row, col):
        assert ((x_hat.float() - x.float()).abs() <= 0.2 * r.rowwise_amax).all()


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
    qx, qw = row_only(x), row_only(w, with_2d=True)
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
