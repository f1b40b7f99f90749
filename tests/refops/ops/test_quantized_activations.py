"""Activation ops with quantized compute under every recipe (``docs/te-ops.md#who-quantizes-what``).

TE's method (``docs/te-ops.md#how-the-tests-check-an-op``, helpers in ``_quantized``): representable
inputs and grads, float64 references, TE's quantization tolerances; each result leaves through its neighbour's
quantizer applied once (exact). Also the activations' ``cache_quantized_input``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import refops as te
import refops.quantization as rq
from refops.ops.basic.activation import GEGLU, GELU, GLU, QGEGLU, QGELU, ReGLU, ReLU, SiLU, SReGLU, SReLU
from refops.ops.basic.quantize import Quantize
from refops.ops.basic.swiglu import ClampedSwiGLU, SiTUGLU, SwiGLU
from refops.ops.sequential import Sequential
from refops.quantization import DType, QuantizedTensor
from refops.testing import make_recipe, quantization_tols

from _quantized import (
    HIDDEN,
    RECIPES,
    ROWS,
    assert_close,
    assert_exact,
    fresh_quantizer,
    gelu_reference,
    glu_reference,
    make_tensors,
    quantized_run,
    skip_unsupported,
    tols,
)


# ------------------------------------------------------------------ references (float64)
def _clamped(x, limit=0.75, alpha=1.702):
    a, b = x.chunk(2, dim=-1)
    a = a.clamp(max=limit)
    return a * torch.sigmoid(alpha * a) * (b.clamp(-limit, limit) + 1)


def _situ(x, beta1=4.0, beta2=25.0):
    a, b = x.chunk(2, dim=-1)
    return beta1 * torch.tanh(a / beta1) * torch.sigmoid(a) * beta2 * torch.tanh(b / beta2)


ACTIVATIONS = {  # name -> (op factory, float64 reference, gated)
    "gelu": (GELU, gelu_reference, False),
    "geglu": (GEGLU, glu_reference(gelu_reference), True),
    "glu": (GLU, glu_reference(torch.sigmoid), True),
    "qgelu": (QGELU, lambda x: x * torch.sigmoid(1.702 * x), False),
    "qgeglu": (QGEGLU, glu_reference(lambda a: a * torch.sigmoid(1.702 * a)), True),
    "relu": (ReLU, torch.relu, False),
    "reglu": (ReGLU, glu_reference(torch.relu), True),
    "srelu": (SReLU, lambda x: torch.relu(x) ** 2, False),
    "sreglu": (SReGLU, glu_reference(lambda a: torch.relu(a) ** 2), True),
    "silu": (SiLU, F.silu, False),
    "swiglu": (SwiGLU, glu_reference(F.silu), True),
    "clamped_swiglu": (lambda **kw: ClampedSwiGLU(limit=0.75, **kw), _clamped, True),
    "situglu": (SiTUGLU, _situ, True),
}


# ------------------------------------------------------------------ activations
@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_activation(activation, recipe_name, dtype, device):
    """Quantize(bwd) -> act -> Quantize(fwd), as TE's test_activation (the neighbours' quantizers fuse)."""
    skip_unsupported(recipe_name, dtype)
    factory, reference, gated = ACTIVATIONS[activation]
    in_shape, out_shape = (ROWS, 2 * HIDDEN if gated else HIDDEN), (ROWS, HIDDEN)
    x_ref, x = make_tensors(in_shape, recipe_name, dtype, device, low=-1.0)
    dy_ref, dy = make_tensors(out_shape, recipe_name, dtype, device, role="grad_output", low=-1.0,
                              requires_grad=False)
    op = factory()
    y = quantized_run(Sequential(Quantize(forward=False, backward=True), op, Quantize()), x, dy, recipe_name)
    y_ref = reference(x_ref)
    y_ref.backward(dy_ref)

    assert isinstance(y, QuantizedTensor) and isinstance(x.grad, QuantizedTensor)
    assert y.dtype == dtype and x.grad.dtype == dtype
    assert_close(y, y_ref, **tols(recipe_name))
    assert_close(x.grad, x_ref.grad, **tols(recipe_name))
    # Each leaves through its neighbour's quantizer as TE's fused kernel does: the activation (and dy * act'(x))
    # computed in fp32 from the compute-dtype inputs and quantized unrounded (docs/recipes/fused-activations.md).
    x32 = x.detach().float().requires_grad_(True)
    y32 = factory()(x32)
    y32.backward(dy.float())
    assert_exact(y, fresh_quantizer(recipe_name).quantize_unrounded(y32.detach(), dtype=dtype))
    assert_exact(x.grad, fresh_quantizer(recipe_name, mode="backward").quantize_unrounded(x32.grad, dtype=dtype))


@pytest.mark.parametrize("recipe_name", ("fp8_current_scaling", "mxfp8"))
@pytest.mark.parametrize("factory", (SwiGLU, lambda **kw: ClampedSwiGLU(limit=0.75, **kw), SiTUGLU),
                         ids=("swiglu", "clamped_swiglu", "situglu"))
def test_interleaved_glu_output_quantized_grad_input_not(recipe_name, factory, device):
    dtype = torch.bfloat16
    x_ref, x = make_tensors((ROWS, 2 * HIDDEN), recipe_name, dtype, device, low=-2.0, high=2.0)
    dy = torch.rand(ROWS, HIDDEN, device=device, dtype=dtype)
    op = factory(glu_interleave_size=32)
    y = quantized_run(Sequential(Quantize(forward=False, backward=True), op, Quantize()), x, dy, recipe_name)
    x_plain = x.detach().clone().requires_grad_(True)
    y_plain = factory(glu_interleave_size=32)(x_plain)
    y_plain.backward(dy)
    assert isinstance(y, QuantizedTensor)
    # Forward fuses (fp32 activation, quantized unrounded), as for every activation.
    y32 = factory(glu_interleave_size=32)(x.detach().float())
    assert_exact(y, fresh_quantizer(recipe_name).quantize_unrounded(y32, dtype=dtype))
    # Interleaved: no grad-input quantizer; Quantize(backward) then quantizes the plain dx once.
    assert_exact(x.grad, fresh_quantizer(recipe_name, mode="backward")(x_plain.grad))


@pytest.mark.parametrize("activation", ("gelu", "swiglu", "sreglu", "clamped_swiglu"))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("quantized_compute", (False, True), ids=("hp_compute", "qcompute"))
def test_cache_quantized_input(activation, dtype, quantized_compute, device):
    """x is saved as an E4M3 current-scaling row-wise copy: dx is the backward at those values."""
    factory, reference, gated = ACTIVATIONS[activation]
    x = torch.empty(ROWS, 2 * HIDDEN if gated else HIDDEN, device=device, dtype=dtype).uniform_(-1, 1)
    x.requires_grad_(True)
    dy = torch.empty(ROWS, HIDDEN, device=device, dtype=dtype).uniform_(-1, 1)
    op = factory(cache_quantized_input=True)
    with te.autocast(enabled=quantized_compute, recipe=make_recipe("fp8_current_scaling")):
        y = op(x)
    y.backward(dy)

    cache = rq.Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
    cache.set_usage(rowwise=True, columnwise=False)
    x_cached = cache(x.detach()).dequantize().requires_grad_(True)
    plain = factory()
    assert_exact(y, plain(x.detach()))  # the forward is unaffected
    plain(x_cached).backward(dy)
    assert_exact(x.grad, x_cached.grad)  # the backward sees exactly the FP8 copy
    x_ref = x.detach().double().requires_grad_(True)
    reference(x_ref).backward(dy.double())
    assert_close(x.grad, x_ref.grad, **quantization_tols("fp8_current_scaling"))
    assert not torch.equal(x_cached.detach(), x.detach())  # guard: the copy really is lossy
