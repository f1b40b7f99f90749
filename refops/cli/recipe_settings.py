"""What the commands say about the recipes they run: the settings of ``refops.testing.make_recipe``.

``check`` and ``trace --recipe`` run TE's *test* recipes (``make_recipe``: E4M3 FP8, a delayed-
scaling history of 8, NVFP4 without the random Hadamard transform, stochastic rounding or 2D
weight blocks), not the recipes' defaults; the commands print which fields differ from the defaults.
"""

from __future__ import annotations

import dataclasses
import enum

from ..testing.recipes import make_recipe

__all__ = ["recipe_settings", "TEST_RECIPES_NOTE"]

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
