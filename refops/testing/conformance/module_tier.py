"""The module tier of a conformance run: ``compare_modules`` with a TE ``te.ops`` pipeline as the
candidate and its refops twin as the reference, every recipe, dtype, with and without quantized weights; with
``gemm_numerics`` the reference runs under ``refops.gemm_numerics(name)`` and each tensor's share of
bit-identical elements is reported."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch

from ...quantization.state import autocast as refops_autocast
from ...recipe import Recipe
from ..modules import compare_modules
from ..recipes import make_recipe
from ..transformer_engine import bit_identical_share, build_pair, candidate_context, quantized_fields
from .record import NotRun, Row, TierTable
from .run_setup import BATCH, DTYPES, HIDDEN, SHARE_COLUMN, Planned, Setup, gemm_numerics_function, \
    unsupported_reason

__all__ = ["MODULE_CRITERION", "plan_modules"]

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


def plan_modules(setup: Setup) -> tuple[TierTable, list[Planned]]:
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
