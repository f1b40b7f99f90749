"""Errors name the op and the tensor, and leave the model usable.

Block sizes (MXFP8 32, NVFP4 16), NVFP4's bf16-only Hadamard transform, a
truncated quantized weight in a checkpoint, non-integer constructor sizes: each
is refused with a message that says which op, which tensor and what was
expected; afterwards the same model still runs (and equals an untouched copy).
"""

from __future__ import annotations

import copy

import pytest
import torch

import refops as te
from refops.recipe import DelayedScaling, MXFP8BlockScaling, NVFP4BlockScaling


# ------------------------------------------------------------------ sizes
@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: te.ops.Linear(8.5, 4), r"Linear: in_features must be a positive int, got 8\.5 \(float\)"),
        (lambda: te.ops.Linear(True, 4), r"Linear: in_features must be a positive int, got True \(bool\)"),
        (lambda: te.ops.BasicLinear(8, 4.0), r"BasicLinear: out_features must be a positive int, got 4\.0"),
        (lambda: te.ops.Bias(2.5), r"Bias: size must be a positive int, got 2\.5"),
        (lambda: te.ops.RMSNorm(2.5), r"RMSNorm: normalized_shape must be a positive int or a tuple"),
        (lambda: te.ops.LayerNorm((4, 1.5)), r"LayerNorm: normalized_shape\[1\] must be a positive int, got 1\.5"),
        (lambda: te.ops.GroupedLinear(2, 8.5, 4), r"GroupedLinear: in_features must be a positive int"),
        (lambda: te.ops.GroupedLinear("2", 8, 4), r"GroupedLinear: num_groups must be a positive int, got '2'"),
    ],
)
def test_non_integer_sizes_name_the_op_and_the_argument(build, match):
    with pytest.raises(TypeError, match=match):
        build()


def test_integer_like_sizes_are_accepted_as_int():
    import numpy as np

    op = te.ops.Linear(np.int64(8), np.int32(4))
    assert (op.in_features, op.out_features) == (8, 4) and type(op.in_features) is int
    assert op(torch.randn(2, 8)).shape == (2, 4)


# ------------------------------------------------------------ block sizes
def _assert_usable(model, twin, x, recipe):
    """The model that saw the error computes exactly as an untouched copy (forward and backward)."""
    results = []
    for m in (model, twin):
        xi = x.clone().requires_grad_()
        with te.autocast(recipe=recipe):
            y = m(xi)
        y.float().square().sum().backward()
        results.append((y.detach(), xi.grad, [p.grad for p in m.parameters()]))
    (y_a, dx_a, g_a), (y_b, dx_b, g_b) = results
    assert torch.equal(y_a, y_b) and torch.equal(dx_a, dx_b)
    assert all(torch.equal(a, b) for a, b in zip(g_a, g_b))


def test_mxfp8_block_size_error_names_the_op_and_the_input(device):
    model = te.ops.Sequential(te.ops.Linear(64, 64, device=device))
    twin = copy.deepcopy(model)
    with pytest.raises(ValueError, match=r"BasicLinear \(forward quantizer 0: input\): MXFP8 quantization needs .*"
                                         r"multiples of 32; got shape \(33, 64\)"):
        with te.autocast(recipe=MXFP8BlockScaling()):
            model(torch.randn(33, 64, device=device))
    _assert_usable(model, twin, torch.randn(32, 64, device=device), MXFP8BlockScaling())


def test_mxfp8_block_size_error_names_the_weight(device):
    model = te.ops.Sequential(te.ops.Linear(40, 64, device=device))
    with pytest.raises(ValueError, match=r"BasicLinear \(forward quantizer 1: weight\): MXFP8 .*got shape \(64, 40\)"):
        with te.autocast(recipe=MXFP8BlockScaling()):
            model(torch.randn(32, 40, device=device))
    x = torch.randn(32, 40, device=device)
    assert torch.equal(model(x), copy.deepcopy(model)(x))  # still runs in high precision
    with pytest.raises(ValueError, match=r"BasicLinear \(forward quantizer 1: weight\): MXFP8"):
        with te.quantized_model_init(recipe=MXFP8BlockScaling()):
            te.ops.Linear(40, 64, device=device)


def _nvfp4():
    return NVFP4BlockScaling(disable_stochastic_rounding=True)


def test_nvfp4_block_size_error_names_the_op_and_the_tensor(device):
    model = te.ops.Sequential(te.ops.Linear(64, 64, device=device, dtype=torch.bfloat16))
    twin = copy.deepcopy(model)
    with pytest.raises(ValueError, match=r"BasicLinear \(forward quantizer 0: input\): NVFP4 quantization needs .*"
                                         r"multiples of 16; got shape \(24, 64\)"):
        with te.autocast(recipe=_nvfp4()):
            model(torch.randn(24, 64, device=device, dtype=torch.bfloat16))
    _assert_usable(model, twin, torch.randn(32, 64, device=device, dtype=torch.bfloat16), _nvfp4())


def test_nvfp4_dtype_error_names_the_op_and_the_tensor(device):
    model = te.ops.Sequential(te.ops.Linear(64, 64, device=device, dtype=torch.float16))
    twin = copy.deepcopy(model)
    with pytest.raises(ValueError, match=r"BasicLinear \(forward quantizer 0: input\): .*Hadamard transform needs "
                                         r"bfloat16 input, got torch.float16"):
        with te.autocast(recipe=_nvfp4()):
            model(torch.randn(32, 64, device=device, dtype=torch.float16))
    _assert_usable(model, twin, torch.randn(32, 64, device=device, dtype=torch.float16), MXFP8BlockScaling())


# ----------------------------------------------------------- checkpoints
@pytest.mark.parametrize("cut", [1, 40, 400])
def test_truncated_quantized_weight_in_a_state_dict_names_the_op_and_loads_nothing(cut, device):
    def build():
        with te.quantized_model_init(recipe=DelayedScaling()):
            return te.ops.Sequential(te.ops.Linear(32, 32, device=device))

    torch.manual_seed(0)
    source, target = build(), build()
    state = source.state_dict()
    good = dict(state)
    state["0.basic_ops.0.weight"] = state["0.basic_ops.0.weight"][:-cut]
    before = target[0].weight.dequantize().clone()
    bias_before = target[0].bias.detach().clone()
    with pytest.raises(RuntimeError, match=r"BasicLinear \(0\.basic_ops\.0\.\): parameter 'weight': .*truncated or "
                                           r"corrupt.*nothing of this op was loaded"):
        target.load_state_dict(state)
    assert torch.equal(target[0].weight.dequantize(), before) and torch.equal(target[0].bias, bias_before)
    target.load_state_dict(good)  # still usable: a good checkpoint loads
    x = torch.randn(4, 32, device=device)
    assert torch.equal(target(x), source(x))
