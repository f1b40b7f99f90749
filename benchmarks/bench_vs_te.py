"""TransformerEngine and refops's fast path side by side on one GPU: same inputs, same work, one run.

    python benchmarks/bench_vs_te.py [--out OUTDIR] [--rows KEY,...] [--reps 20] [--size 8192]
                                     [--tokens 8192 --hidden 4096 --ffn 16384] [--no-kernels] [--profile]
    python benchmarks/bench_vs_te.py --compare BEFORE/vs_te.json AFTER/vs_te.json

Rows (``--rows`` takes their keys, or substrings of them):

* quantize rows: one ``size x size`` bf16 tensor quantized row-wise and column-wise by each side's quantizer
  object (``quantizer.quantize(x)``): FP8 current scaling and delayed scaling (E4M3), FP8 block scaling 1x128
  and 128x128 (E4M3, power-of-two scales). refops: ``refops.quantization``'s ``Float8CurrentScalingQuantizer``,
  ``Float8Quantizer``, ``Float8BlockQuantizer``, with ``refops.use_backend("fastpath")``; TE: the quantizer of
  the same class and options (``refops.testing.transformer_engine.te_quantizer``). Before timing, both sides'
  data and scale bytes are compared (the ``same_bytes`` key). MXFP8 and NVFP4 have no TE kernel on sm_90 (TE
  needs compute capability 10.0), so their rows compare refops with a ``torch.compile``'d plain-torch
  formulation that produces the same bytes (asserted: ``peers.mxfp8`` and ``nvfp4_vs_compile.peer``); the
  ``te_ms`` of those rows is that peer's time and their ``baseline`` key says so.
* training-step rows: ``Sequential(Linear(hidden, ffn), GELU(), Linear(ffn, hidden))`` in bf16 with biases, one
  forward (inside ``autocast(recipe=...)``; none for the bf16 row) and one backward with a fixed ``dy``, the
  input requiring grad, every grad set to None before the step, no optimizer. TE: ``te.ops.Sequential(
  te.ops.Linear, te.ops.GELU, te.ops.Linear)`` under ``te.autocast`` (``candidate_context`` of
  ``refops.testing.transformer_engine``); refops: ``refops.ops.Sequential(refops.ops.Linear, refops.ops.GELU,
  refops.ops.Linear)`` under ``refops.autocast``, fast-path backend. Both sides hold the same parameter values
  (``copy_values``) and get the same ``x`` and ``dy``; the SQNR of refops's output and input grad against TE's
  is recorded (``sqnr_y_db``, ``sqnr_dx_db``). Recipes: refops' default ``DelayedScaling()``,
  ``Float8CurrentScaling()``, ``Float8BlockScaling()``, and TE's with the same settings (``te_recipe``).

Every time is the median of ``--reps`` CUDA-event intervals between consecutive calls after warm-up:

* ``te_ms`` / ``refops_ms`` (the headline, "eager"): calls enqueued back to back on an idle GPU, as a training
  loop runs them. When the host takes longer to enqueue a call than the GPU takes to run it, this is host time.
* ``*_device_ms``: the same calls (at most 5 training steps) enqueued behind a GPU spin (``torch.cuda._sleep``) long
  enough for the host to queue all of them, so the intervals are device time without host gaps. A call that synchronizes the host
  with the device (``cudaStreamSynchronize``, a blocking copy) drains the queue: its device time stays eager.
* ``*_host_ms``: host wall time per call (no synchronization inside the loop).

Each row also gets achieved bandwidth (quantize rows: bytes read + written, counted once for both sides, over
the time) or TFLOP/s (training rows: 6 GEMMs of ``2 tokens hidden ffn`` FLOP). With ``--kernels`` (default) one
call per side runs under ``torch.profiler``: the kernels it launched (``kernels/<row>_<side>.txt``), their
count and the host-device synchronizations (``*_kernels``, ``*_syncs``), and refops's fast-path launches
counted in Python (``refops_fastpath_launches``).

Records: ``OUTDIR/vs_te.json`` (a list of rows: ``work``, ``te_ms``, ``refops_ms``, ``ratio`` = refops_ms /
te_ms, and the extra keys above; ``te_ms`` and ``ratio`` are null, with ``te_skipped`` saying why, where the
baseline cannot run) and ``OUTDIR/vs_te.md`` (a markdown table of the same). Without a GPU the script says why
and exits 0; without TransformerEngine the TE columns are skipped with the import error as the reason.

TE's objects come from the oracle's adapters (``refops.testing.transformer_engine``): the quantizer, the recipe,
the autocast, the parameter copy and the quantized arrays read the same way as in ``python -m refops
conformance``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import pathlib
import statistics
import sys
import time
from typing import Any, Callable, Optional, Sequence

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # peers.py and nvfp4_vs_compile.py beside this script

import torch  # noqa: E402

from fastpath.benchmark.timing import event_intervals_ms  # noqa: E402
from refops.testing import sqnr_db  # noqa: E402,F401  (the SQNR of the records, and of the tests)

RECORD_KEYS = ("work", "te_ms", "refops_ms", "ratio")


# ------------------------------------------------------------------------------------------ the rows
@dataclasses.dataclass(frozen=True)
class Sizes:
    size: int = 8192  # the quantize rows' tensor is size x size
    tokens: int = 8192
    hidden: int = 4096
    ffn: int = 16384


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    kind: str  # "quantize" or "step"
    recipe: Optional[str]  # quantize: fp8_current, fp8_delayed, fp8_block_1x128, fp8_block_128x128, mxfp8, nvfp4;
    #                        step: None (bf16), fp8_current, fp8_delayed, fp8_block
    baseline: str  # "te" or "compile"

    def work(self, sizes: Sizes) -> str:
        """The row's name in the records (the issue's wording)."""
        if self.kind == "quantize":
            what = _QUANTIZE_NAMES[self.recipe]
            peer = ", vs torch.compile peer (no TE kernel on sm_90)" if self.baseline == "compile" else ""
            return f"quantize {sizes.size}x{sizes.size} bf16, {what}, row+col{peer}"
        step = (f"training step Linear({sizes.hidden},{sizes.ffn})-GELU-Linear({sizes.ffn},{sizes.hidden}), "
                f"batch {sizes.tokens}")
        return f"{step}, {_STEP_NAMES[self.recipe]}"


_QUANTIZE_NAMES = {
    "fp8_current": "FP8 current scaling",
    "fp8_delayed": "FP8 delayed scaling",
    "fp8_block_1x128": "FP8 block 1x128",
    "fp8_block_128x128": "FP8 block 128x128",
    "mxfp8": "MXFP8",
    "nvfp4": "NVFP4",
}
_STEP_NAMES = {None: "bf16", "fp8_current": "FP8 current scaling", "fp8_delayed": "FP8 delayed scaling",
               "fp8_block": "FP8 block scaling"}

ROWS: tuple[Row, ...] = (
    Row("quantize_fp8_current", "quantize", "fp8_current", "te"),
    Row("quantize_fp8_delayed", "quantize", "fp8_delayed", "te"),
    Row("quantize_fp8_block_1x128", "quantize", "fp8_block_1x128", "te"),
    Row("quantize_fp8_block_128x128", "quantize", "fp8_block_128x128", "te"),
    Row("quantize_mxfp8", "quantize", "mxfp8", "compile"),
    Row("quantize_nvfp4", "quantize", "nvfp4", "compile"),
    Row("step_bf16", "step", None, "te"),
    Row("step_fp8_current", "step", "fp8_current", "te"),
    Row("step_fp8_delayed", "step", "fp8_delayed", "te"),
    Row("step_fp8_block", "step", "fp8_block", "te"),
)


def select_rows(spec: Optional[str], rows: Sequence[Row] = ROWS) -> list[Row]:
    """The rows ``--rows`` names: comma-separated keys or substrings of keys (all rows for None or "")."""
    if not spec:
        return list(rows)
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    chosen = [r for r in rows if any(w == r.key or w in r.key for w in wanted)]
    unknown = [w for w in wanted if not any(w == r.key or w in r.key for r in rows)]
    if unknown:
        raise ValueError(f"bench_vs_te.py --rows: no row matches {unknown}; the rows are {[r.key for r in rows]}")
    return chosen


def step_flops(sizes: Sizes) -> float:
    """FLOP of one training step: forward, dgrad and wgrad GEMMs of both linears (the element-wise work aside)."""
    return 6 * 2.0 * sizes.tokens * sizes.hidden * sizes.ffn


# ------------------------------------------------------------------------------------------ records
def make_record(row: Row, sizes: Sizes, te_ms: Optional[float], refops_ms: Optional[float],
                **extra: Any) -> dict[str, Any]:
    """One row of ``vs_te.json``: the four keys first (ratio = refops_ms / te_ms, None when either is missing),
    then ``extra``. Non-finite times are recorded as None."""
    te_ms = _finite(te_ms)
    refops_ms = _finite(refops_ms)
    ratio = refops_ms / te_ms if te_ms and refops_ms is not None else None
    record = {"work": row.work(sizes), "te_ms": te_ms, "refops_ms": refops_ms, "ratio": ratio,
              "key": row.key, "baseline": _BASELINES[row.baseline]}
    record.update(extra)
    return record


_BASELINES = {"te": "TransformerEngine", "compile": "torch.compile of a plain-torch formulation (same bytes)"}


def _finite(value: Optional[float]) -> Optional[float]:
    return float(value) if value is not None and math.isfinite(value) else None


def _fmt(value: Optional[float], digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def throughput(record: dict[str, Any], side: str) -> str:
    """The achieved GB/s (quantize rows) or TFLOP/s (training rows) of ``side`` ("te" or "refops")."""
    for key, unit in (("gbps", "GB/s"), ("tflops", "TFLOP/s")):
        value = record.get(f"{side}_{key}")
        if value is not None:
            return f"{value:.0f} {unit}"
    return "-"


def markdown_table(records: Sequence[dict[str, Any]], meta: Optional[dict[str, Any]] = None) -> str:
    """``vs_te.md``: one line per row; ratio = refops / baseline (below 1: refops faster)."""
    lines = []
    if meta:
        lines += [f"# TransformerEngine vs refops fast path ({meta.get('device', '?')})", "",
                  f"torch {meta.get('torch', '?')}, TransformerEngine {meta.get('te', '?')}, CuPy "
                  f"{meta.get('cupy', '?')}; {meta.get('date', '?')}; median of {meta.get('reps', '?')} CUDA-event "
                  "intervals after warm-up. eager: calls back to back on an idle GPU (host time where the host "
                  "is slower than the GPU); device: the same calls queued behind a GPU spin (no host gaps); "
                  "host: host wall time per call. Baseline: TransformerEngine, or a torch.compile peer where TE "
                  "has no kernel on this GPU.", ""]
    header = ["work", "baseline ms", "refops ms", "ratio", "baseline", "refops", "device ms (base / refops)",
              "device ratio", "host ms (base / refops)", "notes"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in records:
        te_dev, ref_dev = r.get("te_device_ms"), r.get("refops_device_ms")
        device_ratio = ref_dev / te_dev if te_dev and ref_dev is not None else None
        notes = []
        if r.get("baseline", "").startswith("torch.compile"):
            notes.append("baseline: torch.compile peer")
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
        lines.append("| " + " | ".join([
            r["work"], _fmt(r["te_ms"]), _fmt(r["refops_ms"]), _fmt(r["ratio"], 2), throughput(r, "te"),
            throughput(r, "refops"), f"{_fmt(te_dev)} / {_fmt(ref_dev)}", _fmt(device_ratio, 2),
            f"{_fmt(r.get('te_host_ms'))} / {_fmt(r.get('refops_host_ms'))}", "; ".join(notes)]) + " |")
    return "\n".join(lines) + "\n"


def write_records(out: pathlib.Path, records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    """``out/vs_te.json`` (the list of rows), ``out/vs_te_meta.json`` and ``out/vs_te.md``."""
    out.mkdir(parents=True, exist_ok=True)
    for r in records:
        missing = [k for k in RECORD_KEYS if k not in r]
        if missing:
            raise ValueError(f"write_records: row {r.get('key', r)} lacks {missing}")
    (out / "vs_te.json").write_text(json.dumps(list(records), indent=1) + "\n")
    (out / "vs_te_meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    (out / "vs_te.md").write_text(markdown_table(records, meta))


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


# ------------------------------------------------------------------------------------------ timing
def _sync() -> None:
    torch.cuda.synchronize()


def eager_ms(fn: Callable[[], Any], reps: int, warmup: int) -> float:
    """Median of ``reps`` event intervals of calls enqueued back to back on an idle GPU."""
    for _ in range(warmup):
        fn()
    _sync()
    return statistics.median(event_intervals_ms(fn, reps))


def host_ms(fn: Callable[[], Any], calls: int) -> float:
    """Host wall milliseconds per call, no synchronization inside the loop (the GPU runs meanwhile)."""
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    _sync()
    return 1e3 * elapsed / calls


_SPIN_CYCLES_PER_MS: Optional[float] = None


def _spin_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep`` (measured once)."""
    global _SPIN_CYCLES_PER_MS
    if _SPIN_CYCLES_PER_MS is None:
        cycles = 20_000_000
        torch.cuda._sleep(cycles)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SPIN_CYCLES_PER_MS = cycles / max(start.elapsed_time(end), 1e-3)
    return _SPIN_CYCLES_PER_MS


