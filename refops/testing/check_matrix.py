"""The differential matrix, op x recipe x dtype: :func:`run_check_matrix` (``python -m refops check`` prints it).

With a GPU and the fast path (:func:`check_target`): the fast path against the reference (quantization
bit-exact, GEMMs within the recipe's tolerance; a quantized pipeline above the 20 dB
SQNR floor of ``compare_modules``). Otherwise: the reference
against plain float64 torch on quantize-dequantized inputs (TE's method): high
precision within TE's dtype tolerances (the loose MLP tolerances for the whole
pipeline), quantized cases above an SQNR floor (18 dB for FP8, 10 dB for NVFP4).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional, Sequence

import torch

from .. import ops as refops_ops
from ..kernels.registry import available_backends, get_backend
from ..quantization.recipe_state import RecipeState
from ..quantization.state import autocast
from .modules import compare_backends, compare_modules
from .recipes import RECIPE_NAMES, make_recipe

__all__ = ["CASES", "DTYPES", "CaseResult", "CheckTarget", "check_target", "run_check_matrix"]

H = 128  # every block size divides it

#: The matrix checks kernels, one fresh step each: the training scenarios and metamorphic checks are the module
#: oracle's (``compare_modules``' defaults), not this differential check's.
ONE_STEP = {"scenarios": ("one step",), "metamorphic": False}


def _mlp(device, dtype):
    return refops_ops.Sequential(
        refops_ops.LayerNorm(H, device=device, dtype=dtype),
        refops_ops.Linear(H, 2 * H, device=device, dtype=dtype),
        refops_ops.GELU(),
        refops_ops.Linear(2 * H, H, device=device, dtype=dtype),
    )


def _torch_mlp(device):
    return torch.nn.Sequential(
        torch.nn.LayerNorm(H, device=device, dtype=torch.float64),
        torch.nn.Linear(H, 2 * H, device=device, dtype=torch.float64),
        torch.nn.GELU(approximate="tanh"),
        torch.nn.Linear(2 * H, H, device=device, dtype=torch.float64),
    )


class _SwiGLU64(torch.nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(a) * b


#: name -> (refops factory(device, dtype), float64 torch factory(device), pipeline?)
CASES: dict[str, tuple[Callable, Callable, bool]] = {
    "linear": (
        lambda d, t: refops_ops.Linear(H, H, device=d, dtype=t),
        lambda d: torch.nn.Linear(H, H, device=d, dtype=torch.float64),
        False,
    ),
    "layer_norm": (
        lambda d, t: refops_ops.LayerNorm(H, device=d, dtype=t),
        lambda d: torch.nn.LayerNorm(H, device=d, dtype=torch.float64),
        False,
    ),
    "rms_norm": (
        lambda d, t: refops_ops.RMSNorm(H, device=d, dtype=t),
        lambda d: torch.nn.RMSNorm(H, device=d, dtype=torch.float64, eps=1e-5),
        False,
    ),
    "gelu": (lambda d, t: refops_ops.GELU(), lambda d: torch.nn.GELU(approximate="tanh"), False),
    "swiglu": (lambda d, t: refops_ops.SwiGLU(), lambda d: _SwiGLU64(), False),
    "mlp": (_mlp, _torch_mlp, True),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: TE's loose tolerances for whole pipelines (test_layernorm_mlp).
LOOSE_TOLS = dict(rtol=0.25, atol=0.5)


@dataclasses.dataclass
class CaseResult:
    """One case of the matrix: its op, recipe ("none": high precision) and dtype, the verdict, the comparison
    furthest from passing, and the time it took."""

    op: str
    recipe: str
    dtype: str
    passed: bool
    worst: str
    seconds: float
    #: What the worst comparison measured, with its criterion in brackets: a pass gives the share of the tolerance
    #: its worst element used (element-wise tiers) or the SQNR; a failure the max abs/rel errors and elements out.
    error: str = ""
    #: Why the case did not run ("" when it ran).
    skipped: str = ""


def _skip_reason(recipe_name: Optional[str], dtype_name: str) -> str:
    """Why a case of the matrix does not run ("" when it does)."""
    if recipe_name is not None and dtype_name == "float32" and recipe_name.startswith("nvfp4"):
        return "NVFP4 is checked in bfloat16 only, as TE's tests do"
    return ""


def _distance(c) -> float:
    """How close a comparison is to failing, larger is closer: minus the SQNR ('sqnr' tier), the share of its
    bound the worst element uses (element-wise tiers; the largest relative error where that is not known)."""
    if c.tier == "sqnr":
        return -c.sqnr_db
    return c.max_rel_error if c.tolerance_used is None else c.tolerance_used


def _worst(report):
    """The comparison furthest from passing: among the failures if any, else among the comparisons of the
    output's tier, the one closest to its limit (:func:`_distance`)."""
    tier = report["output"].tier
    same = report.failures or [c for c in report.comparisons if c.tier == tier] or report.comparisons
    return max(same, key=_distance)


