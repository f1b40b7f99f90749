"""A full LayerNorm -> Linear -> GELU -> Linear MLP under every recipe (``docs/te-ops.md#who-quantizes-what``).

TE's method (``docs/te-ops.md#how-the-tests-check-an-op``, helpers in ``_quantized``): representable
inputs, weights and grads, a float64 reference, TE's loose ``test_layernorm_mlp`` tolerances; high-precision or
quantized weights, 2-D and 3-D inputs.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import refops as te
from refops.ops.basic.activation import GELU
from refops.ops.basic.layer_norm import LayerNorm
from refops.ops.sequential import Sequential
from refops.quantization import QuantizedTensor

from _quantized import (
    HIDDEN,
    RECIPES,
    ROWS,
    assert_close,
    gelu_reference,
    make_tensors,
    make_test_recipe,
    quantized_run,
    record_calls,
    relative_error,
    skip_unsupported,
    to64,
)


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("quantized_weight", (False, True), ids=("hp_weight", "q_weight"))
def test_layernorm_mlp(recipe_name, dtype, quantized_weight, device):
    """LayerNorm -> Linear -> GELU -> Linear vs float64 with TE's loose test_layernorm_mlp tolerances."""
    assert_layernorm_mlp_matches_float64(recipe_name, dtype, quantized_weight, device, (ROWS, HIDDEN))


def assert_layernorm_mlp_matches_float64(recipe_name, dtype, quantized_weight, device, in_shape):
    skip_unsupported(recipe_name, dtype)
    hidden, ffn = HIDDEN, 2 * HIDDEN
    with te.quantized_model_init(enabled=quantized_weight, recipe=make_test_recipe(recipe_name)):
        norm = LayerNorm(hidden, device=device, dtype=dtype)
        fc1, fc2 = te.ops.Linear(hidden, ffn, device=device, dtype=dtype), te.ops.Linear(ffn, hidden, device=device,
                                                                                       dtype=dtype)
    model = Sequential(norm, fc1, GELU(), fc2)
    with torch.no_grad():
        for p in (fc1.bias, fc2.bias, norm.bias):
            p.uniform_(-0.5, 0.5)
        for fc in (fc1, fc2):  # representable weights, as TE makes them (quantized ones already are)
            if not quantized_weight:
                bound = 1 / math.sqrt(fc.weight.shape[1])
                _, w = make_tensors(fc.weight.shape, recipe_name, dtype, device, role="weight", low=-bound, high=bound)
                fc.weight.copy_(w)
    x_ref, x = make_tensors(in_shape, recipe_name, dtype, device)  # TE's [0, 1) data
    dy_ref, dy = make_tensors(in_shape, recipe_name, dtype, device, role="grad_output", requires_grad=False)
    inputs: dict[str, list] = {"fc1": [], "fc2": []}
    record_calls(fc1.basic_ops[0], "op_forward", inputs["fc1"])
    record_calls(fc2.basic_ops[0], "op_forward", inputs["fc2"])
    y = quantized_run(model, x, dy, recipe_name)

    params = {name: to64(p).requires_grad_(True) for name, p in model.named_parameters()}
    h = F.layer_norm(x_ref, (hidden,), params["0.weight"], params["0.bias"], eps=norm.eps)
    h = gelu_reference(F.linear(h, params["1.weight"], params["1.bias"]))
    y_ref = F.linear(h, params["3.weight"], params["3.bias"])
    y_ref.backward(dy_ref)

    loose = dict(rtol=0.25, atol=0.5)
    assert isinstance(inputs["fc1"][0], QuantizedTensor)  # LayerNorm emitted it through fc1's input quantizer
    assert isinstance(inputs["fc2"][0], QuantizedTensor)  # GELU emitted it through fc2's input quantizer
    assert isinstance(fc1.weight, QuantizedTensor) == quantized_weight
    assert_close(y, y_ref, **loose)
    assert_close(x.grad, x_ref.grad, **loose)
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        if recipe_name.startswith("nvfp4"):
            # E2M1 noise in the quantized dgrad/wgrad operands, summed over 128 rows: a few elements
            # exceed even the loose tolerance, so NVFP4 param grads are held to a relative error.
            assert relative_error(p.grad, params[name].grad) < 0.25, name
        else:
            assert_close(p.grad, params[name].grad, **loose)


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_layernorm_mlp_3d_input(recipe_name, device):
    """TE's [seq, batch, hidden] input: the same MLP on (2, 64, 128)."""
    assert_layernorm_mlp_matches_float64(recipe_name, torch.bfloat16, False, device, (2, ROWS // 2, HIDDEN))
