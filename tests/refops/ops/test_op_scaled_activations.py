"""Scaled activations (ScaledSwiGLU, ScaledSiTUGLU, ScaledClampedQGeGLU, ScaledSReLU): ``scales[..., None] * act(x)``.

Forward and backward (dx and dscales) against float64 formulas on CPU, plain and interleaved, and the
ops' validation of scales, shapes and the fused grouped MLP options.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn.functional as F

import refops
from refops.ops.basic.activation import ReLU
from refops.ops.basic.scaled_activation import ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU, ScaledSwiGLU
from refops.ops.basic.swiglu import ClampedSwiGLU
from refops.testing.tolerances import dtype_tols, gemm_tols

from _activation_references import DTYPES, assert_close, clamped_swiglu_ref, gated, make_tensors, situglu_ref


def scaled_reference(act: Callable) -> Callable:
    return lambda x, scales: scales.unsqueeze(-1) * act(x)


SCALED = {
    "swiglu": (lambda s: ScaledSwiGLU(s), lambda s: lambda x: gated(F.silu)(x, s)),
    "situglu": (
        lambda s: ScaledSiTUGLU(s, beta1=0.5, beta2=2.0),
        lambda s: lambda x: situglu_ref(x, 0.5, 2.0, s),
    ),
    "clamped_qgeglu": (
        lambda s: ScaledClampedQGeGLU(s, limit=0.75),
        lambda s: lambda x: clamped_swiglu_ref(x, 0.75, 1.702, 1.0, s),
    ),
    "clamped_qgeglu_no_offset": (
        lambda s: ScaledClampedQGeGLU(s, glu_linear_offset=0.0, limit=7.0),
        lambda s: lambda x: clamped_swiglu_ref(x, 7.0, 1.702, 0.0, s),
    ),
}


def assert_scaled_op_matches_reference(op, act_ref, in_shape, out_width, dtype, device, *, input_requires_grad=True,
               scales_requires_grad=True, scales_dtype=None):
    scales_dtype = scales_dtype or dtype
    rows = tuple(in_shape[:-1])
    x_ref, x_test = make_tensors(in_shape, dtype, device, requires_grad=input_requires_grad)
    s_ref, s_test = make_tensors(rows, scales_dtype, device, low=0.0, high=1.0, requires_grad=scales_requires_grad)
    dy_ref, dy_test = make_tensors((*rows, out_width), dtype, device, low=-1.0, high=1.0, requires_grad=False)

    y_ref = scaled_reference(act_ref)(x_ref, s_ref)
    y_test = op(x_test, s_test)
    assert y_test.dtype == dtype and tuple(y_test.shape) == (*rows, out_width)
    assert_close(y_test, y_ref, **dtype_tols(dtype))
    if not (input_requires_grad or scales_requires_grad):
        assert not y_test.requires_grad
        return
    y_ref.backward(dy_ref)
    y_test.backward(dy_test)
    if input_requires_grad:
        assert x_test.grad.dtype == dtype
        assert_close(x_test.grad, x_ref.grad, **dtype_tols(dtype))
    else:
        assert x_test.grad is None
    if scales_requires_grad:
        assert s_test.grad.dtype == scales_dtype
        # dscales is a dot product over the last dim (TE: vecdot), so it gets GEMM tolerances:
        # fp32 summation error exceeds fp32's element-wise rtol once terms cancel.
        assert_close(s_test.grad, s_ref.grad, **gemm_tols(scales_dtype))
    else:
        assert s_test.grad is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_shape", ((16, 64), (2, 7, 32)))
@pytest.mark.parametrize("input_requires_grad", (False, True))
@pytest.mark.parametrize("scales_requires_grad", (False, True))
def test_scaled_swiglu(dtype, in_shape, input_requires_grad, scales_requires_grad, device):
    make_op, make_ref = SCALED["swiglu"]
    assert_scaled_op_matches_reference(make_op(None), make_ref(None), in_shape, in_shape[-1] // 2, dtype, device,
               input_requires_grad=input_requires_grad, scales_requires_grad=scales_requires_grad)


@pytest.mark.parametrize("variant", sorted(SCALED))
@pytest.mark.parametrize("dtype", DTYPES)
def test_interleaved_scaled_glu(variant, dtype, device):
    make_op, make_ref = SCALED[variant]
    assert_scaled_op_matches_reference(make_op(8), make_ref(8), (24, 64), 32, dtype, device)


def test_interleaved_scaled_swiglu(device):
    assert_scaled_op_matches_reference(ScaledSwiGLU(32), lambda x: gated(F.silu)(x, 32), (32, 384), 192, torch.float32, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", (None, 32))
def test_scaled_situglu(dtype, interleave, device):
    make_op, make_ref = SCALED["situglu"]
    assert_scaled_op_matches_reference(make_op(interleave), make_ref(interleave), (16, 128), 64, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("glu_linear_offset", (1.0, 0.0))
@pytest.mark.parametrize("interleave", (None, 32))
def test_scaled_clamped_qgeglu(dtype, glu_linear_offset, interleave, device):
    op = ScaledClampedQGeGLU(interleave, limit=7.0, alpha=1.702, glu_linear_offset=glu_linear_offset)
    assert isinstance(op._clamped, ClampedSwiGLU)
    assert (op._clamped.limit, op._clamped.alpha, op._clamped.glu_linear_offset) == (7.0, 1.702, glu_linear_offset)
    reference = lambda x: clamped_swiglu_ref(x, 7.0, 1.702, glu_linear_offset, interleave)  # noqa: E731
    # Inputs up to +-9 exercise both clamps at limit 7.
    x_shape = (16, 128)
    x_ref, x_test = make_tensors(x_shape, dtype, device, low=-9.0, high=9.0)
    s_ref, s_test = make_tensors((16,), dtype, device, low=0.0, high=1.0)
    dy_ref, dy_test = make_tensors((16, 64), dtype, device, low=-1.0, high=1.0, requires_grad=False)
    y_ref = s_ref.unsqueeze(-1) * reference(x_ref)
    y_ref.backward(dy_ref)
    y_test = op(x_test, s_test)
    y_test.backward(dy_test)
    tols = dtype_tols(dtype)
    assert_close(y_test, y_ref, **tols)
    assert_close(x_test.grad, x_ref.grad, **tols)
    assert_close(s_test.grad, s_ref.grad, **gemm_tols(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("input_requires_grad", (False, True))
@pytest.mark.parametrize("scales_requires_grad", (False, True))
def test_scaled_srelu(dtype, input_requires_grad, scales_requires_grad, device):
    assert_scaled_op_matches_reference(ScaledSReLU(), lambda x: F.relu(x) ** 2, (4, 6, 24), 24, dtype, device,
               input_requires_grad=input_requires_grad, scales_requires_grad=scales_requires_grad)


def test_scaled_fp32_scales_with_bf16_input(device):
    assert_scaled_op_matches_reference(ScaledSwiGLU(), gated(F.silu), (16, 64), 32, torch.bfloat16, device, scales_dtype=torch.float32)


def test_scaled_in_sequential_and_no_grad(device):
    x_ref, x_test = make_tensors((8, 32), torch.float32, device)
    s_ref, s_test = make_tensors((8,), torch.float32, device, low=0.0, high=1.0)
    model = refops.ops.Sequential(ScaledSwiGLU(), ReLU())
    y = model(x_test, s_test)
    y_ref = F.relu(s_ref.unsqueeze(-1) * gated(F.silu)(x_ref))
    y.sum().backward()
    y_ref.sum().backward()
    tols = dtype_tols(torch.float32)
    assert_close(y, y_ref, **tols)
    assert_close(x_test.grad, x_ref.grad, **tols)
    assert_close(s_test.grad, s_ref.grad, **gemm_tols(torch.float32))
    with torch.no_grad():
        assert_close(model(x_test, s_test), y_ref, **tols)


@pytest.mark.parametrize("op_class", (ScaledSwiGLU, ScaledSiTUGLU, ScaledClampedQGeGLU))
def test_scaled_glu_rejects_activation_recompute_in_mlp(op_class):
    with pytest.raises(ValueError, match="does not support activation recomputation in the fused grouped MLP"):
        op_class(activation_recompute_in_mlp=True)
    assert op_class(activation_recompute_in_mlp=False).activation_recompute_in_mlp is False


def test_scaled_srelu_activation_recompute_in_mlp_config(device):
    assert ScaledSReLU().activation_recompute_in_mlp is False
    op = ScaledSReLU(activation_recompute_in_mlp=True)
    assert op.activation_recompute_in_mlp is True
    with pytest.raises(RuntimeError, match="requires the fused grouped MLP path"):
        op(torch.rand(4, 8, device=device), torch.rand(4, device=device))


@pytest.mark.parametrize("op_class", (ScaledSwiGLU, ScaledSReLU))
def test_scaled_rejects_bad_scales(op_class, device):
    x = torch.rand(4, 8, device=device)
    with pytest.raises(ValueError, match=r"scales with shape input.shape\[:-1\] = \(4,\)"):
        op_class()(x, torch.rand(4, 1, device=device))
    with pytest.raises(TypeError, match="scales has dtype torch.float64"):
        op_class()(x, torch.rand(4, device=device, dtype=torch.float64))
    with pytest.raises(TypeError, match=f"{op_class.__name__}.*float64"):
        op_class()(x.double(), torch.rand(4, device=device))
    with pytest.raises(RuntimeError, match="fuser_forward"):
        op_class().op_forward(None, x, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None)


def test_scaled_glu_shape_errors(device):
    with pytest.raises(ValueError, match="ScaledSwiGLU.*divisible by 2"):
        ScaledSwiGLU()(torch.rand(4, 7, device=device), torch.rand(4, device=device))
    with pytest.raises(ValueError, match="ScaledSiTUGLU.*divisible by 16"):
        ScaledSiTUGLU(8)(torch.rand(4, 24, device=device), torch.rand(4, device=device))
    with pytest.raises(ValueError, match="glu_interleave_size"):
        ScaledClampedQGeGLU(0)
