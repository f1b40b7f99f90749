"""FP8 block scaling (1x128 / 128x128, fp32 scales): golden values derived by hand in the comments.

Per block: s = compute_scale_from_amax(amax, 448, pow2, eps=0, value_for_inf = input dtype max),
q = Q_E4M3(RN(x*s)), scale_inv = RN(1/s). pow2 drops the mantissa of s (rounds down).
"""

from __future__ import annotations

import pytest
import torch

from refops.quantization import DType, Float8BlockQuantizer, Float8BlockwiseQTensor

INF = float("inf")


def _quantizer(dim: int, *, pow2: bool = True, rowwise: bool = True, columnwise: bool = True,
               fp8_dtype: DType = DType.kFloat8E4M3) -> Float8BlockQuantizer:
    return Float8BlockQuantizer(fp8_dtype, rowwise=rowwise, columnwise=columnwise, force_pow_2_scales=pow2,
                                block_scaling_dim=dim)


def _bits(t: torch.Tensor) -> list[int]:
    return [b & 0xFFFFFFFF for b in t.reshape(-1).float().view(torch.int32).tolist()]


@pytest.mark.parametrize("pow2, scale_inv, first_byte", [
    # s = RN(448/3) = 0x43155555 = 149.33; pow2 -> 128, scale_inv 2^-7; 3*128 = 384 = 1.5*2^8: 0 1111 100 = 0x7C
    (True, 2**-7, 0x7C),
    # fp32 scales: 3*s = 29360127 * 2^-16 is a tie between 448 - 2^-15 and 448 -> even -> 448 = 0x7E
    (False, None, 0x7E),
])
def test_1d_block_golden(device: torch.device, pow2: bool, scale_inv: float | None, first_byte: int) -> None:
    x = torch.zeros(1, 128, device=device)
    x[0, 0], x[0, 1] = 3.0, -1.0
    q = _quantizer(1, pow2=pow2, columnwise=False)(x)
    assert q._rowwise_data[0, 0].item() == first_byte
    if scale_inv is not None:
        assert q._rowwise_scale_inv[0, 0].item() == scale_inv
        assert q._rowwise_data[0, 1].item() == 0xF0  # -128 = -2^7: 1 1110 000
    else:
        s = torch.tensor([0x43155555], dtype=torch.int32).view(torch.float32)
        assert _bits(q._rowwise_scale_inv[0, 0]) == _bits((1.0 / s.double()).float())


def test_subnormals_ties_and_saturation_in_a_block(device: torch.device) -> None:
    x = torch.zeros(1, 128, device=device)
    x[0, :5] = torch.tensor([448.0, 2**-9, 2**-10, 3 * 2**-10, -1.0625])
    q = _quantizer(1, columnwise=False)(x)
    # amax 448 -> s = RN(448/448) = 1 (pow2 keeps it): the bytes are the plain E4M3 casts:
    # 448 -> 0x7E; 2^-9 -> min subnormal 0x01; 2^-10 -> tie with 0 -> 0x00;
    # 3*2^-10 -> tie between 0x01 and 0x02 -> even 0x02; -1.0625 -> tie between -1 and -1.125 -> 0xB8
    assert q._rowwise_scale_inv[0, 0].item() == 1.0
    assert q._rowwise_data[0, :5].tolist() == [0x7E, 0x01, 0x00, 0x02, 0xB8]


def test_zero_and_inf_blocks(device: torch.device) -> None:
    x = torch.zeros(2, 256, device=device)
    x[1, 128] = INF
    x[1, 129] = 2.5
    q = _quantizer(1, columnwise=False)(x)
    # 1D row-wise scale layout [k/128, m]: every block but (m=1, kb=1) is all zero -> scale 1;
    # that block's amax is inf -> scale 1 too; inf saturates to 0x7E, 2.5 = 1.25*2: 0 1000 010 = 0x42
    assert q._rowwise_scale_inv[:2, :2].eq(1.0).all()
    assert q._rowwise_data[1, 128:130].tolist() == [0x7E, 0x42]
    assert q._rowwise_data[0].eq(0).all()


