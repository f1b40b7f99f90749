"""How many GEMM outputs refops' ``gemm_numerics("hopper")`` reproduces bit for bit on a Hopper GPU.

    python benchmarks/gpu/hopper_gemm_shares.py OUTDIR [--budget-s 480] [--parts ABC]

Needs a CUDA GPU of compute capability 9.0 (H100 / H200), mmaemu (``pip install refops[hopper]``) and,
for part B, TransformerEngine. Writes ``OUTDIR/hopper_shares.json`` and ``OUTDIR/hopper_shares.md`` after
every row (a killed run keeps what it measured). Each part runs in try/except: an error is recorded,
the other parts still run. Parts:

* **A** ``torch._scaled_mm`` (per-tensor FP8, no bias) against refops' reference GEMM under
  ``gemm_numerics("hopper")`` and under ``"exact"``: the share of bit-identical outputs per shape,
  accumulation (fast / split) and output dtype, on the same FP8 bytes and scales.
* **B** TransformerEngine's ``te.ops`` (``Linear`` and ``Linear-GELU-Linear`` without bias) under FP8
  delayed and current scaling against the same refops pipeline under each mode: the share of
  bit-identical elements of the output (fprop), the input gradient (dgrad) and the weight gradients
  (wgrad), fp32 and bf16 parameters.
* **C** the fast path's FP8 GEMMs (``fastpath`` backend: ``torch._scaled_mm``) against the reference in
  hopper mode, per role, with the fast path under each mode (under "hopper" its fprop uses fast
  accumulation, as TE; under "exact" it uses the split accumulator for every role).

Exit status 0 when every part ran, 1 when one raised, 2 without a suitable GPU.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback
from typing import Any, Callable, Optional

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import refops  # noqa: E402
from refops.kernels import get_backend  # noqa: E402

#: (M, N, K) of part A: the 7 shapes of the 2026-12-04 measurement, and a few Linear-like ones.
SHAPES_A = [(16, 16, 32), (64, 64, 64), (128, 256, 512), (256, 512, 1024), (512, 512, 2048),
            (1024, 1024, 4096), (1024, 1024, 8192), (128, 1024, 256), (2048, 512, 128)]
OUT_DTYPES = (torch.float32, torch.bfloat16)
#: Which role gives which accumulation under gemm_numerics("hopper") (TE's per-tensor recipes).
ROLE_OF_ACCUMULATION = {True: "fprop", False: "dgrad"}  # use_fast_accum -> role


def bit_share(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The share of elements whose bits are equal."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise ValueError(f"bit_share: {tuple(actual.shape)} {actual.dtype} vs {tuple(expected.shape)} {expected.dtype}")
    if actual.numel() == 0:
        return 1.0
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[actual.element_size()]
    a, e = actual.detach().contiguous().cpu().view(width), expected.detach().contiguous().cpu().view(width)
    return float((a == e).double().mean().item())


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class Record:
    """Rows of each part, flushed to JSON and Markdown after every change."""

    def __init__(self, outdir: pathlib.Path, meta: dict[str, Any]) -> None:
        self.outdir = outdir
        self.data: dict[str, Any] = {"meta": meta, "parts": {}, "errors": {}, "notes": []}
        outdir.mkdir(parents=True, exist_ok=True)

    def add(self, part: str, row: dict[str, Any]) -> None:
        self.data["parts"].setdefault(part, []).append(row)
        self.flush()

    def error(self, part: str, text: str) -> None:
        self.data["errors"][part] = text
        self.flush()

    def flush(self) -> None:
        (self.outdir / "hopper_shares.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.outdir / "hopper_shares.md").write_text(markdown(self.data))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{100 * value:.2f} %"
    return "" if value is None else str(value)


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of ``rows`` (the union of their keys, in first-seen order)."""
    if not rows:
        return "(no rows)\n"
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_fmt(row.get(k)) for k in keys) + " |" for row in rows]
    return "\n".join(lines) + "\n"


TITLES = {
    "A": "A. torch._scaled_mm against the reference GEMM (share of bit-identical outputs)",
    "B": "B. TransformerEngine te.ops against refops (share of bit-identical elements per GEMM)",
    "C": "C. The fast path's FP8 GEMMs against the reference under gemm_numerics('hopper')",
}


def markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    out = ["# refops gemm_numerics('hopper') on " + str(meta.get("device")), ""]
    out += [f"- {k}: {v}" for k, v in meta.items()] + [""]
    for part in sorted(set(data["parts"]) | set(data["errors"])):
        out += [f"## {TITLES.get(part, part)}", "", table(data["parts"].get(part, []))]
        if part in data["errors"]:
            out += ["Error:", "", "```", data["errors"][part], "```", ""]
    if data["notes"]:
        out += ["## Notes", ""] + [f"- {n}" for n in data["notes"]] + [""]
    return "\n".join(out)


