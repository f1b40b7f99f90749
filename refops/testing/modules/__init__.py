"""The module tier: whole modules (or backends) against the reference, judged by numerics-grounded criteria."""

from .compare import ComparisonReport, TierRun, compare_backends, compare_modules, recipe_tols
from .metamorphic import METAMORPHIC_CHECKS
from .scenarios import SCENARIOS

__all__ = ["METAMORPHIC_CHECKS", "SCENARIOS", "ComparisonReport", "TierRun", "compare_backends", "compare_modules", "recipe_tols"]
