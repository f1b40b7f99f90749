"""Activation ops (TE §4.5 / TestBasicOps activation tests) against float64 torch formulas.

Every reference is written here, independently of the kernels: plain
``torch.nn.functional`` (or the formula) in float64 on CPU, differentiated by
autograd, from the same input values the op sees.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F

import refops
from refops.ops.basic.activation import GEGLU, GELU, GLU, QGEGLU, QGELU, SReGLU, SReLU, ReGLU, ReLU, SiLU
from refops.ops.basic.scaled_activation import ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU, ScaledSwiGLU
from refops.ops.basic.swiglu import ClampedSwiGLU, SiTUGLU, SwiGLU
from refops.testing.tolerances import dtype_tols, gemm_tols

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------ helpers
def make_tensors(shape, dtype, device, *, low=-3.0, high=3.0, requires_grad=True):
    """``(ref, test)``: the same values, float64 on CPU and ``dtype`` on ``device``."""
    ref = torch.empty(shape, dtype=torch.float64, device="cpu").uniform_(low, high)
    test = ref.to(device=device, dtype=dtype)
    ref = test.detach().to(device="cpu", dtype=torch.float64)
    return ref.requires_grad_(requires_grad), test.requires_grad_(requires_grad)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, **tols) -> None:
    torch.testing.assert_close(actual.detach().to(device="cpu", dtype=torch.float64), expected.detach(), **tols)


def halves(x: torch.Tensor, interleave: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate half ``a`` and linear half ``b``; with ``interleave = s`` the last dim is ``[a(s), b(s), ...]``."""
    width = x.shape[-1]
    if interleave is None:
        a_index = list(range(width // 2))
        b_index = [i + width // 2 for i in a_index]
    else:
        a_index = [blk + j for blk in range(0, width, 2 * interleave) for j in range(interleave)]
        b_index = [i + interleave for i in a_index]
    return x[..., a_index], x[..., b_index]


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def qgelu(x):
    return x * torch.sigmoid(1.702 * x)


def glu_torch_convention(x):
    a, b = halves(x)
    return F.glu(torch.cat([b, a], dim=-1))  # F.glu gates its second half


def situglu_ref(x, beta1, beta2, interleave=None):
    a, b = halves(x, interleave)
    return beta1 * torch.tanh(a / beta1) * torch.sigmoid(a) * (beta2 * torch.tanh(b / beta2))


def clamped_swiglu_ref(x, limit, alpha, offset, interleave=None):
    a, b = halves(x, interleave)
    a = a.clamp(max=limit)
    b = b.clamp(min=-limit, max=limit)
    return a * torch.sigmoid(alpha * a) * (b + offset)


def gated(gate: Callable) -> Callable:
    def ref(x, interleave=None):
        a, b = halves(x, interleave)
        return gate(a) * b

    return ref


# name -> (op class, float64 reference, gated)
ACTIVATIONS = {
    "gelu": (GELU, gelu_tanh, False),
    "geglu": (GEGLU, gated(gelu_tanh), True),
    "glu": (GLU, glu_torch_convention, True),
    "qgelu": (QGELU, qgelu, False),
    "qgeglu": (QGEGLU, gated(qgelu), True),
    "relu": (ReLU, F.relu, False),
    "reglu": (ReGLU, gated(F.relu), True),
    "srelu": (SReLU, lambda x: F.relu(x) ** 2, False),
    "sreglu": (SReGLU, gated(lambda a: F.relu(a) ** 2), True),
    "silu": (SiLU, F.silu, False),
    "swiglu": (SwiGLU, gated(F.silu), True),
}


def run_and_check(op, reference, in_shape, out_shape, dtype, device, tols=None):
    """Forward and backward of ``op`` vs ``reference`` (a float64 function of x)."""
    tols = tols or dtype_tols(dtype)
    x_ref, x_test = make_tensors(in_shape, dtype, device)
    dy_ref, dy_test = make_tensors(out_shape, dtype, device, low=-1.0, high=1.0, requires_grad=False)
    y_ref = reference(x_ref)
    y_ref.backward(dy_ref)
    y_test = op(x_test)
    y_test.backward(dy_test)
    assert y_test.dtype == dtype and x_test.grad.dtype == dtype
    assert tuple(y_test.shape) == tuple(out_shape)
    assert_close(y_test, y_ref, **tols)
    assert_close(x_test.grad, x_ref.grad, **tols)
    return y_test, x_test


# --------------------------------------------------------- test_activation
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("out_shape", ((37,), (2, 13), (32, 1, 32)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation(activation, out_shape, dtype, device):
    op_class, reference, is_gated = ACTIVATIONS[activation]
    in_shape = list(out_shape)
    if is_gated:
        in_shape[-1] *= 2
    run_and_check(op_class(), reference, in_shape, out_shape, dtype, device)


@pytest.mark.parametrize("activation", ("gelu", "swiglu", "sreglu"))
def test_cache_quantized_input_saves_an_fp8_copy_for_backward(activation, device):
    """The forward is unchanged; the backward sees x through an E4M3 current-scaling copy (TE's FP8 tolerance)."""
    op_class, _, is_gated = ACTIVATIONS[activation]
    op = op_class(cache_quantized_input=True)
    assert op.cache_quantized_input is True
    x = torch.randn(4, 16, device=device, requires_grad=True)
    dy = torch.randn(4, 8 if is_gated else 16, device=device)
    y_cached = op(x)
    y_cached.backward(dy)
    dx_cached = x.grad.clone()
    x.grad = None
    y_plain = op_class()(x)
    y_plain.backward(dy)
    torch.testing.assert_close(y_cached, y_plain, rtol=0, atol=0)
    assert not torch.equal(dx_cached, x.grad), "the backward must use the quantized copy"
    torch.testing.assert_close(dx_cached, x.grad, **dtype_tols(torch.float8_e4m3fn))


def test_activation_in_sequential_and_no_grad(device):
    x_ref, x_test = make_tensors((6, 20), torch.float32, device)
    model = refops.ops.Sequential(GEGLU(), SiLU())
    y = model(x_test)
    y.sum().backward()
    y_ref = F.silu(gated(gelu_tanh)(x_ref))
    y_ref.sum().backward()
    assert_close(y, y_ref, **dtype_tols(torch.float32))
    assert_close(x_test.grad, x_ref.grad, **dtype_tols(torch.float32))
    with torch.no_grad():
        assert_close(model(x_test), y_ref, **dtype_tols(torch.float32))


def test_activation_under_autocast(device):
    x = torch.rand(8, 32, device=device, dtype=torch.float32, requires_grad=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        y = SwiGLU()(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32
    x_ref = x.detach().to(torch.bfloat16).double().cpu().requires_grad_()
    y_ref = gated(F.silu)(x_ref)
    y_ref.sum().backward()
    assert_close(y, y_ref, **dtype_tols(torch.bfloat16))
    assert_close(x.grad, x_ref.grad, **dtype_tols(torch.bfloat16))


@pytest.mark.parametrize("op_class", (GEGLU, GLU, QGEGLU, ReGLU, SReGLU, SwiGLU, SiTUGLU, ClampedSwiGLU))
def test_gated_activation_rejects_odd_last_dim(op_class, device):
    with pytest.raises(ValueError, match=rf"{op_class.__name__}.*even|{op_class.__name__}.*divisible by 2"):
        op_class()(torch.rand(4, 7, device=device))


def test_activation_rejects_unsupported_dtype_and_kwargs(device):
    with pytest.raises(TypeError, match="GELU.*float64"):
        GELU()(torch.rand(4, 8, device=device, dtype=torch.float64))
    with pytest.raises(TypeError, match="ReLU.*unexpected forward kwargs"):
        ReLU()(torch.rand(4, 8, device=device), foo=1)


# ------------------------------------------------------------ SwiGLU family
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", (None, 4))
def test_swiglu(dtype, interleave, device):
    op = SwiGLU(glu_interleave_size=interleave)
    run_and_check(op, lambda x: gated(F.silu)(x, interleave), (3, 5, 48), (3, 5, 24), dtype, device)


def test_interleaved_swiglu(device):
    op = SwiGLU(glu_interleave_size=32)
    run_and_check(op, lambda x: gated(F.silu)(x, 32), (32, 384), (32, 192), torch.float32, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", (None, 32))
@pytest.mark.parametrize("betas", ((4.0, 25.0), (0.5, 2.0)))
def test_situglu(dtype, interleave, betas, device):
    beta1, beta2 = betas
    op = SiTUGLU(beta1=beta1, beta2=beta2, glu_interleave_size=interleave)
    reference = lambda x: situglu_ref(x, beta1, beta2, interleave)  # noqa: E731
    run_and_check(op, reference, (16, 128), (16, 64), dtype, device)


@pytest.mark.parametrize("op_class", (SiTUGLU, ScaledSiTUGLU))
@pytest.mark.parametrize(
    "betas, bad", (((0.0, 25.0), "beta1"), ((4.0, math.inf), "beta2"), ((-1.0, 25.0), "beta1"),
                   ((4.0, math.nan), "beta2"))
)
def test_situglu_invalid_beta(op_class, betas, bad):
    with pytest.raises(ValueError, match=bad):
        op_class(beta1=betas[0], beta2=betas[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("glu_linear_offset", (1.0, 0.0))
def test_clamped_swiglu(dtype, glu_linear_offset, device):
    limit, alpha = 0.75, 1.702
    op = ClampedSwiGLU(limit=limit, alpha=alpha, glu_linear_offset=glu_linear_offset)
    reference = lambda x: clamped_swiglu_ref(x, limit, alpha, glu_linear_offset)  # noqa: E731
    run_and_check(op, reference, (32, 64), (32, 32), dtype, device)


def test_interleaved_clamped_swiglu(device):
    op = ClampedSwiGLU(limit=0.75, glu_interleave_size=32)
    reference = lambda x: clamped_swiglu_ref(x, 0.75, 1.702, 1.0, 32)  # noqa: E731
    run_and_check(op, reference, (32, 384), (32, 192), torch.float32, device)


def test_clamped_swiglu_defaults():
    op = ClampedSwiGLU()
    assert (op.limit, op.alpha, op.glu_linear_offset, op.glu_interleave_size) == (7.0, 1.702, 1.0, None)
    assert (SiTUGLU().beta1, SiTUGLU().beta2) == (4.0, 25.0)


@pytest.mark.parametrize("op_class", (SwiGLU, SiTUGLU, ClampedSwiGLU))
def test_interleave_errors(op_class, device):
    with pytest.raises(ValueError, match=r"divisible by 8"):
        op_class(glu_interleave_size=4)(torch.rand(2, 12, device=device))
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="glu_interleave_size"):
            op_class(glu_interleave_size=bad)


# ---------------------------------------------------------- scaled variants
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
