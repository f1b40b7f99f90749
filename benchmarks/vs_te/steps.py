"""The training step of both sides: ``Sequential(Linear(h, f), GELU(), Linear(f, h))`` in bf16 with biases, one
forward (inside the side's autocast; none for bf16) and one backward with a fixed ``dy``, every grad set to None
before the step, no optimizer; eager, or captured as CUDA graphs.

* eager: ``te.ops.Sequential`` under ``te.autocast`` (``candidate_context``), and ``refops.ops.Sequential`` under
  ``refops.autocast`` on the fast-path backend (:func:`make_step`);
* graphed (:func:`make_te_graphed_step`, :func:`make_refops_graphed_step`): each side's own capture API, called as
  its documentation says. TE: ``transformer_engine.pytorch.make_graphed_callables(model, (x,), enabled=...,
  recipe=...)`` (TE 2.20's names; ``fp8_enabled`` / ``fp8_recipe`` are deprecated there), the replay called
  inside ``te.autocast`` with the same recipe object, as TE's ``tests/pytorch/test_cuda_graphs.py`` does (TE
  updates delayed scaling's amaxes after a replayed backward only there); refops: ``refops.make_graphed_callables(
  model, (x,), enabled=..., recipe=...)``, whose replay enters its autocast itself (``docs/cuda-graphs.md``).

Where a side cannot be captured, its row records why: refops refuses delayed scaling at capture (its amax-history
update runs on the host after backward); TE's te.ops with Float8BlockScaling is not captured here, because TE's
own CUDA-graph tests skip it as unsupported (:data:`TE_BLOCK_GRAPHS_UNSUPPORTED`; ``--te-block-graphs`` tries).

Every step records ``(forward_s, backward_s)`` of host time in ``step.phases`` while that is a list (the host
profile, ``vs_te.timing.host_per_call``) and keeps its output in ``step.y``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Optional

import torch

from .rows import Sizes

TE_BLOCK_GRAPHS_UNSUPPORTED = (
    "TE not captured: TE's own CUDA-graph tests (tests/pytorch/test_cuda_graphs.py, TE 2.x) skip te.ops with "
    "Float8BlockScaling as 'Module not yet supported for Float8BlockScaling with CUDA graphs' "
    "(--te-block-graphs tries it anyway)")


def parameter_values(sizes: Sizes, device: torch.device) -> dict[str, torch.Tensor]:
    """The two linears' weights and biases by parameter name, the same values for both sides."""
    g = torch.Generator(device=device).manual_seed(0)
    h, f = sizes.hidden, sizes.ffn

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(torch.bfloat16)

    return {"0.weight": randn(f, h, scale=h ** -0.5), "0.bias": randn(f, scale=0.1),
            "2.weight": randn(h, f, scale=f ** -0.5), "2.bias": randn(h, scale=0.1)}


