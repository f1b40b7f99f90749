"""MXFP8: E8M0 block scales and FP8 data, golden bytes derived by hand in the comments.

Per 32-element block with amax a: v = RN(a * fl(1/448)), fl(1/448) = 0x3B124925 =
9586981 * 2^-32; e = biased exponent of v rounded *up* to a power of two;
q = Q_E4M3(x * 2^(127-e)); decode q * 2^(e-127).
"""

from __future__ import annotations

import pytest
import torch

from refops.quantization import DType, MXFP8Quantizer, MXFP8Tensor

INF, NAN = float("inf"), float("nan")


def _first_row_block(values: list[float], device: torch.device) -> torch.Tensor:
    """A (32, 32) tensor whose row 0 starts with ``values`` (rest zeros): row 0 is one 1x32 block."""
    x = torch.zeros(32, 32, device=device)
    x[0, : len(values)] = torch.tensor(values, device=device)
    return x


@pytest.mark.parametrize(
    "values, expected_e, expected_bytes",
    [
        # a = 448: 448 * 9586981 * 2^-32 = 1 + 192 * 2^-32, below half an ulp of 1 -> v = 1.0,
        # mantissa 0 -> e = 127 (scale 1); 448 -> 0x7E
        ([448.0], 127, [0x7E]),
        # a = 449: v = 1.0022.. (mantissa > 0) -> e = 128, multiplier 2^-1: 224.5 -> E4M3 binade
        # [128, 256) spacing 16 -> 224 = 1.75*2^7: 0 1110 110 = 0x76
        ([449.0], 128, [0x76]),
        # a = 1: v = fl(1/448) = 0x3B124925, exponent field 118, mantissa > 0 -> e = 119, multiplier 2^8:
        # 1 -> 256 = 0x78; 2^-17 -> 2^-9 (min subnormal) 0x01; 2^-18 -> 2^-10, tie with 0 -> 0x00;
        # 3*2^-18 -> 3*2^-10, tie between 0x01 and 0x02 -> even 0x02; 1.0625/256 -> 1.0625, tie -> 0x38
        ([1.0, 2**-17, 2**-18, 3 * 2**-18, 1.0625 / 256], 119, [0x78, 0x01, 0x00, 0x02, 0x38]),
        # a = inf -> v = inf -> e = 254 (saturated), multiplier 2^-127: inf -> 448 (0x7E), 1 -> 0
        ([INF, 1.0], 254, [0x7E, 0x00]),
        # NaN skipped by the amax: a = 2 -> e = 120, multiplier 2^7: 2 -> 256 = 0x78; NaN -> 0x7F
        ([NAN, 2.0], 120, [0x7F, 0x78]),
        # all-zero block: e = 0 and data 0
        ([0.0], 0, [0x00]),
    ],
)
def test_rowwise_block_golden(device: torch.device, values: list, expected_e: int, expected_bytes: list) -> None:
    q = MXFP8Quantizer(DType.kFloat8E4M3, columnwise=False)(_first_row_block(values, device))
    assert q._rowwise_scale_inv[0, 0].item() == expected_e
    assert q._rowwise_data[0, : len(values)].tolist() == expected_bytes
    assert q._columnwise_data is None and q._columnwise_scale_inv is None


def test_e5m2_block_scale_uses_its_own_fmax(device: torch.device) -> None:
    # a = 57344 * 2 = 114688: v = 2 * (57344 * fl(1/57344)) rounds to 2.0 -> e = 128, multiplier 2^-1
    x = _first_row_block([114688.0, 1.0], device)
    q = MXFP8Quantizer(DType.kFloat8E5M2, columnwise=False)(x)
    assert q._rowwise_scale_inv[0, 0].item() == 128
    # 57344 = 0x7B (E5M2 max); 0.5 = 2^-1: 0 01110 00 = 0x38
    assert q._rowwise_data[0, :2].tolist() == [0x7B, 0x38]


def test_rowwise_and_columnwise_blocks_are_independent(device: torch.device) -> None:
    x = torch.ones(32, 32, device=device)
    x[5, 0] = 4.0
    q = MXFP8Quantizer(DType.kFloat8E4M3)(x)
    # rows: amax 1 -> e = 119 (x256), row 5 amax 4 -> v = 4*fl(1/448) -> 2^-6.8 up to 2^-6 -> e = 121 (x64)
    assert q._rowwise_scale_inv[:6, 0].tolist() == [119, 119, 119, 119, 119, 121]
    # columns: column 0 holds the 4 -> e = 121; other columns e = 119
    assert q._columnwise_scale_inv[0, :3].tolist() == [121, 119, 119]
    # x[0,0] = 1: row-wise 1*256 = 256 = 0x78, column-wise 1*64 = 64 = 0 1101 000 = 0x68
    assert q._rowwise_data[0, 0].item() == 0x78 and q._columnwise_data[0, 0].item() == 0x68
    # column-wise data is NOT transposed
    assert q._columnwise_data.shape == x.shape


