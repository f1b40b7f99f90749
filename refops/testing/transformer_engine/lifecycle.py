"""TransformerEngine's ops as subjects of :func:`refops.testing.check_lifecycle`.

``check_lifecycle`` takes a factory ``f(device) -> module`` and the forward inputs.
:func:`lifecycle_cases` gives one :class:`LifecycleCase` per TE op (``te.ops.BasicLinear``,
``Bias``, ``Linear``, ``LayerNorm``, ``RMSNorm``, ``GroupedLinear`` and a
``Sequential`` MLP), built on the device it is given, inside TE's
``quantized_model_init`` when asked. Under a recipe the module runs every forward inside
TE's ``autocast`` with TE's version of the recipe: its ``forward`` is wrapped on the
instance (a bound method, so ``copy.deepcopy`` rebinds it to the copy), which keeps the
parameter names and the class the report shows those of the TE op itself.

TE's ops materialize meta parameters in ``reset_parameters()`` and at the first forward
(``pre_first_fuser_forward``): both are TE's own promises, so they are checked with
``materializes_through_reset_parameters=True, materializes_at_first_forward=True`` (:data:`TE_CLAIMS`):
a path that leaves a parameter on meta, or raises, is a violation. Keeping parameter objects through
materialization is a refops extension TE does not promise: reported, not held against TE.

``lifecycle_cases(..., reference=True)`` builds refops' own ops the same way (refops' ops,
``autocast`` and ``quantized_model_init``): the control. A property that the reference
violates too is a limit of the check, not a finding about TE. (Under delayed scaling the scales
move between two training steps, so grads before and after a parameter replacement differ for any
correct implementation; ``no_stale_cache_after_replacement`` therefore compares with an untouched
twin run for the same steps, and the reference holds it.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Callable, Optional

import torch

from ... import ops as refops_ops
from ...quantization import state as refops_state
from ...recipe import NVFP4BlockScaling, Recipe
from .availability import import_te
from .recipes import te_recipe

__all__ = ["LifecycleCase", "lifecycle_cases", "LIFECYCLE_OPS", "WEIGHTED_OPS", "TE_CLAIMS"]

#: What TE's ops claim of their materialization, as ``check_lifecycle`` keywords: ``reset_parameters()``
#: materializes a meta-built op, and so does the first forward (``pre_first_fuser_forward``).
TE_CLAIMS = {"materializes_through_reset_parameters": True, "materializes_at_first_forward": True}

#: The ops checked, in report order.
LIFECYCLE_OPS = ("BasicLinear", "Bias", "Linear", "LayerNorm", "RMSNorm", "GroupedLinear", "Sequential")
#: The ops that own a weight (the only ones ``quantized_model_init`` changes).
WEIGHTED_OPS = ("BasicLinear", "Linear", "GroupedLinear", "Sequential")
_GROUPS = 2


@dataclasses.dataclass(frozen=True)
class LifecycleCase:
    """One TE op under one recipe: ``check_lifecycle(case.factory, inputs=case.inputs, **TE_CLAIMS)``."""

    #: The op's name in ``te.ops`` (``"Sequential"``: LayerNorm -> Linear -> GELU -> Linear).
    op: str
    #: ``factory(device)``: the TE op built on ``device``.
    factory: Callable[[torch.device], torch.nn.Module]
    #: ``inputs(device)``: its forward arguments.
    inputs: Callable[[torch.device], tuple[Any, ...]]
    #: The refops recipe it runs under (None: high precision), and whether it was built quantized.
    recipe: Optional[Recipe]
    quantized_init: bool
    dtype: torch.dtype


def _build(ops: Any, op: str, hidden: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    kw = dict(device=device, dtype=dtype)
    if op == "BasicLinear":
        return ops.BasicLinear(hidden, hidden, **kw)
    if op == "Bias":
        return ops.Bias(hidden, **kw)
    if op == "Linear":
        return ops.Linear(hidden, hidden, bias=True, **kw)
    if op == "LayerNorm":
        return ops.LayerNorm(hidden, **kw)
    if op == "RMSNorm":
        return ops.RMSNorm(hidden, **kw)
    if op == "GroupedLinear":
        return ops.GroupedLinear(_GROUPS, hidden, hidden, bias=True, **kw)
    if op == "Sequential":
        return ops.Sequential(ops.LayerNorm(hidden, **kw), ops.Linear(hidden, 2 * hidden, **kw), ops.GELU(),
                              ops.Linear(2 * hidden, hidden, **kw))
    raise ValueError(f"lifecycle_cases: unknown op {op!r}; known: {LIFECYCLE_OPS}")


def _inputs(op: str, hidden: int, dtype: torch.dtype) -> Callable[[torch.device], tuple[Any, ...]]:
    def inputs(device: torch.device) -> tuple[Any, ...]:
        x = torch.randn(hidden * _GROUPS if op == "GroupedLinear" else hidden, hidden, device=device, dtype=dtype)
        if op == "GroupedLinear":
            return x, torch.full((_GROUPS,), hidden, dtype=torch.int64, device=device)
        return (x,)

    return inputs


def _forward_under_autocast(module: torch.nn.Module, autocast: Any, recipe: Any) -> None:
    """Make every forward of ``module`` run inside ``autocast(enabled=True, recipe=recipe)``."""
    forward = type(module).forward

    def forward_under_autocast(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        with autocast(enabled=True, recipe=recipe):
            return forward(self, *args, **kwargs)

    module.forward = types.MethodType(forward_under_autocast, module)


def lifecycle_cases(
    recipe: Optional[Recipe] = None,
    *,
    quantized_init: bool = False,
    ops: Optional[tuple[str, ...]] = None,
    dtype: Optional[torch.dtype] = None,
    hidden: int = 128,
    reference: bool = False,
) -> list[LifecycleCase]:
    """One case per TE op (of ``ops``, default :data:`LIFECYCLE_OPS`) under ``recipe``.

    Args:
        recipe: the refops recipe the forward runs under (None: high precision).
        quantized_init: build inside TE's ``quantized_model_init`` (only the ops of
            :data:`WEIGHTED_OPS` are returned then; the others hold no weight).
        ops: the op names to build.
        dtype: the parameters' and inputs' dtype (default: bfloat16 for NVFP4, whose TE
            kernels take bfloat16, and for ``GroupedLinear`` under a recipe, whose quantized
            grouped GEMM TE runs in BF16/FP16 only (cuBLAS refuses fp32); float32 otherwise).
        hidden: the features (a multiple of every block size: 128).
        reference: build refops' ops of the same names instead, with refops' ``autocast`` and
            ``quantized_model_init`` (the control; TransformerEngine is not needed then).
    """
    if quantized_init and recipe is None:
        raise ValueError("lifecycle_cases: quantized_init=True needs a recipe")
    names = LIFECYCLE_OPS if ops is None else tuple(ops)
    unknown = sorted(set(names) - set(LIFECYCLE_OPS))
    if unknown:
        raise ValueError(f"lifecycle_cases: unknown ops {unknown}; known: {LIFECYCLE_OPS}")
    if quantized_init:
        names = tuple(n for n in names if n in WEIGHTED_OPS)
    if reference:
        library_ops, autocast, init, translated = (refops_ops, refops_state.autocast,
                                                   refops_state.quantized_model_init, recipe)
    else:
        te = import_te("lifecycle_cases")
        library_ops, autocast, init, translated = (te.pytorch.ops, te.pytorch.autocast,
                                                   te.pytorch.quantized_model_init, te_recipe(recipe))
    cases = []
    for name in names:
        dtype_of_case = dtype if dtype is not None else _default_dtype(name, recipe)

        def factory(device: torch.device, name: str = name, dtype: torch.dtype = dtype_of_case) -> torch.nn.Module:
            building = init(enabled=True, recipe=translated) if quantized_init else contextlib.nullcontext()
            with building:
                module = _build(library_ops, name, hidden, torch.device(device), dtype)
            if recipe is not None:
                _forward_under_autocast(module, autocast, translated)
            return module

        factory.__qualname__ = f"{'refops' if reference else 'te'}.ops.{name}"
        cases.append(LifecycleCase(name, factory, _inputs(name, hidden, dtype_of_case), recipe, quantized_init,
                                   dtype_of_case))
    return cases


def _default_dtype(op: str, recipe: Optional[Recipe]) -> torch.dtype:
    """bfloat16 where TE computes in it only (NVFP4; a quantized grouped GEMM), else float32."""
    if isinstance(recipe, NVFP4BlockScaling) or (op == "GroupedLinear" and recipe is not None):
        return torch.bfloat16
    return torch.float32
