"""Per-tensor FP8 (delayed and current scaling): golden bytes derived by hand in the comments.

E4M3: sign | 4 exponent bits (bias 7) | 3 mantissa bits; max 448 = 1.75*2^8 = 0x7E;
NaN 0x7F; min subnormal 2^-9 = 0x01. E5M2: bias 15, 2 mantissa bits; max 57344 = 0x7B.
"""

from __future__ import annotations

import pytest
import torch

from refops.formats import FLT_MAX
from refops.kernels import current_backend
from refops.quantization import DType, Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor

INF, NAN = float("inf"), float("nan")


def _bytes(t: torch.Tensor) -> list[int]:
    return t.reshape(-1).view(torch.uint8).tolist()


def _bits(t: torch.Tensor) -> list[int]:
    return [b & 0xFFFFFFFF for b in t.reshape(-1).float().view(torch.int32).tolist()]


def _delayed(scale: float, fp8_dtype: DType = DType.kFloat8E4M3, device: str = "cpu", **kw) -> Float8Quantizer:
    return Float8Quantizer(torch.tensor([scale], device=device), torch.zeros(1, device=device), fp8_dtype, **kw)


def test_e4m3_cast_with_unit_scale(device: torch.device) -> None:
    x = torch.tensor([
        0.0,        # 0x00
        -0.0,       # sign bit only: 0x80
        1.0,        # 2^0: exponent field 7 -> 0 0111 000 = 0x38
        448.0,      # max: 0x7E
        500.0,      # above max: satfinite -> 0x7E
        -1000.0,    # -> -max 0xFE
        INF,        # satfinite: inf -> 0x7E
        -INF,       # 0xFE
        NAN,        # NaN kept: 0x7F
        2**-9,      # min subnormal: 0x01
        2**-10,     # tie between 0 and 2^-9: even -> 0x00
        3 * 2**-10, # tie between 2^-9 (0x01) and 2^-8 (0x02): even -> 0x02
        1.0625,     # tie between 1.0 (0x38) and 1.125 (0x39): even -> 0x38
        1.1875,     # tie between 1.125 (0x39) and 1.25 (0x3A): even -> 0x3A
    ], device=device)
    q = _delayed(1.0, device=device)(x)
    assert _bytes(q._data) == [0x00, 0x80, 0x38, 0x7E, 0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x01, 0x00, 0x02, 0x38, 0x3A]
    assert q._scale_inv.item() == 1.0


def test_e5m2_cast_with_unit_scale(device: torch.device) -> None:
    x = torch.tensor([
        57344.0,    # max = 1.75*2^15: 0 11110 11 = 0x7B
        1.0,        # exponent field 15: 0 01111 00 = 0x3C
        61440.0,    # above max (torch alone would give inf 0x7C): satfinite -> 0x7B
        -INF,       # -> -max 0xFB
        2**-16,     # min subnormal 0x01
        2**-17,     # tie with 0: even -> 0x00
        3 * 2**-17, # tie between 0x01 and 0x02: even -> 0x02
    ], device=device)
    q = _delayed(1.0, DType.kFloat8E5M2, device=device)(x)
    assert _bytes(q._data) == [0x7B, 0x3C, 0x7B, 0xFB, 0x01, 0x00, 0x02]
    nan_q = _delayed(1.0, DType.kFloat8E5M2, device=device)(torch.tensor([NAN], device=device))
    assert torch.isnan(nan_q.dequantize()).all()


def test_delayed_scaling_uses_given_scale_and_records_amax(device: torch.device) -> None:
    history = torch.zeros(4, 3, device=device)  # amax_history: row 0 is the current window
    scale = torch.tensor([1.0, 2.0, 4.0], device=device)
    quantizer = Float8Quantizer(scale[1:2], history[0, 1:2], DType.kFloat8E4M3)
    q = quantizer(torch.tensor([1.0, -3.0], device=device))
    # 1*2 = 2 = 2^1: 0 1000 000 = 0x40; -3*2 = -6 = -1.5*2^2: 1 1001 100 = 0xCC
    assert _bytes(q._data) == [0x40, 0xCC]
    assert q._scale_inv.item() == 0.5  # RN(1/2)
    assert history[0].tolist() == [0.0, 3.0, 0.0]  # pre-scale amax recorded in the slot's view
    quantizer(torch.tensor([2.0, NAN], device=device))  # smaller amax (NaN skipped): max stays 3
    assert history[0, 1].item() == 3.0
    quantizer(torch.tensor([-5.0], device=device))
    assert history[0, 1].item() == 5.0
    # the scale is read at cast time: updating the recipe state changes the next cast
    scale[1] = 64.0
    assert _bytes(quantizer(torch.tensor([1.0], device=device))._data) == [0x68]  # 64 = 2^6: 0 1101 000