def test_scale_tensors_are_padded(device: torch.device) -> None:
    x = torch.randn(2, 16, 64, device=device)  # M = 32, K = 64
    q = MXFP8Quantizer(DType.kFloat8E4M3)(x)
    # row-wise (round_up(32,128), round_up(64/32,4)) = (128, 4); column-wise (round_up(1,4), round_up(64,128))
    assert q._rowwise_scale_inv.shape == (128, 4) and q._columnwise_scale_inv.shape == (4, 128)
    assert q._rowwise_scale_inv.dtype == torch.uint8
    assert q._rowwise_scale_inv[32:].eq(0).all() and q._rowwise_scale_inv[:, 2:].eq(0).all()
    assert q._columnwise_scale_inv[1:].eq(0).all() and q._columnwise_scale_inv[:, 64:].eq(0).all()
    assert q._rowwise_data.shape == x.shape and q.dequantize().shape == x.shape


@pytest.mark.parametrize("shape", [(32, 48), (16, 64), (64,), (2, 8, 32)])
def test_shapes_not_multiple_of_32_are_rejected(shape: tuple) -> None:
    quantizer = MXFP8Quantizer(DType.kFloat8E4M3)
    with pytest.raises(ValueError, match="multiples of 32"):
        quantizer(torch.zeros(shape))
    with pytest.raises(ValueError, match="multiples of 32"):
        quantizer.make_empty(shape)
    assert not quantizer.is_quantizable(torch.zeros(shape))


def test_2d_quantization_golden(device: torch.device) -> None:
    # One known amax per 32x32 tile: 448 * 2^k -> e = 127 + k exactly (as in TE's test).
    exponents = [[-2, -1], [0, 1]]
    x = torch.zeros(64, 64, device=device)
    for i in range(2):
        for j in range(2):
            amax = 448.0 * 2.0 ** exponents[i][j]
            x[32 * i : 32 * (i + 1), 32 * j : 32 * (j + 1)] = amax / 2
            x[32 * i, 32 * j] = amax
    q = MXFP8Quantizer(DType.kFloat8E4M3, with_2d_quantization=True)(x)
    tile_e = torch.tensor(exponents, device=device) + 127
    assert torch.equal(q._rowwise_scale_inv[:64, :2], tile_e.repeat_interleave(32, dim=0).to(torch.uint8))
    assert torch.equal(q._columnwise_scale_inv[:2, :64], tile_e.repeat_interleave(32, dim=1).to(torch.uint8))
    # every tile maps its amax to 448 (0x7E) and amax/2 to 224 (0x76); both usages hold the same bytes
    assert q._rowwise_data[0, 0].item() == 0x7E and q._rowwise_data[1, 1].item() == 0x76
    assert torch.equal(q._rowwise_data, q._columnwise_data)
    assert torch.equal(q.dequantize(), x)


def test_2d_rowwise_only_matches_bidirectional(device: torch.device) -> None:
    x = torch.randn(64, 96, device=device)
    both = MXFP8Quantizer(DType.kFloat8E4M3, with_2d_quantization=True)(x)
    row = MXFP8Quantizer(DType.kFloat8E4M3, columnwise=False, with_2d_quantization=True)(x)
    assert row._columnwise_data is None
    assert torch.equal(row._rowwise_data, both._rowwise_data)
    assert torch.equal(row._rowwise_scale_inv, both._rowwise_scale_inv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_is_exact(device: torch.device, dtype: torch.dtype) -> None:
    x = torch.randn(32, 64, device=device).to(dtype)
    q = MXFP8Quantizer(DType.kFloat8E4M3)(x)
    e = q._rowwise_scale_inv[:32, :2].to(torch.float64)
    expected = q._rowwise_data.view(torch.float8_e4m3fn).double() * torch.pow(2.0, e - 127).repeat_interleave(32, 1)
    assert torch.equal(q.dequantize(dtype=torch.float32).double(), expected)
    assert torch.equal(q.dequantize(), expected.float().to(dtype))


def test_make_empty_layout(device: torch.device) -> None:
    t = MXFP8Quantizer(DType.kFloat8E4M3).make_empty((64, 96), dtype=torch.bfloat16, device=device)
    assert isinstance(t, MXFP8Tensor) and t.dtype == torch.bfloat16
    assert t._rowwise_scale_inv.shape == (128, 4) and t._columnwise_scale_inv.shape == (4, 128)
    assert t._columnwise_data.shape == (64, 96)


def test_swizzled_scales_are_not_supported() -> None:
    with pytest.raises(NotImplementedError, match="compact"):
        MXFP8Tensor((32, 32), torch.float32, rowwise_data=torch.zeros(32, 32, dtype=torch.uint8),
                    rowwise_scale_inv=torch.zeros(128, 4, dtype=torch.uint8), with_gemm_swizzled_scales=True)