def _error_size(c) -> str:
    """What the comparison measured, against its criterion. A pass says how close it came (the share of the
    tolerance the worst element used, or the SQNR): a relative error of a tiny element says nothing there.
    A failure adds the raw errors and how many elements are out."""
    if c.tier == "sqnr":
        quality = "identical" if math.isinf(c.sqnr_db) and c.sqnr_db > 0 else f"{c.sqnr_db:.1f} dB"
        return f"{quality} [{c.criterion}]"
    if c.passed:
        if c.max_abs_error == 0:
            return f"identical [{c.criterion}]"
        if c.tolerance_used is not None:
            return f"{_share(c.tolerance_used)} of the tolerance [{c.criterion}]"
    out = f", {c.num_mismatches}/{c.numel} elements out" if c.num_mismatches else ""
    return f"max_abs={c.max_abs_error:.2e} max_rel={c.max_rel_error:.2e}{out} [{c.criterion}]"


def _share(used: float) -> str:
    """``0.004`` -> ``"0.4%"``, ``0.35`` -> ``"35%"``: two significant digits below 10 %, whole percents above,
    ``"under 0.1%"`` below that."""
    percent = 100 * used
    if percent < 0.1:
        return "under 0.1%"
    return f"{percent:.2g}%" if percent < 10 else f"{percent:.0f}%"


