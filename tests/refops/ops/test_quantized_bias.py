"""Bias with quantized compute under every recipe (``docs/te-ops.md#who-quantizes-what``).

TE's method (``docs/te-ops.md#how-the-tests-check-an-op``, helpers in ``_quantized``): representable
inputs and grads, float64 references; dx leaves through the previous op's grad-output quantizer (exact), also after
a BasicLinear and under every ``backward_override``.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.ops.basic.basic_linear import BasicLinear
from refops.ops.basic.bias import Bias
from refops.ops.basic.quantize import Quantize
from refops.ops.sequential import Sequential
from refops.quantization import QuantizedTensor
from refops.testing import dtype_tols

from _quantized import (
    HIDDEN,
    RECIPES,
    ROWS,
    assert_close,
    assert_exact,
    fresh_quantizer,
    make_tensors,
    make_test_recipe,
    quantized_run,
    record_calls,
    skip_unsupported,
    tols,
)


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_bias(recipe_name, dtype, device):
    """Quantized input accepted; dx = Q(dy) through the previous op's grad-output quantizer; db from dy."""
    skip_unsupported(recipe_name, dtype)
    x_ref, x = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, low=-1.0)
    b_ref, b = make_tensors((HIDDEN,), "fp8_current_scaling", dtype, device, low=-1.0)
    dy_ref, dy = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, role="grad_output", low=-1.0,
                              requires_grad=False)
    op = Bias(HIDDEN, device=device, dtype=dtype)
    with torch.no_grad():
        op.bias.copy_(b)
    y = quantized_run(Sequential(Quantize(forward=True, backward=True), op), x, dy, recipe_name)
    (x_ref + b_ref).backward(dy_ref)

    assert not isinstance(y, QuantizedTensor)
    assert_close(y, x_ref + b_ref, **dtype_tols(dtype))
    assert isinstance(x.grad, QuantizedTensor)  # Bias quantized it (Quantize passes it through)
    assert_exact(x.grad, fresh_quantizer(recipe_name, mode="backward")(dy))
    assert_close(op.bias.grad, b_ref.grad, **dtype_tols(dtype))

@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("override", (None, "high_precision", "dequantized"))
def test_bias_grad_input_quantized_after_basic_linear(recipe_name, override, device):
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    if override is not None and recipe_name == "fp8_delayed_scaling":
        pytest.skip("DelayedScaling only supports backward_override=None")
    recipe = make_test_recipe(recipe_name)
    recipe.backward_override = override
    linear, bias = BasicLinear(HIDDEN, HIDDEN, device=device, dtype=dtype), Bias(HIDDEN, device=device, dtype=dtype)
    _, x = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device)
    _, dy = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, role="grad_output", requires_grad=False)
    _, w = make_tensors((HIDDEN, HIDDEN), recipe_name, dtype, device, role="weight", low=-0.1, high=0.1)
    with torch.no_grad():
        linear.weight.copy_(w)
    seen: list = []
    record_calls(linear, "op_backward", seen)
    with te.autocast(recipe=recipe):
        y = Sequential(linear, bias)(x)
    y.backward(dy)
    assert isinstance(seen[0], QuantizedTensor) == (override is None)
    if override is None:
        assert_exact(seen[0], fresh_quantizer(recipe_name, mode="backward")(dy))
    assert_close(bias.bias.grad, dy.double().sum(0), **dtype_tols(dtype))
    assert_close(x.grad, dy.double() @ linear.weight.double(), **tols(recipe_name))