def test_delayed_scaling_first_step_saturates(device: torch.device) -> None:
    # Initial state: scale 1, so anything above 448 saturates (docs/recipes/delayed-scaling.md#pitfalls).
    q = _delayed(1.0, device=device)(torch.tensor([1000.0, -2.0], device=device))
    assert q.dequantize().tolist() == [448.0, -2.0]


def test_delayed_scaling_calibrate_records_amax_without_casting(device: torch.device) -> None:
    quantizer = _delayed(1.0, device=device)
    quantizer.calibrate(torch.tensor([-7.0, 2.0], device=device))
    assert quantizer.amax.item() == 7.0


def test_current_scaling_golden(device: torch.device) -> None:
    x = torch.tensor([1.0, -2.0, 0.5, 3.5], device=device)
    quantizer = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
    q = quantizer(x)
    # amax 3.5 -> scale RN(448/3.5) = 128 exactly; x*128 = [128, -256, 64, 448]
    # 128 = 2^7: 0 1110 000 = 0x70; -256 = -2^8: 1 1111 000 = 0xF8; 64: 0x68; 448: 0x7E
    assert _bytes(q._data) == [0x70, 0xF8, 0x68, 0x7E]
    assert q._scale_inv.item() == 2**-7
    assert quantizer.amax.item() == 3.5 and quantizer.scale.item() == 128.0
    assert q.dequantize().tolist() == x.tolist()


def test_current_scaling_non_pow2_and_pow2(device: torch.device) -> None:
    x = torch.tensor([3.0, 1.0], device=device)
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)(x)
    # s = RN(448/3) = 149.333... : mantissa 0.1666..*2^23 = 1398101.33 -> 0x155555, s = 0x43155555
    s = torch.tensor([0x43155555], dtype=torch.int32).view(torch.float32).item()
    # 3*s = 29360127 * 2^-16 exactly: halfway between 448 - 2^-15 and 448 -> even -> 448 (0x7E)
    # 1*s = 149.33 -> E4M3 binade [128, 256) spacing 16: nearest is 144 = 1.125*2^7: 0 1110 001 = 0x71
    assert _bytes(q._data) == [0x7E, 0x71]
    assert _bits(q._scale_inv) == _bits((1.0 / torch.tensor([s], dtype=torch.float64)).float())
    qp = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device, force_pow_2_scales=True)(x)
    # pow2: mantissa bits of 0x43155555 dropped -> 0x43000000 = 128 (rounds down); 3*128 = 384 = 0x7C
    assert qp._scale_inv.item() == 2**-7
    assert _bytes(qp._data) == [0x7C, 0x70]


@pytest.mark.parametrize(
    "amax, pow2, expected_bits",
    [
        (0.0, False, 0x3F800000),           # amax 0: scale 1
        (INF, False, 0x3F800000),           # inf: scale 1 (TE's Python reference would give 0)
        (NAN, False, 0x3F800000),           # NaN: scale 1
        (2**-149, False, 0x7F7FFFFF),       # 448/2^-149 overflows: +inf -> FLT_MAX
        (2**-149, True, 0x7F000000),        # FLT_MAX with the mantissa dropped: 2^127
        (3.5, True, 0x43000000),            # 128 is already a power of two
        (1.0, True, 0x43800000),            # 448 -> 256 (round down, not to nearest 512)
    ],
)
def test_compute_scale_from_amax_edge_cases(amax: float, pow2: bool, expected_bits: int) -> None:
    scale = current_backend().compute_scale_from_amax(
        torch.tensor([amax]), fmax=448.0, force_pow_2_scales=pow2, amax_epsilon=0.0, value_for_inf=FLT_MAX
    )
    assert _bits(scale) == [expected_bits]


