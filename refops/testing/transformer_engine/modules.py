"""TransformerEngine modules as candidates of :func:`refops.testing.compare_modules`.

``compare_modules(te_module, refops_module, inputs, recipe=r, candidate_context=candidate_context(r))``
runs the TE module under TE's own ``autocast`` with TE's version of the recipe. The two
modules must have the same structure (the same parameter names); :data:`PIPELINES` builds
the same pipeline from either library's ``ops`` namespace, and :func:`build_pair` builds a
TE module and its refops twin holding the same values:

1. the refops pipeline is built in high precision on the device under ``seed``: these are
   the values both sides start from;
2. TE's pipeline is built (inside TE's ``quantized_model_init`` when asked) and every
   parameter takes those values (``quantize_`` for a quantized weight, so TE quantizes it
   with its own weight quantizer);
3. the refops twin is built the same way under refops' ``quantized_model_init``.

Then ``compare_modules(..., copy_parameters=False)``: nothing is copied between libraries,
each side quantized its own weights from the same values.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager, Optional

import torch

from ... import ops as refops_ops
from ...quantization.state import quantized_model_init as refops_quantized_model_init
from ...recipe import Recipe
from .availability import import_te
from .recipes import te_recipe

__all__ = ["PIPELINES", "Pipeline", "build_pair", "candidate_context", "bit_identical_share", "copy_values"]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A pipeline both libraries can build: ``build(ops, hidden, device, dtype)`` with ``ops`` = ``te.ops``."""

    name: str
    description: str
    build: Callable[[Any, int, torch.device, torch.dtype], torch.nn.Module]


def _linear(ops, h, device, dtype):
    return ops.Sequential(ops.Linear(h, h, device=device, dtype=dtype))


def _linear_gelu_linear(ops, h, device, dtype):
    return ops.Sequential(
        ops.Linear(h, 2 * h, bias=True, device=device, dtype=dtype),
        ops.GELU(),
        ops.Linear(2 * h, h, bias=True, device=device, dtype=dtype),
    )


def _layernorm_mlp(ops, h, device, dtype):
    return ops.Sequential(
        ops.LayerNorm(h, device=device, dtype=dtype),
        ops.Linear(h, 2 * h, device=device, dtype=dtype),
        ops.GELU(),
        ops.Linear(2 * h, h, device=device, dtype=dtype),
    )


#: The pipelines of the module tier, by name.
PIPELINES: dict[str, Pipeline] = {
    p.name: p
    for p in (
        Pipeline("linear", "Linear(H, H) with bias", _linear),
        Pipeline("linear_gelu_linear", "Linear(H, 2H) + bias -> GELU -> Linear(2H, H) + bias", _linear_gelu_linear),
        Pipeline("layernorm_mlp", "LayerNorm -> Linear(H, 2H) -> GELU -> Linear(2H, H)", _layernorm_mlp),
    )
}


def candidate_context(recipe: Optional[Recipe]) -> Callable[[], ContextManager[Any]]:
    """The ``candidate_context`` of ``compare_modules`` for a TE module: TE's ``autocast`` with TE's recipe.

    The TE recipe is made once, so that every call shares it (as a training loop would).
    """
    te = import_te("candidate_context")
    translated = te_recipe(recipe)

    def context() -> ContextManager[Any]:
        if recipe is None:
            return te.pytorch.autocast(enabled=False)
        return te.pytorch.autocast(enabled=True, recipe=translated)

    return context


def copy_values(module: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Give every parameter of ``module`` the value of the same name (quantized ones are re-quantized in place).

    Raises:
        KeyError: a parameter has no value of its name, or a value has no parameter.
    """
    params = dict(module.named_parameters())
    if set(params) != set(values):
        raise KeyError(
            f"copy_values: parameter names differ: the module has {sorted(params)}, the values {sorted(values)}"
        )
    with torch.no_grad():
        for name, p in params.items():
            value = values[name].to(device=p.device, dtype=p.dtype)
            if callable(getattr(p, "quantize_", None)):
                p.quantize_(value)
            else:
                p.copy_(value)


def build_pair(
    pipeline: str,
    *,
    recipe: Optional[Recipe],
    dtype: torch.dtype,
    device: torch.device,
    quantized_init: bool = False,
    hidden: int = 128,
    seed: int = 0,
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(TE module, refops module)``: the same pipeline, the same starting values (see the module docstring)."""
    if pipeline not in PIPELINES:
        raise ValueError(f"build_pair: unknown pipeline {pipeline!r}; known: {sorted(PIPELINES)}")
    if quantized_init and recipe is None:
        raise ValueError("build_pair: quantized_init=True needs a recipe")
    te = import_te("build_pair")
    build = PIPELINES[pipeline].build
    torch.manual_seed(seed)
    values = {n: p.detach().clone() for n, p in build(refops_ops, hidden, device, dtype).named_parameters()}
    te_init = te.pytorch.quantized_model_init(enabled=True, recipe=te_recipe(recipe)) if quantized_init \
        else contextlib.nullcontext()
    torch.manual_seed(seed)  # both libraries initialize as torch.nn does: the same draws, the same values
    with te_init:
        te_module = build(te.pytorch.ops, hidden, device, dtype)
    refops_init = refops_quantized_model_init(enabled=True, recipe=recipe) if quantized_init \
        else contextlib.nullcontext()
    torch.manual_seed(seed)
    with refops_init:
        refops_module = build(refops_ops, hidden, device, dtype)
    copy_values(te_module, values)
    copy_values(refops_module, values)
    return te_module, refops_module


def bit_identical_share(actual: Optional[torch.Tensor], expected: Optional[torch.Tensor]) -> Optional[float]:
    """The share of elements whose bits are equal (NaN payloads included); None when a side is missing.

    Raises:
        ValueError: the shapes or dtypes differ (there is no element-wise share to speak of).
    """
    if actual is None or expected is None:
        return None
    a, e = actual.detach(), expected.detach()
    if a.shape != e.shape or a.dtype != e.dtype:
        raise ValueError(
            f"bit_identical_share: {a.dtype}{list(a.shape)} against {e.dtype}{list(e.shape)}: no element-wise share"
        )
    if a.numel() == 0:
        return 1.0
    return float((_bits(a) == _bits(e)).double().mean().item())


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of ``t`` as integers of its width."""
    t = t.contiguous().cpu()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
