"""CUDA graphs (refops.graphs): what a replay may assume is checked on every call; the capture replays exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import refops as te
from refops.graphs import CaptureGuard, GraphInvalidatedError, _check_capturable, make_graphed_callables
from refops.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling


def _model(device: torch.device | str = "cpu") -> te.ops.Sequential:
    return te.ops.Sequential(te.ops.Linear(32, 64, device=device), te.ops.GELU(), te.ops.Linear(64, 32, device=device))


def test_the_guard_accepts_in_place_updates():
    model = _model()
    guard = CaptureGuard.capture(model, None)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # what an optimizer step does
    guard.check(model, None)


@pytest.mark.parametrize("change", ["replace", "assign_load", "requires_grad", "dtype"])
def test_the_guard_refuses_a_changed_parameter(change):
    model = _model()
    guard = CaptureGuard.capture(model, None)
    first = model[0]
    if change == "replace":
        first.basic_ops[0]._parameters["weight"] = torch.nn.Parameter(first.weight.detach().clone())
    elif change == "assign_load":
        model.load_state_dict({k: v.clone() if isinstance(v, torch.Tensor) else v
                               for k, v in model.state_dict().items()}, assign=True)
    elif change == "requires_grad":
        first.weight.requires_grad_(False)
    else:
        model.to(torch.float64)
    with pytest.raises(GraphInvalidatedError, match="replaced or changed .* capture the graph again"):
        guard.check(model, None)


def test_the_guard_refuses_a_recipe_changed_in_place():
    recipe = Float8CurrentScaling()
    model = _model()
    guard = CaptureGuard.capture(model, recipe)
    guard.check(model, recipe)
    recipe.fp8_quant_fwd_inp = dataclasses.replace(recipe.fp8_quant_fwd_inp,
                                                   power_2_scale=not recipe.fp8_quant_fwd_inp.power_2_scale)
    with pytest.raises(GraphInvalidatedError, match="recipe differs"):
        guard.check(model, recipe)


def test_delayed_scaling_is_refused_with_the_reason():
    with pytest.raises(NotImplementedError, match="DelayedScaling cannot be captured.*host after backward"):
        _check_capturable(DelayedScaling())
    _check_capturable(MXFP8BlockScaling())
    _check_capturable(None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_without_cuda_capture_is_a_clear_error():
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        make_graphed_callables(_model(), (torch.randn(4, 32),))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("recipe", [None, Float8CurrentScaling(), MXFP8BlockScaling()],
                         ids=["bf16", "fp8_current", "mxfp8"])
@pytest.mark.parametrize("meta", [False, True], ids=["eager_init", "meta_init"])
@pytest.mark.parametrize("backend", ["reference", "fastpath"])
def test_replays_match_eager_steps_and_the_guard_catches_replacement(recipe, meta, backend):
    if backend == "fastpath":
        fastpath = pytest.importorskip("fastpath", reason="the fast path is not installed")
        if fastpath.unavailable_reason():
            pytest.skip(f"fast path unavailable: {fastpath.unavailable_reason()}")
    with te.use_backend(backend):
        _check_replays_match_eager_steps(recipe, meta)


def _check_replays_match_eager_steps(recipe, meta):
    torch.manual_seed(0)
    device = torch.device("cuda")
    eager = _model(device).to(torch.bfloat16)
    torch.manual_seed(0)
    graphed = _model("meta" if meta else device)
    if meta:
        graphed.to_empty(device=device)
        graphed.load_state_dict(eager.state_dict())
    graphed = graphed.to(torch.bfloat16)
    graphed.load_state_dict(eager.state_dict())
    x = torch.randn(32, 32, device=device, dtype=torch.bfloat16, requires_grad=True)
    graphed = make_graphed_callables(graphed, (x,), enabled=recipe is not None, recipe=recipe)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.1)
    for step in range(3):
        xs = torch.randn(32, 32, device=device, dtype=torch.bfloat16)
        outs = []
        for model, opt in ((eager, opt_e), (graphed, opt_g)):
            xi = xs.clone().requires_grad_(True)
            ctx = te.autocast(recipe=recipe) if (recipe is not None and model is eager) else torch.enable_grad()
            with ctx:
                y = model(xi)
            y.float().square().sum().backward()
            torch.cuda.synchronize()
            outs.append((y.detach(), xi.grad, [p.grad.clone() for p in model.parameters()]))
            opt.step()
            opt.zero_grad(set_to_none=True)
        (ye, dxe, ge), (yg, dxg, gg) = outs
        assert torch.equal(ye, yg), f"step {step}: y"
        assert torch.equal(dxe, dxg), f"step {step}: dx"
        assert all(torch.equal(a, b) for a, b in zip(ge, gg)), f"step {step}: parameter grads"
    graphed[0].basic_ops[0]._parameters["weight"] = torch.nn.Parameter(graphed[0].weight.detach().clone())
    with pytest.raises(GraphInvalidatedError):
        graphed(torch.randn(32, 32, device=device, dtype=torch.bfloat16, requires_grad=True))
