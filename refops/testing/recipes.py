"""Recipes by name, as TransformerEngine's tests build them (``make_recipe``), and what differs in them from the
recipes' defaults (``recipe_settings``).

``check``, ``conformance`` and ``trace --recipe`` run TE's *test* recipes (E4M3 FP8, a delayed-scaling history
of 8, NVFP4 without the random Hadamard transform, stochastic rounding or 2D weight blocks), not the recipes'
defaults; they print :func:`recipe_settings` to say which fields differ.
"""

from __future__ import annotations

import dataclasses
import enum

from ..recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)

__all__ = ["RECIPE_NAMES", "make_recipe", "recipe_settings", "TEST_RECIPES_NOTE"]

#: Every recipe name :func:`make_recipe` knows, FP8 first.
RECIPE_NAMES = (
    "fp8_delayed_scaling",
    "fp8_current_scaling",
    "mxfp8",
    "fp8_block_scaling",
    "nvfp4",
    "nvfp4_4over6",
)


def make_recipe(name: str) -> Recipe:
    """TE's test recipes: E4M3 FP8 (delayed with a history of 8), and NVFP4 without RHT or SR."""
    if name == "fp8_delayed_scaling":
        return DelayedScaling(fp8_format=Format.E4M3, amax_history_len=8)
    if name == "fp8_current_scaling":
        return Float8CurrentScaling(fp8_format=Format.E4M3)
    if name == "mxfp8":
        return MXFP8BlockScaling(fp8_format=Format.E4M3)
    if name == "fp8_block_scaling":
        return Float8BlockScaling()
    if name in ("nvfp4", "nvfp4_4over6"):
        four_over_six = name == "nvfp4_4over6"
        return NVFP4BlockScaling(
            disable_rht=True,
            disable_stochastic_rounding=True,
            disable_2d_quantization=not four_over_six,
            nvfp4_4over6="all" if four_over_six else "none",
        )
    raise ValueError(f"unknown recipe name {name!r}; known: {RECIPE_NAMES}")


#: The sentence that introduces the settings in the commands' output.
TEST_RECIPES_NOTE = "TE's test settings (refops.testing.make_recipe), not the recipe defaults"


def _show(value: object) -> str:
    return value.name if isinstance(value, enum.Enum) else repr(value)


def recipe_settings(name: str) -> str:
    """``"NVFP4BlockScaling(disable_rht=True, ...)"``: the recipe ``make_recipe(name)`` builds, with the
    constructor fields that differ from the class's defaults (``"MXFP8BlockScaling() (the defaults)"`` when none)."""
    recipe = make_recipe(name)
    defaults = type(recipe)()
    changed = [
        f"{f.name}={_show(getattr(recipe, f.name))}"
        for f in dataclasses.fields(recipe)
        if f.init and getattr(recipe, f.name) != getattr(defaults, f.name)
    ]
    text = f"{type(recipe).__name__}({', '.join(changed)})"
    return text if changed else f"{text} (the defaults)"
