"""The Quantize op under every recipe (``docs/te-ops.md#who-quantizes-what``): exact casts forward and backward.

TE's method (``docs/te-ops.md#how-the-tests-check-an-op``, helpers in ``_quantized``): representable
inputs and grads; a Quantize op's values are exact, and what it emits is the recipe's quantizer applied once.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.ops.basic.quantize import Quantize
from refops.ops.sequential import Sequential
from refops.quantization import QuantizedTensor
from refops.recipe import Float8CurrentScaling, Format

from _quantized import (
    HIDDEN,
    RECIPES,
    ROWS,
    assert_exact,
    fresh_quantizer,
    make_tensors,
    quantized_run,
    skip_unsupported,
)


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("cast_forward, cast_backward", [(True, False), (False, True), (True, True)])
def test_quantize(recipe_name, cast_forward, cast_backward, device):
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    x_ref, x = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device)
    dy_ref, dy = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, role="grad_output", requires_grad=False)
    op = Quantize(forward=cast_forward, backward=cast_backward)
    assert (op.num_quantizers("forward"), op.num_quantizers("backward")) == (int(cast_forward), int(cast_backward))
    y = quantized_run(Sequential(op), x, dy, recipe_name)

    assert isinstance(y, QuantizedTensor) == cast_forward
    assert isinstance(x.grad, QuantizedTensor) == cast_backward
    assert_exact(y, x_ref)  # TE: Quantize values are exact
    assert_exact(x.grad, dy_ref)
    if cast_forward:  # the recipe's quantizer applied once, nothing else
        assert type(y) is type(fresh_quantizer(recipe_name)(x.detach()))
        assert_exact(y, fresh_quantizer(recipe_name)(x.detach()))
    if cast_backward:
        assert_exact(x.grad, fresh_quantizer(recipe_name, mode="backward")(dy))


def test_quantize_is_the_identity_outside_autocast(device):
    x = torch.randn(ROWS, HIDDEN, device=device, requires_grad=True)
    op = Quantize(forward=True, backward=True)
    y = op(x)
    y.backward(2 * x.detach())
    assert not isinstance(y, QuantizedTensor) and torch.equal(y, x)
    assert not isinstance(x.grad, QuantizedTensor) and torch.equal(x.grad, 2 * x.detach())
    assert op.get_quantizer("forward", 0) is None


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_quantize_passes_quantized_tensors_through(recipe_name, device):
    skip_unsupported(recipe_name, torch.bfloat16)
    x_ref, x = make_tensors((ROWS, HIDDEN), recipe_name, torch.bfloat16, device)
    first, second = Quantize(forward=True, backward=True), Quantize(forward=True, backward=True)
    dy = torch.randn(ROWS, HIDDEN, device=device, dtype=torch.bfloat16)
    y = quantized_run(Sequential(first, second), x, dy, recipe_name)
    assert isinstance(y, QuantizedTensor) and y.quantizer is first.get_quantizer("forward", 0)
    assert isinstance(x.grad, QuantizedTensor) and x.grad.quantizer is second.get_quantizer("backward", 0)


def test_quantize_backward_respects_backward_override(device):
    recipe = Float8CurrentScaling(fp8_format=Format.E4M3, backward_override="high_precision")
    x = torch.rand(ROWS, HIDDEN, device=device, requires_grad=True)
    dy = torch.rand(ROWS, HIDDEN, device=device)
    with te.autocast(recipe=recipe):
        y = Quantize(forward=True, backward=True)(x)
    y.backward(dy)
    assert isinstance(y, QuantizedTensor)
    assert not isinstance(x.grad, QuantizedTensor) and torch.equal(x.grad, dy)
