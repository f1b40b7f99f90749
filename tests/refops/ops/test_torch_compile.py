"""``torch.compile`` of refops ops (issue #38 item 6; docs/te-ops.md#under-torchcompile): the model compiles around
each fuser, which runs eagerly as a graph break, so training gives eager's bits under every recipe and none; under
``fullgraph=True`` Dynamo's error names refops and what to do instead.

Every test resets Dynamo and asserts that Dynamo reached a fuser while compiling (it recorded the graph break
with refops' reason): a run that never compiled (a recompile limit, a skipped frame) would otherwise pass for a
compiled one.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Optional

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import refops as te
from refops.ops.torch_compile import EAGER_REASON
from refops.testing.recipes import RECIPE_NAMES, make_recipe

HIDDEN = 128  # a multiple of every recipe's block
RECIPES = [None, *RECIPE_NAMES]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo warns about every graph break; the tests assert the outcomes
        yield
    torch._dynamo.reset()


def _build(recipe_name: Optional[str], quantized_weights: bool = False) -> te.ops.Sequential:
    torch.manual_seed(0)
    recipe = make_recipe(recipe_name) if recipe_name else None
    with te.quantized_model_init(enabled=quantized_weights, recipe=recipe):
        return te.ops.Sequential(te.ops.LayerNorm(HIDDEN), te.ops.Linear(HIDDEN, HIDDEN), te.ops.GELU(),
                                 te.ops.Linear(HIDDEN, HIDDEN))


def _train(model: torch.nn.Module, run: Callable, recipe_name: Optional[str], steps: int = 2) -> list[torch.Tensor]:
    """Outputs, input grads and parameter grads of ``steps`` SGD steps; ``run(model, x)`` is the forward."""
    recipe = make_recipe(recipe_name) if recipe_name else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for step in range(steps):
        x = torch.randn(32, HIDDEN, generator=torch.Generator().manual_seed(step), requires_grad=True)
        optimizer.zero_grad()
        with te.autocast(recipe=recipe) if recipe else contextlib.nullcontext():
            y = run(model, x)
        y.float().square().mean().backward()
        optimizer.step()
        seen += [y.detach(), x.grad, *(p.grad.clone() for p in model.parameters())]
    return seen


def _assert_dynamo_reached_a_fuser() -> None:
    assert any(EAGER_REASON in reason for reason in counters["graph_break"]), dict(counters["graph_break"])


def _assert_bits_equal(compiled: list[torch.Tensor], eager: list[torch.Tensor]) -> None:
    assert len(compiled) == len(eager)
    for i, (c, e) in enumerate(zip(compiled, eager)):
        assert torch.equal(c, e), f"tensor {i} differs from eager: max |diff| {(c - e).abs().max().item()}"


@pytest.mark.parametrize("recipe_name", RECIPES, ids=lambda r: r or "no_recipe")
def test_a_compiled_model_trains_with_eager_bits(recipe_name):
    eager = _train(_build(recipe_name), lambda m, x: m(x), recipe_name)
    model = _build(recipe_name)
    compiled = torch.compile(model, backend="aot_eager")
    _assert_bits_equal(_train(model, lambda m, x: compiled(x), recipe_name), eager)
    _assert_dynamo_reached_a_fuser()


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_a_compiled_model_with_quantized_weights_trains_with_eager_bits(recipe_name):
    eager = _train(_build(recipe_name, quantized_weights=True), lambda m, x: m(x), recipe_name)
    model = _build(recipe_name, quantized_weights=True)
    compiled = torch.compile(model, backend="aot_eager")
    _assert_bits_equal(_train(model, lambda m, x: compiled(x), recipe_name), eager)
    assert isinstance(model[1].weight, te.QuantizedTensor)
    _assert_dynamo_reached_a_fuser()


def test_code_around_the_ops_compiles_and_autocast_may_be_inside_the_compiled_function():
    recipe = make_recipe("fp8_delayed_scaling")

    def forward(model, x):  # plain torch before and after the refops ops, and the autocast, all compiled
        with te.autocast(recipe=recipe):
            return model(x * 2.0).relu() + 1.0

    eager = _train(_build("fp8_delayed_scaling"), forward, None, steps=3)
    graphs = CompileCounterWithBackend("aot_eager")
    compiled_forward = torch.compile(forward, backend=graphs)
    _assert_bits_equal(_train(_build("fp8_delayed_scaling"), compiled_forward, None, steps=3), eager)
    _assert_dynamo_reached_a_fuser()
    assert graphs.frame_count >= 1 and graphs.op_count >= 1  # the plain torch around the ops became graphs


def test_a_standalone_op_compiles_with_eager_bits():
    recipe = "mxfp8"
    torch.manual_seed(0)
    eager_op = te.ops.Linear(HIDDEN, HIDDEN)
    torch.manual_seed(0)
    op = te.ops.Linear(HIDDEN, HIDDEN)
    compiled = torch.compile(op, backend="aot_eager")
    _assert_bits_equal(_train(op, lambda m, x: compiled(x), recipe), _train(eager_op, lambda m, x: m(x), recipe))
    _assert_dynamo_reached_a_fuser()


@pytest.mark.parametrize("recipe_name", [None, "fp8_delayed_scaling", "nvfp4"], ids=lambda r: r or "no_recipe")
def test_fullgraph_fails_with_refops_reason_and_the_alternatives(recipe_name):
    compiled = torch.compile(_build(recipe_name), backend="eager", fullgraph=True)
    recipe = make_recipe(recipe_name) if recipe_name else None
    with pytest.raises(torch._dynamo.exc.Unsupported) as raised:
        with te.autocast(recipe=recipe) if recipe else contextlib.nullcontext():
            compiled(torch.randn(32, HIDDEN))
    text = str(raised.value)
    assert EAGER_REASON in text
    assert "refops does not support compiling its fused ops" in text and "Drop fullgraph=True" in text
    assert "InternalTorchDynamoError" not in text
