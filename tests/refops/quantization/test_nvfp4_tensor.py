"""NVFP4Tensor / NVFP4Quantizer: the wrapper around refops.kernels.reference.quant_nvfp4."""

from __future__ import annotations

import json

import pytest
import torch

from refops.kernels import current_backend
from refops.kernels.reference.quant_nvfp4 import quantize_nvfp4
from refops.quantization import DType, NVFP4Quantizer, NVFP4Tensor, QuantizedTensor


def test_golden_block_through_the_quantizer(device: torch.device) -> None:
    x = torch.zeros(16, 16, device=device)
    x[0, :3] = torch.tensor([6.0, 3.0, 1.5])
    q = NVFP4Quantizer(columnwise=False)(x)
    # A = 6: S_enc = RN(2688/6) = 448; s_b = Q_E4M3(RN(6 * RN(448 * fl(1/6)))) = Q_E4M3(448.00001) = 448 (0x7E);
    # enc = RN(1/RN(448 * RN(1/448))) = RN(1/(1 + 192*2^-32 rounded to 1)) = 1, so q = x:
    # E2M1 codes 6 -> 7, 3 -> 5, 1.5 -> 3; element 2j in the low nibble: bytes 0x57, 0x03
    assert q._rowwise_data[0, :2].tolist() == [0x57, 0x03]
    assert q._rowwise_scale_inv[0, 0].item() == 0x7E and q._amax_rowwise.tolist() == [6.0]
    assert torch.equal(q.dequantize(), x)
    assert q._rowwise_data.shape == (16, 8) and q._rowwise_scale_inv.shape == (128, 4)


@pytest.mark.parametrize("options, dtype", [
    ({}, torch.float32),
    ({"with_2d_quantization": True}, torch.bfloat16),
    ({"with_rht": True, "with_post_rht_amax": True}, torch.bfloat16),
    ({"with_rht": True, "with_random_sign_mask": False}, torch.bfloat16),
    ({"nvfp4_use_4over6": True, "nvfp4_e4m3_max": 256}, torch.float32),
    ({"nvfp4_use_4over6": True, "nvfp4_e4m3_max": 448, "nvfp4_4over6_err_mode": "MSE"}, torch.float32),
    ({"row_scaled_nvfp4": True}, torch.float16),
])
def test_quantizer_matches_the_numerics_function(device: torch.device, options: dict, dtype: torch.dtype) -> None:
    x = (torch.randn(2, 32, 48, device=device) * 3).to(dtype)
    q = NVFP4Quantizer(**options)(x)
    ref = quantize_nvfp4(
        x.reshape(64, 48), with_2d_quantization=options.get("with_2d_quantization", False),
        with_rht=options.get("with_rht", False), with_random_sign_mask=options.get("with_random_sign_mask", True),
        use_4over6=options.get("nvfp4_use_4over6", False), e4m3_max_4over6=options.get("nvfp4_e4m3_max", 256),
        err_mode=options.get("nvfp4_4over6_err_mode", "MAE"), row_scaled=options.get("row_scaled_nvfp4", False),
    )
    assert q._rowwise_data.shape == (2, 32, 24) and q._columnwise_data.shape == (48, 32)
    assert torch.equal(q._rowwise_data.reshape(64, 24), ref.rowwise_data)
    assert torch.equal(q._columnwise_data, ref.columnwise_data)
    assert torch.equal(q._rowwise_scale_inv, ref.rowwise_scale) and torch.equal(q._columnwise_scale_inv, ref.columnwise_scale)
    assert torch.equal(q._amax_rowwise, ref.rowwise_amax) and torch.equal(q._amax_columnwise, ref.columnwise_amax)
    assert q._nvfp4_e4m3_max == ref.e4m3_max and q.shape == x.shape and q.dtype == dtype
    assert q._columnwise_rht == options.get("with_rht", False)


def test_stochastic_rounding_draws_from_torch_rng(device: torch.device) -> None:
    x = torch.randn(32, 64, device=device)
    quantizer = NVFP4Quantizer(stochastic_rounding=True)
    torch.manual_seed(7)
    a = quantizer(x)
    torch.manual_seed(7)
    b = quantizer(x)
    torch.manual_seed(7)
    bytes_row = torch.randint(0, 256, (32, 64), dtype=torch.uint8, device=device)
    bytes_col = torch.randint(0, 256, (64, 32), dtype=torch.uint8, device=device)
    ref = quantize_nvfp4(x, stochastic_rounding=True, random_bytes_rowwise=bytes_row, random_bytes_columnwise=bytes_col)
    assert torch.equal(a._rowwise_data, b._rowwise_data) and torch.equal(a._rowwise_data, ref.rowwise_data)
    assert torch.equal(a._columnwise_data, ref.columnwise_data)
    c = quantizer(x)  # next draw
    assert not torch.equal(c._rowwise_data, a._rowwise_data)


