"""The delayed-scaling recipe update (``docs/recipes/delayed-scaling.md#the-arithmetic``) as one kernel of the
interface, in torch: the code ``DelayedScalingRecipeState.update_scales`` ran before it became
``KernelBackend.delayed_scaling_update``, whose docstring states the update."""

from __future__ import annotations

import torch

from ...formats import FLT_MAX

__all__ = ["delayed_scaling_update", "nan_skipping_max", "scale_from_amax"]


def nan_skipping_max(rows: torch.Tensor) -> torch.Tensor:
    """Column max of ``rows`` (L, n) that skips NaN: TE's kernel folds ``fmaxf`` from 0, so an all-NaN
    column gives 0 (and the scale stays)."""
    return torch.fmax(rows, torch.zeros_like(rows[:1])).amax(dim=0)


def scale_from_amax(amax: torch.Tensor, old: torch.Tensor, numerator: float) -> torch.Tensor:
    """``RN(numerator / amax)`` (+inf -> FLT_MAX) where ``amax`` is finite and positive, else ``old``."""
    # A filled tensor, not torch.tensor(value, device=cuda): that is a blocking host-to-device copy, one per
    # update. ``numerator / amax`` with a Python float would not do: torch computes it as
    # ``numerator * reciprocal(amax)``. 0-D, so type promotion with an ``amax`` of another dtype is as it was.
    num = torch.full((), numerator, dtype=torch.float32, device=amax.device)
    scale = num / amax
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FLT_MAX), scale)
    valid = torch.isfinite(amax) & (amax > 0)
    return torch.where(valid, scale, old)


def delayed_scaling_update(
    amax_history: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, *, numerator: float, algorithm: str
) -> None:
    """``KernelBackend.delayed_scaling_update`` (its docstring is the contract), in place: every slot's new
    history and scale are computed first, then written where the slot was used (``amax != 0``), so ``amax``
    may be a view of ``amax_history``'s row 0."""
    used = amax != 0
    rolled = torch.zeros_like(amax_history)
    if amax_history.shape[0] > 1:
        rolled[1:-1] = amax_history[2:]
        rolled[-1] = amax
    if algorithm == "max":
        current = nan_skipping_max(torch.cat([amax_history[1:], amax.unsqueeze(0)]))
    elif algorithm == "most_recent":
        current = amax
    else:
        raise ValueError(f"delayed_scaling_update: algorithm must be 'max' or 'most_recent', got {algorithm!r}")
    new_scale = scale_from_amax(current, scale, numerator)
    amax_history.copy_(torch.where(used, rolled, amax_history))
    scale.copy_(torch.where(used, new_scale, scale))