def test_amax_epsilon_floors_the_amax() -> None:
    quantizer = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu", amax_epsilon=1.0)
    q = quantizer(torch.tensor([0.5, -0.25]))
    # a = max(0.5, eps=1) = 1 -> scale 448; 0.5*448 = 224 = 1.75*2^7: 0 1110 110 = 0x76;
    # -0.25*448 = -112 = -1.75*2^6: 1 1101 110 = 0xEE
    assert quantizer.scale.item() == 448.0
    assert _bytes(q._data) == [0x76, 0xEE]


def test_current_scaling_all_zero_tensor(device: torch.device) -> None:
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)(torch.zeros(2, 3, device=device))
    assert q._scale_inv.item() == 1.0 and _bytes(q._data) == [0] * 6


def test_current_scaling_with_inf_and_nan(device: torch.device) -> None:
    # amax = inf -> scale 1 (kernel rule); inf saturates to 448, 2.5 stays 2.5 = 1.25*2^1: 0 1000 010 = 0x42
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)(torch.tensor([INF, 2.5, -INF], device=device))
    assert _bytes(q._data) == [0x7E, 0x42, 0xFE] and q._scale_inv.item() == 1.0
    # NaN is skipped by the amax (amax 7 -> s = RN(448/7) = 64) and stays NaN: 7*64 = 448 = 0x7E
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)(torch.tensor([NAN, 7.0], device=device))
    assert _bytes(q._data) == [0x7F, 0x7E] and q._scale_inv.item() == 1 / 64


def test_empty_tensor(device: torch.device) -> None:
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)(torch.zeros(0, 4, device=device))
    assert q.shape == (0, 4) and q._data.shape == (0, 4) and q._transpose.shape == (4, 0)
    assert q._scale_inv.item() == 1.0 and q.dequantize().shape == (0, 4)


def test_columnwise_is_the_transpose_of_the_same_bytes(device: torch.device) -> None:
    x = torch.randn(2, 3, 4, device=device)
    q = Float8CurrentScalingQuantizer(DType.kFloat8E5M2, device)(x)
    assert q._transpose.shape == (4, 2, 3)
    assert torch.equal(q._transpose, q._data.reshape(6, 4).t().reshape(4, 2, 3))
    assert torch.equal(q.dequantize(usage="columnwise"), q.dequantize(usage="rowwise"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dequantize_is_one_fp32_product_then_one_rounding(device: torch.device, dtype: torch.dtype) -> None:
    x = (torch.randn(8, 16, device=device) * 3).to(dtype)
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)(x)
    assert q.dtype == dtype and q.dequantize().dtype == dtype
    values = q._data.view(torch.float8_e4m3fn).float() * q._scale_inv
    assert torch.equal(q.dequantize(dtype=torch.float32), values)
    assert torch.equal(q.dequantize(), values.to(dtype))
    assert torch.equal(q.dequantize(dtype=torch.bfloat16), values.to(torch.bfloat16))


def test_bf16_input_amax_is_exact(device: torch.device) -> None:
    # bf16 3.5 converts exactly; same golden bytes as the fp32 case
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)(
        torch.tensor([1.0, -2.0, 0.5, 3.5], device=device, dtype=torch.bfloat16))
    assert _bytes(q._data) == [0x70, 0xF8, 0x68, 0x7E]


def test_bad_fp8_dtype_and_input_dtype_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="fp8_dtype"):
        Float8CurrentScalingQuantizer(DType.kFloat4E2M1, "cpu")
    with pytest.raises(TypeError, match="fp32, fp16 or bf16"):
        Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu")(torch.ones(3, dtype=torch.int32))


def test_torch_fp8_dtypes_are_accepted_as_fp8_dtype() -> None:
    q = Float8CurrentScalingQuantizer(torch.float8_e5m2, "cpu")
    assert q.dtype == DType.kFloat8E5M2 and q.fmax == 57344.0


def test_make_empty_shapes(device: torch.device) -> None:
    t = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device).make_empty((5, 7), dtype=torch.bfloat16, device=device)
    assert isinstance(t, Float8Tensor) and t.dtype == torch.bfloat16 and t.shape == (5, 7)
    assert t._data.shape == (5, 7) and t._transpose.shape == (7, 5) and t._scale_inv.shape == (1,)
