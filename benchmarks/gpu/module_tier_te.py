"""The module tier against TransformerEngine: TE ``te.ops`` pipelines as candidates, refops twins as references.

    python benchmarks/gpu/module_tier_te.py OUTDIR [--fake-te] [--device cuda] [--pipeline linear_gelu_linear]

For every setting (recipes none, fp8_delayed_scaling, fp8_current_scaling, fp8_block_scaling x dtypes float32,
bfloat16 x weights high precision or quantized; "none" has no quantized weights, so it runs high precision only
and its "quantized" settings are listed as not applicable) the TE pipeline and its refops twin are built from
the same values (``refops.testing.transformer_engine.build_pair``), and ``compare_modules`` runs with its
defaults (``tier="numerics"``, the seeded zero-mean output grad) on a zero-mean randn input. Then planted bugs,
which must fail: the TE module with its last bias perturbed by +0.05, and with its first weight's grad doubled.

Writes OUTDIR/module_tier.md and OUTDIR/module_tier.json; exits 0 only when every correct setting passes and every
planted bug is caught. ``--fake-te`` runs refops under TE's names (``tests/refops/_fake_te.py``), on CPU by
default: the script's own test, before it meets a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import time
from typing import Any, Optional

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
RECIPES = ["none", "fp8_delayed_scaling", "fp8_current_scaling", "fp8_block_scaling"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
WEIGHTS = ["high precision", "quantized"]
BATCH, HIDDEN = 64, 128


@contextlib.contextmanager
def _fake_te():
    """refops installed under TransformerEngine's module names for the duration."""
    import pytest

    sys.path.insert(0, str(REPO / "tests" / "refops"))
    from _fake_te import install_refops_as_te

    with pytest.MonkeyPatch.context() as monkeypatch:
        install_refops_as_te(monkeypatch)
        yield


def _summary(report) -> dict[str, Any]:
    tensors = [c for c in report.comparisons if c.tier in ("numerics", "tolerance", "sqnr", "exact")
               and not c.name.startswith("operand ") and "[" not in c.name]
    return {
        "ok": report.ok,
        "failures": [str(c) for c in report.failures],
        "tensors": {
            c.name: {
                "passed": c.passed,
                "criterion": c.criterion,
                "candidate_to_float64_db": c.candidate_to_float64_db,
                "reference_to_float64_db": c.reference_to_float64_db,
                "bit_identical_share": c.bit_identical_share,
                "sqnr_db": c.sqnr_db,
                "max_abs_error": c.max_abs_error,
                "why": c.why,
            }
            for c in tensors
        },
        "tiers not run": [str(t) for t in report.tiers if not t.ran],
    }


def _run_setting(pipeline: str, recipe_name: str, dtype: torch.dtype, quantized: bool, device: torch.device,
                 bug: Optional[str] = None, seed: int = 0) -> dict[str, Any]:
    from refops.testing import compare_modules, make_recipe
    from refops.testing.transformer_engine import build_pair, candidate_context

    recipe = make_recipe(recipe_name) if recipe_name != "none" else None
    te_module, ref_module = build_pair(pipeline, recipe=recipe, dtype=dtype, device=device, quantized_init=quantized,
                                       hidden=HIDDEN, seed=seed)
    params = dict(te_module.named_parameters())
    if bug == "bias +0.05":
        name = sorted(n for n in params if n.endswith("bias"))[-1]
        with torch.no_grad():
            params[name].add_(0.05)
    elif bug == "weight grad x2":
        name = sorted(n for n in params if n.endswith("weight"))[0]

        def double(p):
            p.grad.mul_(2.0)

        params[name].register_post_accumulate_grad_hook(double)
    torch.manual_seed(seed + 1)
    x = torch.randn(BATCH, HIDDEN, device=device, dtype=dtype)
    start = time.perf_counter()
    report = compare_modules(te_module, ref_module, (x,), recipe=recipe, candidate_context=candidate_context(recipe),
                             copy_parameters=False)
    return {"seconds": round(time.perf_counter() - start, 2), **_summary(report)}