@pytest.mark.parametrize("dtype, tiny, pow2, expected_scale_bits", [
    # fp32 min subnormal: 448/2^-149 overflows -> value_for_inf FLT_MAX (0x7F7FFFFF); pow2 -> 2^127
    (torch.float32, 2**-149, False, 0x7F7FFFFF),
    (torch.float32, 2**-149, True, 0x7F000000),
    # bf16 min subnormal 2^-133: 448*2^133 overflows fp32 -> bf16 max 0x1.FEp127 = 0x7F7F0000; pow2 -> 2^127
    (torch.bfloat16, 2**-133, False, 0x7F7F0000),
    (torch.bfloat16, 2**-133, True, 0x7F000000),
])
def test_value_for_inf_is_the_input_dtype_max(dtype: torch.dtype, tiny: float, pow2: bool,
                                               expected_scale_bits: int) -> None:
    x = torch.zeros(1, 128, dtype=dtype)
    x[0, 0] = tiny
    q = _quantizer(1, pow2=pow2, columnwise=False)(x)
    expected_scale = torch.tensor([expected_scale_bits], dtype=torch.int32).view(torch.float32)
    # scale_inv = RN(1/s): 2^-127 exactly for the pow2 cases (an fp32 subnormal)
    assert _bits(q._rowwise_scale_inv[0, 0]) == _bits((1.0 / expected_scale.double()).float())
    if pow2:
        assert q._rowwise_scale_inv[0, 0].item() == 2.0**-127


@pytest.mark.parametrize("pow2, scale_inv, byte", [
    # x = bf16 max = 1.9921875 * 2^127; 448/x = 224.88 * 2^-127 = 1.757 * 2^-120 -> pow2 2^-120;
    # x * 2^-120 = 1.9921875 * 2^7 = 255 -> binade [128, 256) spacing 16: nearest 256 = 0 1111 000 = 0x78
    (True, 2.0**120, 0x78),
    # fp32 scales: x * RN(448/x) rounds to 448 -> 0x7E
    (False, None, 0x7E),
])
def test_extrema_tile_like_te(device: torch.device, pow2: bool, scale_inv: float | None, byte: int) -> None:
    x = torch.full((128, 128), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16, device=device)
    q = _quantizer(2, pow2=pow2, columnwise=False)(x)
    if scale_inv is not None:
        assert q._rowwise_scale_inv[0, 0].item() == scale_inv
    assert q._rowwise_data.eq(byte).all()


def test_shapes_that_are_not_multiples_of_128_are_padded(device: torch.device) -> None:
    x = torch.randn(3, 200, device=device)
    q1 = _quantizer(1)(x)
    # 1D: row-wise (ceil(200/128), round_up(3,4)) = (2, 4); column-wise data (200, 3), scales (1, round_up(200,4))
    assert q1._rowwise_scale_inv.shape == (2, 4) and q1._columnwise_scale_inv.shape == (1, 200)
    assert q1._columnwise_data.shape == (200, 3)
    assert q1._rowwise_scale_inv[:, 3].eq(0).all()  # padding
    q2 = _quantizer(2)(x)
    # 2D: row-wise (ceil(3/128), round_up(ceil(200/128),4)) = (1, 4); column-wise (2, round_up(1,4)) = (2, 4)
    assert q2._rowwise_scale_inv.shape == (1, 4) and q2._columnwise_scale_inv.shape == (2, 4)
    assert torch.equal(q2._columnwise_scale_inv[:2, :1], q2._rowwise_scale_inv[:1, :2].t())
    for q in (q1, q2):
        assert q.dequantize().shape == x.shape


