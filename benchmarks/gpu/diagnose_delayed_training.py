"""Triage of the conformance finding "linear_gelu_linear / fp8_delayed_scaling / float32: training, step 3".

    python3 benchmarks/gpu/diagnose_delayed_training.py OUTDIR

Runs ``compare_modules`` (TE 2.20.2's te.ops pipeline against its refops twin, as the module tier does) over
seeds 0-5 and over subsets of the scenarios, and writes, per run, whether it passed and every failing
comparison with its SQNRs to float64, to OUTDIR/diagnose_delayed_training.{json,md}. A finding that moves with
the seed and the scenario mix, with TE on either side of the reference, is the criterion's noise; one that
holds with TE always on one side is a difference in what TE computes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from refops.quantization.state import autocast as refops_autocast  # noqa: E402
from refops.testing.modules import compare_modules  # noqa: E402
from refops.testing.recipes import make_recipe  # noqa: E402
from refops.testing.transformer_engine import build_pair, candidate_context  # noqa: E402

SUBSETS = {
    "defaults": None,
    "training only": ("one step", "training"),
    "row-spread, training": ("one step", "row-spread input", "training"),
    "microbatches, training": ("one step", "microbatches", "training"),
    "grad scales, training": ("one step", "grad scales", "training"),
}


def _te_states(module: torch.nn.Module) -> list:
    """(mode, amax history, scale) of every TE delayed-scaling state, in module order."""
    out = []
    for m in module.modules():
        for mode, metas in (getattr(m, "_fp8_metas", None) or {}).items():
            for state in (metas or {}).values():
                if hasattr(state, "amax_history"):
                    out.append((mode, state.amax_history.detach().cpu(), state.scale.detach().cpu()))
    return out


def _ref_states(module: torch.nn.Module) -> list:
    from refops.testing.modules.exact_state import recipe_states
    return [(name.rsplit(".", 1)[-1], s.amax_history.detach().cpu(), s.scale.detach().cpu())
            for name, s in recipe_states(module).items()]


def _states_side_by_side(te_module, ref_module) -> list:
    rows = []
    for (mode, h_te, s_te), (mode_r, h_ref, s_ref) in zip(_te_states(te_module), _ref_states(ref_module)):
        n = min(h_te.shape[1], h_ref.shape[1])
        rows.append({"mode": f"{mode}/{mode_r}", "te history": h_te[:, :n].tolist(), "refops history": h_ref[:, :n].tolist(),
                     "te scale": s_te[:n].tolist(), "refops scale": s_ref[:n].tolist()})
    return rows


def run(recipe_name, dtype: torch.dtype, seed: int, scenarios, states: bool = False) -> dict:
    recipe = make_recipe(recipe_name) if isinstance(recipe_name, str) else recipe_name
    te_module, ref_module = build_pair("linear_gelu_linear", recipe=recipe, dtype=dtype, device=torch.device("cuda"),
                                       quantized_init=False, hidden=128, seed=seed)
    torch.manual_seed(seed + 1)
    x = torch.randn(128, 128, device="cuda", dtype=dtype)
    kwargs = {} if scenarios is None else {"scenarios": scenarios}
    report = compare_modules(te_module, ref_module, (x,), recipe=recipe, candidate_context=candidate_context(recipe),
                             reference_context=lambda: refops_autocast(enabled=True, recipe=recipe),
                             copy_parameters=False, **kwargs)
    training = {c.name: (round(c.candidate_to_float64_db or float("nan"), 2),
                          round(c.reference_to_float64_db or float("nan"), 2))
                for c in report.comparisons if c.tier == "numerics" and c.name.startswith("training")
                and c.name.endswith("output")}
    result = {"ok": report.ok, "failures": [str(c) for c in report.failures],
              "training outputs (cand, ref dB)": training}
    if states:
        result["states after the script"] = _states_side_by_side(te_module, ref_module)
    return result


def main(out: Path) -> int:
    from refops.testing.conformance.run_setup import BATCH, HIDDEN
    assert (BATCH, HIDDEN) == (128, 128), (BATCH, HIDDEN)  # the module tier's shapes, used above
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for subset, scenarios in SUBSETS.items():
            for seed in range(6) if subset == "defaults" else range(3 if dtype == torch.float32 else 0):
                result = run("fp8_delayed_scaling", dtype, seed, scenarios)
                row = {"dtype": str(dtype).removeprefix("torch."), "scenarios": subset, "seed": seed, **result}
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("dtype", "scenarios", "seed", "ok")}),
                      [f[:160] for f in result["failures"]], flush=True)
    for seed in (0, 1):  # the failing ones: every failure in full, and the recipe states after the script
        detail = run("fp8_delayed_scaling", torch.float32, seed, None, states=True)
        print("DETAIL seed", seed, json.dumps(detail["failures"]), json.dumps(detail["training outputs (cand, ref dB)"]))
        for st in detail["states after the script"]:
            print("STATE", json.dumps(st))
    from refops.recipe import DelayedScaling, Format
    for length in (1, 1024):
        for seed in range(4):
            r = run(DelayedScaling(fp8_format=Format.E4M3, amax_history_len=length), torch.float32, seed, None)
            print("HISTORY", length, "seed", seed, "ok", r["ok"], json.dumps(r["failures"])[:300])
    (out / "diagnose_delayed_training.json").write_text(json.dumps(rows, indent=1))
    lines = ["| dtype | scenarios | seed | ok | failing | training outputs to float64 (TE, refops dB) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        outs = "; ".join(f"{k.split(':')[0].removeprefix('training, ')}: {v[0]}, {v[1]}"
                         for k, v in r["training outputs (cand, ref dB)"].items())
        lines.append(f"| {r['dtype']} | {r['scenarios']} | {r['seed']} | {r['ok']} | "
                     f"{'; '.join(f.split(':')[0] + ':' + f.split(':')[1][:40] for f in r['failures']) or '-'} | "
                     f"{outs} |")
    (out / "diagnose_delayed_training.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "diagnose_out")))
