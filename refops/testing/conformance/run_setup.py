"""What every tier of a conformance run shares: the run's setup, the recipe variants and what this GPU cannot
run, a planned row, and how a row that raised is reported."""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Callable, Optional

import torch


from ... import kernels
from ...recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)
from ..recipes import make_recipe
from ..transformer_engine import PIPELINES, TransformerEngine
from .record import Row

__all__ = [
    "Setup", "ConformanceError", "QUANTIZER_RECIPES", "DTYPES", "TIERS", "Planned", "unsupported_reason",
    "gemm_numerics_function", "EVIDENCE_CHARS", "clip", "raised_row",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TIERS = ("quantizers", "modules", "lifecycle")
BATCH = 128  # rows of the module tier's input: a multiple of every block size
HIDDEN = 128
#: The most characters of one property's evidence a lifecycle row shows (the JSON keeps all of it).
EVIDENCE_CHARS = 400
#: The module tier's column of bit-identical shares (with ``--gemm-numerics``).
SHARE_COLUMN = "bit-identical elements (reference under gemm_numerics)"


class ConformanceError(RuntimeError):
    """The run cannot start (an option this refops or this TE cannot honour); the message says why."""


@dataclasses.dataclass
class Setup:
    """What the run compares, where, and with which TE."""

    te: TransformerEngine
    device: torch.device
    #: The GPU's compute capability, e.g. ``(9, 0)`` for an H200.
    capability: tuple[int, int]
    #: The recipes selected (names of ``refops.testing.make_recipe``); ``high_precision``: also no recipe.
    recipes: list[str]
    high_precision: bool = True
    dtypes: list[str] = dataclasses.field(default_factory=lambda: list(DTYPES))
    pipelines: list[str] = dataclasses.field(default_factory=lambda: list(PIPELINES))
    lifecycle_ops: Optional[tuple[str, ...]] = None
    gemm_numerics: Optional[str] = None
    seed: int = 0


# ----------------------------------------------------------------------------- recipes
def _variant(base: str, make: Callable[[], Recipe], what: str) -> tuple[str, Callable[[], Recipe], str]:
    return base, make, what


#: The quantizer tier's recipes: TE's test recipes (``make_recipe``) and variants that reach the other
#: options (E5M2 grads, power-of-two or fp32 scales, 2D blocks, the Hadamard transform, row scaling),
#: each ``name: (base recipe name, factory, what it adds)``; ``--recipes`` selects by base name.
QUANTIZER_RECIPES: dict[str, tuple[str, Callable[[], Recipe], str]] = {
    "fp8_delayed_scaling": _variant("fp8_delayed_scaling", lambda: make_recipe("fp8_delayed_scaling"), "E4M3"),
    "fp8_delayed_scaling+hybrid": _variant(
        "fp8_delayed_scaling", lambda: DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=8), "E5M2 grads"),
    "fp8_current_scaling": _variant("fp8_current_scaling", lambda: make_recipe("fp8_current_scaling"), "E4M3"),
    "fp8_current_scaling+hybrid": _variant(
        "fp8_current_scaling", lambda: Float8CurrentScaling(fp8_format=Format.HYBRID), "E5M2 grads"),
    "fp8_current_scaling+pow2": _variant(
        "fp8_current_scaling", lambda: Float8CurrentScaling(fp8_format=Format.E4M3, use_power_2_scales=True),
        "power-of-two scales"),
    "mxfp8": _variant("mxfp8", lambda: make_recipe("mxfp8"), "1D blocks"),
    "mxfp8+2d": _variant("mxfp8", lambda: MXFP8BlockScaling(enable_2d_quantization=True), "2D weight blocks"),
    "fp8_block_scaling": _variant("fp8_block_scaling", lambda: make_recipe("fp8_block_scaling"),
                                  "1x128 inputs and grads, 128x128 weights"),
    "fp8_block_scaling+f32_scales": _variant(
        "fp8_block_scaling", lambda: Float8BlockScaling(use_f32_scales=True), "fp32 (not power-of-two) scales"),
    "fp8_block_scaling+2d_inputs": _variant(
        "fp8_block_scaling", lambda: Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=1),
        "128x128 inputs, 1x128 weights"),
    "nvfp4": _variant("nvfp4", lambda: make_recipe("nvfp4"), "no RHT, no stochastic rounding, 1D blocks"),
    "nvfp4+defaults": _variant(
        "nvfp4", lambda: NVFP4BlockScaling(disable_rht=False, disable_stochastic_rounding=False,
                                           disable_2d_quantization=False),
        "the defaults: RHT on column-wise inputs and grads, 2D weights, stochastic rounding of grads"),
    "nvfp4+row_scaled": _variant(
        "nvfp4", lambda: NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True,
                                           row_scaled_activation=True), "row-scaled activations"),
    "nvfp4_4over6": _variant("nvfp4_4over6", lambda: make_recipe("nvfp4_4over6"), "4over6 on every tensor"),
}

#: TE's availability check of each recipe.
_AVAILABILITY = {
    "fp8_delayed_scaling": "is_fp8_available",
    "fp8_current_scaling": "is_fp8_available",
    "mxfp8": "is_mxfp8_available",
    "fp8_block_scaling": "is_fp8_block_scaling_available",
    "nvfp4": "is_nvfp4_available",
    "nvfp4_4over6": "is_nvfp4_available",
}
#: Recipes TE 2.20 runs from compute capability 10.0 only.
_NEEDS_CC_10 = ("mxfp8", "nvfp4", "nvfp4_4over6")


def unsupported_reason(setup: Setup, recipe: str) -> str:
    """Why ``recipe`` is not compared on this GPU ("" when it is)."""
    cc = f"{setup.capability[0]}.{setup.capability[1]}"
    if recipe in _NEEDS_CC_10 and setup.capability < (10, 0):
        return (f"needs compute capability 10.0 (this GPU: {cc}); below it TE's MXFP8 quantizer returns garbage "
                "and its NVFP4 kernels trap, so nothing is compared against them")
    check = getattr(setup.te.pytorch, _AVAILABILITY[recipe], None) or getattr(
        setup.te.quantization, _AVAILABILITY[recipe], None)
    if check is not None:
        answer = check(return_reason=True)
        ok, why = answer if isinstance(answer, tuple) else (bool(answer), "")
        if not ok:
            return f"TransformerEngine says it cannot run here: {why or 'no reason given'}"
    return ""


def gemm_numerics_function() -> Callable[[str], Any]:
    """``refops.gemm_numerics`` (``refops.kernels``'), looked up when asked for (it may not exist in this refops)."""
    function = getattr(kernels, "gemm_numerics", None)
    if function is None:
        raise ConformanceError(
            "--gemm-numerics needs refops.gemm_numerics(name) (the GEMM numerics modes, 'exact' and 'hopper'), "
            "which this refops does not have; run without --gemm-numerics"
        )
    return function


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:300]}"


def raised_row(cells: dict[str, str], error: BaseException) -> Row:
    return Row(cells, False, f"raised {_first_line(error)}",
               {"traceback": traceback.format_exception(error)[-6:]})



@dataclasses.dataclass
class Planned:
    """One row to run: its cells and how to run it."""

    tier: str
    cells: dict[str, str]
    run: Callable[[], Row]



def clip(text: str, limit: int = EVIDENCE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

