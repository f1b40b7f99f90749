"""``refops check``: the differential matrix, op x recipe x dtype, with progress and a summary table.

With a GPU and the fast path: the fast path against the reference (quantization
bit-exact, GEMMs within the recipe's tolerance; a quantized pipeline above the 20 dB
SQNR floor of ``compare_modules``). Otherwise: the reference
against plain float64 torch on quantize-dequantized inputs (TE's method): high
precision within TE's dtype tolerances (the loose MLP tolerances for the whole
pipeline), quantized cases above an SQNR floor (18 dB for FP8, 10 dB for NVFP4).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Callable, Optional

import torch

from .. import ops
from ..kernels.registry import available_backends, get_backend
from ..quantization.recipe_state import RecipeState
from ..quantization.state import autocast
from ..testing.modules import compare_backends, compare_modules
from ..testing.recipes import RECIPE_NAMES, make_recipe
from .progress import Progress
from .recipe_settings import TEST_RECIPES_NOTE, recipe_settings

__all__ = ["add_parser", "CASES", "run_matrix"]

H = 128  # every block size divides it

#: The matrix checks kernels, one fresh step each: the training scenarios and metamorphic checks are the module
#: oracle's (``compare_modules``' defaults), not this differential check's.
ONE_STEP = {"scenarios": ("one step",), "metamorphic": False}


def _mlp(device, dtype):
    return ops.Sequential(
        ops.LayerNorm(H, device=device, dtype=dtype),
        ops.Linear(H, 2 * H, device=device, dtype=dtype),
        ops.GELU(),
        ops.Linear(2 * H, H, device=device, dtype=dtype),
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
        lambda d, t: ops.Linear(H, H, device=d, dtype=t),
        lambda d: torch.nn.Linear(H, H, device=d, dtype=torch.float64),
        False,
    ),
    "layer_norm": (
        lambda d, t: ops.LayerNorm(H, device=d, dtype=t),
        lambda d: torch.nn.LayerNorm(H, device=d, dtype=torch.float64),
        False,
    ),
    "rms_norm": (
        lambda d, t: ops.RMSNorm(H, device=d, dtype=t),
        lambda d: torch.nn.RMSNorm(H, device=d, dtype=torch.float64, eps=1e-5),
        False,
    ),
    "gelu": (lambda d, t: ops.GELU(), lambda d: torch.nn.GELU(approximate="tanh"), False),
    "swiglu": (lambda d, t: ops.SwiGLU(), lambda d: _SwiGLU64(), False),
    "mlp": (_mlp, _torch_mlp, True),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: TE's loose tolerances for whole pipelines (test_layernorm_mlp).
LOOSE_TOLS = dict(rtol=0.25, atol=0.5)


@dataclasses.dataclass
class CaseResult:
    op: str
    recipe: str
    dtype: str
    passed: bool
    worst: str
    seconds: float
    #: The worst comparison's error: max abs/rel error (element-wise tiers) or SQNR, with its criterion.
    error: str = ""
    #: Why the case did not run ("" when it ran).
    skipped: str = ""


def _skip_reason(recipe_name: Optional[str], dtype_name: str) -> str:
    """Why a case of the matrix does not run ("" when it does)."""
    if recipe_name is not None and dtype_name == "float32" and recipe_name.startswith("nvfp4"):
        return "NVFP4 is checked in bfloat16 only, as TE's tests do"
    return ""


def _worst(report):
    """The comparison furthest from passing: among the failures if any, else among the comparisons of the
    output's tier, the largest relative error (element-wise tiers) or the lowest SQNR (the 'sqnr' tier)."""
    tier = report["output"].tier
    same = report.failures or [c for c in report.comparisons if c.tier == tier] or report.comparisons
    return max(same, key=lambda c: -c.sqnr_db if c.tier == "sqnr" else c.max_rel_error)


def _error_size(c) -> str:
    """How far the comparison is from passing, in its own tier's terms."""
    if c.tier == "sqnr":
        return f"sqnr={c.sqnr_db:.1f}dB [{c.criterion}]"
    return f"max_abs={c.max_abs_error:.2e} max_rel={c.max_rel_error:.2e} [{c.criterion}]"


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


def run_matrix(device: torch.device, *, fastpath: bool, ops_filter=None, recipes=None, dtypes=None, progress=None):
    """Run every case, with a progress bar over the cases that run (on ``progress``, default stderr, when it is
    a terminal); returns the run cases, then the skipped ones."""
    names = [n for n in CASES if not ops_filter or n in ops_filter]
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
    bar = Progress(len(cases), stream=progress)
    for op, recipe_name, dtype_name in cases:
        start = time.perf_counter()
        torch.manual_seed(0)
        report = _run_case(op, recipe_name, DTYPES[dtype_name], device, fastpath)
        worst = _worst(report)
        result = CaseResult(op, recipe_name or "none", dtype_name, report.ok, worst.name, time.perf_counter() - start,
                            error=_error_size(worst))
        results.append(result)
        bar.step(f"{op} {result.recipe} {dtype_name}: {'ok' if result.passed else 'FAIL'}")
    bar.close()
    return results + skipped


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="run the differential matrix (fast path vs reference, or reference vs float64)")
    p.add_argument("--ops", nargs="*", choices=sorted(CASES), help="only these ops")
    p.add_argument("--recipes", nargs="*", choices=RECIPE_NAMES, help="only these recipes (plus high precision)")
    p.add_argument("--dtypes", nargs="*", choices=sorted(DTYPES), help="only these dtypes")
    p.add_argument("--reference-only", action="store_true", help="compare with float64 torch even with a GPU")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fastpath = False
    device = torch.device("cpu")
    if not args.reference_only and torch.cuda.is_available() and "fastpath" in available_backends():
        try:
            get_backend("fastpath")
            fastpath, device = True, torch.device("cuda")
        except RuntimeError as exc:
            print(f"fast path unavailable ({exc}); checking the reference against float64 torch")
    mode = "fast path vs reference" if fastpath else "reference vs float64 torch (quantize-dequantized inputs)"
    print(f"refops check: {mode} on {device}")
    ran_recipes = [r for r in RECIPE_NAMES if not args.recipes or r in args.recipes]
    if ran_recipes:
        print(f"recipes: {TEST_RECIPES_NOTE}:")
        for name in ran_recipes:
            print(f"  {name} = {recipe_settings(name)}")
    results = run_matrix(device, fastpath=fastpath, ops_filter=args.ops, recipes=args.recipes, dtypes=args.dtypes)
    ran = [r for r in results if not r.skipped]
    skipped = [r for r in results if r.skipped]
    print(f"{'op':<12}{'recipe':<22}{'dtype':<10}{'result':<8}{'seconds':>8}  {'worst comparison':<24}error")
    for r in ran:
        print(f"{r.op:<12}{r.recipe:<22}{r.dtype:<10}{'ok' if r.passed else 'FAIL':<8}{r.seconds:>8.2f}  "
              f"{r.worst:<24}{r.error}")
    for r in skipped:
        print(f"skipped: {r.op} {r.recipe} {r.dtype}: {r.skipped}")
    failed = [r for r in ran if not r.passed]
    print(f"{len(ran) - len(failed)}/{len(ran)} cases passed, {len(skipped)} skipped")
    return 1 if failed else 0
