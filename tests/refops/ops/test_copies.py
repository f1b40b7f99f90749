"""Copies of models and quantized tensors (``docs/api/refops.md#copies-and-pickling``), every recipe.

Issue #38 item 4: a ``pickle.loads(pickle.dumps(model))`` copy of a DelayedScaling model never updated its
scales again (its quantizers' views into the recipe state were pickled as tensors of their own). Here the
original and each copy train side by side, and everything they compute or keep must be equal bit for bit.
"""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any, Callable

import pytest
import torch

import refops as te
from refops.quantization.quantized_tensor import QuantizedTensor
from refops.quantization.recipe_state import DelayedScalingRecipeState
from refops.testing.recipes import RECIPE_NAMES, make_recipe


def _torch_save_load(obj: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES: dict[str, Callable[[Any], Any]] = {
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "deepcopy": copy.deepcopy,
    "torch.save": _torch_save_load,
}
#: The copies that serialize: refused for quantized tensors (deepcopy never leaves the process).
SERIALIZING = ("pickle", "torch.save")


def _model(recipe_name: str, quantized: bool) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    recipe = make_recipe(recipe_name)
    with te.quantized_model_init(enabled=quantized, recipe=recipe):
        model = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.Linear(32, 32))
    with te.autocast(recipe=recipe):  # a step first, so the copy has recipe state to keep linked
        model(torch.randn(32, 32)).square().sum().backward()
    return model, recipe


def _step(model: torch.nn.Module, recipe: Any, x: torch.Tensor, opt: torch.optim.Optimizer) -> dict[str, Any]:
    opt.zero_grad()
    with te.autocast(recipe=recipe):
        y = model(x)
    y.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return {"output": y.detach(), "grads": grads, "kept": _kept(model)}


def _kept(model: torch.nn.Module) -> list[torch.Tensor]:
    """What the model keeps: parameters (a quantized weight's arrays), delayed-scaling scales and histories."""
    kept: list[torch.Tensor] = []
    for p in model.parameters():
        kept += list(p.to_plain_tensors()[0].values()) if isinstance(p, QuantizedTensor) else [p.detach()]
    for state in _delayed_states(model):
        kept += [state.scale, state.amax_history]
    return [t.clone() for t in kept]


def _assert_same(a: Any, b: Any, what: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), what
    else:
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{what}[{i}]")


@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("quantized", [False, True], ids=["plain", "quantized_weights"])
@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_a_copy_trains_bit_exactly_as_the_original(recipe_name, quantized, how):
    model, recipe = _model(recipe_name, quantized)
    if quantized and how in SERIALIZING:
        with pytest.raises(TypeError, match="is not picklable .*copy.deepcopy.*state_dict"):
            COPIES[how](model)
        return
    twin = COPIES[how](model)
    assert not any(p is q for p, q in zip(model.parameters(), twin.parameters()))
    _assert_same(_kept(model), _kept(twin), "before training")
    scales_before = [s.scale.clone() for s in _delayed_states(twin)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (model, twin)]
    for step in range(4):
        x = torch.randn(32, 32) * (step + 1)  # growing inputs: delayed scaling's scales must follow
        mine, theirs = (_step(m, recipe, x, opt) for m, opt in zip((model, twin), opts))
        for key in mine:
            _assert_same(mine[key], theirs[key], f"step {step}: {key}")
    if recipe_name == "fp8_delayed_scaling":  # the copy's scales moved with the original's: both updated
        assert all(not torch.equal(s.scale, scale) for s, scale in zip(_delayed_states(twin), scales_before))


def _delayed_states(model: torch.nn.Module) -> list[DelayedScalingRecipeState]:
    return [state for module in model.modules() for state in (getattr(module, "_recipe_states", None) or {}).values()
            if isinstance(state, DelayedScalingRecipeState)]


@pytest.mark.parametrize("recipe_name", ["fp8_delayed_scaling", "mxfp8"])
def test_a_shallow_copy_of_a_model_is_the_same_model_under_another_name(recipe_name):
    """``copy.copy`` of a module is shallow (torch's rule): it shares parameters, ops and recipe state, so
    training it trains the original; it is not an independent model (``copy.deepcopy`` is)."""
    model, recipe = _model(recipe_name, quantized=True)
    alias = copy.copy(model)
    assert all(p is q for p, q in zip(model.parameters(), alias.parameters()))
    assert all(a is b for a, b in zip(model.modules(), alias.modules()) if a is not model)
    before = _kept(model)
    _step(alias, recipe, torch.randn(32, 32), torch.optim.SGD(alias.parameters(), lr=0.01))
    assert any(not torch.equal(a, b) for a, b in zip(before, _kept(model)))  # the original moved


def _quantized_weight(recipe_name: str) -> QuantizedTensor:
    model, _ = _model(recipe_name, quantized=True)
    weight = model[0].weight
    assert isinstance(weight, QuantizedTensor)
    return weight


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_quantized_tensor_copies(recipe_name):
    """deepcopy: the same bytes, none shared; copy.copy: a new tensor on the same arrays and quantizer
    (as for a torch tensor); pickle and torch.save: the clear error."""
    weight = _quantized_weight(recipe_name)
    arrays, metadata = weight.to_plain_tensors()
    deep = copy.deepcopy(weight)
    deep_arrays, deep_metadata = deep.to_plain_tensors()
    assert type(deep) is type(weight) and deep_metadata == metadata
    _assert_same(list(arrays.values()), list(deep_arrays.values()), "deepcopy")
    assert all(a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
               for a, b in zip(arrays.values(), deep_arrays.values()))
    shallow = copy.copy(weight)
    assert type(shallow) is type(weight) and shallow is not weight and shallow.quantizer is weight.quantizer
    assert all(getattr(shallow, name) is getattr(weight, name) for name in weight._array_names())
    assert torch.equal(shallow.dequantize(), weight.dequantize())
    for how in SERIALIZING:
        with pytest.raises(TypeError, match=f"{type(weight).__name__} is not picklable"):
            COPIES[how](weight)


def test_a_stale_quantizer_pickles_its_own_tensors():
    """A delayed-scaling quantizer whose state's history was replaced no longer views it: it is pickled as a
    quantizer of its own, never silently re-linked to other tensors."""
    model, _ = _model("fp8_delayed_scaling", quantized=False)
    op = model[0].basic_ops[0]
    quantizer = op.get_quantizer("forward", 0)
    op._recipe_states["forward"].amax_history = op._recipe_states["forward"].amax_history.clone()
    twin = pickle.loads(pickle.dumps(quantizer))
    assert twin.recipe_slot is None
    assert torch.equal(twin.amax, quantizer.amax) and torch.equal(twin.scale, quantizer.scale)
