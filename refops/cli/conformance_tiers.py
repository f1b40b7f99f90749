"""The three tiers of ``python -m refops conformance``, each as a plan (the rows to run, what is left out and
why) and a run of one row, through the oracle's public functions and :mod:`refops.testing.transformer_engine`.

* quantizer tier: ``check_quantizer`` with TE's quantizer (TE's recipe state for each role) as the
  candidate, for every recipe variant of :data:`QUANTIZER_RECIPES` and role: codes and scales bit
  for bit over the adversarial matrix;
* module tier: ``compare_modules`` with a TE ``te.ops`` pipeline as the candidate and its refops
  twin as the reference (same starting values), every recipe, dtype, with and without quantized
  weights, under the module tier's own criterion; with ``--gemm-numerics`` the reference runs under
  ``refops.gemm_numerics(name)`` and each tensor's share of bit-identical elements is reported;
* lifecycle tier: ``check_lifecycle`` on TE's ops, and the same check on refops' own ops as the
  control: a property the reference violates too is reported as a limit of the check, not as a
  finding about TE.

MXFP8 and NVFP4 need compute capability 10.0 in TE 2.20: below it TE's MXFP8 quantizer returns
garbage and its NVFP4 kernels trap, so those recipes are never compared there, whatever TE answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import traceback
from typing import Any, Callable, Optional

import torch

import refops

from ..quantization.state import autocast as refops_autocast
from ..recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)
from ..testing import check_lifecycle, check_quantizer, compare_modules
from ..testing.lifecycle import Status
from ..testing.lifecycle.materialization import REFOPS_EXTENSION
from ..testing.recipes import RECIPE_NAMES, make_recipe
from ..testing.transformer_engine import (
    PIPELINES,
    ROLES,
    TransformerEngine,
    bit_identical_share,
    build_pair,
    candidate_context,
    lifecycle_cases,
    quantized_fields,
    quantizer_candidate,
)
from .conformance_record import NotRun, Row, TierTable
from .progress import Progress

__all__ = [
    "Setup",
    "ConformanceError",
    "QUANTIZER_RECIPES",
    "DTYPES",
    "TIERS",
    "unsupported_reason",
    "gemm_numerics_function",
    "plan_tiers",
    "run_planned",
    "Planned",
    "RECIPE_CHOICES",
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
    """``refops.gemm_numerics``, looked up when asked for (it may not exist in this refops)."""
    function = getattr(refops, "gemm_numerics", None)
    if function is None:
        raise ConformanceError(
            "--gemm-numerics needs refops.gemm_numerics(name) (the GEMM numerics modes, 'exact' and 'hopper'), "
            "which this refops does not have; run without --gemm-numerics"
        )
    return function


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:300]}"


def _raised(cells: dict[str, str], error: BaseException) -> Row:
    return Row(cells, False, f"raised {_first_line(error)}",
               {"traceback": traceback.format_exception(error)[-6:]})


# ----------------------------------------------------------------------- the plan
@dataclasses.dataclass
class Planned:
    """One row to run: its cells and how to run it."""

    tier: str
    cells: dict[str, str]
    run: Callable[[], Row]


def plan_tiers(setup: Setup, tiers: list[str]) -> tuple[list[TierTable], list[Planned]]:
    """The tables (with what each leaves out) and every row to run, in order."""
    tables, planned = [], []
    for tier in tiers:
        table, rows = _PLANS[tier](setup)
        tables.append(table)
        planned += rows
    return tables, planned


def run_planned(tables: list[TierTable], planned: list[Planned], progress: Progress) -> None:
    """Run every planned row into its table; a row that raises is a failing row with the error as evidence."""
    by_tier = {t.tier: t for t in tables}
    for item in planned:
        try:
            row = item.run()
        except Exception as error:  # noqa: BLE001  (one row's crash is that row's evidence)
            row = _raised(item.cells, error)
        by_tier[item.tier].rows.append(row)
        progress.step(f"{item.tier}: {' '.join(item.cells.values())}: {row.result}")


# ------------------------------------------------------------------- quantizer tier
QUANTIZER_CRITERION = (
    "`check_quantizer` with TE's quantizer as the candidate (made by TE's own recipe state for the role, "
    "so TE's mapping of recipe fields to quantizer options is checked too): every code and every scale of "
    "the adversarial matrix (random values at many scales, zeros, subnormals, ties between codes, values "
    "at and past the format's max, inf and NaN, partial blocks; fp32, fp16 and bf16 inputs; row-wise and "
    "column-wise) compared bit for bit with refops' reference."
)


def _plan_quantizers(setup: Setup) -> tuple[TierTable, list[Planned]]:
    table = TierTable("quantizers", "Quantizer tier", QUANTIZER_CRITERION,
                      ["recipe", "role", "quantizer", "runs", "codes differ", "scales differ"])
    planned = []
    for name, (base, make, what) in QUANTIZER_RECIPES.items():
        if base not in setup.recipes:
            continue
        why = unsupported_reason(setup, base)
        if why:
            table.not_run.append(NotRun(f"{name} ({what})", why))
            continue
        for role in ROLES:
            recipe = make()
            cells = {"recipe": name, "role": role}
            if _stochastic(recipe, role):
                table.not_run.append(NotRun(f"{name}, {role}", "stochastic rounding draws random bits: "
                                                               "nothing to compare bit for bit"))
                continue
            planned.append(Planned("quantizers", cells, lambda r=recipe, c=cells: _run_quantizer(setup, r, c)))
    return table, planned


def _stochastic(recipe: Recipe, role: str) -> bool:
    return isinstance(recipe, NVFP4BlockScaling) and role == "grad_output" and not recipe.disable_stochastic_rounding


def _run_quantizer(setup: Setup, recipe: Recipe, cells: dict[str, str]) -> Row:
    role = cells["role"]
    torch.manual_seed(setup.seed)
    candidate = quantizer_candidate(recipe, role=role, device=setup.device)
    report = check_quantizer(candidate, recipe, role=role, output="data_and_scale_inv", device=setup.device,
                             seed=setup.seed)
    compared = [r for r in report.runs if r.status in ("ok", "differs", "candidate raised")]
    codes = sum(r.code_mismatches for r in compared)
    elements = sum(r.elements for r in compared)
    scales = sum(r.scale_mismatches for r in compared)
    scale_count = sum(r.scales for r in compared)
    statuses: dict[str, int] = {}
    for r in report.runs:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    cells = {**cells, "quantizer": report.reference, "runs": f"{len(compared)}/{len(report.runs)}",
             "codes differ": f"{codes}/{elements}", "scales differ": f"{scales}/{scale_count}"}
    others = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()) if s != "ok")
    if report.ok:
        evidence = f"{len(compared)} runs bit-identical" + (f"; {others}" if others else "")
    else:
        failing = [f"{r.case}/{r.dtype}/{r.usage}: {r.status}" + (f" ({r.detail})" if r.detail else "")
                   for r in report.failures[:4]]
        more = len(report.failures) - len(failing)
        evidence = "; ".join(failing) + (f"; +{more} more failing runs" if more > 0 else "")
        if report.mismatches:
            evidence += f"; first mismatch: {report.mismatches[0]}"
    details = {"statuses": statuses, "notes": list(report.notes), "recipe": repr(recipe),
               "mismatches": [str(m) for m in report.mismatches]}
    return Row(cells, report.ok, evidence, details)


# ----------------------------------------------------------------------- module tier
MODULE_CRITERION = (
    "`compare_modules` with a TE `te.ops` pipeline as the candidate, run under TE's `autocast` with TE's "
    "version of the recipe, and its refops twin as the reference; both start from the same values and "
    "quantize their own weights (with quantized weights: built inside each library's "
    "`quantized_model_init`). Forward and backward on a zero-mean random input; the output, the input's "
    "grad and every parameter's grad are judged by the module tier's default criterion, `tier=\"numerics\"`: "
    "within 4x a legitimately different refops twin's distance of the reference, or (quantized) as close to a "
    "float64 twin as the reference, and element-wise within 12x the row x column error profile (its report "
    "says which decided)."
)


def _plan_modules(setup: Setup) -> tuple[TierTable, list[Planned]]:
    columns = ["pipeline", "recipe", "dtype", "weights"]
    if setup.gemm_numerics:
        columns.append(SHARE_COLUMN)
    table = TierTable("modules", "Module tier", MODULE_CRITERION + (
        f" The reference runs under `refops.gemm_numerics({setup.gemm_numerics!r})`; the last column gives "
        "each tensor's share of elements bit-identical between TE and refops." if setup.gemm_numerics else ""),
        columns)
    recipes: list[Optional[str]] = ([None] if setup.high_precision else []) + list(setup.recipes)
    planned = []
    for recipe_name in recipes:
        why = unsupported_reason(setup, recipe_name) if recipe_name else ""
        if why:
            table.not_run.append(NotRun(f"{recipe_name} (every pipeline)", why))
            continue
        for dtype_name in setup.dtypes:
            if recipe_name and recipe_name.startswith("nvfp4") and dtype_name != "bfloat16":
                table.not_run.append(NotRun(f"{recipe_name}, {dtype_name}",
                                            "NVFP4 is checked in bfloat16 only, as TE's tests do"))
                continue
            for pipeline in setup.pipelines:
                for quantized in ([False, True] if recipe_name else [False]):
                    cells = {"pipeline": pipeline, "recipe": recipe_name or "none", "dtype": dtype_name,
                             "weights": "quantized" if quantized else "high precision"}
                    planned.append(Planned("modules", cells, lambda c=cells: _run_module(setup, c)))
    return table, planned


def _contexts(setup: Setup, recipe: Optional[Recipe]):
    """The candidate's context (TE's autocast) and the reference's (refops' autocast, under gemm_numerics)."""
    numerics = gemm_numerics_function() if setup.gemm_numerics else None

    def reference() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if numerics is not None:
            stack.enter_context(numerics(setup.gemm_numerics))
        stack.enter_context(refops_autocast(enabled=recipe is not None, recipe=recipe))
        return stack

    return candidate_context(recipe), reference


def _run_module(setup: Setup, cells: dict[str, str]) -> Row:
    recipe = make_recipe(cells["recipe"]) if cells["recipe"] != "none" else None
    dtype = DTYPES[cells["dtype"]]
    quantized = cells["weights"] == "quantized"

    def pair():
        return build_pair(cells["pipeline"], recipe=recipe, dtype=dtype, device=setup.device,
                          quantized_init=quantized, hidden=HIDDEN, seed=setup.seed)

    te_module, ref_module = pair()
    torch.manual_seed(setup.seed + 1)
    x = torch.randn(BATCH, HIDDEN, device=setup.device, dtype=dtype)
    candidate, reference = _contexts(setup, recipe)
    report = compare_modules(te_module, ref_module, (x,), recipe=recipe, candidate_context=candidate,
                             reference_context=reference, copy_parameters=False)
    details: dict[str, Any] = {
        "comparisons": [str(c) for c in report.comparisons],
        "tiers not run": [str(t) for t in report.tiers if not t.ran],
        "to float64 (candidate / reference dB) and bit-identical share": {
            c.name: (c.candidate_to_float64_db, c.reference_to_float64_db, c.bit_identical_share)
            for c in report.comparisons if c.tier == "numerics"
        },
    }
    if report.ok:
        output = report["output"] if any(c.name == "output" for c in report.comparisons) else None
        evidence = f"{len(report.comparisons)} comparisons pass" + (f"; output: {_brief(output)}" if output else "")
    else:
        shown = report.failures[:3]
        evidence = "; ".join(f"{c.name}: {_brief(c)}" for c in shown)
        if len(report.failures) > len(shown):
            evidence += f"; +{len(report.failures) - len(shown)} more failing comparisons"
    if quantized:
        same = _weight_codes_identical(te_module, ref_module)
        details["quantized weight codes identical"] = same
        evidence += f"; quantized weight codes identical: {_percent(min(same.values()))}" if same else ""
    if setup.gemm_numerics:
        shares = _bit_identical_shares(pair(), x, candidate, reference, setup.seed)
        details["bit-identical share"] = shares
        cells = {**cells, SHARE_COLUMN: ", ".join(f"{k} {_percent(v)}" for k, v in shares.items())}
    return Row(cells, report.ok, evidence, details)


def _brief(c: Any) -> str:
    """A comparison in a few words: its errors, SQNR and criterion."""
    return (f"max_abs={c.max_abs_error:.3g}, sqnr={c.sqnr_db:.1f} dB, {c.num_mismatches}/{c.numel} outside "
            f"[{c.criterion}]")


def _percent(share: Optional[float]) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"


def _weight_codes_identical(te_module: torch.nn.Module, ref_module: torch.nn.Module) -> dict[str, float]:
    """For every quantized weight, the share of bytes of its data equal between TE and refops (every usage)."""
    shares = {}
    ref_params = dict(ref_module.named_parameters())
    for name, p in te_module.named_parameters():
        q = ref_params[name]
        if not all(hasattr(t, "_scale_inv") or hasattr(t, "_rowwise_data") for t in (p, q)):
            continue  # not a quantized weight on both sides
        for usage in ("rowwise", "columnwise"):
            try:
                a, b = quantized_fields(p, usage)["data"], quantized_fields(q, usage)["data"]
            except ValueError:
                continue
            a, b = a.detach().view(torch.uint8).reshape(-1), b.detach().view(torch.uint8).reshape(-1)
            shares[f"{name} {usage}"] = bit_identical_share(a, b) if a.shape == b.shape else 0.0
    return shares


def _bit_identical_shares(pair, x, candidate_context_, reference_context, seed) -> dict[str, Optional[float]]:
    """Forward and backward of a fresh pair with one output grad; per tensor, the share of bit-identical elements."""
    te_module, ref_module = pair
    torch.manual_seed(seed + 2)
    results = []
    dy = None
    for module, context in ((te_module, candidate_context_), (ref_module, reference_context)):
        xi = x.detach().clone().requires_grad_(True)
        with context():
            y = module(xi)
        if dy is None:
            dy = torch.randn_like(y)
        y.backward(dy)
        results.append((y.detach(), xi.grad, {n: p.grad for n, p in module.named_parameters()}))
    (y_te, dx_te, g_te), (y_ref, dx_ref, g_ref) = results
    shares = {"output": bit_identical_share(y_te, y_ref), "input grad": bit_identical_share(dx_te, dx_ref)}
    for name in g_ref:
        shares[f"{name}.grad"] = bit_identical_share(g_te.get(name), g_ref[name])
    return shares


# -------------------------------------------------------------------- lifecycle tier
LIFECYCLE_CRITERION = (
    "`check_lifecycle` on TE's ops (built on meta and materialized by `reset_parameters()`, by "
    "`to_empty()` + `reset_parameters()` and by the first forward; parameters replaced, loaded with "
    "`assign=True`, deep-copied, checkpointed), each property held or violated with its evidence. The same "
    "check runs on refops' own op as the control: a property the reference violates too is a limit of the "
    "check (listed as such), not a finding about TE; a property that is a refops extension (materializing "
    "keeps parameter objects) is listed, not held against TE; a row fails on properties TE alone violates."
)


def _plan_lifecycle(setup: Setup) -> tuple[TierTable, list[Planned]]:
    table = TierTable("lifecycle", "Lifecycle tier", LIFECYCLE_CRITERION, ["op", "recipe", "weights", "dtype"])
    recipes: list[Optional[str]] = ([None] if setup.high_precision else []) + list(setup.recipes)
    planned = []
    for recipe_name in recipes:
        why = unsupported_reason(setup, recipe_name) if recipe_name else ""
        if why:
            table.not_run.append(NotRun(f"{recipe_name} (every op)", why))
            continue
        for quantized in ([False, True] if recipe_name else [False]):
            recipe = make_recipe(recipe_name) if recipe_name else None
            cases = lifecycle_cases(recipe, quantized_init=quantized, ops=setup.lifecycle_ops)
            controls = lifecycle_cases(recipe, quantized_init=quantized, ops=setup.lifecycle_ops, reference=True)
            for case, control in zip(cases, controls):
                cells = {"op": case.op, "recipe": recipe_name or "none",
                         "weights": "quantized" if quantized else "high precision",
                         "dtype": str(case.dtype).removeprefix("torch.")}
                planned.append(Planned("lifecycle", cells,
                                       lambda c=case, k=control, cl=cells: _run_lifecycle(setup, c, k, cl)))
    return table, planned


def _run_lifecycle(setup: Setup, case, control, cells: dict[str, str]) -> Row:
    report = check_lifecycle(case.factory, inputs=case.inputs, device=setup.device, seed=setup.seed, lazy=True)
    reference = check_lifecycle(control.factory, inputs=control.inputs, device=setup.device, seed=setup.seed,
                                lazy=True)
    findings, shared, extensions = [], [], []
    for result in report.violations:
        if result.evidence.startswith(REFOPS_EXTENSION):
            extensions.append(result.name)  # a promise refops makes and TE does not: reported, not a verdict
            continue
        known = set(_clauses(reference[result.name].evidence)) if result.name in reference.statuses and \
            reference[result.name] in reference.violations else set()
        own = [c for c, key in zip(result.evidence.split("; "), _clauses(result.evidence)) if key not in known]
        if own:
            findings.append(f"{result.name}: {_clip('; '.join(own))}")
        if len(own) < len(_clauses(result.evidence)):
            shared.append(result.name)
    held = sum(r.status == Status.HELD for r in report)
    other = len(report.results) - held - len(report.violations)
    if findings:
        evidence = "; ".join(findings)
    else:
        evidence = f"{held} of {len(report.results)} properties held" + (
            f", {other} not applicable or not checked" if other else "")
    if extensions:
        evidence += (f"; refops extensions TE does not promise (not a verdict on TE): {', '.join(extensions)}")
    if shared:
        first = reference[shared[0]].evidence
        evidence += (f"; not a verdict on TE, the reference violates it too: {', '.join(shared)} "
                     f"({_clip(first, 200)})")
    details = {
        "te": {r.name: [str(r.status), r.evidence] for r in report},
        "reference": {r.name: [str(r.status), r.evidence] for r in reference},
    }
    return Row(cells, not findings, evidence, details)


_VOLATILE = (
    re.compile(r"\(id 0x[0-9a-f]+( -> 0x[0-9a-f]+)?\)"),  # object ids differ between the two modules
    re.compile(r"\(max \|diff\| [^)]*\)"),  # so do the sizes of a difference
    re.compile(r"(?<=allocated )\d+(?= bytes)"),
)


def _clauses(evidence: str) -> list[str]:
    """The clauses of a property's evidence, without what differs between two runs (ids, sizes): a TE clause
    equal to one of the reference's is the same observation."""
    out = []
    for clause in evidence.split("; "):
        for pattern in _VOLATILE:
            clause = pattern.sub("", clause)
        out.append(" ".join(clause.split()))
    return out


def _clip(text: str, limit: int = EVIDENCE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_PLANS = {"quantizers": _plan_quantizers, "modules": _plan_modules, "lifecycle": _plan_lifecycle}

#: For the CLI's ``--recipes`` choices.
RECIPE_CHOICES = ("none", *RECIPE_NAMES)
