"""``Quantizer.quantize_unrounded``: TE's fused activation + quantize, per scheme (``docs/recipes/fused-activations.md``).

Each scheme's rule is checked against an independent computation in plain torch (the FP8 cast of ``v * scale``,
the amax of the fp32 values), on inputs built so that the rule matters: bf16 rounding that changes an FP8 code
(double rounding) and bf16 rounding that changes the amax.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.quantization import (DType, Float8BlockQuantizer, Float8CurrentScalingQuantizer, Float8Quantizer,
                                 MXFP8Quantizer, NVFP4Quantizer)

BF16 = torch.bfloat16


def _values(device: str) -> torch.Tensor:
    """fp32 values with a maximum that bf16 rounds down (1 + 2^-9 rounds to 1.0, ties to even)."""
    torch.manual_seed(0)
    v = (torch.randn(64, 128, device=device) * 0.3).clamp(-0.9, 0.9)
    v[3, 5] = 1.0 + 2.0 ** -9
    return v


def _e4m3_codes(v32: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (v32 * scale).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def _delayed(device: str, scale: float = 8.0) -> Float8Quantizer:
    return Float8Quantizer(torch.tensor([scale], device=device), torch.zeros(1, device=device), DType.kFloat8E4M3)


def test_delayed_scaling_rounds_once_from_fp32_and_records_the_fp32_amax(device):
    v = _values(device)
    q = _delayed(device)
    t = q.quantize_unrounded(v, dtype=BF16)
    assert t.dtype == BF16 and t.shape == v.shape
    codes = t.gemm_operand("rowwise", values=False).data
    assert torch.equal(codes, _e4m3_codes(v, q.scale))
    assert q.amax.item() == v.abs().max().item() == 1.0 + 2.0 ** -9
    # The unfused path (bf16 first) is a different result: some codes move (double rounding), and so does the amax.
    unfused_q = _delayed(device)
    unfused = unfused_q(v.to(BF16)).gemm_operand("rowwise", values=False).data
    assert not torch.equal(codes, unfused)
    assert unfused_q.amax.item() == 1.0


def test_current_scaling_scales_by_the_fp32_amax_and_casts_the_rounded_values(device):
    v = _values(device)
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
    t = q.quantize_unrounded(v, dtype=BF16)
    amax = v.abs().max()
    scale = (torch.tensor(448.0, device=device) / amax).float()
    operand = t.gemm_operand("rowwise", values=False)
    assert q.amax.item() == amax.item()
    assert torch.equal(operand.scale_inv.reshape(()), scale.reciprocal())
    assert torch.equal(operand.data, _e4m3_codes(v.to(BF16).float(), scale))
    assert t.dtype == BF16
    plain = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)(v.to(BF16))
    assert not torch.equal(plain.gemm_operand("rowwise", values=False).scale_inv, operand.scale_inv)


def test_nvfp4_takes_the_global_amax_from_fp32_and_the_blocks_from_the_rounded_values(device):
    v = _values(device)
    t = NVFP4Quantizer().quantize_unrounded(v, dtype=BF16)
    row = t.gemm_operand("rowwise", values=False)
    assert row.amax.item() == v.abs().max().item()
    # Same blocks as quantizing the rounded values with that global amax: only the amax differs from unfused.
    plain = NVFP4Quantizer()(v.to(BF16)).gemm_operand("rowwise", values=False)
    assert plain.amax.item() == 1.0 and row.amax.item() != plain.amax.item()


@pytest.mark.parametrize("make", [
    lambda d: MXFP8Quantizer(DType.kFloat8E4M3),
    lambda d: Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
    lambda d: NVFP4Quantizer(with_rht=True, with_post_rht_amax=True),
], ids=["mxfp8", "fp8_block", "nvfp4_rht"])
def test_unfused_schemes_round_to_the_compute_dtype_then_quantize(make, device):
    v = _values(device)
    fused = make(device).quantize_unrounded(v, dtype=BF16)
    plain = make(device)(v.to(BF16))
    assert fused.dtype == BF16
    for usage in ("rowwise", "columnwise"):
        a, b = fused.gemm_operand(usage, values=False), plain.gemm_operand(usage, values=False)
        assert torch.equal(a.data, b.data) and torch.equal(a.scale_inv, b.scale_inv)


@pytest.mark.parametrize("make", [
    lambda d: _delayed(d), lambda d: Float8CurrentScalingQuantizer(DType.kFloat8E4M3, d),
    lambda d: MXFP8Quantizer(DType.kFloat8E4M3), lambda d: NVFP4Quantizer(),
], ids=["delayed", "current", "mxfp8", "nvfp4"])
def test_in_fp32_every_scheme_is_plain_quantization(make, device):
    v = _values(device)
    fused = make(device).quantize_unrounded(v, dtype=torch.float32)
    plain = make(device)(v)
    assert torch.equal(fused.dequantize(), plain.dequantize())


def test_the_dbias_rule_of_each_scheme():
    assert Float8Quantizer.dbias_from_unrounded and MXFP8Quantizer.dbias_from_unrounded
    assert not Float8CurrentScalingQuantizer.dbias_from_unrounded and not NVFP4Quantizer.dbias_from_unrounded
    assert not Float8BlockQuantizer.dbias_from_unrounded


class _QuantizingPrev(te.ops.BasicOperation):
    """Stands for a quantized BasicLinear before the Bias: offers ``quantizer`` as its grad-output quantizer."""

    def __init__(self, quantizer):
        super().__init__()
        self.quantizer = quantizer
        self.received = None

    def get_grad_output_quantizer(self):
        return self.quantizer

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer, next_op_input_quantizer):
        return input_

    def op_backward(self, ctx, grad_output):
        self.received = grad_output
        return grad_output.dequantize(), []


@pytest.fixture
def bias_activation_fusion_always():
    """The BackwardActivationBias rule applied without a recipe (its conditions only ask that one is active)."""
    from refops.ops.fused import backward_activation_bias
    from refops.ops.fuser import OperationFuser

    saved = list(OperationFuser.backward_fusion_functions)
    te.ops.register_backward_fusion(lambda ops, *, recipe: backward_activation_bias.RULE.fuse(ops, recipe=object()))
    yield
    OperationFuser.backward_fusion_functions[:] = saved


@pytest.mark.parametrize("scheme", ["delayed", "current"])
def test_backward_activation_bias_quantizes_unrounded_and_sums_dbias_by_the_scheme(
        scheme, device, bias_activation_fusion_always):
    torch.manual_seed(1)
    if scheme == "delayed":
        quantizer = Float8Quantizer(torch.tensor([4.0], device=device), torch.zeros(1, device=device),
                                    DType.kFloat8E5M2)
    else:
        quantizer = Float8CurrentScalingQuantizer(DType.kFloat8E5M2, device)
    prev = _QuantizingPrev(quantizer)
    model = te.ops.Sequential(prev, te.ops.Bias(128, device=device, dtype=BF16), te.ops.GELU())
    x = torch.randn(64, 128, device=device, dtype=BF16, requires_grad=True)
    dy = torch.randn(64, 128, device=device, dtype=BF16)
    model(x).backward(dy)
    fuser = model._module_groups[0]
    assert [type(op).__name__ for op, _ in fuser._backward_ops] == ["_QuantizingPrev", "BackwardActivationBias"]

    pre = (x.detach().float() + model[1].bias.detach().float()).to(BF16)  # what the GELU saw
    v = te.ops.GELU().backward_fp32(dy, pre)  # dy * gelu'(pre) in fp32, unrounded
    summed = v if scheme == "delayed" else v.to(BF16).float()
    assert torch.equal(model[1].bias.grad, summed.sum(0).to(BF16))
    received = prev.received.gemm_operand("rowwise", values=False)
    if scheme == "delayed":
        assert torch.equal(received.data, (v * 4.0).clamp(-57344, 57344).to(torch.float8_e5m2).view(torch.uint8))
        assert quantizer.amax.item() == v.abs().max().item()
    else:
        scale = (torch.tensor(57344.0, device=device) / v.abs().max()).float()
        assert torch.equal(received.scale_inv.reshape(()), scale.reciprocal())
        assert torch.equal(received.data, (v.to(BF16).float() * scale).to(torch.float8_e5m2).view(torch.uint8))
