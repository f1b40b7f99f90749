"""The records of ``bench_vs_te.py``: ``vs_te.json`` (a list of rows), ``vs_te_meta.json``, ``vs_te.md``, and
``--compare`` (two records side by side).

Every row starts with ``work``, ``te_ms``, ``refops_ms``, ``ratio`` (refops_ms / te_ms: below 1, refops is faster;
None when either time is missing), then ``key``, ``baseline``, ``id``, ``mode`` and the extra keys of the run.
The files are rewritten after every row, each one atomically (written beside, then renamed), so a run stopped by
its budget, or killed, keeps a readable record of what it measured.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Optional, Sequence

from .rows import ROWS, STEP_NAMES, Row, Sizes

RECORD_KEYS = ("work", "te_ms", "refops_ms", "ratio")

_BASELINES = {"te": "TransformerEngine", "compile": "torch.compile of a plain-torch formulation (same bytes)"}


def make_record(row: Row, sizes: Sizes, te_ms: Optional[float], refops_ms: Optional[float], *,
                mode: str = "eager", item_id: Optional[str] = None, **extra: Any) -> dict[str, Any]:
    """One row of ``vs_te.json``: the four keys first (ratio = refops_ms / te_ms, None when either is missing),
    then ``key``, ``baseline``, ``id``, ``mode`` and ``extra``. Non-finite times are recorded as None."""
    te_ms = _finite(te_ms)
    refops_ms = _finite(refops_ms)
    ratio = refops_ms / te_ms if te_ms and refops_ms is not None else None
    record = {"work": row.work(sizes, mode), "te_ms": te_ms, "refops_ms": refops_ms, "ratio": ratio,
              "key": row.key, "baseline": _BASELINES[row.baseline], "id": item_id or row.key, "mode": mode}
    if row.kind == "step":
        record.update(tokens=sizes.tokens, hidden=sizes.hidden, ffn=sizes.ffn)
    record.update(extra)
    return record


def _finite(value: Optional[float]) -> Optional[float]:
    return float(value) if value is not None and math.isfinite(value) else None


def _fmt(value: Optional[float], digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return num / den if den and num is not None else None


def throughput(record: dict[str, Any], side: str) -> str:
    """The achieved GB/s (quantize rows) or TFLOP/s (training rows) of ``side`` ("te" or "refops")."""
    for key, unit in (("gbps", "GB/s"), ("tflops", "TFLOP/s")):
        value = record.get(f"{side}_{key}")
        if value is not None:
            return f"{value:.0f} {unit}"
    return "-"


def _notes(r: dict[str, Any]) -> list[str]:
    notes = []
    if r.get("baseline", "").startswith("torch.compile"):
        notes.append("baseline: torch.compile peer")
    if r.get("skipped"):
        notes.append(f"skipped: {r['skipped']}")
    if r.get("te_skipped"):
        notes.append(f"baseline skipped: {r['te_skipped']}")
    if r.get("refops_error"):
        notes.append(f"refops failed: {r['refops_error']}")
    if r.get("same_bytes") is False:
        notes.append(f"bytes differ: {r.get('same_bytes_detail', '')}")
    for key in ("te_syncs", "refops_syncs"):
        if r.get(key):
            notes.append(f"{key.split('_')[0]}: {r[key]} host syncs/call")
    if r.get("sqnr_y_db") is not None:
        notes.append(f"SQNR y {r['sqnr_y_db']:.1f} dB, dx {r.get('sqnr_dx_db', float('nan')):.1f} dB")
    fwd = [r.get(f"{s}_host_fwd_ms") for s in ("te", "refops")]
    if any(v is not None for v in fwd):
        bwd = [r.get(f"{s}_host_bwd_ms") for s in ("te", "refops")]
        notes.append(f"host fwd {_fmt(fwd[0])} / {_fmt(fwd[1])}, bwd {_fmt(bwd[0])} / {_fmt(bwd[1])} ms")
    return notes


def markdown_table(records: Sequence[dict[str, Any]], meta: Optional[dict[str, Any]] = None) -> str:
    """``vs_te.md``: one line per row; ratio = refops / baseline (below 1: refops faster); then the step rows'
    ratios by size (eager and graphed), and the rows the budget left out."""
    lines = []
    if meta:
        lines += [f"# TransformerEngine vs refops fast path ({meta.get('device', '?')})", "",
                  f"torch {meta.get('torch', '?')}, TransformerEngine {meta.get('te', '?')}, CuPy "
                  f"{meta.get('cupy', '?')}; {meta.get('date', '?')}; median of {meta.get('reps', '?')} CUDA-event "
                  "intervals after warm-up. eager: calls back to back on an idle GPU (host time where the host "
                  "is slower than the GPU); device: the same calls queued behind a GPU spin (no host gaps); "
                  "host: host wall time per call. Baseline: TransformerEngine, or a torch.compile peer where TE "
                  "has no kernel on this GPU. Rows ending in \"CUDA graphs\": both sides captured "
                  "(TE's make_graphed_callables, refops'), the replays timed the same way.", ""]
    header = ["work", "baseline ms", "refops ms", "ratio", "baseline", "refops", "device ms (base / refops)",
              "device ratio", "host ms (base / refops)", "notes"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in records:
        te_dev, ref_dev = r.get("te_device_ms"), r.get("refops_device_ms")
        lines.append("| " + " | ".join([
            r["work"], _fmt(r["te_ms"]), _fmt(r["refops_ms"]), _fmt(r["ratio"], 2), throughput(r, "te"),
            throughput(r, "refops"), f"{_fmt(te_dev)} / {_fmt(ref_dev)}", _fmt(_ratio(ref_dev, te_dev), 2),
            f"{_fmt(r.get('te_host_ms'))} / {_fmt(r.get('refops_host_ms'))}", "; ".join(_notes(r))]) + " |")
    by_size = ratio_by_size(records)
    if by_size:
        lines += ["", by_size]
    if meta and meta.get("not_run"):
        lines += ["", f"Not run ({meta.get('stopped', 'budget')}):", ""]
        lines += [f"- {n['id']}: {n['reason']}" for n in meta["not_run"]]
    if meta and meta.get("elapsed_s") is not None:
        budget = meta.get("budget_s")
        lines += ["", f"Run time {meta['elapsed_s']:.0f} s" + (f" of a {budget:.0f} s budget" if budget else "")
                  + "."]
    return "\n".join(lines) + "\n"


def _size_label(r: dict[str, Any]) -> str:
    return f"{r['tokens']} tokens, {r['hidden']}/{r['ffn']}"


def ratio_by_size(records: Sequence[dict[str, Any]]) -> str:
    """The step rows' ratio (refops / TE) per size: one line per recipe, one column per size, each cell
    ``eager / graphed`` (``-``: not measured); then the same for the device ratio, and the host ms per call of
    both sides. Empty without step rows."""
    steps = [r for r in records if "tokens" in r]
    if not steps:
        return ""
    sizes = list(dict.fromkeys(_size_label(r) for r in steps))
    names = {row.key: STEP_NAMES[row.recipe] for row in ROWS if row.kind == "step"}
    cells: dict[tuple[str, str, str], dict[str, Any]] = {(r["key"], _size_label(r), r.get("mode", "eager")): r
                                                         for r in steps}

    def table(title: str, value, join: str = " / ") -> list[str]:
        out = [f"{title}, by size (tokens, hidden/ffn):", "",
               "| step | " + " | ".join(sizes) + " |", "|---|" + "|".join("---" for _ in sizes) + "|"]
        for key in dict.fromkeys(r["key"] for r in steps):
            row = []
            for size in sizes:
                pair = [cells.get((key, size, mode)) for mode in ("eager", "graphed")]
                row.append(join.join(value(c) if c else "-" for c in pair) if any(pair) else "-")
            out.append(f"| {names.get(key, key)} | " + " | ".join(row) + " |")
        return out

    lines = table("Ratio refops / TE (eager / graphed)", lambda r: _fmt(r.get("ratio"), 2))
    lines += [""] + table("Device ratio (eager / graphed)", lambda r: _fmt(
        _ratio(r.get("refops_device_ms"), r.get("te_device_ms")), 2))
    lines += [""] + table("Host ms per call, TE / refops (eager; graphed)", lambda r: (
        f"{_fmt(r.get('te_host_ms'), 2)} / {_fmt(r.get('refops_host_ms'), 2)}"), join="; ")
    return "\n".join(lines)


def _write_atomic(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_records(out: pathlib.Path, records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    """``out/vs_te.json`` (the list of rows), ``out/vs_te_meta.json`` and ``out/vs_te.md``."""
    out.mkdir(parents=True, exist_ok=True)
    for r in records:
        missing = [k for k in RECORD_KEYS if k not in r]
        if missing:
            raise ValueError(f"write_records: row {r.get('key', r)} lacks {missing}")
    _write_atomic(out / "vs_te.json", json.dumps(list(records), indent=1) + "\n")
    _write_atomic(out / "vs_te_meta.json", json.dumps(meta, indent=1, default=str) + "\n")
    _write_atomic(out / "vs_te.md", markdown_table(records, meta))


def compare_table(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> str:
    """Two records of the script (a tree before and after a change) side by side, by row."""
    by_work = {r["work"]: r for r in before}
    header = ["work", "baseline ms", "refops ms before", "refops ms after", "ratio before", "ratio after",
              "device ms before", "device ms after"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in after:
        b = by_work.get(r["work"], {})
        lines.append("| " + " | ".join([
            r["work"], _fmt(r.get("te_ms")), _fmt(b.get("refops_ms")), _fmt(r.get("refops_ms")),
            _fmt(b.get("ratio"), 2), _fmt(r.get("ratio"), 2), _fmt(b.get("refops_device_ms")),
            _fmt(r.get("refops_device_ms"))]) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["RECORD_KEYS", "STEP_NAMES", "compare_table", "make_record", "markdown_table", "ratio_by_size",
           "throughput", "write_records"]
