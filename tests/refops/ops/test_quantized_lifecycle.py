"""The seed's own case: ops built on meta inside quantized_model_init, for every recipe.

The deferred-init matrix of the core lifecycle tests, repeated with quantized
weights and quantized compute on and off: materialization gives QuantizedTensor
parameters (same objects), aliases and the fuser cache follow, grads land on the
device, and everything equals eager construction bit for bit.
"""

from __future__ import annotations

import io

import pytest
import torch

import refops as te
from refops.ops.quantized_weights import NO_QUANTIZER_MESSAGE
from refops.testing import RECIPE_NAMES, make_recipe

from _cases import aliases_in_sync

SHAPE = 128  # a multiple of every block size


def _build(device, recipe_name, quantized_weight, dtype=torch.bfloat16):
    with te.quantized_model_init(enabled=quantized_weight, recipe=make_recipe(recipe_name)):
        return te.ops.Sequential(
            te.ops.LayerNorm(SHAPE, device=device, dtype=dtype),
            te.ops.Linear(SHAPE, SHAPE, device=device, dtype=dtype),
            te.ops.GELU(),
            te.ops.Linear(SHAPE, SHAPE, device=device, dtype=dtype),
        )


def _step(model, x, recipe_name, quantized_compute):
    x = x.clone().requires_grad_(True)
    with te.autocast(enabled=quantized_compute, recipe=make_recipe(recipe_name) if quantized_compute else None):
        y = model(x)
    y.backward(torch.linspace(-1, 1, y.numel(), device=y.device).reshape(y.shape).to(y.dtype))
    return y.detach(), x.grad


def _arrays(t):
    tensors, metadata = t.to_plain_tensors()
    return {k: v.view(torch.uint8) if v.dtype != torch.uint8 and v.element_size() == 1 else v for k, v in tensors.items()}


def _same_parameter(p, q) -> bool:
    if isinstance(p, te.QuantizedTensor) != isinstance(q, te.QuantizedTensor):
        return False
    if isinstance(p, te.QuantizedTensor):
        a, b = _arrays(p), _arrays(q)
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return torch.equal(p, q)


@pytest.mark.parametrize("quantized_compute", [True, False], ids=["qcompute", "hp_compute"])
@pytest.mark.parametrize("quantized_weight", [True, False], ids=["qweight", "hp_weight"])
@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_deferred_init_matrix(recipe_name, quantized_weight, quantized_compute, device):
    x = torch.randn(SHAPE, SHAPE, device=device, dtype=torch.bfloat16)
    torch.manual_seed(0)
    eager = _build(device, recipe_name, quantized_weight)
    meta = _build("meta", recipe_name, quantized_weight)
    ids = [id(p) for p in meta.parameters()]
    torch.manual_seed(0)
    y_meta, dx_meta = _step(meta, x, recipe_name, quantized_compute)
    y_eager, dx_eager = _step(eager, x, recipe_name, quantized_compute)

    assert [id(p) for p in meta.parameters()] == ids
    assert aliases_in_sync(meta)
    for linear in (meta[1], meta[3]):
        assert isinstance(linear.weight, te.QuantizedTensor) == quantized_weight
        assert not isinstance(linear.bias, te.QuantizedTensor)
    for (name, p), q in zip(meta.named_parameters(), eager.parameters()):
        assert p.device == device and p.grad is not None and p.grad.device == device, name
        assert _same_parameter(p, q), name
        assert torch.equal(p.grad, q.grad), name
    assert torch.equal(y_meta, y_eager) and torch.equal(dx_meta, dx_eager)


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_first_forward_outside_autocast_uses_the_remembered_recipe(recipe_name, device):
    """Beyond TE: no autocast at the first forward, yet the weight materializes quantized."""
    model = _build("meta", recipe_name, quantized_weight=True)
    y, _ = _step(model, torch.randn(SHAPE, SHAPE, device=device, dtype=torch.bfloat16), recipe_name, False)
    assert isinstance(model[1].weight, te.QuantizedTensor)
    assert model[1].basic_ops[0]._quantizers is None  # no autocast: the op's quantizers were dropped
    assert torch.isfinite(y.float()).all()


def test_no_recipe_at_all_is_a_clear_error_and_nothing_is_materialized(device):
    model = _build("meta", "fp8_current_scaling", quantized_weight=True)
    for op in (model[1].basic_ops[0], model[3].basic_ops[0]):
        op._quantized_weight_recipe = None  # as if nothing was remembered
    x = torch.randn(SHAPE, SHAPE, device=device, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="no quantizer was available"):
        model(x)
    assert all(p.is_meta for p in model.parameters()), "a failure must leave nothing half-materialized"
    with te.autocast(recipe=make_recipe("fp8_current_scaling")):
        model(x)  # the documented fix: run the first forward under autocast
    assert isinstance(model[1].weight, te.QuantizedTensor)
    assert "autocast" in NO_QUANTIZER_MESSAGE


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_quantized_weight_keeps_no_hidden_high_precision_copy(recipe_name, device):
    with te.quantized_model_init(recipe=make_recipe(recipe_name)):
        op = te.ops.BasicLinear(SHAPE, SHAPE, device=device, dtype=torch.bfloat16)
    weight = op.weight
    held = weight.quantized_nbytes()
    high_precision = SHAPE * SHAPE * 2  # bf16
    # Row-wise and column-wise copies of 8-bit (or 4-bit) data plus scales: at most the bf16 size.
    assert held <= high_precision + 4 * SHAPE * 4, held
    assert op.get_high_precision_init_val() is None
    with te.quantized_model_init(recipe=make_recipe(recipe_name), preserve_high_precision_init_val=True):
        kept = te.ops.BasicLinear(SHAPE, SHAPE, device=device, dtype=torch.bfloat16)
    init = kept.get_high_precision_init_val()
    assert init is not None and init.device.type == "cpu" and init.dtype == torch.bfloat16
    kept.clear_high_precision_init_val()
    assert kept.get_high_precision_init_val() is None


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_quantized_checkpoint_round_trip_is_bit_exact(recipe_name, device):
    model = _build(device, recipe_name, quantized_weight=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = [torch.randn(SHAPE, SHAPE, device=device, dtype=torch.bfloat16) for _ in range(4)]
    for x in xs[:2]:
        optimizer.zero_grad()
        _step(model, x, recipe_name, True)
        optimizer.step()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    restored = _build("meta", recipe_name, quantized_weight=True)
    ids = [id(p) for p in restored.parameters()]
    result = restored.load_state_dict(state)
    assert not result.missing_keys and not result.unexpected_keys
    assert [id(p) for p in restored.parameters()] == ids
    assert aliases_in_sync(restored)
    for p, q in zip(model.parameters(), restored.parameters()):
        assert _same_parameter(p, q)
    for x in xs[2:]:
        y_a, dx_a = _step(model, x, recipe_name, True)
        y_b, dx_b = _step(restored, x, recipe_name, True)
        assert torch.equal(y_a, y_b) and torch.equal(dx_a, dx_b)


def test_optimizer_step_requantizes_in_place(device):
    with te.quantized_model_init(recipe=make_recipe("fp8_current_scaling")):
        op = te.ops.BasicLinear(SHAPE, SHAPE, device="meta", dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(op.parameters(), lr=0.5)
    x = torch.randn(SHAPE, SHAPE, device=device, dtype=torch.bfloat16)
    _step(op, x, "fp8_current_scaling", True)
    weight = op.weight
    before = weight.dequantize().clone()
    optimizer.step()
    assert op.weight is weight and isinstance(weight, te.QuantizedTensor)
    assert not torch.equal(weight.dequantize(), before)