def device_ms(fn: Callable[[], Any], reps: int, host_ms_per_call: float) -> float:
    """Median of ``reps`` event intervals of calls queued behind a GPU spin that outlasts their enqueueing."""
    _sync()
    spin_ms = 1.5 * host_ms_per_call * reps + 5.0
    torch.cuda._sleep(int(spin_ms * _spin_cycles_per_ms()))
    return statistics.median(event_intervals_ms(fn, reps))


# ------------------------------------------------------------------------------------------ the sides
def load_te() -> tuple[Any, Optional[str]]:
    """``(TransformerEngine, None)`` (the adapters' handle: ``.pytorch``, ``.recipe``, ``.version``), or
    ``(None, reason)`` when it does not import."""
    from refops.testing.transformer_engine import TransformerEngineUnavailable, import_te

    try:
        return import_te("bench_vs_te.py"), None
    except TransformerEngineUnavailable as exc:  # not installed, or built for another torch / CUDA
        return None, str(exc)


def load_refops_fastpath() -> tuple[Any, Any]:
    """``(refops, fastpath)`` with the fast path selected (registered here: works from a source tree too)."""
    import fastpath
    import refops
    from refops.kernels import register_backend

    register_backend("fastpath", fastpath.make_backend)
    refops.use_backend("fastpath")
    return refops, fastpath


