"""BitFit-style training (frozen weights, trainable biases) and every other mix of frozen parameters.

A backward that needs neither dgrad nor wgrad of an op must not quantize anything for that op: when the
first ``Linear``'s weight is frozen and the input has no grad, that linear runs no backward, and the
grad-input of the ``Bias``/activation after it must not go through its grad-output quantizer (which then
has neither usage). Before the fix, ``Sequential(GELU, Linear, GELU, Linear, GELU)`` with frozen weights
raised "neither row-wise nor column-wise usage is enabled" in backward under every recipe.

Checked for every mix of frozen weights, frozen biases and an input with or without grad, under every
recipe: forward and backward run, frozen parameters get no gradient, and every gradient that is computed
is bit-equal to the one the same model computes with everything trainable (freezing a parameter drops
work, it never changes the numbers of what remains).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import refops as te
from refops.recipe import NVFP4BlockScaling
from refops.testing import make_recipe

RECIPES = ("none", "fp8_delayed_scaling", "fp8_current_scaling", "mxfp8", "fp8_block_scaling", "nvfp4",
           "nvfp4_rht_sr")
MIXES = list(itertools.product((True, False), repeat=3))  # (weights frozen, biases frozen, input requires grad)
FEATURES, ROWS = 64, 64


def _recipe(name: str):
    if name == "none":
        return None
    if name == "nvfp4_rht_sr":  # the default NVFP4 recipe: RHT and stochastic rounding in backward
        return NVFP4BlockScaling()
    return make_recipe(name)


def _dtype(name: str) -> torch.dtype:
    return torch.bfloat16 if name.startswith("nvfp4") else torch.float32


def gelu_linear_stack(dtype: torch.dtype) -> te.ops.Sequential:
    """The reported model: activations on both sides of every Linear."""
    return te.ops.Sequential(te.ops.GELU(), te.ops.Linear(FEATURES, FEATURES, dtype=dtype), te.ops.GELU(),
                             te.ops.Linear(FEATURES, FEATURES, dtype=dtype), te.ops.GELU())


def norm_linear_stack(dtype: torch.dtype) -> te.ops.Sequential:
    """A norm first (its own weight and bias), then Linear-ReLU-Linear."""
    return te.ops.Sequential(te.ops.LayerNorm(FEATURES, dtype=dtype), te.ops.Linear(FEATURES, FEATURES, dtype=dtype),
                             te.ops.ReLU(), te.ops.Linear(FEATURES, FEATURES, dtype=dtype))


MODELS = {"gelu_linear_stack": gelu_linear_stack, "norm_linear_stack": norm_linear_stack}


def _run(model_name, recipe_name, weights_frozen, biases_frozen, input_grad, seed=0):
    """One step; returns (output, input grad, {parameter name: grad})."""
    dtype = _dtype(recipe_name)
    torch.manual_seed(seed)
    model = MODELS[model_name](dtype)
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        param.requires_grad_(not (weights_frozen if leaf == "weight" else biases_frozen))
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(ROWS, FEATURES, generator=generator).to(dtype).requires_grad_(input_grad)
    dy = torch.randn(ROWS, FEATURES, generator=generator).to(dtype)
    torch.manual_seed(seed + 2)  # stochastic rounding draws from here
    recipe = _recipe(recipe_name)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = model(x)
    if y.requires_grad:
        y.backward(dy)
    return y.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("recipe_name", RECIPES)
def test_every_mix_of_frozen_parameters_trains_and_keeps_the_numbers(model_name, recipe_name):
    y_all, dx_all, grads_all = _run(model_name, recipe_name, False, False, True)
    exact = recipe_name != "nvfp4_rht_sr"  # stochastic rounding: frozen weights draw fewer random bytes
    for weights_frozen, biases_frozen, input_grad in MIXES:
        case = f"weights frozen={weights_frozen}, biases frozen={biases_frozen}, input grad={input_grad}"
        y, dx, grads = _run(model_name, recipe_name, weights_frozen, biases_frozen, input_grad)
        assert torch.equal(y, y_all), case
        assert (dx is not None) == input_grad, case
        for name, grad in grads.items():
            frozen = weights_frozen if name.endswith("weight") else biases_frozen
            assert (grad is None) == frozen, f"{case}: {name}"
            if grad is None:
                continue
            assert torch.isfinite(grad.float()).all(), f"{case}: {name}"
            if exact:
                assert torch.equal(grad, grads_all[name]), f"{case}: {name}"
        if input_grad and exact:
            assert torch.equal(dx, dx_all), case


@pytest.mark.parametrize("recipe_name", RECIPES[1:])
def test_the_reported_bitfit_case_runs_backward(recipe_name):
    """Weights frozen, biases trainable, input without grad: the biases get their gradients."""
    _, dx, grads = _run("gelu_linear_stack", recipe_name, True, False, False)
    assert dx is None
    assert {n for n, g in grads.items() if g is not None} == {"1.bias", "3.bias"}
