"""TransformerEngine's conformance to refops: every tier of the oracle with TE's own objects as the candidates.

:func:`run_conformance` runs the quantizer, module and lifecycle tiers against the installed TE on this
GPU and returns a :class:`ConformanceRecord`: one :class:`TierTable` per tier, each row pass or fail with
its evidence, what was not run and why, and the environment (TE's version, the GPU, refops' commit).
``python -m refops conformance`` is the same run from the command line (``docs/conformance.md``)::

    from refops.testing.conformance import (
        ConformanceUnavailable, run_conformance)

    try:
        record = run_conformance(
            tiers=["quantizers"], recipes=["fp8_current_scaling"])
    except ConformanceUnavailable as error:  # no CUDA GPU, no TE
        print(error)
    else:
        record.write("conformance-record")  # .md and .json
"""

from .record import RECORD_FILES, ConformanceRecord, NotRun, Row, TierTable
from .run_setup import DTYPES, QUANTIZER_RECIPES, TIERS, ConformanceError, Planned, Setup, gemm_numerics_function
from .runner import (
    ConformancePlan,
    ConformanceUnavailable,
    DeviceInfo,
    detect_device,
    plan_conformance,
    run_conformance,
)
from .tiers import LIFECYCLE_CRITERION, MODULE_CRITERION, QUANTIZER_CRITERION, RECIPE_CHOICES, ProgressCallback

__all__ = [
    "run_conformance",
    "plan_conformance",
    "ConformancePlan",
    "ConformanceRecord",
    "TierTable",
    "Row",
    "NotRun",
    "RECORD_FILES",
    "ConformanceError",
    "ConformanceUnavailable",
    "DeviceInfo",
    "detect_device",
    "Setup",
    "Planned",
    "ProgressCallback",
    "TIERS",
    "DTYPES",
    "QUANTIZER_RECIPES",
    "RECIPE_CHOICES",
    "QUANTIZER_CRITERION",
    "MODULE_CRITERION",
    "LIFECYCLE_CRITERION",
    "gemm_numerics_function",
]
