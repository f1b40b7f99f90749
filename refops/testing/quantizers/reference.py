"""The reference's side of a :func:`refops.testing.check_quantizer` run: which quantizer, set up how, and what it gives.

The reference quantizes every case once, on the contiguous input, in the
orientations asked for; each run of the candidate (either orientation, any input
layout) gets a fresh copy of the case's quantizer, so that nothing one call does
to it reaches the next.
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Sequence, Union

import torch

from ...quantization import Float8Quantizer, NVFP4Quantizer, Quantizer
from ...quantization.quantizer import QuantizerRole
from ...quantization.recipe_state import RecipeState
from ...recipe import Recipe
from . import amax as amax_check
from .cases import QuantizerCase, multiplier_for_amax
from .compare import first_line

__all__ = ["reference_quantizer", "describe_quantizer", "case_quantizer", "reference_outputs"]


def reference_quantizer(quantizer_or_recipe: Union[Quantizer, Recipe], role: str) -> Quantizer:
    """The quantizer to check against: the one given, or the recipe's quantizer for ``role``."""
    if isinstance(quantizer_or_recipe, Quantizer):
        if role != "input":
            raise ValueError(
                f"check_quantizer: role={role!r} chooses a recipe's quantizer; a quantizer "
                f"({type(quantizer_or_recipe).__name__}) is checked as given, so leave role out"
            )
        quantizer = quantizer_or_recipe
    elif isinstance(quantizer_or_recipe, Recipe):
        if role not in ("input", "weight", "grad_output"):
            raise ValueError(f"check_quantizer: role must be 'input', 'weight' or 'grad_output', got {role!r}")
        mode = "backward" if role == "grad_output" else "forward"
        state = RecipeState.create(
            quantizer_or_recipe, mode=mode, num_quantizers=1, roles=[QuantizerRole(module_type="linear", tensor_type=role)],
            device=torch.device("cpu"),
        )
        quantizer = state.make_quantizer(0)
    else:
        raise TypeError(
            f"check_quantizer: expected a refops Quantizer or Recipe, got {type(quantizer_or_recipe).__name__}"
        )
    if isinstance(quantizer, NVFP4Quantizer) and quantizer.stochastic_rounding:
        raise ValueError(
            "check_quantizer: stochastic rounding draws random bits and cannot be compared bit for bit; "
            "check an NVFP4Quantizer(stochastic_rounding=False) (or another role) instead"
        )
    return quantizer


def describe_quantizer(q: Quantizer) -> str:
    """``Float8BlockQuantizer(dtype=kFloat8E4M3, force_pow_2_scales=True, block_scaling_dim=1)``: the class
    and the options that change the numerics (off-by-default flags only when set)."""
    options = []
    for name in ("dtype", "force_pow_2_scales", "amax_epsilon", "block_scaling_dim", "with_2d_quantization",
                 "with_rht", "row_scaled_nvfp4", "nvfp4_use_4over6"):
        value = getattr(q, name, None)
        always_shown = name in ("dtype", "force_pow_2_scales", "block_scaling_dim")
        if value is None or (not always_shown and not value):
            continue
        options.append(f"{name}={value.name if name == 'dtype' else value}")
    return f"{type(q).__name__}({', '.join(options)})"


def case_quantizer(reference: Quantizer, x: torch.Tensor, case: QuantizerCase, *usages: str) -> Quantizer:
    """A fresh quantizer for one run: these usages; for delayed scaling, the scale this case casts with;
    a zero amax where the scheme records one."""
    if isinstance(reference, Float8Quantizer):
        amax = _amax_skipping_nan(x) * case.amax_factor
        scale = torch.tensor([multiplier_for_amax(reference, amax, x.dtype)], dtype=torch.float32, device=x.device)
        q = Float8Quantizer(scale, torch.zeros(1, device=x.device), reference.dtype)
    else:
        q = copy.deepcopy(reference)
    q.set_usage(rowwise="rowwise" in usages, columnwise="columnwise" in usages)
    amax_check.reset_recorded(q)
    return q


def reference_outputs(reference: Quantizer, case: QuantizerCase, x: torch.Tensor, usages: Sequence[str]):
    """``{usage: (QuantizedTensor or the reference's error, the amax its quantizer recorded or None)}``:
    both usages at once, or one by one if that fails."""
    try:
        q = case_quantizer(reference, x, case, *usages)
        both = q(x.clone())
        return dict.fromkeys(usages, (both, _recorded_amax(q)))
    except Exception:  # noqa: BLE001  (one usage may be what the reference rejects: try each alone)
        pass
    out: dict[str, Any] = {}
    for usage in usages:
        try:
            q = case_quantizer(reference, x, case, usage)
            out[usage] = (q(x.clone()), _recorded_amax(q))
        except Exception as error:  # noqa: BLE001  (recorded: the reference rejects this input)
            out[usage] = (first_line(error), None)
    return out


def _recorded_amax(q: Quantizer) -> Optional[torch.Tensor]:
    return q.amax.detach().clone() if amax_check.records_amax(q) else None


def _amax_skipping_nan(x: torch.Tensor) -> float:
    """``max |x|`` skipping NaN (0 for all-NaN), as the quantizers take it."""
    a = x.detach().float().abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return float(a.max()) if a.numel() else 0.0
