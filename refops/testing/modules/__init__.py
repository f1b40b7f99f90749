"""The module tier: whole modules (or backends) against the reference, judged by numerics-grounded criteria."""

from .compare import ComparisonReport, TierRun, compare_backends, compare_modules, recipe_tols

__all__ = ["ComparisonReport", "TierRun", "compare_backends", "compare_modules", "recipe_tols"]
