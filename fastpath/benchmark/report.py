"""Writing the results: JSON (everything), Markdown (tables) and the bandwidth roofline PNG."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Optional

__all__ = ["write_json", "write_markdown", "write_roofline"]


def write_json(path: pathlib.Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return str(value)


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def write_markdown(path: pathlib.Path, data: dict[str, Any]) -> None:
    meta = data["meta"]
    lines = [
        "# Fast-path benchmark",
        "",
        f"{meta['device']}; torch {meta['torch']}, CuPy {meta['cupy']}; {meta['date']}.",
        f"Kernel tensor: {meta['kernel_shape'][0]} x {meta['kernel_shape'][1]} bf16 ({meta['kernel_mib']:.0f} MiB); "
        "median of CUDA-event timings after warm-up; bytes = distinct tensors read + written.",
        "",
    ]
    copy = data.get("copy")
    kernels = data.get("kernels") or []
    if copy:
        lines += ["## Kernels", "",
                  f"Device-to-device copy: {copy['ms']:.3f} ms, **{copy['gbps']:.0f} GB/s** (2 x bytes / time): "
                  "the 100% line below.", ""]
        rows = [[k["family"], k["name"], k["implementation"], f"{k['ms']:.3f}", f"{k['bytes'] / 2**20:.0f}",
                 f"{k['gbps']:.0f}", f"{k['pct_of_copy']:.0f}%"] for k in kernels]
        lines += _table(["family", "kernel", "runs on", "ms", "MiB moved", "GB/s", "% of copy"], rows)
    pipeline = data.get("pipeline") or []
    if pipeline:
        p = meta["pipeline"]
        lines += ["## Pipeline", "",
                  f"LayerNorm -> Linear({p['hidden']} -> {p['ffn']}) -> GELU -> Linear({p['ffn']} -> {p['hidden']}), "
                  f"{p['tokens']} tokens, bf16, forward + backward per step.", ""]
        rows = [[r["label"], r["gemm_path"], r["scaled_mm_calls_per_step"], f"{r['ms']:.2f}", f"{r['tflops']:.1f}"]
                for r in pipeline]
        lines += _table(["case", "GEMM path", "_scaled_mm calls / step", "ms / step", "TFLOP/s"], rows)
        lines += ["GEMM paths (fastpath.gemm.GEMM_PATHS):", ""]
        seen = set()
        for r in pipeline:
            if r["gemm_path"] + r["recipe"] not in seen:
                seen.add(r["gemm_path"] + r["recipe"])
                lines.append(f"- **{r['recipe']}** -> `{r['gemm_path']}`: {r['gemm_reason']}")
        lines.append("")
    host = data.get("host") or []
    if host:
        lines += ["## Host time per fuser forward", "",
                  "Tiny pipeline (hidden 64, ffn 256, 32 tokens): CPU time per forward, no synchronization in "
                  "the loop; the GPU work is negligible. The median over batches of forwards; the spread is "
                  "(slowest batch - fastest) / median.", ""]
        probe = data.get("host_probe_us")
        if probe:
            lines += [f"Host speed probe of this machine: {probe:.2f} us to allocate two small tensors and add "
                      "them (no refops code). Host times of runs on different machines compare through "
                      "'forward / probe'.", ""]
        lines += _table(["case", "us / forward", "spread", "forward / probe", "self time by area (us / forward)"],
                        [[h["label"], f"{h['us_per_forward']:.1f}", f"{h.get('spread_pct', 0.0):.0f} %",
                          f"{h['us_per_forward'] / probe:.0f}" if probe else "-",
                          ", ".join(f"{k}: {v}" for k, v in h["by_area"].items())] for h in host])
        for h in host:
            lines += [f"### cProfile, {h['label']}: top functions by self time", ""]
            lines += _table(["function", "calls / fwd", "self us / fwd", "cumulative us / fwd"],
                            [[f"`{r['function']}`", f"{r['calls_per_forward']:.0f}", f"{r['us_self_per_forward']:.1f}",
                              f"{r['us_cumulative_per_forward']:.1f}"] for r in h["top_functions"]])
    if data.get("roofline_png"):
        lines += [f"![bandwidth roofline]({pathlib.Path(data['roofline_png']).name})", ""]
    for note in data.get("notes", []):
        lines.append(f"- {note}")
    path.write_text("\n".join(lines) + "\n")


def write_roofline(path: pathlib.Path, copy_gbps: float, kernels: list[dict[str, Any]]) -> Optional[str]:
    """Horizontal bars of each kernel's bandwidth against the copy line; None (and why) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"matplotlib unavailable ({exc}); no roofline PNG"
    ordered = sorted(kernels, key=lambda k: k["gbps"])
    colors = {"quantize": "tab:blue", "dequantize": "tab:cyan", "activation": "tab:orange",
              "bias+activation": "tab:red", "norm": "tab:green"}
    fig, ax = plt.subplots(figsize=(10, 0.24 * len(ordered) + 1.5))
    ax.barh([f"{k['name']}{' (ref)' if k['implementation'] == 'reference' else ''}" for k in ordered],
            [k["gbps"] for k in ordered], color=[colors.get(k["family"], "gray") for k in ordered])
    ax.axvline(copy_gbps, color="black", label=f"D2D copy {copy_gbps:.0f} GB/s")
    ax.axvline(0.85 * copy_gbps, color="black", linestyle="--", label="85% (quantize target)")
    ax.axvline(0.80 * copy_gbps, color="gray", linestyle=":", label="80% (element-wise / norm target)")
    ax.set_xlabel("effective bandwidth (GB/s) = bytes read + written / median time")
    ax.set_title("Fast-path kernels on a 16384 x 8192 bf16 tensor vs device-to-device copy")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