# ------------------------------------------------------------------ operands
def fp8_operand(shape: tuple[int, int], device: torch.device, seed: int, fp8_dtype: Any = None):
    """A current-scaling ``Float8Tensor`` of random normal values (both usages)."""
    fp8_dtype = refops.DType.kFloat8E4M3 if fp8_dtype is None else fp8_dtype
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * (1 + seed % 3)).to(device)
    return refops.Float8CurrentScalingQuantizer(fp8_dtype, device)(x)


def reference_gemm(a, b, *, numerics: str, role: str, out_dtype: torch.dtype, trans_a=False, trans_b=True):
    with refops.gemm_numerics(numerics):
        return get_backend("reference").gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype, role=role)


def scaled_mm(a, b, *, out_dtype: torch.dtype, fast: bool) -> torch.Tensor:
    """``torch._scaled_mm`` of fprop-layout operands (a rowwise (M, K), b rowwise (N, K))."""
    op_a, op_b = a.gemm_operand("rowwise", values=False), b.gemm_operand("rowwise", values=False)
    mat1 = op_a.data.view(op_a.fp8_dtype)
    mat2 = op_b.data.view(op_b.fp8_dtype).t()
    return torch._scaled_mm(mat1, mat2, scale_a=op_a.scale_inv.reshape(()).float(),
                            scale_b=op_b.scale_inv.reshape(()).float(), out_dtype=out_dtype, use_fast_accum=fast)


# ------------------------------------------------------------------ parts
def part_a(record: Record, device: torch.device, deadline: float) -> None:
    for i, (m, n, k) in enumerate(SHAPES_A):
        a, b = fp8_operand((m, k), device, 2 * i), fp8_operand((n, k), device, 2 * i + 1)
        for fast in (True, False):
            for out_dtype in OUT_DTYPES:
                if time.monotonic() > deadline:
                    record.data["notes"].append("part A stopped at the time budget")
                    return
                row: dict[str, Any] = {"M": m, "N": n, "K": k, "fast accum": fast, "out": dtype_name(out_dtype)}
                truth = scaled_mm(a, b, out_dtype=out_dtype, fast=fast)
                role = ROLE_OF_ACCUMULATION[fast]
                for numerics in ("hopper", "exact"):
                    try:
                        ref = reference_gemm(a, b, numerics=numerics, role=role, out_dtype=out_dtype)
                        row[numerics] = bit_share(ref, truth)
                    except Exception as error:  # noqa: BLE001  (recorded per row)
                        row[numerics] = f"{type(error).__name__}: {str(error)[:160]}"
                record.add("A", row)


def _te_pipelines(te_ops, refops_ops, hidden: int, device, dtype):
    def single(ops):
        return ops.Sequential(ops.Linear(hidden, hidden, bias=False, device=device, dtype=dtype))

    def mlp(ops):
        return ops.Sequential(ops.Linear(hidden, 2 * hidden, bias=False, device=device, dtype=dtype), ops.GELU(),
                              ops.Linear(2 * hidden, hidden, bias=False, device=device, dtype=dtype))

    return {"Linear": single, "Linear-GELU-Linear": mlp}


def _run(module, x, context, numerics: Optional[str]):
    x = x.detach().clone().requires_grad_(True)
    stack = refops.gemm_numerics(numerics) if numerics else _null()
    with stack:
        with context():
            y = module(x)
        y.backward(torch.ones_like(y) * 0.01 + 0.001 * torch.arange(y.numel(), device=y.device).reshape(y.shape) % 7)
    grads = {n: p.grad for n, p in module.named_parameters()}
    return y.detach(), x.grad, grads


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def part_b(record: Record, device: torch.device, deadline: float) -> None:
    from refops.recipe import DelayedScaling, Float8CurrentScaling
    from refops.testing.transformer_engine import candidate_context, copy_values, import_te

    te = import_te("hopper_gemm_shares")
    tokens, hidden = 256, 256
    for recipe_name, make_recipe in (("fp8 delayed", DelayedScaling), ("fp8 current", Float8CurrentScaling)):
        for dtype in (torch.float32, torch.bfloat16):
            for pipeline_name in ("Linear", "Linear-GELU-Linear"):
                if time.monotonic() > deadline:
                    record.data["notes"].append("part B stopped at the time budget")
                    return
                recipe = make_recipe()
                builders = _te_pipelines(te.pytorch.ops, refops.ops, hidden, device, dtype)
                build = builders[pipeline_name]
                torch.manual_seed(0)
                values = {n: p.detach().clone() for n, p in build(refops.ops).named_parameters()}
                gen = torch.Generator(device="cpu").manual_seed(1)
                x = torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype)
                te_module = build(te.pytorch.ops)
                copy_values(te_module, values)
                te_y, te_dx, te_dw = _run(te_module, x, candidate_context(recipe), None)
                shares: dict[str, dict[str, float]] = {}
                for numerics in ("hopper", "exact"):
                    ref_module = build(refops.ops)
                    copy_values(ref_module, values)
                    try:
                        y, dx, dw = _run(ref_module, x, lambda: refops.autocast(recipe=make_recipe()), numerics)
                        shares[numerics] = {"fprop (y)": bit_share(y, te_y), "dgrad (dx)": bit_share(dx, te_dx)}
                        for n in sorted(dw):
                            shares[numerics][f"wgrad ({n})"] = bit_share(dw[n], te_dw[n])
                    except Exception as error:  # noqa: BLE001
                        shares[numerics] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
                for tensor in shares["hopper"]:
                    record.add("B", {"recipe": recipe_name, "dtype": dtype_name(dtype), "pipeline": pipeline_name,
                                     "tokens x hidden": f"{tokens} x {hidden}", "tensor": tensor,
                                     "hopper": shares["hopper"].get(tensor), "exact": shares["exact"].get(tensor)})


