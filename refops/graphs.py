"""CUDA graphs of refops modules, with the lifecycle's guarantees kept by a guard on every replay.

A captured graph replays kernels on fixed memory: no Python runs, so none of the fuser's per-forward
lifecycle checks (step 3's identity check of the parameter cache, the recipe check of steps 1 and 5)
run either. What a replay may assume is therefore fixed at capture time, and :class:`CaptureGuard`
checks it on the host before each replay, in a few microseconds:

* **Parameters**: the same objects, with the same storage, shape, dtype and ``requires_grad``.
  In-place updates (an optimizer's ``step``, ``copy_`` of a checkpoint) are fine: the graph reads the
  storage. Replacing a parameter (``load_state_dict(assign=True)``, ``module.to(...)``, FSDP's swaps)
  invalidates the graph: the guard raises :class:`GraphInvalidatedError` and the caller captures anew.
* **Recipe and backend**: the recipe (type and fields) and the kernel backend of the capture.
* **Shapes**: the sample arguments' shapes and dtypes (torch's replay already requires them).

What a graph cannot hold, and is refused at capture:

* Delayed scaling: its amax-history roll and scale update run on the host after backward, so a replay
  would quantize every later step with stale scales.
* Quantizer state read on the host (``noop_flag``), and any op that synchronizes with the host.

Current scaling, MXFP8, FP8 block scaling and NVFP4 compute their scales on the device from the data
of the step, so their replays quantize exactly as an eager step does.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Optional, Sequence

import torch

from .kernels import current_backend
from .quantization.state import autocast, get_default_recipe

__all__ = ["CaptureGuard", "GraphInvalidatedError", "make_graphed_callables"]


class GraphInvalidatedError(RuntimeError):
    """A captured graph no longer matches its module: capture it again."""


def _parameter_signature(module: torch.nn.Module) -> tuple:
    """What a replay reads of each parameter: the object, its storage, shape, dtype and ``requires_grad``."""
    return tuple(
        (name, id(p), p.data_ptr(), tuple(p.shape), p.dtype, p.requires_grad)
        for name, p in module.named_parameters()
    )


def _recipe_signature(recipe: Any) -> Any:
    if recipe is None:
        return None
    fields = dataclasses.asdict(recipe) if dataclasses.is_dataclass(recipe) else vars(recipe)
    return type(recipe), repr(sorted(fields.items()))


@dataclasses.dataclass(frozen=True)
class CaptureGuard:
    """The state a graph of ``module`` was captured with; :meth:`check` raises if the module has left it."""

    module_name: str
    parameters: tuple
    recipe: Any
    backend: str

    @classmethod
    def capture(cls, module: torch.nn.Module, recipe: Any) -> "CaptureGuard":
        """Record the module's parameters, the recipe and the current backend (right after capture)."""
        return cls(type(module).__name__, _parameter_signature(module), _recipe_signature(recipe),
                   current_backend().name)

    def check(self, module: torch.nn.Module, recipe: Any) -> None:
        """Invariant: a replay runs only on the parameters, recipe and backend it was captured with."""
        now = _parameter_signature(module)
        if now != self.parameters:
            changed = sorted({a[0] for a, b in zip(self.parameters, now) if a != b}
                             | {e[0] for e in now[len(self.parameters):]}
                             | {e[0] for e in self.parameters[len(now):]})
            raise GraphInvalidatedError(
                f"{self.module_name}: parameters {changed} were replaced or changed (object, storage, shape, dtype "
                "or requires_grad) since the CUDA graph was captured, so a replay would read stale memory. "
                "Update parameters in place (optimizer.step, copy_) or capture the graph again")
        if _recipe_signature(recipe) != self.recipe:
            raise GraphInvalidatedError(
                f"{self.module_name}: the recipe differs from the one the CUDA graph was captured with "
                f"(now {recipe!r}); capture the graph again for this recipe")
        backend = current_backend().name
        if backend != self.backend:
            raise GraphInvalidatedError(
                f"{self.module_name}: the kernel backend is {backend!r} but the CUDA graph was captured with "
                f"{self.backend!r}")


def _check_capturable(recipe: Any) -> None:
    if recipe is not None and getattr(recipe, "delayed", lambda: False)():
        raise NotImplementedError(
            "make_graphed_callables: DelayedScaling cannot be captured in refops: its amax-history roll and scale "
            "update run on the host after backward, so every replay would reuse the capture's scales. Use "
            "Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling or NVFP4BlockScaling")


def make_graphed_callables(
    modules: torch.nn.Module | Sequence[torch.nn.Module],
    sample_args: tuple | Sequence[tuple],
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    sample_kwargs: Optional[dict | Sequence[dict]] = None,
    fp8_enabled: bool = False,
    fp8_calibrating: bool = False,
    fp8_recipe: Any = None,
    fp8_group: Any = None,
    fp8_weight_caching: bool = False,
    pool: Any = None,
    *,
    enabled: Optional[bool] = None,
    recipe: Any = None,
) -> Any:
    """Capture each module's forward and backward in CUDA graphs (TE's name and leading arguments).

    The quantized recipe is ``recipe`` (or ``fp8_recipe``) when ``enabled`` (or ``fp8_enabled``), the
    default recipe if none is given. Warm-up iterations run the first forward, so meta-built modules are
    materialized and fused before capture. Each returned module replays its graphs in training (grad
    enabled) and runs eagerly, under the same recipe, otherwise; every call first checks a
    :class:`CaptureGuard` and raises :class:`GraphInvalidatedError` if the module has changed.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("make_graphed_callables: CUDA graphs need a CUDA device; torch reports none")
    if fp8_calibrating or fp8_weight_caching or fp8_group is not None:
        raise NotImplementedError("make_graphed_callables: fp8_calibrating, fp8_weight_caching and fp8_group are "
                                  "not supported by refops")
    quantized = bool(enabled if enabled is not None else fp8_enabled)
    chosen = (recipe if recipe is not None else fp8_recipe) if quantized else None
    if quantized and chosen is None:
        chosen = get_default_recipe()
    _check_capturable(chosen)
    single = isinstance(modules, torch.nn.Module)
    module_list = [modules] if single else list(modules)
    args_list = [sample_args] if single else list(sample_args)
    kwargs_list = None
    if sample_kwargs is not None:
        kwargs_list = [sample_kwargs] if single else list(sample_kwargs)
    context: Callable[[], Any] = (lambda: autocast(enabled=True, recipe=chosen)) if quantized else contextlib.nullcontext
    options: dict[str, Any] = {"num_warmup_iters": num_warmup_iters, "allow_unused_input": allow_unused_input}
    if kwargs_list is not None:  # newer torch only: pass it only when used
        options["sample_kwargs"] = tuple(kwargs_list)
    if pool is not None:
        options["pool"] = pool
    with context():
        graphed = torch.cuda.make_graphed_callables(tuple(module_list), tuple(tuple(a) for a in args_list), **options)
    for module in graphed:
        _install_guard(module, chosen, quantized, context)
    return graphed[0] if single else graphed


def _install_guard(module: torch.nn.Module, recipe: Any, quantized: bool, context: Callable[[], Any]) -> None:
    """Wrap the graphed forward so that every call checks the capture's assumptions first."""
    guard = CaptureGuard.capture(module, recipe)
    replay = module.forward

    def guarded_forward(*args: Any, **kwargs: Any) -> Any:
        guard.check(module, recipe)
        with context():  # an eager (no-grad or eval) call quantizes as the capture did
            return replay(*args, **kwargs)

    module.forward = guarded_forward  # type: ignore[method-assign]
    module.refops_capture_guard = guard  # type: ignore[attr-defined]
