"""The oracle: helpers for comparing implementations with the reference."""

from .recipes import RECIPE_NAMES, make_recipe
from .conformance import LifecycleReport, PropertyResult, Status, check_lifecycle
from .tolerances import dtype_tols, gemm_tols, quantization_tols

__all__ = ["RECIPE_NAMES", "make_recipe", "dtype_tols", "gemm_tols", "quantization_tols"]
__all__ += ["check_lifecycle", "LifecycleReport", "PropertyResult", "Status"]