def test_rht_columnwise_is_in_the_hadamard_domain(device: torch.device) -> None:
    x = torch.randn(32, 64, device=device, dtype=torch.bfloat16)
    q = NVFP4Quantizer(with_rht=True)(x)
    assert torch.allclose(q.dequantize().float(), x.float(), atol=0.75)  # row-wise: plain values
    col = q.clone()
    col.update_usage(rowwise_usage=False)
    with pytest.raises(RuntimeError, match="Hadamard"):
        col.dequantize()
    transformed = col.dequantize(usage="columnwise")
    assert transformed.shape == x.shape and not torch.allclose(transformed.float(), x.float(), atol=0.75)


def test_wgrad_gemm_with_rht_on_both_operands(device: torch.device) -> None:
    gen = torch.Generator(device=device).manual_seed(3)
    x = torch.randn(64, 32, device=device, generator=gen).to(torch.bfloat16)
    dy = torch.randn(64, 16, device=device, generator=gen).to(torch.bfloat16)
    quantizer = NVFP4Quantizer(with_rht=True)
    qx, qdy = quantizer(x), quantizer(dy)
    dw = current_backend().gemm(qdy, qx, trans_a=True, out_dtype=torch.float32)  # dW = dy^T x, contracts M
    fp32 = dict(dtype=torch.float32, usage="columnwise")
    expected = qdy.dequantize(**fp32).t() @ qx.dequantize(**fp32)
    assert torch.equal(dw, expected)
    exact = dy.float().t() @ x.float()
    assert (dw - exact).norm() / exact.norm() < 0.25  # the transform cancels: an NVFP4-accurate dW
    plain_x = NVFP4Quantizer()(x)
    with pytest.raises(ValueError, match="Hadamard"):
        current_backend().gemm(qdy, plain_x, trans_a=True, out_dtype=torch.float32)


@pytest.mark.parametrize("shape", [(16, 24), (8, 32), (64,), (2, 4, 32)])
def test_shape_requirements(shape: tuple) -> None:
    quantizer = NVFP4Quantizer()
    assert not quantizer.is_quantizable(torch.zeros(shape))
    with pytest.raises(ValueError, match="multiples of 16"):
        quantizer(torch.zeros(shape))
    with pytest.raises(ValueError, match="multiples of 16"):
        quantizer.make_empty(shape)


def test_rht_needs_bf16_and_bad_options() -> None:
    with pytest.raises(ValueError, match="bfloat16"):
        NVFP4Quantizer(with_rht=True)(torch.randn(16, 16))
    with pytest.raises(ValueError, match="kFloat4E2M1"):
        NVFP4Quantizer(fp4_dtype=DType.kFloat8E4M3)
    # Without a process group amax reduction has no peers: the same bytes as without it
    # (the 2-rank case is in tests/refops/distributed/test_quantized_tensor_parallel.py).
    x = torch.randn(32, 32)
    reduced, plain = NVFP4Quantizer(with_amax_reduction=True)(x), NVFP4Quantizer()(x)
    assert torch.equal(reduced._rowwise_data, plain._rowwise_data)
    assert torch.equal(reduced._amax_columnwise, plain._amax_columnwise)


def test_make_empty_and_update_quantized(device: torch.device) -> None:
    quantizer = NVFP4Quantizer(row_scaled_nvfp4=True, columnwise=False)
    t = quantizer.make_empty((2, 16, 32), dtype=torch.bfloat16, device=device)
    assert isinstance(t, NVFP4Tensor) and t._rowwise_data.shape == (2, 16, 16)
    assert t._rowwise_scale_inv.shape == (128, 4) and t._amax_rowwise.shape == (32,) and t._columnwise_data is None
    x = torch.randn(2, 16, 32, device=device)
    quantizer.update_quantized(x, t)
    assert torch.equal(t._rowwise_data, quantizer(x)._rowwise_data)
    assert NVFP4Quantizer().get_scale_shape((64, 96), columnwise=True) == (128, 4)


def test_plain_round_trip_keeps_the_options(device: torch.device) -> None:
    quantizer = NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, with_2d_quantization=True)
    q = quantizer(torch.randn(32, 32, device=device))
    tensors, metadata = q.to_plain_tensors()
    json.dumps(metadata)
    rebuilt = QuantizedTensor.from_plain_tensors(tensors, metadata)
    assert type(rebuilt) is NVFP4Tensor and rebuilt._nvfp4_e4m3_max == 256 and rebuilt._fp4_dtype == DType.kFloat4E2M1
    assert torch.equal(rebuilt.dequantize(), q.dequantize())
    assert rebuilt.quantizer._config() == quantizer._config()
