"""The scripts under ``benchmarks/`` and the fast path's benchmark (``fastpath.benchmark``): without a GPU they say
why they measure nothing; the byte count they report.

A benchmark that cannot run exits with a clear message instead of a traceback. The measuring scripts exit 0
(nothing to measure is not an error in a CPU job). The profiling driver exits 1, because a profiler run that
profiled nothing failed.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from fastpath.benchmark import kernel_cases, pipeline, report

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The scripts import this tree's packages, wherever refops is installed from.
SCRIPT_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU these scripts measure for minutes")
@pytest.mark.parametrize(
    ("script", "args", "returncode", "message"),
    [
        ("bench_fastpath.py", ["--quick", "--parts", "kernels"], 0, "nothing measured"),
        ("profile_cases.py", ["amax"], 1, "needs a GPU with CuPy"),
        ("bench_vs_te.py", [], 0, "torch reports no CUDA device: nothing measured"),
    ],
)
def test_script_without_a_gpu_says_why(script, args, returncode, message, tmp_path):
    if script == "bench_fastpath.py":
        args = [*args, "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=SCRIPT_ENV)
    assert done.returncode == returncode, done.stdout + done.stderr
    assert message in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def _benchmark_module(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_benchmark_charges_only_what_a_kernel_reads_and_writes():
    """Bytes of a case: distinct tensors read (not those listed as unread) plus distinct new outputs."""
    Case, charged_bytes = kernel_cases.Case, kernel_cases.charged_bytes
    dy, x = torch.zeros(4, 8), torch.zeros(4, 8)  # 128 bytes each
    dx = torch.zeros(4, 8)
    case = Case("backward", "activation", "activation_backward", (dy, x, "relu"), {})
    assert charged_bytes(case, dx) == 3 * 128
    assert charged_bytes(dataclasses.replace(case, unread=(1,)), dx) == 2 * 128
    assert charged_bytes(case, dy) == 2 * 128  # an output that is an input counts once
    assert charged_bytes(Case("same", "x", "m", (dy, dy), {}), (dx, dx)) == 2 * 128


def test_a_case_with_its_own_function_calls_that_function_not_the_backend_method():
    """Benchmark and profiler call ``Case.fn`` (one kernel of a multi-kernel method) where it is given."""
    Case = kernel_cases.Case

    class Backend:
        def quantize(self, x, *, scale):
            return ("method", x, scale)

    def first_kernel(x, *, scale):
        return ("kernel", x, scale)

    method_case = Case("whole", "quantize", "quantize", (3,), {"scale": 2})
    assert method_case.callable_on(Backend())() == ("method", 3, 2)
    kernel_case = dataclasses.replace(method_case, fn=first_kernel)
    assert kernel_case.callable_on(Backend())() == ("kernel", 3, 2)


def test_host_time_is_the_median_of_batch_means_with_their_spread(monkeypatch):
    """A slow batch (a busy machine for a moment) moves the spread, not the figure."""
    clock = {"now": 0.0, "calls": 0}
    batch_costs_s = [10e-6, 10e-6, 40e-6, 12e-6, 10e-6]  # per call, by batch of 3 calls

    def call():
        clock["now"] += batch_costs_s[clock["calls"] // 3]
        clock["calls"] += 1

    monkeypatch.setattr(pipeline.time, "perf_counter", lambda: clock["now"])
    median_us, spread_pct = pipeline.median_of_batches(call, calls=15, batches=5)
    assert clock["calls"] == 15
    assert median_us == pytest.approx(10.0)
    assert spread_pct == pytest.approx(300.0)  # (40 - 10) / 10


def test_host_time_of_the_reference_pipeline_runs_on_cpu():
    """The host measurement itself needs no GPU: on CPU it times the reference backend's forward."""
    result = pipeline.measure_host("reference, bf16", "reference", None, device=torch.device("cpu"),
                                   forwards=8, batches=4, profiled=2)
    assert result.us_per_forward > 0 and result.batches == 4 and result.spread_pct >= 0
    assert "refops/ops" in result.by_area  # the profile sees the fuser's ops
    assert pipeline.host_speed_probe_us(torch.device("cpu"), calls=20, batches=2) > 0


def test_the_report_puts_host_times_beside_the_machine_probe(tmp_path):
    data = {"meta": {"device": "cpu", "torch": "x", "cupy": "y", "date": "d", "kernel_shape": [2, 2],
                     "kernel_mib": 0.0},
            "host_probe_us": 4.0,
            "host": [{"label": "fastpath, bf16", "us_per_forward": 600.0, "spread_pct": 3.0,
                      "by_area": {"fastpath": 300.0}, "top_functions": []}]}
    path = tmp_path / "bench.md"
    report.write_markdown(path, data)
    text = path.read_text()
    assert "Host speed probe of this machine: 4.00 us" in text
    assert "| fastpath, bf16 | 600.0 | 3 % | 150 | fastpath: 300.0 |" in text


