"""Benchmark the CuPy fast path on a GPU: kernels vs a device-to-device copy, a pipeline, host overhead.

    python -m fastpath.benchmark [--out benchmarks/results] [--quick] [--parts kernels,pipeline,host]
                                 [--cases SUBSTRING ...]

(also ``python -m refops bench [-- OPTIONS]`` and, in a source checkout, ``python benchmarks/bench_fastpath.py``)

(a) a device-to-device copy of a 16384 x 8192 bf16 tensor (bandwidth = 2 x bytes /
    median time), then every quantize/dequantize method of the fastpath backend
    (each recipe's usages), every activation forward/backward, bias + activation,
    LayerNorm/RMSNorm/L2 forward and backward on that tensor: median time (CUDA
    events, after warm-up), bytes read + written, effective bandwidth, % of copy;
(b) LayerNorm -> Linear(4096 -> 16384) -> GELU -> Linear(16384 -> 4096), 8192 tokens,
    bf16, forward + backward: fastpath vs reference under Float8CurrentScaling,
    plain bf16, and DelayedScaling, MXFP8, Float8BlockScaling, NVFP4 on the fast
    path, with the GEMM path each takes;
(c) host time per fuser forward of that pipeline at a tiny size, and a cProfile
    breakdown of it;
(d) a bandwidth roofline PNG of every kernel against the copy.

Writes ``fastpath_bench.json``, ``fastpath_bench.md`` and ``fastpath_roofline.png``
to ``--out`` (default: ``benchmarks/results`` under the current directory). GPU only: without CUDA and CuPy it
says why and exits 0. A full run takes a few minutes on an H200; ``--quick`` shrinks every shape for a smoke
test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import time
from typing import Optional, Sequence, Union

import torch

from .. import make_backend, unavailable_reason

__all__ = ["FULL", "QUICK", "ACTIVATION_PARAMS", "DEFAULT_OUT", "parse_args", "main"]

FULL = dict(kernel_shape=(16384, 8192), tokens=8192, hidden=4096, ffn=16384, pipeline_reps=5)
QUICK = dict(kernel_shape=(2048, 2048), tokens=1024, hidden=512, ffn=2048, pipeline_reps=3)
#: Parameters the parametrized activations are benchmarked with.
ACTIVATION_PARAMS = {
    "clamped_swiglu": {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0},
    "situglu": {"beta1": 4.0, "beta2": 25.0},
}


#: Where the records go without ``--out``: relative, so a run from the repository root writes where the docs'
#: records are, and a run from an installed package writes under the current directory.
DEFAULT_OUT = pathlib.Path("benchmarks", "results")


def parse_args(argv: Optional[Sequence[str]] = None, *, prog: Optional[str] = None,
               default_out: Union[pathlib.Path, str] = DEFAULT_OUT) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(default_out),
                        help=f"output directory (default: {default_out})")
    parser.add_argument("--quick", action="store_true", help="small shapes, for a smoke test")
    parser.add_argument("--parts", default="kernels,pipeline,host",
                        help="comma-separated subset of: kernels, pipeline, host")
    parser.add_argument("--cases", nargs="+", default=None, metavar="SUBSTRING",
                        help="measure only the kernel cases whose name contains one of these (the copy always)")
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(message, flush=True)


def main(argv: Optional[Sequence[str]] = None, *, prog: Optional[str] = None,
         default_out: Union[pathlib.Path, str] = DEFAULT_OUT) -> int:
    """Run the benchmark with the command-line arguments ``argv``; 0 also when there is nothing to measure here."""
    args = parse_args(argv, prog=prog, default_out=default_out)
    reason = unavailable_reason()
    if reason:
        log(f"the fast-path benchmark measures CUDA kernels and needs a GPU with CuPy; nothing measured: {reason}")
        return 0
    import cupy
    from refops.kernels import get_backend, register_backend

    from ..elementwise import GATED_ACTIVATIONS, UNARY_ACTIVATIONS
    from .kernel_cases import kernel_cases, measure_copy, run_cases
    from .pipeline import host_speed_probe_us, run_host_cases, run_pipeline_cases
    from .report import write_json, write_markdown, write_roofline

    register_backend("fastpath", make_backend)  # without an installed entry point too (a source checkout)
    sizes = QUICK if args.quick else FULL
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    device = torch.device("cuda", torch.cuda.current_device())
    args.out.mkdir(parents=True, exist_ok=True)
    rows, cols = sizes["kernel_shape"]
    data = {
        "meta": {
            "device": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "cupy": cupy.__version__,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "quick": args.quick,
            "kernel_shape": [rows, cols],
            "kernel_mib": rows * cols * 2 / 2**20,
            "pipeline": {k: sizes[k] for k in ("tokens", "hidden", "ffn")},
        },
        "notes": [],
    }
    started = time.perf_counter()
    if "kernels" in parts:
        log(f"(a) kernels on a {rows} x {cols} bf16 tensor")
        backend = get_backend("fastpath")
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device=device)
        copy = measure_copy(x)
        log(f"  copy: {copy.ms:.3f} ms, {copy.gbps:.0f} GB/s")
        cases = kernel_cases(backend, x, UNARY_ACTIVATIONS + GATED_ACTIVATIONS, ACTIVATION_PARAMS)
        if args.cases:
            cases = [c for c in cases if any(part in c.name for part in args.cases)]
        results = run_cases(backend, cases, log)
        data["copy"] = {"ms": copy.ms, "gbps": copy.gbps, "bytes": copy.bytes, "reps": copy.reps}
        data["kernels"] = [r.as_dict(copy.gbps) for r in results]
        del x, cases
        torch.cuda.empty_cache()
        png = args.out / "fastpath_roofline.png"
        why_not = write_roofline(png, copy.gbps, data["kernels"])
        if why_not:
            data["notes"].append(why_not)
        else:
            data["roofline_png"] = str(png)
    if "pipeline" in parts:
        log("(b) pipeline, forward + backward per step")
        data["pipeline"] = run_pipeline_cases(log, tokens=sizes["tokens"], hidden=sizes["hidden"],
                                              ffn=sizes["ffn"], reps=sizes["pipeline_reps"], device=device)
    if "host" in parts:
        log("(c) host time per fuser forward (tiny pipeline)")
        data["host_probe_us"] = round(host_speed_probe_us(device), 2)
        log(f"  host speed probe (two small tensors allocated and added): {data['host_probe_us']:.2f} us")
        data["host"] = run_host_cases(log, device)
    data["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    write_json(args.out / "fastpath_bench.json", data)
    # The Markdown writer reads plain dicts.
    write_markdown(args.out / "fastpath_bench.md", json.loads((args.out / "fastpath_bench.json").read_text()))
    log(f"wrote {args.out / 'fastpath_bench.json'}, {args.out / 'fastpath_bench.md'} "
        f"in {data['meta']['seconds']} s")
    return 0
