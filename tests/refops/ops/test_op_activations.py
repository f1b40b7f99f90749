"""Activation ops (``docs/te-ops.md#activations``, TE's TestBasicOps activation tests) against float64 torch formulas.

Every reference is written in the tests, independently of the kernels: plain
``torch.nn.functional`` (or the formula) in float64 on CPU, differentiated by
autograd, from the same input values the op sees. The SwiGLU family and the scaled
variants are in ``test_op_swiglu.py`` and ``test_op_scaled_activations.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import refops
from refops.ops.basic.activation import GEGLU, GELU, GLU, QGEGLU, QGELU, SReGLU, SReLU, ReGLU, ReLU, SiLU
from refops.ops.basic.swiglu import ClampedSwiGLU, SiTUGLU, SwiGLU
from refops.testing.tolerances import dtype_tols

from _activation_references import DTYPES, assert_close, gated, halves, make_tensors, run_and_check


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def qgelu(x):
    return x * torch.sigmoid(1.702 * x)


def glu_torch_convention(x):
    a, b = halves(x)
    return F.glu(torch.cat([b, a], dim=-1))  # F.glu gates its second half


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


def _python_float_formulas() -> dict:
    """The table's fixed-constant formulas written with Python floats, as they read in TE's docs."""
    import math

    c, k, a = math.sqrt(2.0 / math.pi), 0.044715, 1.702

    def gelu_d(x):
        t = torch.tanh(c * (x + k * x * x * x))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (c * (1.0 + 3.0 * k * x * x))

    def silu_d(x):
        s = torch.sigmoid(x)
        return s + x * s * (1.0 - s)

    def qgelu_d(x):
        s = torch.sigmoid(a * x)
        return s + a * x * s * (1.0 - s)

    return {
        "gelu": (lambda x: 0.5 * x * (1.0 + torch.tanh(c * (x + k * x * x * x))), gelu_d),
        "qgelu": (lambda x: x * torch.sigmoid(a * x), qgelu_d),
        "srelu": (lambda x: torch.clamp_min(x, 0.0) * torch.clamp_min(x, 0.0), lambda x: 2.0 * torch.clamp_min(x, 0.0)),
        "silu": (lambda x: x * torch.sigmoid(x), silu_d),
        "sigmoid": (torch.sigmoid, lambda x: torch.sigmoid(x) * (1.0 - torch.sigmoid(x))),
    }


@pytest.mark.parametrize("activation", ["gelu", "qgelu", "srelu", "silu", "sigmoid"])
def test_fixed_constants_give_the_bits_of_python_floats(activation, device):
    """The table holds its constants as fp32 0-dim tensors (cheaper per call); the bits must not move."""
    from refops.kernels.reference.activations import UNARY

    torch.manual_seed(0)
    special = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, 3e38, -3e38, 1e-3, -1e-3]
    x = torch.cat([torch.randn(1 << 16) * 4, torch.randn(1 << 12) * 40, torch.tensor(special)]).to(device)
    ours, theirs = UNARY[activation], _python_float_formulas()[activation]
    for what, f, g in (("forward", ours[0], theirs[0]), ("derivative", ours[1], theirs[1])):
        mismatch = (f(x).view(torch.int32) != g(x).view(torch.int32)).nonzero()
        assert mismatch.numel() == 0, f"{activation} {what}: bits differ at x = {x[mismatch[:5, 0]].tolist()}"
