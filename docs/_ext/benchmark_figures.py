"""Sphinx extension: the benchmark page's figures come from one GPU run record, named once.

``refops_figures_run`` (set in ``docs/conf.py``) names a directory under ``benchmarks/results/``. On
``builder-inited`` this writes into ``docs/_generated/``:

* ``figures-summary.md``: the table that opens ``docs/benchmarks.md``, made from the record's
  ``fastpath_bench.json``: each kernel family's time, bandwidth and share of the copy, against its floor;
* ``figures-bench.md``: the record's ``fastpath_bench.md`` from its first section (``## Kernels``) on, without its
  title and its own image line; ``fastpath_roofline.png``: the record's roofline.

A new verification run replaces the cited one by changing ``refops_figures_run`` alone.
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

from refops_artifacts import write_if_changed

__all__ = ["FLOORS", "record_dir", "record_tables", "summary_markdown", "setup"]

logger = logging.getLogger(__name__)

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"
#: Kernel family -> the floor it is held to, in % of the copy measured in the same run.
FLOORS = {"quantize": 85, "dequantize": 85, "activation": 80, "bias+activation": 80, "norm": 80}


def record_dir(run: str) -> pathlib.Path:
    """``benchmarks/results/<run>``, which must hold the benchmark's JSON."""
    path = RESULTS / run
    if not run or not (path / "fastpath_bench.json").is_file():
        raise ExtensionError(f"refops_figures_run = {run!r} (docs/conf.py): {path}/fastpath_bench.json is missing; "
                             f"name a directory of benchmarks/results/ written by benchmarks/bench_fastpath.py")
    return path


def _range(values: list[float], digits: int) -> str:
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def _below(rows: list[dict], floor: int) -> str:
    under = [r for r in rows if r["pct_of_copy"] < floor]
    if not under:
        return "none"
    if len(under) <= 3:
        return ", ".join(f"{r['name']} ({r['pct_of_copy']:.0f} %)" for r in under)
    formats = sorted({r["name"].split()[0] for r in under})
    return f"{len(under)} ({', '.join(formats)}: {_range([r['pct_of_copy'] for r in under], 0)} %)"


def summary_markdown(data: dict, run: str) -> str:
    """The figures table: the copy, then one row per kernel family, then the pipeline, from one run's JSON."""
    meta, copy = data["meta"], data["copy"]
    lines = [
        f"Measured on an {meta['device']} (torch {meta['torch']}, CuPy {meta['cupy']}) on {meta['date'][:10]};"
        f" the record, logs included: `benchmarks/results/{run}/`. Kernels take one"
        f" {meta['kernel_shape'][0]} x {meta['kernel_shape'][1]} bf16 tensor ({meta['kernel_mib']:.0f} MiB).",
        "",
        "| kernels | ms | GB/s | % of copy | floor | below the floor |",
        "|---|---|---|---|---|---|",
        f"| device-to-device copy | {copy['ms']:.3f} | {copy['gbps']:.0f} | 100 | | |",
    ]
    for family, floor in FLOORS.items():
        rows = [r for r in data["kernels"] if r["family"] == family and r["implementation"] == "fastpath"]
        if rows:
            lines.append(f"| {family} ({len(rows)}) | {_range([r['ms'] for r in rows], 3)} | "
                         f"{_range([r['gbps'] for r in rows], 0)} | {_range([r['pct_of_copy'] for r in rows], 0)} | "
                         f">= {floor} % | {_below(rows, floor)} |")
    pipeline = {p["label"]: p for p in data.get("pipeline", [])}
    fast, ref = pipeline.get("fastpath, Float8CurrentScaling"), pipeline.get("reference, Float8CurrentScaling")
    bf16 = pipeline.get("fastpath, bf16 (no quantization)")
    if fast and ref and bf16:
        speedup = ref["ms"] / fast["ms"]
        lines.append(f"| pipeline step, FP8 current scaling | {fast['ms']:.2f} | | | >= 5x the reference "
                     f"({ref['ms']:.2f} ms), faster than bf16 ({bf16['ms']:.2f} ms) | "
                     f"{'none' if speedup >= 5 and fast['ms'] < bf16['ms'] else 'yes'} ({speedup:.1f}x) |")
    host = {h["label"]: h for h in data.get("host", [])}
    if data.get("host_probe_us") and all(k in host for k in ("fastpath, bf16 (no quantization)",
                                                              "fastpath, Float8CurrentScaling")):
        probe = data["host_probe_us"]
        bf16_us = host["fastpath, bf16 (no quantization)"]["us_per_forward"]
        fp8_us = host["fastpath, Float8CurrentScaling"]["us_per_forward"]
        lines += ["", f"Host time per fuser forward (a tiny pipeline, where the GPU work is negligible): {bf16_us:.0f} us "
                      f"in bf16 and {fp8_us:.0f} us under FP8 current scaling, on a host whose refops-free probe took "
                      f"{probe:.1f} us ({bf16_us / probe:.0f} and {fp8_us / probe:.0f} probes)."]
    return "\n".join(lines) + "\n"


def record_tables(markdown: str) -> str:
    """The benchmark's report from its first ``## `` section on, less any image line (the page shows the figure)."""
    lines = markdown.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("## ")), None)
    if first is None:
        raise ExtensionError("benchmark_figures: the record's fastpath_bench.md has no '## ' section")
    return "\n".join(line for line in lines[first:] if not line.startswith("![")).rstrip() + "\n"


def _on_builder_inited(app: Sphinx) -> None:
    start = time.perf_counter()
    run = app.config.refops_figures_run
    record = record_dir(run)
    out = pathlib.Path(app.srcdir) / app.config.refops_artifacts_dir
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads((record / "fastpath_bench.json").read_text())
    write_if_changed(out / "figures-summary.md", summary_markdown(data, run).encode())
    write_if_changed(out / "figures-bench.md", record_tables((record / "fastpath_bench.md").read_text()).encode())
    write_if_changed(out / "fastpath_roofline.png", (record / "fastpath_roofline.png").read_bytes())
    logger.info("benchmark figures from %s in %.1f s", record, time.perf_counter() - start)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("refops_artifacts")  # its artifacts folder and its config value
    app.add_config_value("refops_figures_run", "", "env")
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