def refops_quantizer(recipe: str, device: torch.device) -> Any:
    from refops.quantization import (
        DType,
        Float8BlockQuantizer,
        Float8CurrentScalingQuantizer,
        Float8Quantizer,
        MXFP8Quantizer,
        NVFP4Quantizer,
    )

    e4m3 = DType.kFloat8E4M3
    if recipe == "fp8_current":
        return Float8CurrentScalingQuantizer(e4m3, device, rowwise=True, columnwise=True)
    if recipe == "fp8_delayed":
        return Float8Quantizer(torch.ones(1, device=device), torch.zeros(1, device=device), e4m3, rowwise=True,
                               columnwise=True)
    if recipe.startswith("fp8_block"):
        return Float8BlockQuantizer(e4m3, rowwise=True, columnwise=True,
                                    block_scaling_dim=1 if recipe.endswith("1x128") else 2)
    if recipe == "mxfp8":
        return MXFP8Quantizer(e4m3, rowwise=True, columnwise=True)
    if recipe == "nvfp4":
        return NVFP4Quantizer(rowwise=True, columnwise=True)
    raise ValueError(f"refops_quantizer: unknown recipe {recipe!r}")


#: The quantize rows TE has a kernel for on sm_90.
_TE_QUANTIZERS = ("fp8_current", "fp8_delayed", "fp8_block_1x128", "fp8_block_128x128")


