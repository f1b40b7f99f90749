"""``benchmarks/bench_vs_te.py``'s sizes, graphed rows, budget and record (issue #39 items 5-7), on the CPU, and the
device session's driver script (``benchmarks/gpu/issue39_session.sh``).

What needs a GPU (the timing itself, the captures) is replaced here: ``measure_side`` by fixed times, the CUDA
synchronization by a no-op, TE by refops (``tests/refops/_fake_te.py``), the clock by a fake one.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DRIVER = BENCH / "gpu" / "issue39_session.sh"


def _bench():
    sys.path.insert(0, str(BENCH))
    try:
        return __import__("bench_vs_te")
    finally:
        sys.path.remove(str(BENCH))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cli_selects_sizes_modes_and_a_budget():
    bench = _bench()
    args = bench.parse_args([])
    assert [n for n, _ in args.step_sizes] == ["8192", "2048", "32768", "large"]
    assert args.step_modes == ["eager", "graphed"] and args.budget_s == 300 and args.kernels
    assert dict(args.step_sizes)["large"] == bench.Sizes(tokens=8192, hidden=8192, ffn=32768)
    args = bench.parse_args(["--sizes", "large,2048", "--modes", "graphed", "--budget-s", "0", "--host-profile"])
    assert [n for n, _ in args.step_sizes] == ["large", "2048"] and args.step_modes == ["graphed"]
    assert args.budget_s == 0 and args.host_profile
    args = bench.parse_args(["--tokens", "1024", "--ffn", "8192"])  # one size of one's own, as before
    assert args.step_sizes == [("custom", bench.Sizes(tokens=1024, hidden=4096, ffn=8192))]
    for wrong in (["--sizes", "nope"], ["--sizes", "2048", "--tokens", "64"], ["--modes", "lazy"],
                  ["--budget-s", "-1"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(wrong)


def test_the_plan_has_every_step_row_at_every_size_eager_then_graphed():
    bench = _bench()
    plan = bench.build_plan(bench.parse_args([]))
    assert len(plan) == 6 + 4 * 4 * 2 and len({i.id for i in plan}) == len(plan)
    assert [i.row.kind for i in plan[:6]] == ["quantize"] * 6
    assert [i.id for i in plan[6:10]] == ["step_bf16@8192", "step_bf16@8192+graphed", "step_fp8_current@8192",
                                          "step_fp8_current@8192+graphed"]
    works = {i.id: i.work for i in plan}
    # The eager rows at the earlier records' size keep their names (so --compare matches them).
    assert works["step_fp8_delayed@8192"] == (
        "training step Linear(4096,16384)-GELU-Linear(16384,4096), batch 8192, FP8 delayed scaling")
    assert works["step_fp8_delayed@8192+graphed"].endswith("FP8 delayed scaling, CUDA graphs")
    assert works["step_bf16@large"] == "training step Linear(8192,32768)-GELU-Linear(32768,8192), batch 8192, bf16"
    assert works["quantize_nvfp4"].startswith("quantize 8192x8192 bf16, NVFP4")
    chosen = bench.build_plan(bench.parse_args(["--rows", "step_fp8", "--sizes", "32768", "--modes", "graphed"]))
    assert [i.id for i in chosen] == ["step_fp8_current@32768+graphed", "step_fp8_delayed@32768+graphed",
                                      "step_fp8_block@32768+graphed"]
    assert all(i.sizes.tokens == 32768 for i in chosen)


def test_the_default_run_is_expected_to_fit_five_minutes(capsys):
    """The docstring's estimate: about 250 s for the default run by vs_te.budget's model (``--plan``)."""
    bench = _bench()
    args = bench.parse_args([])
    total = bench.plan_seconds(bench.build_plan(args), reps=20, warmup=3, kernels=True, host_profile=False)
    assert 200 < total <= 300
    assert bench.main(["--plan"]) == 0
    out = capsys.readouterr().out
    assert "38 items, about" in out and "step_fp8_block@large+graphed" in out
    done = subprocess.run([sys.executable, str(BENCH / "bench_vs_te.py"), "--plan", "--rows", "step"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and "32 items, about" in done.stdout, done.stdout + done.stderr


def test_the_large_shape_fits_an_h100_with_both_sides_and_their_graphs():
    bench = _bench()
    from vs_te import memory

    large = bench.STEP_SIZES["large"]
    # hidden 8192 / ffn 32768: parameters 2 x 268M, activations 8192 x 32768 per tensor.
    assert memory.step_memory_bytes(large, graphed=True) < 0.5 * memory.H100_BYTES
    assert memory.step_memory_bytes(large) < memory.step_memory_bytes(large, graphed=True)
    assert memory.step_memory_bytes(bench.Sizes(tokens=32768, hidden=8192, ffn=32768), graphed=True) > \
        memory.H100_BYTES  # why the large shape runs at 8192 tokens
    assert all(memory.step_memory_bytes(s, graphed=True) < 0.6 * memory.H100_BYTES
               for s in bench.STEP_SIZES.values())
    assert memory.too_big(large, True, None) is None
    assert memory.too_big(large, True, 80 * memory.GIB) is None
    assert "GiB free on the GPU: not run" in memory.too_big(large, True, 10 * memory.GIB)


def _step_records(bench):
    rows = {r.key: r for r in bench.ROWS}
    small, large = bench.STEP_SIZES["2048"], bench.STEP_SIZES["large"]
    return [
        bench.make_record(rows["step_fp8_current"], small, 2.0, 4.4, item_id="step_fp8_current@2048",
                          te_device_ms=1.6, refops_device_ms=1.5, size="2048", te_host_ms=1.9, refops_host_ms=4.4),
        bench.make_record(rows["step_fp8_current"], small, 1.7, 1.6, mode="graphed", size="2048",
                          item_id="step_fp8_current@2048+graphed", te_device_ms=1.6, refops_device_ms=1.5,
                          te_host_ms=0.3, refops_host_ms=0.2),
        bench.make_record(rows["step_fp8_delayed"], large, 24.0, 26.0, item_id="step_fp8_delayed@large"),
        bench.make_record(rows["step_fp8_delayed"], large, 23.0, None, mode="graphed",
                          item_id="step_fp8_delayed@large+graphed",
                          refops_error="refops could not capture the step: NotImplementedError: DelayedScaling"),
    ]


def test_the_record_gives_every_ratio_by_size_eager_and_graphed(tmp_path, capsys):
    bench = _bench()
    records = _step_records(bench)
    assert records[1]["ratio"] == pytest.approx(1.6 / 1.7) and records[3]["ratio"] is None
    assert records[1]["mode"] == "graphed" and records[1]["id"] == "step_fp8_current@2048+graphed"
    assert [list(r)[:4] for r in records] == [list(bench.RECORD_KEYS)] * 4
    meta = {"device": "GPU X", "reps": 20, "budget_s": 300, "elapsed_s": 290.0, "stopped": "the time budget ran out",
            "not_run": [{"id": "step_bf16@32768", "reason": "budget: expected 9 s, 4 s of 300 s left"}]}
    bench.write_records(tmp_path, records, meta)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vs_te.json", "vs_te.md", "vs_te_meta.json"]  # no .tmp
    table = (tmp_path / "vs_te.md").read_text()
    assert "| step | 2048 tokens, 4096/16384 | 8192 tokens, 8192/32768 |" in table
    assert "| FP8 current scaling | 2.20 / 0.94 | - |" in table
    assert "| FP8 delayed scaling | - | 1.08 / - |" in table
    assert "| FP8 current scaling | 0.94 / 0.94 | - |" in table  # the device ratios
    assert "| FP8 current scaling | 1.90 / 4.40; 0.30 / 0.20 | - |" in table  # host ms, TE / refops
    assert "refops failed: refops could not capture the step: NotImplementedError" in table
    assert "- step_bf16@32768: budget: expected 9 s, 4 s of 300 s left" in table
    assert "Run time 290 s of a 300 s budget." in table
    after = [dict(r, refops_ms=1.0, ratio=1.0 / r["te_ms"]) for r in records]
    (tmp_path / "after.json").write_text(json.dumps(after))
    assert bench.main(["--compare", str(tmp_path / "vs_te.json"), str(tmp_path / "after.json")]) == 0
    out = capsys.readouterr().out
    assert ("| training step Linear(4096,16384)-GELU-Linear(16384,4096), batch 2048, FP8 current scaling, CUDA "
            "graphs | 1.700 | 1.600 | 1.000 | 0.94 | 0.59 |") in out


def test_the_budget_scales_its_estimates_by_what_rows_took():
    from vs_te.budget import Budget

    clock = FakeClock()
    budget = Budget(100, clock=clock)
    assert budget.left() == 100 and budget.fits("step-eager", 100) and not budget.fits("step-eager", 101)
    clock.now += 40
    assert budget.elapsed() == 40 and budget.left() == 60
    budget.observe("step-eager", 5.0, 10.0)  # twice as long as expected
    assert budget.factor("step-eager") == 2.0 and budget.factor("step-graphed") == 1.0
    assert budget.fits("step-eager", 30) and not budget.fits("step-eager", 31)
    budget.observe("quantize-compile", 1.0, 100.0)
    assert budget.factor("quantize-compile") == 4.0  # clamped
    assert "budget: expected 62 s, 60 s of 100 s left" == budget.reason("step-eager", 31)
    unlimited = Budget(0, clock=clock)
    assert unlimited.total_s is None and unlimited.fits("step-eager", 1e9)


def test_a_run_stops_cleanly_at_its_budget_with_a_record_after_every_row(tmp_path):
    bench = _bench()
    from vs_te import budget as budgets

    args = bench.parse_args(["--out", str(tmp_path), "--rows", "step_bf16,step_fp8_current", "--sizes",
                             "8192,2048", "--budget-s", "40", "--no-kernels"])
    plan = bench.build_plan(args)
    clock = FakeClock()
    budget = budgets.Budget(args.budget_s, clock=clock)
    seen = []

    def measure(item):
        if seen:  # the rows before this one are on disk already
            assert len(json.loads((tmp_path / "vs_te.json").read_text())) == len(seen)
        clock.now += 9.0
        seen.append(item.id)
        return bench.make_record(item.row, item.sizes, 1.0, 1.1, mode=item.mode, item_id=item.id)

    meta: dict = {}
    records = bench.run_plan(plan, args, meta, budget, measure)
    assert len(plan) == 8 and [r["id"] for r in records] == seen and len(seen) == 4
    assert meta["stopped"] == "the time budget ran out" and [n["id"] for n in meta["not_run"]] == [
        i.id for i in plan[4:]]
    assert all(r["row_s"] == 9.0 for r in records) and meta["elapsed_s"] == 36.0
    written = json.loads((tmp_path / "vs_te.json").read_text())
    assert [r["id"] for r in written] == seen
    assert json.loads((tmp_path / "vs_te_meta.json").read_text())["not_run"][0]["id"] == plan[4].id


def test_host_time_per_call_splits_forward_and_backward():
    bench = _bench()
    from vs_te import steps, timing

    clock = FakeClock()
    sizes = bench.Sizes(size=128, tokens=16, hidden=32, ffn=64)
    values = steps.parameter_values(sizes, torch.device("cpu"))
    x, dy = steps.step_inputs(sizes, torch.device("cpu"))
    import refops

    step, _ = steps.make_step(refops.ops, steps.refops_context(None), sizes, torch.device("cpu"), values, x, dy)
    durations = iter([0.002, 0.004, 0.003])

    def timed_step():
        step()
        clock.now += next(durations)

    timed_step.phases = None
    result = timing.host_per_call(timed_step, 3, clock=clock, synchronize=lambda: None)
    assert result["host_call_ms"] == pytest.approx(3.0) and result["host_call_min_ms"] == pytest.approx(2.0)
    assert result["host_call_max_ms"] == pytest.approx(4.0) and "host_fwd_ms" not in result  # no phases there
    result = timing.host_per_call(step, 2, synchronize=lambda: None)
    assert result["host_fwd_ms"] > 0 and result["host_bwd_ms"] > 0 and step.phases is None
    assert step.y.shape == (16, 32) and x.grad.shape == (16, 32)


def test_step_rows_on_cpu_say_why_a_side_cannot_be_graphed(monkeypatch, tmp_path):
    """Eager rows on the CPU with refops standing in for TE: the same step both sides. Graphed rows there: neither
    side captures (no CUDA device; the stand-in has no make_graphed_callables), and each says why."""
    sys.path.insert(0, str(ROOT / "tests" / "refops"))
    try:
        from _fake_te import install_refops_as_te
    finally:
        sys.path.remove(str(ROOT / "tests" / "refops"))
    install_refops_as_te(monkeypatch)
    bench = _bench()
    from vs_te import runner, timing

    monkeypatch.setattr(timing, "sync", lambda: None)
    monkeypatch.setattr(runner, "measure_side", lambda side, reps, warmup: (
        side.fn(), {"ms": 2.0, "device_ms": 1.5, "host_ms": 0.5})[1])
    te, reason = bench.load_te()
    args = bench.parse_args(["--out", str(tmp_path), "--no-kernels", "--host-profile", "--tokens", "64",
                             "--hidden", "128", "--ffn", "256", "--rows", "step_bf16,step_fp8_block"])
    plan = bench.build_plan(args)
    assert [i.id for i in plan] == ["step_bf16@custom", "step_bf16@custom+graphed", "step_fp8_block@custom",
                                    "step_fp8_block@custom+graphed"]
    records = bench.run_plan(plan, args, {"device": "cpu"}, bench.Budget(None),
                             lambda item: runner.run_item(item, te, reason, args, torch.device("cpu")))
    eager, graphed, block_eager, block_graphed = records
    assert eager["ratio"] == 1.0 and eager["sqnr_y_db"] == float("inf") and eager["sqnr_dx_db"] == float("inf")
    assert eager["refops_host_fwd_ms"] > 0 and eager["te_host_bwd_ms"] > 0 and eager["mode"] == "eager"
    assert (tmp_path / "host_profile" / "step_bf16@custom_te.txt").read_text().startswith("3 calls, CPU-only")
    assert graphed["ratio"] is None and graphed["mode"] == "graphed"
    assert graphed["refops_error"].startswith("refops could not capture the step: RuntimeError")
    assert graphed["te_skipped"].startswith("TE could not capture the step: AttributeError")
    assert block_eager["ratio"] == 1.0
    assert block_graphed["te_skipped"].startswith("TE not captured: TE's own CUDA-graph tests")
    assert len(json.loads((tmp_path / "vs_te.json").read_text())) == 4


def test_every_module_of_the_benchmark_keeps_the_house_size():
    files = [BENCH / "bench_vs_te.py", *sorted((BENCH / "vs_te").glob("*.py"))]
    assert len(files) >= 10
    assert {p.name: len(p.read_text().splitlines()) for p in files if len(p.read_text().splitlines()) > 400} == {}


# ------------------------------------------------------------------ the device session's driver script
def test_the_driver_script_parses_and_calls_what_exists():
    done = subprocess.run(["bash", "-n", str(DRIVER)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = DRIVER.read_text()
    calls = re.findall(r"^\s*part (\w+) (\d+|\"\$\(\(bench_s \+ 10\)\)\") (.*)$", text, re.M)
    assert [c[0] for c in calls] == ["setup", "probe", "shares", "hopper", "tests", "vs_te"]  # by value
    caps = {name: int(cap) for name, cap, _ in calls if cap.isdigit()}
    assert sum(caps.values()) > 560  # the caps are limits; the deadline shares out what is left
    assert caps["setup"] + caps["probe"] + caps["shares"] <= 560 - 15
    for script in re.findall(r"(benchmarks/[\w/]+\.(?:py|sh))", text):
        assert (ROOT / script).is_file(), script
    shares = (BENCH / "gpu" / "hopper_gemm_shares.py").read_text()
    assert '"--parts"' in shares and '"--budget-s"' in shares
    conformance = (ROOT / "refops" / "cli" / "conformance_cmd.py").read_text()
    assert '"--tiers"' in conformance and '"modules"' in (ROOT / "refops/testing/conformance/run_setup.py").read_text()
    assert "GEMM_NUMERICS" in (BENCH / "gpu" / "te_conformance.sh").read_text()
    assert "def main(out: Path)" in (BENCH / "gpu" / "te_fused_activation_probe.py").read_text()
    assert '"compile: ' in (ROOT / "pyproject.toml").read_text()  # the -m "not compile" marker
    start = text.index("part vs_te")
    bench_line = text[start:text.index("\nelse", start)]
    assert "python3 benchmarks/bench_vs_te.py" in bench_line
    bench = _bench()
    bench.parse_args(["--out", "/tmp/x", "--rows", "step", "--host-profile", "--budget-s", "100"])
    for option in re.findall(r"--[\w-]+", bench_line):
        assert option in ("--out", "--rows", "--host-profile", "--budget-s"), option