# ------------------------------------------------------------------ bench_vs_te.py (TE side by side)
def test_bench_vs_te_rows_are_the_issue_table_plus_the_compile_peers():
    bench = _benchmark_module("bench_vs_te")
    sizes = bench.Sizes()
    works = {r.key: r.work(sizes) for r in bench.ROWS}
    assert len(works) == len(bench.ROWS) == 10
    assert works["quantize_fp8_current"] == "quantize 8192x8192 bf16, FP8 current scaling, row+col"
    assert works["quantize_fp8_block_128x128"] == "quantize 8192x8192 bf16, FP8 block 128x128, row+col"
    assert works["step_fp8_delayed"] == (
        "training step Linear(4096,16384)-GELU-Linear(16384,4096), batch 8192, FP8 delayed scaling")
    assert works["step_bf16"].endswith("batch 8192, bf16")
    assert {r.key for r in bench.ROWS if r.baseline == "compile"} == {"quantize_mxfp8", "quantize_nvfp4"}
    assert "torch.compile peer" in works["quantize_nvfp4"]
    # 6 GEMMs of 2 * 8192 * 4096 * 16384 FLOP: the issue's 695 TFLOP/s at 9.50 ms
    assert bench.step_flops(sizes) / 9.50e-3 / 1e12 == pytest.approx(694.4, abs=0.1)
    assert [r.key for r in bench.select_rows("step")] == ["step_bf16", "step_fp8_current", "step_fp8_delayed",
                                                          "step_fp8_block"]
    assert [r.key for r in bench.select_rows("quantize_fp8_block_1x128,nvfp4")] == [
        "quantize_fp8_block_1x128", "quantize_nvfp4"]
    assert bench.select_rows("") == list(bench.ROWS)
    with pytest.raises(ValueError, match="no row matches \\['nope'\\]; the rows are"):
        bench.select_rows("step,nope")


def test_bench_vs_te_records_and_table(tmp_path, capsys):
    """The JSON starts every row with work, te_ms, refops_ms, ratio = refops / te; a missing baseline is null
    with its reason; the markdown table has a line per row; --compare prints two records side by side."""
    import json

    bench = _benchmark_module("bench_vs_te")
    sizes = bench.Sizes()
    rows = {r.key: r for r in bench.ROWS}
    records = [
        bench.make_record(rows["quantize_fp8_current"], sizes, 0.158, 0.260, te_device_ms=0.150,
                          refops_device_ms=0.110, te_gbps=1700.0, refops_gbps=1030.0, same_bytes=True),
        bench.make_record(rows["step_fp8_delayed"], sizes, None, 9.78, te_skipped="TransformerEngine does not import",
                          refops_tflops=674.6, refops_syncs=4),
        bench.make_record(rows["step_bf16"], sizes, 9.5, float("nan")),
    ]
    assert records[0]["ratio"] == pytest.approx(0.260 / 0.158)
    assert records[1]["te_ms"] is None and records[1]["ratio"] is None
    assert records[2]["refops_ms"] is None and records[2]["ratio"] is None  # a NaN time is no time
    bench.write_records(tmp_path, records, {"device": "NVIDIA H200", "reps": 20})
    written = json.loads((tmp_path / "vs_te.json").read_text())
    assert [list(r)[:4] for r in written] == [list(bench.RECORD_KEYS)] * 3
    assert written[0]["work"] == "quantize 8192x8192 bf16, FP8 current scaling, row+col"
    table = (tmp_path / "vs_te.md").read_text()
    assert "| quantize 8192x8192 bf16, FP8 current scaling, row+col | 0.158 | 0.260 | 1.65 | 1700 GB/s | 1030 GB/s " \
           "| 0.150 / 0.110 | 0.73 |" in table
    assert "baseline skipped: TransformerEngine does not import; refops: 4 host syncs/call" in table
    assert "| 675 TFLOP/s |" in table
    with pytest.raises(ValueError, match="lacks \\['ratio'\\]"):
        bench.write_records(tmp_path, [{"work": "w", "te_ms": 1.0, "refops_ms": 1.0}], {})
    after = [dict(records[0], refops_ms=0.120, ratio=0.120 / 0.158)]
    (tmp_path / "after.json").write_text(json.dumps(after))
    assert bench.main(["--compare", str(tmp_path / "vs_te.json"), str(tmp_path / "after.json")]) == 0
    assert "| quantize 8192x8192 bf16, FP8 current scaling, row+col | 0.158 | 0.260 | 0.120 | 1.65 | 0.76 |" in \
        capsys.readouterr().out