def step_inputs(sizes: Sizes, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (bf16, requiring grad) and ``dy`` of a step at ``sizes``, the same for both sides."""
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(sizes.tokens, sizes.hidden, generator=g, device=device).to(torch.bfloat16).requires_grad_(True)
    dy = (torch.randn(sizes.tokens, sizes.hidden, generator=g, device=device) * 0.1).to(torch.bfloat16)
    return x, dy


def refops_recipe(recipe: Optional[str]) -> Any:
    if recipe is None:
        return None
    from refops import recipe as refops_recipes

    return {"fp8_current": refops_recipes.Float8CurrentScaling, "fp8_delayed": refops_recipes.DelayedScaling,
            "fp8_block": refops_recipes.Float8BlockScaling}[recipe]()


def refops_context(recipe: Any) -> Callable[[], Any]:
    """The forward's context on refops's side: ``refops.autocast`` with ``recipe`` (off for None)."""
    import refops

    return lambda: refops.autocast(enabled=recipe is not None, recipe=recipe)


def te_context(recipe: Any) -> Callable[[], Any]:
    """The forward's context on TE's side: TE's ``autocast`` with TE's version of the refops ``recipe``."""
    from refops.testing.transformer_engine import candidate_context

    return candidate_context(recipe)


def build_model(ops: Any, sizes: Sizes, device: torch.device, values: dict[str, torch.Tensor]) -> torch.nn.Module:
    """``ops.Sequential(Linear, GELU, Linear)`` holding ``values`` (``copy_values``)."""
    from refops.testing.transformer_engine import copy_values

    h, f = sizes.hidden, sizes.ffn
    model = ops.Sequential(
        ops.Linear(h, f, device=device, dtype=torch.bfloat16),
        ops.GELU(),
        ops.Linear(f, h, device=device, dtype=torch.bfloat16),
    )
    copy_values(model, values)
    return model


def step_function(call: Callable[[torch.Tensor], torch.Tensor], params: list[torch.nn.Parameter], x: torch.Tensor,
                  dy: torch.Tensor, context: Callable[[], Any]) -> Callable[[], None]:
    """One step: grads to None, ``y = call(x)`` inside ``context()``, ``y.backward(dy)``."""

    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        start = time.perf_counter()
        with context():
            y = call(x)
        middle = time.perf_counter()
        y.backward(dy)
        if step.phases is not None:  # type: ignore[attr-defined]
            step.phases.append((middle - start, time.perf_counter() - middle))  # type: ignore[attr-defined]
        step.y = y  # type: ignore[attr-defined]

    step.phases = None  # type: ignore[attr-defined]
    return step


def make_step(ops: Any, context: Callable[[], Any], sizes: Sizes, device: torch.device,
              values: dict[str, torch.Tensor], x: torch.Tensor,
              dy: torch.Tensor) -> tuple[Callable[[], None], torch.nn.Module]:
    """One eager forward (inside ``context()``) + backward of ``ops.Sequential(Linear, GELU, Linear)``."""
    model = build_model(ops, sizes, device, values)
    return step_function(model, list(model.parameters()), x, dy, context), model


def make_te_graphed_step(te: Any, recipe: Any, sizes: Sizes, device: torch.device, values: dict[str, torch.Tensor],
                         x: torch.Tensor, dy: torch.Tensor) -> tuple[Callable[[], None], torch.nn.Module]:
    """TE's step captured by ``te.pytorch.make_graphed_callables`` (``recipe``: a refops recipe or None)."""
    from refops.testing.transformer_engine import te_recipe

    translated = te_recipe(recipe)
    enabled = recipe is not None
    model = build_model(te.pytorch.ops, sizes, device, values)
    graphed = te.pytorch.make_graphed_callables(model, (x,), enabled=enabled, recipe=translated)

    def context() -> Any:
        return te.pytorch.autocast(enabled=enabled, recipe=translated)

    return step_function(graphed, list(model.parameters()), x, dy, context), graphed


def make_refops_graphed_step(recipe: Any, sizes: Sizes, device: torch.device, values: dict[str, torch.Tensor],
                             x: torch.Tensor, dy: torch.Tensor) -> tuple[Callable[[], None], torch.nn.Module]:
    """refops's step captured by ``refops.make_graphed_callables`` (raises for delayed scaling: refops refuses)."""
    import refops

    model = build_model(refops.ops, sizes, device, values)
    graphed = refops.make_graphed_callables(model, (x,), enabled=recipe is not None, recipe=recipe)
    return step_function(graphed, list(model.parameters()), x, dy, contextlib.nullcontext), graphed


def release_graphs(module: Any) -> None:
    """Free a TE graphed callable's graphs (``reset()``, TE 2.x) before its memory pool is dropped."""
    reset = getattr(module, "reset", None)
    if callable(reset) and getattr(module, "backward_dw", None) is not None:  # a TE graphed callable
        with contextlib.suppress(Exception):
            reset()