def te_quantizer(recipe: str, device: torch.device) -> Any:
    """TE's quantizer of the same class and options as :func:`refops_quantizer` for ``recipe``."""
    from refops.testing.transformer_engine import te_quantizer as te_quantizer_like

    if recipe not in _TE_QUANTIZERS:
        raise ValueError(f"te_quantizer: no TE quantizer for {recipe!r} on this GPU")
    return te_quantizer_like(refops_quantizer(recipe, device), device=device)


def quantized_arrays(q: Any, recipe: str, m: int, k: int) -> dict[str, torch.Tensor]:
    """The data of both usages and the valid region of the scales of a TE or refops quantized tensor
    (``quantized_fields``: the padding of a scale array is no byte either side promises)."""
    from refops.testing.transformer_engine import quantized_fields

    row, col = quantized_fields(q, "rowwise"), quantized_fields(q, "columnwise")
    if recipe in ("fp8_current", "fp8_delayed"):
        return {"data": row["data"], "transpose": col["data"], "scale_inv": row["scale_inv"][:1]}
    bk, bm = -(-k // 128), -(-m // 128)
    if recipe == "fp8_block_1x128":
        valid = {"row": (bk, m), "col": (bm, k)}
    elif recipe == "fp8_block_128x128":
        valid = {"row": (bm, bk), "col": (bk, bm)}
    else:
        raise ValueError(f"quantized_arrays: {recipe!r}")
    return {"row data": row["data"], "col data": col["data"],
            "row scales": row["scale_inv"][: valid["row"][0], : valid["row"][1]],
            "col scales": col["scale_inv"][: valid["col"][0], : valid["col"][1]]}


def compare_bytes(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[bool, str]:
    """Whether every array holds the same bytes; otherwise which differ and how."""
    problems = []
    for name, a in ours.items():
        b = theirs.get(name)
        if a is None or b is None:
            if (a is None) != (b is None):
                problems.append(f"{name}: present on one side only")
            continue
        if tuple(a.shape) != tuple(b.shape):
            problems.append(f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
            continue
        ab, bb = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
        differ = int((ab != bb).sum())
        if differ:
            problems.append(f"{name}: {differ} of {ab.numel()} bytes")
    return not problems, "; ".join(problems)


def _compile_peer(recipe: str) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """The torch.compile'd peer of an MXFP8 / NVFP4 row+col quantization (same bytes as refops)."""
    if recipe == "mxfp8":
        import peers

        def peer(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            row, row_scale = peers.mxfp8(x)
            col_t, col_scale_t = peers.mxfp8(x.t())  # blocks of 32 along dim 0 = row-wise blocks of x^T
            return row, row_scale, col_t.t(), col_scale_t.t()
    else:
        import nvfp4_vs_compile

        def peer(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return nvfp4_vs_compile.peer(x, True)
    return torch.compile(peer, fullgraph=True, dynamic=False)


def refops_peer_outputs(q: Any, recipe: str, m: int, k: int) -> tuple[torch.Tensor, ...]:
    """refops's arrays in the order and region the compile peer returns them."""
    if recipe == "mxfp8":
        return (q._rowwise_data, q._rowwise_scale_inv[:m, : k // 32], q._columnwise_data,
                q._columnwise_scale_inv[: m // 32, :k])
    return (q._rowwise_data.reshape(m, k // 2), q._rowwise_scale_inv[:m, : k // 16], q._amax_rowwise,
            q._columnwise_data.reshape(k, m // 2), q._columnwise_scale_inv[:k, : m // 16])


# ------------------------------------------------------------------------------------------ training step
def _parameter_values(sizes: Sizes, device: torch.device) -> dict[str, torch.Tensor]:
    """The two linears' weights and biases by parameter name, the same values for both sides."""
    g = torch.Generator(device=device).manual_seed(0)
    h, f = sizes.hidden, sizes.ffn

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(torch.bfloat16)

    return {"0.weight": randn(f, h, scale=h ** -0.5), "0.bias": randn(f, scale=0.1),
            "2.weight": randn(h, f, scale=f ** -0.5), "2.bias": randn(h, scale=0.1)}


def _refops_recipe(recipe: Optional[str]) -> Any:
    if recipe is None:
        return None
    from refops import recipe as refops_recipes

    return {"fp8_current": refops_recipes.Float8CurrentScaling, "fp8_delayed": refops_recipes.DelayedScaling,
            "fp8_block": refops_recipes.Float8BlockScaling}[recipe]()


def refops_context(recipe: Any) -> Callable[[], Any]:
    """The forward's context on refops's side: ``refops.autocast`` with ``recipe`` (off for None)."""
    import refops

    return lambda: refops.autocast(enabled=recipe is not None, recipe=recipe)


def te_context(recipe: Any) -> Callable[[], Any]:
    """The forward's context on TE's side: TE's ``autocast`` with TE's version of the refops ``recipe``."""
    from refops.testing.transformer_engine import candidate_context

    return candidate_context(recipe)


def make_step(ops: Any, context: Callable[[], Any], sizes: Sizes, device: torch.device,
              values: dict[str, torch.Tensor], x: torch.Tensor,
              dy: torch.Tensor) -> tuple[Callable[[], None], torch.nn.Module]:
    """One forward (inside ``context()``) + backward of ``ops.Sequential(Linear, GELU, Linear)``."""
    from refops.testing.transformer_engine import copy_values

    h, f = sizes.hidden, sizes.ffn
    model = ops.Sequential(
        ops.Linear(h, f, device=device, dtype=torch.bfloat16),
        ops.GELU(),
        ops.Linear(f, h, device=device, dtype=torch.bfloat16),
    )
    copy_values(model, values)
    params = list(model.parameters())

    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        with context():
            y = model(x)
        y.backward(dy)
        step.y = y  # type: ignore[attr-defined]

    return step, model


# ------------------------------------------------------------------------------------------ profiling
@contextlib.contextmanager
def counting_fastpath_launches(counter: list[int]):
    """Count the fast path's kernel launches (``fastpath._cuda.launch`` and the modules that bound it by name)."""
    patched = []
    try:
        import fastpath._cuda as cuda_module
    except Exception:  # a tree without fastpath: nothing to count
        yield
        return
    real = cuda_module.launch

    def counted(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return real(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if (name == "fastpath" or name.startswith("fastpath.")) and getattr(module, "launch", None) is real:
            setattr(module, "launch", counted)
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            setattr(module, "launch", real)


def profile_call(fn: Callable[[], Any], path: Optional[pathlib.Path]) -> dict[str, Any]:
    """Kernels launched and host-device synchronizations of one call, by ``torch.profiler`` (CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    _sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        _sync()
    kernels: dict[str, list[float]] = {}
    syncs = 0
    for evt in prof.events():
        name = evt.name
        device_type = str(getattr(evt, "device_type", ""))
        if device_type.endswith("CUDA"):
            us = getattr(evt, "self_device_time_total", None)
            if us is None:
                us = getattr(evt, "self_cuda_time_total", 0.0)
            kernels.setdefault(name, []).append(float(us))
        elif name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"):
            syncs += 1
    # The closing torch.cuda.synchronize() above is ours, not the call's.
    syncs = max(0, syncs - 1)
    total = sum(len(v) for v in kernels.values())
    if path is not None:
        rows = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))
        lines = [f"{total} device activities (kernels, copies, memsets), {syncs} host-device syncs in one call",
                 f"{'us total':>10} {'count':>6}  name"]
        lines += [f"{sum(v):10.1f} {len(v):6d}  {n[:160]}" for n, v in rows]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    return {"kernels": total, "syncs": syncs}


# ------------------------------------------------------------------------------------------ measuring
@dataclasses.dataclass
class Side:
    """A prepared call of one side (``fn``), how many calls its host time is the mean of, and at most how many
    calls its device time queues behind the spin: a training step launches ~100-250 kernels, and the GPU's
    launch queue holds about a thousand, so more steps than that would wait for the spin on the host."""

    fn: Callable[[], Any]
    host_calls: int
    device_reps: Optional[int] = None


def measure_side(side: Side, reps: int, warmup: int) -> dict[str, float]:
    eager = eager_ms(side.fn, reps, warmup)
    host = host_ms(side.fn, side.host_calls)
    device = device_ms(side.fn, min(reps, side.device_reps or reps), host)
    return {"ms": eager, "device_ms": device, "host_ms": host}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def run_quantize_row(row: Row, sizes: Sizes, te: Any, te_reason: Optional[str], args: argparse.Namespace,
                     device: torch.device) -> dict[str, Any]:
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
                te_skipped = f"TE failed: {_error(exc)}"
    else:
        try:
            peer = _compile_peer(row.recipe)
            got, want = refops_peer_outputs(q_ours, row.recipe, m, k), peer(x)
            same, detail = compare_bytes({str(i): t for i, t in enumerate(got)},
                                         {str(i): t.reshape(got[i].shape) for i, t in enumerate(want)})
            extra["same_bytes"], extra["same_bytes_detail"] = same, detail
            base_side = Side(lambda: peer(x), host_calls=max(args.reps, 20))
        except Exception as exc:
            te_skipped = f"torch.compile peer failed: {_error(exc)}"
    return _measure_row(row, sizes, args, refops_side, base_side, te_skipped, extra, moved=moved)


def run_step_row(row: Row, sizes: Sizes, te: Any, te_reason: Optional[str], args: argparse.Namespace,
                 device: torch.device) -> dict[str, Any]:
    import refops

    values = _parameter_values(sizes, device)
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(sizes.tokens, sizes.hidden, generator=g, device=device).to(torch.bfloat16).requires_grad_(True)
    dy = (torch.randn(sizes.tokens, sizes.hidden, generator=g, device=device) * 0.1).to(torch.bfloat16)
    extra: dict[str, Any] = {"flop": step_flops(sizes)}
    recipe = _refops_recipe(row.recipe)
    ours_step, _ = make_step(refops.ops, refops_context(recipe), sizes, device, values, x, dy)
    refops_side = Side(ours_step, host_calls=3, device_reps=5)
    base_side, te_skipped = None, None
    if te is None:
        te_skipped = te_reason
    else:
        try:
            te_step, _ = make_step(te.pytorch.ops, te_context(recipe), sizes, device, values, x, dy)
            te_step()
            y_te, dx_te = te_step.y.detach().clone(), x.grad.detach().clone()
            ours_step()
            extra["sqnr_y_db"] = sqnr_db(ours_step.y, y_te)
            extra["sqnr_dx_db"] = sqnr_db(x.grad, dx_te)
            base_side = Side(te_step, host_calls=3, device_reps=5)
        except Exception as exc:
            te_skipped = f"TE failed: {_error(exc)}"
    return _measure_row(row, sizes, args, refops_side, base_side, te_skipped, extra, flop=extra["flop"])


def _measure_row(row: Row, sizes: Sizes, args: argparse.Namespace, refops_side: Side, base_side: Optional[Side],
                 te_skipped: Optional[str], extra: dict[str, Any], *, moved: Optional[int] = None,
                 flop: Optional[float] = None) -> dict[str, Any]:
    warmup = args.warmup
    results: dict[str, dict[str, float]] = {}
    for name, side in (("te", base_side), ("refops", refops_side)):
        if side is None:
            continue
        try:
            results[name] = measure_side(side, args.reps, warmup)
        except Exception as exc:
            extra[f"{name}_error"] = _error(exc)
            if name == "te":
                te_skipped = te_skipped or f"baseline failed while timed: {_error(exc)}"
    for name, r in results.items():
        extra[f"{name}_device_ms"] = r["device_ms"]
        extra[f"{name}_host_ms"] = r["host_ms"]
        if moved is not None:
            extra[f"{name}_gbps"] = moved / (r["ms"] * 1e-3) / 1e9
        if flop is not None:
            extra[f"{name}_tflops"] = flop / (r["ms"] * 1e-3) / 1e12
    if args.kernels:
        for name, side in (("te", base_side), ("refops", refops_side)):
            if side is None or name not in results:
                continue
            try:
                launches = [0]
                with counting_fastpath_launches(launches) if name == "refops" else contextlib.nullcontext():
                    counts = profile_call(side.fn, args.out / "kernels" / f"{row.key}_{name}.txt")
                extra[f"{name}_kernels"], extra[f"{name}_syncs"] = counts["kernels"], counts["syncs"]
                if name == "refops":
                    extra["refops_fastpath_launches"] = launches[0]
            except Exception as exc:
                extra[f"{name}_profile_error"] = _error(exc)
    if args.profile:
        _cprofile(refops_side.fn, args.out / "profiles" / f"{row.key}_refops.txt")
    if te_skipped:
        extra["te_skipped"] = te_skipped
    return make_record(row, sizes, results.get("te", {}).get("ms"), results.get("refops", {}).get("ms"), **extra)


def _cprofile(fn: Callable[[], Any], path: pathlib.Path, calls: int = 20) -> None:
    """The host time of ``calls`` calls by function (cProfile), top 40 by self time."""
    import cProfile
    import io
    import pstats

    _sync()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    _sync()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{calls} calls\n" + stream.getvalue())


def _meta(args: argparse.Namespace, te: Any, te_reason: Optional[str], sizes: Sizes) -> dict[str, Any]:
    import refops

    meta: dict[str, Any] = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "refops": str(pathlib.Path(refops.__file__).resolve().parent),
        "reps": args.reps,
        "warmup": args.warmup,
        "sizes": dataclasses.asdict(sizes),
        "te": te.version if te is not None else None,
        "te_reason": te_reason,
    }
    try:
        import cupy
        import fastpath

        meta["cupy"] = cupy.__version__
        meta["fastpath"] = str(pathlib.Path(fastpath.__file__).resolve().parent)
    except Exception as exc:
        meta["cupy"] = f"unavailable ({_error(exc)})"
    return meta


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("vs_te_out"), help="output directory")
    parser.add_argument("--rows", default="", help="comma-separated row keys or substrings (default: all): "
                        + ", ".join(r.key for r in ROWS))
    parser.add_argument("--reps", type=int, default=20, help="timed calls per side and mode (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--size", type=int, default=Sizes.size)
    parser.add_argument("--tokens", type=int, default=Sizes.tokens)
    parser.add_argument("--hidden", type=int, default=Sizes.hidden)
    parser.add_argument("--ffn", type=int, default=Sizes.ffn)
    parser.add_argument("--no-kernels", dest="kernels", action="store_false",
                        help="skip the torch.profiler pass (kernel lists and host syncs per call)")
    parser.add_argument("--profile", action="store_true", help="also write a cProfile of refops's host time per row")
    parser.add_argument("--compare", nargs=2, type=pathlib.Path, metavar=("BEFORE_JSON", "AFTER_JSON"),
                        help="print two records side by side and exit (no GPU needed)")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        parser.error("--reps must be >= 1 and --warmup >= 0")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        print(compare_table(before, after), end="")
        return 0
    try:
        rows = select_rows(args.rows)
    except ValueError as exc:
        print(exc)
        return 2
    if not torch.cuda.is_available():
        print("bench_vs_te.py times GPU work; torch reports no CUDA device: nothing measured")
        return 0
    import fastpath

    reason = fastpath.unavailable_reason()
    if reason:
        print(f"bench_vs_te.py needs the fast path: {reason}; nothing measured")
        return 0
    load_refops_fastpath()
    te, te_reason = load_te()
    sizes = Sizes(args.size, args.tokens, args.hidden, args.ffn)
    device = torch.device("cuda", torch.cuda.current_device())
    meta = _meta(args, te, te_reason, sizes)
    print(f"refops from {meta['refops']}; TransformerEngine: {meta['te'] or te_reason}; {meta['device']}", flush=True)
    records = []
    for row in rows:
        start = time.perf_counter()
        runner = run_quantize_row if row.kind == "quantize" else run_step_row
        try:
            record = runner(row, sizes, te, te_reason, args, device)
        except Exception as exc:  # the row could not even be set up: record why and go on
            record = make_record(row, sizes, None, None, refops_error=_error(exc))
        records.append(record)
        torch.cuda.empty_cache()
        print(f"{row.key:<28} baseline {_fmt(record['te_ms'])} ms  refops {_fmt(record['refops_ms'])} ms  "
              f"ratio {_fmt(record['ratio'], 2)}  device {_fmt(record.get('te_device_ms'))} / "
              f"{_fmt(record.get('refops_device_ms'))} ms  host {_fmt(record.get('te_host_ms'))} / "
              f"{_fmt(record.get('refops_host_ms'))} ms  ({time.perf_counter() - start:.0f} s)"
              + (f"  [{record['te_skipped']}]" if record.get("te_skipped") else "")
              + (f"  [refops: {record['refops_error']}]" if record.get("refops_error") else ""), flush=True)
        write_records(args.out, records, meta)  # after every row: a run cut short keeps what it measured
    print(f"wrote {args.out / 'vs_te.json'} and {args.out / 'vs_te.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
