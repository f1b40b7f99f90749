"""One item of the plan measured into one record: set up both sides, check they compute the same thing (bytes or
SQNR), time them (``vs_te.timing``), profile them (``vs_te.profiling``), and say why a side could not run."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import pathlib
from typing import Any, Optional

import torch

from refops.testing import sqnr_db

from . import steps
from .memory import too_big
from .profiling import counting_fastpath_launches, cprofile, host_op_table, profile_call
from .quantizers import compare_bytes, compile_peer, quantized_arrays, refops_peer_outputs, refops_quantizer, \
    te_quantizer
from .records import make_record
from .rows import Item, step_flops
from .sides import error_text, te_reset
from .timing import Side, host_per_call, measure_side

#: Calls of the host profile's per-call timer (each started on an idle GPU), and of its torch.profiler table.
HOST_PROFILE_CALLS = 10
HOST_TABLE_CALLS = 3


def run_item(item: Item, te: Any, te_reason: Optional[str], args: argparse.Namespace,
             device: torch.device) -> dict[str, Any]:
    """The record of ``item``; a row that cannot even be set up is recorded with the reason, not raised."""
    runner = run_quantize_row if item.row.kind == "quantize" else run_step_row
    try:
        return runner(item, te, te_reason, args, device)
    except Exception as exc:
        return make_record(item.row, item.sizes, None, None, mode=item.mode, item_id=item.id,
                           refops_error=error_text(exc))
    finally:
        gc.collect()
        torch.cuda.empty_cache()
        if te is not None:
            with contextlib.suppress(Exception):
                te_reset(te)


def run_quantize_row(item: Item, te: Any, te_reason: Optional[str], args: argparse.Namespace,
                     device: torch.device) -> dict[str, Any]:
    row, sizes = item.row, item.sizes
    m = k = sizes.size
    torch.manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16) * 3
    extra: dict[str, Any] = {}
    ours = refops_quantizer(row.recipe, device)
    q_ours = ours.quantize(x)
    arrays = [t for t in (getattr(q_ours, n, None) for n in q_ours._array_names()) if t is not None]
    moved = x.numel() * x.element_size() + sum({t.data_ptr(): t.numel() * t.element_size() for t in arrays}.values())
    extra["bytes"] = moved
    refops_side = Side(lambda: ours.quantize(x), host_calls=max(args.reps, 20))
    base_side: Optional[Side] = None
    te_skipped = None
    if row.baseline == "te":
        if te is None:
            te_skipped = te_reason
        else:
            try:
                theirs = te_quantizer(row.recipe, device)
                same, detail = compare_bytes(quantized_arrays(q_ours, row.recipe, m, k),
                                             quantized_arrays(theirs.quantize(x), row.recipe, m, k))
                extra["same_bytes"], extra["same_bytes_detail"] = same, detail
                base_side = Side(lambda: theirs.quantize(x), host_calls=max(args.reps, 20))
            except Exception as exc:
                te_skipped = f"TE failed: {error_text(exc)}"
    else:
        try:
            peer = compile_peer(row.recipe)
            got, want = refops_peer_outputs(q_ours, row.recipe, m, k), peer(x)
            same, detail = compare_bytes({str(i): t for i, t in enumerate(got)},
                                         {str(i): t.reshape(got[i].shape) for i, t in enumerate(want)})
            extra["same_bytes"], extra["same_bytes_detail"] = same, detail
            base_side = Side(lambda: peer(x), host_calls=max(args.reps, 20))
        except Exception as exc:
            te_skipped = f"torch.compile peer failed: {error_text(exc)}"
    return measure_row(item, args, refops_side, base_side, te_skipped, extra, moved=moved)


def _free_bytes() -> Optional[int]:
    try:
        return torch.cuda.mem_get_info()[0]
    except Exception:
        return None


def run_step_row(item: Item, te: Any, te_reason: Optional[str], args: argparse.Namespace,
                 device: torch.device) -> dict[str, Any]:
    import refops

    row, sizes, graphed = item.row, item.sizes, item.mode == "graphed"
    record_args = {"mode": item.mode, "item_id": item.id, "size": item.size_name}
    reason = too_big(sizes, graphed, _free_bytes())
    if reason:
        return make_record(row, sizes, None, None, skipped=reason, **record_args)
    values = steps.parameter_values(sizes, device)
    x, dy = steps.step_inputs(sizes, device)
    extra: dict[str, Any] = {"flop": step_flops(sizes), **record_args}
    recipe = steps.refops_recipe(row.recipe)
    # A replayed graph is a few launches: its host and device times need no cap on the calls.
    calls = {"host_calls": args.reps, "device_reps": None} if graphed else {"host_calls": 3, "device_reps": 5}
    refops_side: Optional[Side] = None
    try:
        if graphed:
            ours_step, _ = steps.make_refops_graphed_step(recipe, sizes, device, values, x, dy)
        else:
            ours_step, _ = steps.make_step(refops.ops, steps.refops_context(recipe), sizes, device, values, x, dy)
        refops_side = Side(ours_step, **calls)
    except Exception as exc:
        extra["refops_error"] = ("refops could not capture the step: " if graphed else "") + error_text(exc)
    base_side, te_skipped, te_graphed = None, None, None
    if te is None:
        te_skipped = te_reason
    elif graphed and row.recipe == "fp8_block" and not getattr(args, "te_block_graphs", False):
        te_skipped = steps.TE_BLOCK_GRAPHS_UNSUPPORTED
    else:
        try:
            if graphed:
                te_step, te_graphed = steps.make_te_graphed_step(te, recipe, sizes, device, values, x, dy)
            else:
                te_step, _ = steps.make_step(te.pytorch.ops, steps.te_context(recipe), sizes, device, values, x, dy)
            te_step()
            if refops_side is not None:
                y_te, dx_te = te_step.y.detach().clone(), x.grad.detach().clone()
                ours_step()
                extra["sqnr_y_db"] = sqnr_db(ours_step.y, y_te)
                extra["sqnr_dx_db"] = sqnr_db(x.grad, dx_te)
                del y_te, dx_te
            base_side = Side(te_step, **calls)
        except Exception as exc:
            te_skipped = ("TE could not capture the step: " if graphed else "TE failed: ") + error_text(exc)
    try:
        return measure_row(item, args, refops_side, base_side, te_skipped, extra, flop=extra["flop"], step=True)
    finally:
        if te_graphed is not None:
            steps.release_graphs(te_graphed)


def measure_row(item: Item, args: argparse.Namespace, refops_side: Optional[Side], base_side: Optional[Side],
                te_skipped: Optional[str], extra: dict[str, Any], *, moved: Optional[int] = None,
                flop: Optional[float] = None, step: bool = False) -> dict[str, Any]:
    warmup = args.warmup
    sides = (("te", base_side), ("refops", refops_side))
    results: dict[str, dict[str, float]] = {}
    for name, side in sides:
        if side is None:
            continue
        try:
            results[name] = measure_side(side, args.reps, warmup)
        except Exception as exc:
            extra[f"{name}_error"] = error_text(exc)
            if name == "te":
                te_skipped = te_skipped or f"baseline failed while timed: {error_text(exc)}"
    for name, r in results.items():
        extra[f"{name}_device_ms"] = r["device_ms"]
        extra[f"{name}_host_ms"] = r["host_ms"]
        if moved is not None:
            extra[f"{name}_gbps"] = moved / (r["ms"] * 1e-3) / 1e9
        if flop is not None:
            extra[f"{name}_tflops"] = flop / (r["ms"] * 1e-3) / 1e12
    out: pathlib.Path = args.out
    measured = [(name, side) for name, side in sides if side is not None and name in results]
    if args.kernels:
        for name, side in measured:
            try:
                launches = [0]
                with counting_fastpath_launches(launches) if name == "refops" else contextlib.nullcontext():
                    counts = profile_call(side.fn, out / "kernels" / f"{item.id}_{name}.txt")
                extra[f"{name}_kernels"], extra[f"{name}_syncs"] = counts["kernels"], counts["syncs"]
                if name == "refops":
                    extra["refops_fastpath_launches"] = launches[0]
            except Exception as exc:
                extra[f"{name}_profile_error"] = error_text(exc)
    if step and getattr(args, "host_profile", False):
        for name, side in measured:
            try:
                for key, value in host_per_call(side.fn, HOST_PROFILE_CALLS).items():
                    extra[f"{name}_{key}"] = value
                host_op_table(side.fn, out / "host_profile" / f"{item.id}_{name}.txt", calls=HOST_TABLE_CALLS)
            except Exception as exc:
                extra[f"{name}_host_profile_error"] = error_text(exc)
    if args.profile and refops_side is not None and "refops" in results:
        cprofile(refops_side.fn, out / "profiles" / f"{item.id}_refops.txt")
    if te_skipped:
        extra["te_skipped"] = te_skipped
    extra.pop("mode", None)
    extra.pop("item_id", None)
    return make_record(item.row, item.sizes, results.get("te", {}).get("ms"), results.get("refops", {}).get("ms"),
                       mode=item.mode, item_id=item.id, **extra)


def run_meta(args: argparse.Namespace, te: Any, te_reason: Optional[str]) -> dict[str, Any]:
    import refops

    meta: dict[str, Any] = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "refops": str(pathlib.Path(refops.__file__).resolve().parent),
        "reps": args.reps,
        "warmup": args.warmup,
        "sizes": {name: dataclasses.asdict(s) for name, s in args.step_sizes},
        "modes": args.step_modes,
        "budget_s": args.budget_s or None,
        "te": te.version if te is not None else None,
        "te_reason": te_reason,
    }
    try:
        import cupy
        import fastpath

        meta["cupy"] = cupy.__version__
        meta["fastpath"] = str(pathlib.Path(fastpath.__file__).resolve().parent)
    except Exception as exc:
        meta["cupy"] = f"unavailable ({error_text(exc)})"
    return meta