def part_c(record: Record, device: torch.device, deadline: float) -> None:
    fast_backend = get_backend("fastpath")
    shapes = [(128, 256, 512), (256, 512, 1024), (1024, 1024, 4096)]
    for i, (m, n, k) in enumerate(shapes):
        # fprop: x (M, K) rowwise, W (N, K) rowwise; dgrad: dy (M, N) rowwise, W (N, K) columnwise;
        # wgrad: dy^T x: dy (M, N) columnwise, x (M, K) columnwise.
        x, w, dy = fp8_operand((m, k), device, 10 * i), fp8_operand((n, k), device, 10 * i + 1), \
            fp8_operand((m, n), device, 10 * i + 2, refops.DType.kFloat8E5M2)
        cases = {"fprop": (x, w, False, True), "dgrad": (dy, w, False, False), "wgrad": (dy, x, True, False)}
        for role, (a, b, ta, tb) in cases.items():
            for out_dtype in OUT_DTYPES:
                if time.monotonic() > deadline:
                    record.data["notes"].append("part C stopped at the time budget")
                    return
                row: dict[str, Any] = {"M": m, "N": n, "K": k, "role": role, "out": dtype_name(out_dtype)}
                try:
                    ref = reference_gemm(a, b, numerics="hopper", role=role, out_dtype=out_dtype, trans_a=ta,
                                         trans_b=tb)
                    for numerics in ("hopper", "exact"):
                        with refops.gemm_numerics(numerics):
                            got = fast_backend.gemm(a, b, trans_a=ta, trans_b=tb, out_dtype=out_dtype, role=role)
                        row[f"fastpath under {numerics}"] = bit_share(got, ref)
                except Exception as error:  # noqa: BLE001
                    row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                record.add("C", row)


PARTS: dict[str, Callable[[Record, torch.device, float], None]] = {"A": part_a, "B": part_b, "C": part_c}

NOTES = [
    "refops runs gemm_numerics('hopper') with split_k=1: the GEMM cuBLASLt runs without splitting K. A row below "
    "100 % in hopper mode is first suspected of a split-K (or stream-K) choice of cuBLASLt on this GPU, which mmaemu's "
    "H100 PCIe tables do not know, then of a different kernel (cuBLASLt version).",
    "Part B: TE adds no bias here (bias=False) so that each tensor is one GEMM's output rounded once; the "
    "Linear-GELU-Linear rows compound: the second GEMM reads the first one's quantized output, and one flipped "
    "FP8 code changes many outputs downstream.",
    "Part B's exact column is the state before issue #26 (refops' exact dequantize-then-fp32 GEMM).",
]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=pathlib.Path)
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--parts", default="ABC")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("hopper_gemm_shares: needs a CUDA GPU of compute capability 9.0 (H100 / H200)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        import mmaemu
        meta["mmaemu"] = mmaemu.__version__
    except ImportError as error:
        meta["mmaemu"] = f"missing: {error}"
    try:
        from importlib.metadata import version
        meta["transformer_engine"] = version("transformer-engine")
    except Exception:  # noqa: BLE001
        meta["transformer_engine"] = "missing"
    record = Record(args.outdir, meta)
    record.data["notes"] += NOTES
    start = time.monotonic()
    failed = False
    parts = [p for p in args.parts.upper() if p in PARTS]
    for index, part in enumerate(parts):
        remaining = args.budget_s - (time.monotonic() - start)
        deadline = time.monotonic() + remaining / (len(parts) - index)  # an equal share of what is left
        t0 = time.monotonic()
        try:
            PARTS[part](record, device, deadline)
        except Exception:  # noqa: BLE001  (recorded; the other parts still run)
            failed = True
            record.error(part, traceback.format_exc()[-4000:])
        record.data["meta"][f"part {part} seconds"] = round(time.monotonic() - t0, 1)
        record.flush()
        print(f"part {part}: {time.monotonic() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