def test_edge_block_amax_uses_in_bounds_elements(device: torch.device) -> None:
    # Row of 200: block 1 covers columns 128..199 only. Its amax 0.5 -> s = RN(448/0.5) = 896 -> pow2 512.
    x = torch.zeros(1, 200, device=device)
    x[0, 0], x[0, 199] = 100.0, 0.5
    q = _quantizer(1, columnwise=False)(x)
    # block 0: 448/100 = 4.48 -> pow2 4 -> scale_inv 0.25; block 1: scale_inv 2^-9
    assert q._rowwise_scale_inv[:2, 0].tolist() == [0.25, 2**-9]
    assert q._rowwise_data[0, 199].item() == 0x78  # 0.5*512 = 256 = 0 1111 000


def test_1d_columnwise_is_quantized_separately_along_m(device: torch.device) -> None:
    x = torch.ones(128, 2, device=device)
    x[7, 1] = 8.0
    q = _quantizer(1)(x)
    # row-wise: row 7 amax 8 -> 448/8 = 56 -> pow2 32; other rows 448 -> 256
    assert q._rowwise_scale_inv[0, :8].tolist() == [2**-8] * 7 + [2**-5]
    # column-wise (layout [m/128, k]): column 1 amax 8 -> 2^-5, column 0 -> 2^-8
    assert q._columnwise_scale_inv[0, :2].tolist() == [2**-8, 2**-5]
    # x[0,1] = 1: row-wise 1*256 = 0x78; column-wise 1*32 = 32 = 2^5: 0 1100 000 = 0x60
    assert q._rowwise_data[0, 1].item() == 0x78 and q._columnwise_data[1, 0].item() == 0x60


def test_2d_columnwise_is_the_exact_transpose(device: torch.device) -> None:
    x = torch.randn(130, 260, device=device) * 10
    q = _quantizer(2)(x)
    assert torch.equal(q._columnwise_data, q._rowwise_data.t())
    assert torch.equal(q._columnwise_scale_inv[:3, :2], q._rowwise_scale_inv[:2, :3].t())
    assert torch.equal(q.dequantize(usage="columnwise"), q.dequantize(usage="rowwise"))
    # one scale per 128x128 tile
    assert q._rowwise_scale_inv.shape == (2, 4)


def test_gemm_ready_1d_layout_element_order(device: torch.device) -> None:
    # element [k/128, m]: make row m's second block hold amax 2^m so its scale_inv is 2^(m-8)
    x = torch.zeros(4, 256, device=device)
    for m in range(4):
        x[m, 130] = 2.0**m
    q = _quantizer(1, columnwise=False)(x)
    assert q._rowwise_scale_inv[1, :4].tolist() == [2.0 ** (m - 8) for m in range(4)]


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_is_one_fp32_product(device: torch.device, dim: int, dtype: torch.dtype) -> None:
    x = torch.randn(130, 140, device=device).to(dtype)
    q = _quantizer(dim)(x)
    data = q._rowwise_data.view(torch.float8_e4m3fn).float()
    if dim == 1:
        s = q._rowwise_scale_inv[:2, :130].t().repeat_interleave(128, dim=1)[:, :140]
    else:
        s = q._rowwise_scale_inv[:2, :2].repeat_interleave(128, 0)[:130].repeat_interleave(128, 1)[:, :140]
    assert torch.equal(q.dequantize(dtype=torch.float32), data * s)
    assert torch.equal(q.dequantize(), (data * s).to(dtype))


def test_nd_input_and_make_empty(device: torch.device) -> None:
    x = torch.randn(2, 3, 130, device=device)
    q = _quantizer(1)(x)
    assert q._columnwise_data.shape == (130, 2, 3) and q._rowwise_scale_inv.shape == (2, 8)
    assert q.dequantize(usage="columnwise").shape == q.dequantize().shape == x.shape
    quantizer = _quantizer(2)
    t = quantizer.make_empty((2, 3, 130), dtype=torch.bfloat16, device=device)
    assert isinstance(t, Float8BlockwiseQTensor) and t._columnwise_data.shape == (130, 2, 3)
    assert t._rowwise_scale_inv.shape == quantizer.get_scale_shape((2, 3, 130), columnwise=False) == (1, 4)


def test_bad_block_scaling_dim() -> None:
    with pytest.raises(ValueError, match="block_scaling_dim"):
        Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=3)
