"""Checks that need no reference: relations the candidate's own runs must keep, bit for bit.

(The same values in another memory layout are not among them: a correct GEMM may pick another algorithm, and
so another summation order, for a transposed operand, as torch's and cuBLAS's do. The "input layouts" scenario
judges those runs against the reference instead, :mod:`.scenarios`.)

Each runs a fresh copy of the candidate (a ``deepcopy`` taken before the training script) through the first
step of the script, from the same generator state, and compares it with the candidate's own first step:

* ``"same inputs twice"``: the same inputs give the same bits (no stale state, no uninitialized memory read);
* ``"dy x 2^3"``: under a recipe whose scales follow the tensor (none, per-tensor current scaling, MXFP8, FP8
  blocks), an output grad scaled by a power of two scales every grad by exactly that power with the same
  codes (elements that are subnormal in their dtype excepted); a grad cast with a scale that is not its own
  breaks it. Not in float16: its normal range starts at 2^-14, so the backward's intermediate grads (a GELU's
  dgrad, say) are subnormal in one run and normal in the other, and a correct candidate's final grads differ
  in their last bit (TransformerEngine 2.20.2's Linear-GELU-Linear, 1 element in 16384, on an H100).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch

from ...recipe import Float8BlockScaling, Float8CurrentScaling, MXFP8BlockScaling, Recipe
from ..tensor_report import TensorComparison, compare_tensors
from .scenarios import Key
from .sides import Side, deepcopy_module

__all__ = ["METAMORPHIC_CHECKS", "run_metamorphic"]

METAMORPHIC_CHECKS = ("same inputs twice", "dy x 2^3")
GRAD_POWER = 3

_WHY = {
    "same inputs twice": "the candidate's {t} differs between two runs of the same inputs from the same state: it "
                         "reads state or memory the inputs do not determine",
    "dy x 2^3": "scaling the output grad by 2^3 did not scale the candidate's {t} by exactly 2^3: a grad quantized "
                "with a scale that is not its own (stale, or another tensor's)",
}


def _scales_follow_the_tensor(recipe: Optional[Recipe]) -> bool:
    return recipe is None or isinstance(recipe, (Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling))


def run_metamorphic(snapshot: Optional[torch.nn.Module], context: Callable[[], ContextManager[Any]],
                    inputs: Sequence[Any], dy: torch.Tensor, first_step: dict[Key, torch.Tensor], seed: int,
                    recipe: Optional[Recipe]) -> tuple[list[TensorComparison], list[str]]:
    """The comparisons of every check that applies, and a line for each that could not run, with the reason."""
    if snapshot is None:
        return [], ["the candidate could not be deep-copied, so no metamorphic check ran"]
    not_run = []
    checks: dict[str, tuple[list[Any], float]] = {"same inputs twice": (list(inputs), 1.0)}
    if not _scales_follow_the_tensor(recipe):
        not_run.append(f"dy x 2^3: {type(recipe).__name__}'s scales do not follow the tensor alone")
    elif dy.dtype == torch.float16:
        not_run.append("dy x 2^3: in float16 the backward's intermediate grads leave the normal range (from 2^-14) "
                       "when scaled, so exact scaling is not a property of correct code")
    else:
        checks["dy x 2^3"] = (list(inputs), 2.0 ** GRAD_POWER)
    out = []
    for check, (xs, factor) in checks.items():
        try:
            got = _first_step(snapshot, context, xs, (dy.double() * factor).to(dy.dtype), seed)
        except Exception as error:  # noqa: BLE001 - the check could not run: say so, do not guess
            not_run.append(f"{check}: the candidate's rerun raised {type(error).__name__}: {error}")
            continue
        for tensor, expected in ((k[2], v) for k, v in first_step.items()):
            if tensor not in got:
                continue
            scale = 1.0 if tensor == "output" else factor
            out.append(_exactly(check, tensor, got[tensor], expected, scale))
    return out, not_run


def _first_step(snapshot: torch.nn.Module, context: Callable[[], ContextManager[Any]], inputs: Sequence[Any],
                dy: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """The script's first step, rerun on a fresh copy of the candidate from the same generator state."""
    side = Side("candidate", deepcopy_module(snapshot), context)
    torch.manual_seed(seed + 1)
    side.clear_grads()
    y, _ = side.forward(inputs)
    grads = side.backward(dy)
    side.done()
    got = {"output": y.detach()}
    got.update({f"input[{i}].grad": g for i, g in enumerate(grads) if g is not None})
    got.update({(n if n.endswith(".main_grad") else f"{n}.grad"): g for n, g in side.parameter_grads().items()
                if g is not None})
    return got


def _exactly(check: str, tensor: str, got: torch.Tensor, expected: torch.Tensor, scale: float) -> TensorComparison:
    a, e = got.detach().double().cpu(), expected.detach().double().cpu() * scale
    if scale != 1.0 and expected.is_floating_point():
        # Subnormals of the dtype round differently once scaled: compare the normal elements only.
        normal = expected.detach().abs().cpu() >= torch.finfo(expected.dtype).tiny
        a, e = torch.where(normal, a, 0.0), torch.where(normal, e, 0.0)
    result = compare_tensors(f"{check}: {tensor}", a, e, tier="exact")
    return dataclasses.replace(result, tier="metamorphic", kind="metamorphic", criterion=f"bit for bit with the candidate's own first "
                               f"step{'' if scale == 1.0 else f' x {scale:g}'}",
                               why="" if result.passed else "why: " + _WHY[check].format(t=tensor))
