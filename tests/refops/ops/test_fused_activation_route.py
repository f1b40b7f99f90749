"""The activation ops and ``BackwardActivationBias`` hand the whole fused pass to the quantizer
(``Quantizer.quantize_activation`` and its backward twins), and that changes no bit of an MLP.

``Linear -> GELU -> Linear`` under delayed and current scaling, bf16/fp16/fp32, with and without the first
Linear's bias (with it, backward runs ``BackwardActivationBias``): once through the per-tensor FP8 quantizers'
fused seam methods, once with those overrides replaced by ``Quantizer``'s defaults (the composition through
``quantize_unrounded``); outputs, every grad and the recipe state must be bit-identical, and the fused methods
must have been the ones called.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import refops as te
from refops.quantization import Float8CurrentScalingQuantizer, Float8Quantizer
from refops.quantization.quantizer import Quantizer

METHODS = ("quantize_activation", "quantize_activation_backward", "quantize_activation_backward_dbias")
RECIPES = {"delayed": te.recipe.DelayedScaling, "current": te.recipe.Float8CurrentScaling}


def _run(recipe_name: str, dtype: torch.dtype, bias: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    model = te.ops.Sequential(
        te.ops.Linear(64, 128, bias=bias, dtype=dtype), te.ops.GELU(), te.ops.Linear(128, 32, dtype=dtype))
    x = (torch.randn(48, 64) * 2).to(dtype).requires_grad_(True)
    dy = torch.randn(48, 32).to(dtype)
    with te.autocast(recipe=RECIPES[recipe_name]()):
        for _ in range(2):  # the second step runs with updated delayed-scaling scales
            y = model(x)
            y.backward(dy)
    out = {"y": y.detach(), "dx": x.grad}
    out.update({f"param.{name}": p.grad for name, p in model.named_parameters()})
    return out


def _calls(monkeypatch: Any, cls: type, seen: list[str]) -> None:
    for name in METHODS:
        method = getattr(cls, name)

        def spy(self, *args, _method=method, _name=name, **kwargs):
            seen.append(_name)
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, spy)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_mlp_through_the_fused_pass_is_bit_identical_to_the_composition(recipe_name, dtype, bias, monkeypatch):
    cls = Float8Quantizer if recipe_name == "delayed" else Float8CurrentScalingQuantizer
    seen: list[str] = []
    with monkeypatch.context() as m:
        _calls(m, cls, seen)
        fused = _run(recipe_name, dtype, bias)
    backward = "quantize_activation_backward_dbias" if bias else "quantize_activation_backward"
    assert seen.count("quantize_activation") == 2 and seen.count(backward) == 2, seen
    with monkeypatch.context() as m:
        for name in METHODS:  # the defaults: act_fp32 (or dy * act') handed to quantize_unrounded
            m.setattr(cls, name, getattr(Quantizer, name))
        composed = _run(recipe_name, dtype, bias)
    assert fused.keys() == composed.keys()
    for key in fused:
        a, e = fused[key], composed[key]
        assert a.dtype == e.dtype and torch.equal(a.view(torch.uint8), e.view(torch.uint8)), key
