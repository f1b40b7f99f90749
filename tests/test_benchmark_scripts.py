"""The scripts under ``benchmarks/``: without a GPU they say why they measure nothing; the byte count they report.

A benchmark or diagnostic that cannot run exits with a clear message instead of a traceback. The two
measuring scripts exit 0 (nothing to measure is not an error in a CPU job). The profiling driver exits 1,
because a profiler run that profiled nothing failed.
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]

@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU these scripts measure for minutes")
@pytest.mark.parametrize(
    ("script", "args", "returncode", "message"),
    [
        ("diag_access_patterns.py", [], 0, "no CUDA device: nothing to measure"),
        ("bench_fastpath.py", ["--quick", "--parts", "kernels"], 0, "nothing measured"),
        ("profile_cases.py", ["amax"], 1, "needs a GPU with CuPy"),
    ],
)
def test_script_without_a_gpu_says_why(script, args, returncode, message, tmp_path):
    if script == "bench_fastpath.py":
        args = [*args, "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
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
    cases = _benchmark_module("_kernel_cases")
    Case, charged_bytes = cases.Case, cases.charged_bytes
    dy, x = torch.zeros(4, 8), torch.zeros(4, 8)  # 128 bytes each
    dx = torch.zeros(4, 8)
    case = Case("backward", "activation", "activation_backward", (dy, x, "relu"), {})
    assert charged_bytes(case, dx) == 3 * 128
    assert charged_bytes(dataclasses.replace(case, unread=(1,)), dx) == 2 * 128
    assert charged_bytes(case, dy) == 2 * 128  # an output that is an input counts once
    assert charged_bytes(Case("same", "x", "m", (dy, dy), {}), (dx, dx)) == 2 * 128


def test_a_case_with_its_own_function_calls_that_function_not_the_backend_method():
    """Benchmark and profiler call ``Case.fn`` (one kernel of a multi-kernel method) where it is given."""
    Case = _benchmark_module("_kernel_cases").Case

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
    pipeline = _benchmark_module("_pipeline")
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
    pipeline = _benchmark_module("_pipeline")
    result = pipeline.measure_host("reference, bf16", "reference", None, device=torch.device("cpu"),
                                   forwards=8, batches=4, profiled=2)
    assert result.us_per_forward > 0 and result.batches == 4 and result.spread_pct >= 0
    assert "refops/ops" in result.by_area  # the profile sees the fuser's ops
    assert pipeline.host_speed_probe_us(torch.device("cpu"), calls=20, batches=2) > 0


def test_the_report_puts_host_times_beside_the_machine_probe(tmp_path):
    report = _benchmark_module("_report")
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


RUN45 = ROOT / "benchmarks" / "results" / "h200-2026-12-01-run45"


def test_nvfp4_issue_bound_reads_the_recorded_run():
    """GPU run 45's counts: the time at the H200's peak issue rate against the floor, measured and modelled."""
    bound = _benchmark_module("nvfp4_issue_bound")
    report = bound.read_run(RUN45)
    assert report.gpu == bound.Gpu("NVIDIA H200", 132, 1980.0)
    assert report.gpu.warp_instructions_per_second == pytest.approx(1.04544e12)
    rows = {bound.option_set(r.kernel): r for r in report.rows}
    assert set(rows) == {"std", "2d", "rht", "sr_rht", "4o6", "sr", "2d_sr", "4o6_2d"}
    assert rows["std"].warp_instructions == 122_955_456
    # 85 % of run 45's 4163 GB/s copy, for 400 MiB, and for 656 MiB with the SR forms' random bytes
    assert rows["std"].floor_ms == pytest.approx(0.11853, abs=1e-5)
    assert rows["sr_rht"].floor_ms == pytest.approx(0.19439, abs=1e-5)
    assert report.peak_issue_ms(rows["std"].warp_instructions) == pytest.approx(0.11761, abs=1e-5)
    measured_over = {n for n, r in rows.items() if report.peak_issue_ms(r.warp_instructions) > r.floor_ms}
    assert measured_over == {"2d", "rht", "sr_rht", "4o6", "4o6_2d"}
    # The model: 4over6 is over the floor even with every product folded into its roundings.
    assert rows["4o6"].model_per_element == 34 and rows["4o6"].model_folded_per_element == 30
    assert report.model_ms(30) == pytest.approx(0.12036, abs=1e-5)
    model_over = {n for n, r in rows.items() if report.model_ms(r.model_folded_per_element) > r.floor_ms}
    assert model_over == {"4o6", "4o6_2d"}


def test_nvfp4_issue_bound_cli_and_bad_input(tmp_path):
    script = ROOT / "benchmarks" / "nvfp4_issue_bound.py"
    done = subprocess.run([sys.executable, str(script), str(RUN45)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| 4o6 | 400 | 0.1185 | 267.0 | 63.65 | 0.2554 |" in done.stdout
    assert done.stdout.count("| no |") == 2, done.stdout
    usage = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage:" in usage.stdout
    bound = _benchmark_module("nvfp4_issue_bound")
    with pytest.raises(ValueError, match="unknown NVFP4 pass-2 option set 'mxfp8'"):
        bound.per_element("mxfp8")
    with pytest.raises(ValueError, match="not an NVFP4 pass-2 kernel name"):
        bound.option_set("cast_fp8_bf16")
    (tmp_path / "ncu_pass2.txt").write_text('"ID","Process ID"\n')
    with pytest.raises(ValueError, match="lacks the GPU lines"):
        bound.parse_ncu(tmp_path / "ncu_pass2.txt")