def _markdown(rows: list[dict[str, Any]], bugs: list[dict[str, Any]], header: dict[str, Any]) -> str:
    lines = [
        "# Module tier: TE `te.ops` candidates against refops twins",
        "",
        *(f"- {k}: {v}" for k, v in header.items()),
        "",
        "`compare_modules` with its defaults (`tier=\"numerics\"`). Per tensor: the deciding criterion, each "
        "side's SQNR against the float64 twin (candidate / reference), and the share of bit-identical elements.",
        "",
        "| recipe | dtype | weights | result | tensors (cand / ref dB to float64, bit-identical) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        if row.get("not applicable"):
            lines.append(f"| {row['recipe']} | {row['dtype']} | {row['weights']} | n/a | {row['not applicable']} |")
            continue
        cells = []
        for name, t in row["tensors"].items():
            share = "" if t["bit_identical_share"] is None else f", {100 * t['bit_identical_share']:.1f}%"
            c64 = t["candidate_to_float64_db"]
            r64 = t["reference_to_float64_db"]
            dist = "" if c64 is None else f" {c64:.1f} / {r64:.1f} dB"
            cells.append(f"{name}{'' if t['passed'] else ' **FAIL**'}{dist}{share}")
        result = "**pass**" if row["ok"] else "**FAIL**"
        lines.append(f"| {row['recipe']} | {row['dtype']} | {row['weights']} | {result} | {'; '.join(cells)} |")
    lines += ["", "## Planted bugs (must fail)", "", "| bug | recipe | dtype | caught | first failure |", "|---|---|---|---|---|"]
    for bug in bugs:
        first = bug["failures"][0].splitlines()[0][:160] if bug["failures"] else ""
        lines.append(f"| {bug['bug']} | {bug['recipe']} | {bug['dtype']} | {'yes' if not bug['ok'] else '**NO**'} "
                     f"| `{first}` |")
    failures = [r for r in rows if not r.get("not applicable") and not r["ok"]]
    for row in failures:
        lines += ["", f"### {row['recipe']} / {row['dtype']} / {row['weights']}", "", "```", *row["failures"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=pathlib.Path)
    parser.add_argument("--fake-te", action="store_true", help="refops under TE's names (tests/refops/_fake_te.py)")
    parser.add_argument("--device", default=None, help="default: cuda when available (cpu with --fake-te)")
    parser.add_argument("--pipeline", default="linear_gelu_linear")
    parser.add_argument("--recipes", nargs="*", default=RECIPES)
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.fake_te else "cpu"))
    sys.path.insert(0, str(REPO))
    with _fake_te() if args.fake_te else contextlib.nullcontext():
        import transformer_engine  # noqa: F401  (the real one, or the fake)

        rows = []
        for recipe_name in args.recipes:
            for dtype_name, dtype in DTYPES.items():
                for weights in WEIGHTS:
                    cells = {"recipe": recipe_name, "dtype": dtype_name, "weights": weights}
                    if recipe_name == "none" and weights == "quantized":
                        rows.append({**cells, "not applicable": "no recipe: nothing to quantize the weights with"})
                        continue
                    try:
                        result = _run_setting(args.pipeline, recipe_name, dtype, weights == "quantized", device)
                    except Exception as error:  # noqa: BLE001 - recorded as a failing row
                        result = {"ok": False, "failures": [f"{type(error).__name__}: {error}"], "tensors": {}}
                    rows.append({**cells, **result})
                    print(f"{recipe_name:<22} {dtype_name:<9} {weights:<15} {'pass' if result['ok'] else 'FAIL'}",
                          flush=True)
        bugs = []
        for bug in ("bias +0.05", "weight grad x2"):
            for recipe_name in [r for r in args.recipes if r in ("none", "fp8_current_scaling")] or args.recipes[:1]:
                for dtype_name, dtype in DTYPES.items():
                    try:
                        result = _run_setting(args.pipeline, recipe_name, dtype, False, device, bug=bug)
                    except Exception as error:  # noqa: BLE001
                        result = {"ok": True, "failures": [f"did not run: {type(error).__name__}: {error}"]}
                    bugs.append({"bug": bug, "recipe": recipe_name, "dtype": dtype_name, **result})
                    print(f"bug {bug:<16} {recipe_name:<22} {dtype_name:<9} "
                          f"{'caught' if not result['ok'] else 'NOT CAUGHT'}", flush=True)
        te_version = getattr(sys.modules.get("transformer_engine"), "__version__", "unknown")
    header = {
        "TransformerEngine": "fake (refops under TE's names)" if args.fake_te else te_version,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "pipeline": args.pipeline,
        "input": f"randn({BATCH}, {HIDDEN})",
    }
    args.outdir.mkdir(parents=True, exist_ok=True)
    (args.outdir / "module_tier.json").write_text(json.dumps({"header": header, "settings": rows, "bugs": bugs},
                                                             indent=1, default=str))
    (args.outdir / "module_tier.md").write_text(_markdown(rows, bugs, header))
    correct_ok = all(r.get("not applicable") or r["ok"] for r in rows)
    caught = all(not b["ok"] for b in bugs)
    print(f"correct settings pass: {correct_ok}; planted bugs caught: {caught}")
    return 0 if correct_ok and caught else 1


if __name__ == "__main__":
    sys.exit(main())