def _float64_twin(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Runs in float64 on inputs cast up; returns the output in ``dtype`` (parameter names unchanged)."""
    module.register_forward_pre_hook(lambda m, args: tuple(a.double() for a in args))
    module.register_forward_hook(lambda m, args, out: out.to(dtype))
    return module


def _qdq_input(x: torch.Tensor, recipe) -> torch.Tensor:
    """Make the input exactly representable in the recipe's input format (TE's test method)."""
    if recipe is None:
        return x
    quantizer = RecipeState.create(recipe, mode="forward", num_quantizers=1, device=x.device).make_quantizers()[0]
    quantizer.set_usage(rowwise=True, columnwise=False)
    return quantizer(x).dequantize(dtype=x.dtype)


def _run_case(op: str, recipe_name: Optional[str], dtype: torch.dtype, device: torch.device, fastpath: bool):
    build, build64, pipeline = CASES[op]
    recipe = make_recipe(recipe_name) if recipe_name else None
    x = torch.randn(H, H, device=device, dtype=dtype)
    if fastpath:
        if pipeline and recipe is not None:
            # Downstream of the first GEMM, a sum in cuBLAS's order can round an element to the other side
            # of a quantization step, which the next ops carry into the weight grads: the pipeline is held
            # to an SQNR floor, as tests/fastpath's pipeline suite holds it (the quantized bytes of the
            # input and the weights are still compared exactly).
            return compare_backends(lambda d: build(d, dtype), (x,), recipe=recipe, tier="sqnr",
                                    **ONE_STEP)
        return compare_backends(lambda d: build(d, dtype), (x,), recipe=recipe, tier="tolerance",
                                **ONE_STEP)
    x = _qdq_input(x, recipe)
    candidate = build(device, dtype)
    with torch.no_grad(), autocast(enabled=recipe is not None, recipe=recipe):
        candidate(x)  # materialize (and quantize) before copying parameters out
    if recipe is None:
        return compare_modules(
            candidate, _float64_twin(build64(device), dtype), (x,), tolerances=LOOSE_TOLS if pipeline else None,
            tier="tolerance", **ONE_STEP,
        )
    # Quantized against float64: element-wise tolerances say little about small elements, so
    # every output and grad must clear an SQNR floor (torchao's style; NVFP4 has 4-bit noise).
    floor = 10.0 if recipe_name.startswith("nvfp4") else 18.0
    return compare_modules(
        candidate, _float64_twin(build64(device), dtype), (x,), recipe=recipe, tier="sqnr", sqnr_floor_db=floor,
        **ONE_STEP,
    )


@dataclasses.dataclass(frozen=True)
class CheckTarget:
    """What the matrix compares here: the fast path with the reference on the GPU, or the reference with
    float64 torch."""

    fastpath: bool
    device: torch.device
    #: Why the fast path is not compared although a GPU and the backend are there ("" otherwise).
    fastpath_unavailable: str = ""


def check_target(*, reference_only: bool = False) -> CheckTarget:
    """The fast path on the current CUDA device when there is one and the fast path loads (unless
    ``reference_only``); the reference against float64 torch on the CPU otherwise."""
    if not reference_only and torch.cuda.is_available() and "fastpath" in available_backends():
        try:
            get_backend("fastpath")
        except RuntimeError as exc:
            return CheckTarget(False, torch.device("cpu"), str(exc))
        return CheckTarget(True, torch.device("cuda"))
    return CheckTarget(False, torch.device("cpu"))


#: ``progress(done, total, label)``, called after each case that runs.
ProgressCallback = Callable[[int, int, str], None]


def run_check_matrix(
    device: torch.device,
    *,
    fastpath: bool,
    ops: Optional[Sequence[str]] = None,
    recipes: Optional[Sequence[str]] = None,
    dtypes: Optional[Sequence[str]] = None,
    progress: Optional[ProgressCallback] = None,
) -> list[CaseResult]:
    """Run every case of :data:`CASES` x (no recipe + ``recipes``) x ``dtypes`` (None: all); the cases that ran,
    then the skipped ones (each with its reason).

    Args:
        device: where the cases run (:func:`check_target` chooses it with ``fastpath``).
        fastpath: compare the fast path with the reference (``compare_backends``); otherwise the reference with
            a float64 torch twin on quantize-dequantized inputs.
        ops, recipes, dtypes: only these names of :data:`CASES`, ``refops.testing.RECIPE_NAMES`` and
            :data:`DTYPES` (high precision always runs).
        progress: ``progress(done, total, label)`` after each case that runs.

    Raises:
        ValueError: an unknown op, recipe or dtype name.
    """
    for what, given, known in (("op", ops, tuple(CASES)), ("recipe", recipes, RECIPE_NAMES),
                               ("dtype", dtypes, tuple(DTYPES))):
        unknown = [g for g in given or () if g not in known]
        if unknown:
            raise ValueError(f"run_check_matrix: unknown {what} {unknown[0]!r}; known: {list(known)}")
    names = [n for n in CASES if not ops or n in ops]
    recipe_names = [None] + [r for r in RECIPE_NAMES if not recipes or r in recipes]
    dtype_names = [d for d in DTYPES if not dtypes or d in dtypes]
    planned = [(o, r, d) for o in names for r in recipe_names for d in dtype_names]
    skipped = [
        CaseResult(o, r or "none", d, False, "", 0.0, skipped=_skip_reason(r, d))
        for o, r, d in planned
        if _skip_reason(r, d)
    ]
    cases = [(o, r, d) for o, r, d in planned if not _skip_reason(r, d)]
    results = []
    for done, (op, recipe_name, dtype_name) in enumerate(cases, 1):
        start = time.perf_counter()
        torch.manual_seed(0)
        report = _run_case(op, recipe_name, DTYPES[dtype_name], device, fastpath)
        worst = _worst(report)
        result = CaseResult(op, recipe_name or "none", dtype_name, report.ok, worst.name, time.perf_counter() - start,
                            error=_error_size(worst))
        results.append(result)
        if progress is not None:
            progress(done, len(cases), f"{op} {result.recipe} {dtype_name}: {'ok' if result.passed else 'FAIL'}")
    return results + skipped