def test_bench_vs_te_sides_run_on_cpu_with_the_reference():
    """What the GPU run times, at a tiny size on the CPU: the training step of every row (same parameter values
    loaded), the byte comparison, and the compile peers' outputs (eager here) against refops's, byte for byte."""
    bench = _benchmark_module("bench_vs_te")
    import nvfp4_vs_compile
    import peers

    import refops

    cpu = torch.device("cpu")
    sizes = bench.Sizes(size=128, tokens=64, hidden=128, ffn=256)
    values = bench._parameter_values(sizes, cpu)
    x = torch.randn(64, 128).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(64, 128).to(torch.bfloat16)
    for recipe in (None, "fp8_current", "fp8_delayed", "fp8_block"):
        context = bench.refops_context(bench._refops_recipe(recipe))
        step, model = bench.make_step(refops.ops, context, sizes, cpu, values, x, dy)
        step()
        assert step.y.shape == (64, 128) and x.grad.shape == (64, 128), recipe
        assert torch.equal(model[2].weight.detach(), values["2.weight"])
        assert torch.equal(model[2].bias.detach(), values["2.bias"])
    assert bench.sqnr_db(step.y, step.y) == float("inf")
    m = k = 128
    xq = torch.randn(m, k).to(torch.bfloat16) * 3
    for recipe in ("fp8_current", "fp8_block_1x128", "fp8_block_128x128"):
        arrays = bench.quantized_arrays(bench.refops_quantizer(recipe, cpu).quantize(xq), recipe, m, k)
        other = bench.quantized_arrays(bench.refops_quantizer(recipe, cpu).quantize(xq * 1.5), recipe, m, k)
        assert bench.compare_bytes(arrays, arrays) == (True, "")
        same, detail = bench.compare_bytes(arrays, other)
        assert not same and "bytes" in detail, recipe
    row, row_scale = peers.mxfp8(xq)
    col, col_scale = peers.mxfp8(xq.t())
    want = {"mxfp8": (row, row_scale, col.t(), col_scale.t()), "nvfp4": nvfp4_vs_compile.peer(xq, True)}
    for recipe, theirs in want.items():
        ours = bench.refops_peer_outputs(bench.refops_quantizer(recipe, cpu).quantize(xq), recipe, m, k)
        assert bench.compare_bytes({str(i): t for i, t in enumerate(ours)},
                                   {str(i): t.reshape(ours[i].shape) for i, t in enumerate(theirs)}) == (True, ""), \
            recipe


def test_the_oracle_budget_benchmark_writes_one_row_per_recipe(tmp_path):
    out = tmp_path / "oracle.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_oracle.py"), "--repeat", "1",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "recipe" not in line]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == ["none", *__import__("refops.testing").testing.RECIPE_NAMES]
    assert all(" | True | " in r for r in rows)  # every report ok: refops against itself


def test_bench_vs_te_te_side_runs_through_the_oracle_adapters_on_cpu(monkeypatch):
    """TE's side of every row is made by ``refops.testing.transformer_engine``'s adapters; with refops standing in
    for TE (``tests/refops/_fake_te.py``) both sides hold the same bytes and compute the same step."""
    sys.path.insert(0, str(ROOT / "tests" / "refops"))
    try:
        from _fake_te import install_refops_as_te
    finally:
        sys.path.remove(str(ROOT / "tests" / "refops"))
    import refops

    install_refops_as_te(monkeypatch, version="0.0+refops")
    bench = _benchmark_module("bench_vs_te")
    te, reason = bench.load_te()
    assert reason is None and te.version == "0.0+refops"
    cpu = torch.device("cpu")
    m = k = 128
    x = torch.randn(m, k).to(torch.bfloat16) * 3
    for recipe in ("fp8_current", "fp8_delayed", "fp8_block_1x128", "fp8_block_128x128"):
        ours, theirs = bench.refops_quantizer(recipe, cpu).quantize(x), bench.te_quantizer(recipe, cpu).quantize(x)
        assert bench.compare_bytes(bench.quantized_arrays(ours, recipe, m, k),
                                   bench.quantized_arrays(theirs, recipe, m, k)) == (True, ""), recipe
    with pytest.raises(ValueError, match="no TE quantizer for 'mxfp8'"):
        bench.te_quantizer("mxfp8", cpu)
    sizes = bench.Sizes(size=128, tokens=64, hidden=128, ffn=256)
    values = bench._parameter_values(sizes, cpu)
    x = torch.randn(64, 128).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(64, 128).to(torch.bfloat16)
    for recipe in (None, "fp8_current"):
        refops_recipe = bench._refops_recipe(recipe)
        outputs = []
        for ops, context in ((te.pytorch.ops, bench.te_context(refops_recipe)),
                             (refops.ops, bench.refops_context(refops_recipe))):
            step, _ = bench.make_step(ops, context, sizes, cpu, values, x, dy)
            step()
            outputs.append((step.y.detach().clone(), x.grad.detach().clone()))
        assert bench.sqnr_db(outputs[0][0], outputs[1][0]) == float("inf"), recipe
        assert torch.equal(outputs[0][1], outputs[1][1]), recipe

    monkeypatch.undo()  # TE's stand-in out
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    te, reason = bench.load_te()
    assert te is None and reason.startswith("bench_vs_te.py needs TransformerEngine, which is not installed here")
