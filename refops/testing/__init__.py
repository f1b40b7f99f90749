"""The oracle: helpers for comparing implementations with the reference.

Start with :func:`check_quantizer` (a quantizing kernel against the reference, bit for bit,
on adversarial inputs), then :func:`compare_modules` / :func:`compare_backends` (whole modules,
under the three-tier policy, with a report of which tiers ran) and :func:`check_lifecycle`.
"""

from .quantizers import QuantizerCheckReport, QuantizerMismatch, check_quantizer
from .modules import ComparisonReport, TierRun, compare_backends, compare_modules, recipe_tols
from .recipes import RECIPE_NAMES, make_recipe
from .tensor_report import TensorComparison, compare_tensors, sqnr_db
from .lifecycle import LifecycleReport, PropertyResult, Status, check_lifecycle
from .tolerances import dtype_tols, gemm_tols, quantization_tols

__all__ = ["RECIPE_NAMES", "make_recipe", "dtype_tols", "gemm_tols", "quantization_tols"]
__all__ += ["check_lifecycle", "LifecycleReport", "PropertyResult", "Status"]
__all__ += ["check_quantizer", "QuantizerCheckReport", "QuantizerMismatch", "TierRun"]
__all__ += ["ComparisonReport", "compare_backends", "compare_modules", "recipe_tols", "TensorComparison", "compare_tensors", "sqnr_db"]
