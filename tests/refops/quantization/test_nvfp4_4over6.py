"""NVFP4 4over6 (refops/kernels/reference/quant_nvfp4.py): per-block choice between map-to-6 and map-to-4.

Golden values are derived by hand in the comments, with the exact facts stated in ``test_nvfp4_numerics.py``.
"""

from __future__ import annotations

import pytest
import torch

from refops.kernels.reference.nvfp4_scales import nvfp4_4over6_block_scales

from _nvfp4_helpers import dequant_rowwise, hexes, row_only


def test_4over6_base_scale_divides(device):
    # b = 1.125, S_enc = 896: base = RN(RN(1.125 / 6) * 896) = 0.1875 * 896 = 168 (exact).
    # s6 = Q_E4M3(168): tie between 160 (0x72, even) and 176 -> 0x72.  s4 = Q_E4M3(RN(168 * 1.5) = 252) -> 256 (0x78).
    s4, s6 = nvfp4_4over6_block_scales(torch.tensor([1.125], device=device), torch.tensor([896.0], device=device))
    assert hexes(s4.view(torch.uint8)) == [0x78] and hexes(s6.view(torch.uint8)) == [0x72]


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
    two_d = row_only(x, use_4over6=True, with_2d_quantization=True)
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
