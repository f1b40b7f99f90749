"""The command line: trace, check and bench, as a newcomer runs them."""

from __future__ import annotations

import io
import re
import sys

import pytest
import torch

from refops.__main__ import main


def test_trace_prints_every_step_and_the_identity_summary(capsys):
    assert main(["trace", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "== construction" in out and "== training step 2" in out
    assert "materialize        BasicLinear.weight" in out
    # Issue #37: each op named by its path in the model, the recipe by its name ("none": high precision).
    assert "materialize        BasicLinear.weight  (op=1.basic_ops.0, " in out
    assert "materialize        BasicLinear.weight  (op=3.basic_ops.0, " in out
    assert "recipe_state       LayerNorm  (op=0, recipe=none)" in out and "NoneType" not in out
    assert "every parameter kept its identity through materialization: True" in out
    assert "holds the live parameters: True" in out


def test_trace_with_a_recipe_quantized_weights_and_a_mermaid_diagram(tmp_path, capsys):
    diagram = tmp_path / "first_step.mmd"
    assert main(["trace", "--steps", "1", "--recipe", "mxfp8", "--quantized-weights", "--mermaid", str(diagram)]) == 0
    out = capsys.readouterr().out
    assert "weights: MXFP8Tensor" in out
    text = diagram.read_text()
    assert text.startswith("sequenceDiagram") and "materialize weight" in text
    svg = diagram.with_suffix(".svg")
    assert f"view it offline: python3 -m mermaidx -i {diagram} -o {svg}, then open the SVG in a browser" in out


def test_the_mermaid_view_command_renders_the_diagram_offline(tmp_path):
    """The command ``--mermaid`` prints works as printed: mermaidx (docs and test extras) writes the SVG."""
    pytest.importorskip("mermaidx", reason="mermaidx comes with the docs and test extras")
    import shlex
    import subprocess

    from refops.cli.trace_cmd import mermaid_view_command

    diagram = tmp_path / "a step.mmd"
    assert main(["trace", "--steps", "1", "--mermaid", str(diagram)]) == 0
    command = shlex.split(mermaid_view_command(diagram))
    assert command[:3] == ["python3", "-m", "mermaidx"]
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a step.svg").read_text().startswith("<svg")


def test_trace_distributed_runs_the_fsdp2_demo_on_two_ranks(capsys):
    """``--distributed 2``: 2 gloo ranks build on meta, shard, materialize and train; each rank's events print."""
    if torch.cuda.is_initialized():
        pytest.skip("the demo forks gloo ranks, which cannot run backward in a process that has used CUDA (the CPU suite runs it)")
    assert main(["trace", "--distributed", "2", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    for rank in (0, 1):
        for phase in ("build on meta", "fully_shard, to_empty, reset_parameters", "training step 1", "training step 2"):
            assert f"== rank {rank}: {phase} (" in out, (rank, phase)
    assert "materialize        BasicLinear.weight  (op=1.basic_ops.0, device=cpu, dtype=torch.float32, " \
           "kept_identity=True, local_shape=[32, 32])" in out
    assert "1.weight [32, 32]" in out  # rank 0 holds half the rows of the 64x32 weight
    assert "every parameter is still the same DTensor object: True" in out
    assert "full_tensor() equals a single-process eager build (bit for bit): True" in out


def test_trace_distributed_refuses_options_it_does_not_use(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["trace", "--distributed", "2", "--recipe", "mxfp8"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith("refops trace: error: --distributed runs its own")
    with pytest.raises(SystemExit) as refused:
        main(["trace", "--distributed", "0"])
    assert refused.value.code == 2
    assert "argument --distributed: must be at least 1, got 0" in capsys.readouterr().err


def test_check_reference_against_float64(capsys):
    code = main(["check", "--reference-only", "--ops", "linear", "mlp", "--dtypes", "bfloat16",
                 "--recipes", "fp8_current_scaling", "nvfp4"])
    out = capsys.readouterr().out
    assert "reference vs float64 torch" in out
    assert "6/6 cases passed, 0 skipped" in out and code == 0


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_check_progress_and_summary_agree_skips_are_listed_and_the_worst_error_is_shown(capsys, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["check", "--reference-only", "--ops", "gelu", "--dtypes", "float32", "bfloat16",
                 "--recipes", "nvfp4"])
    out = capsys.readouterr().out
    progress = [line for line in terminal.getvalue().replace("\r", "\n").splitlines() if line.startswith("[")]
    assert progress[-1].split()[1] == "3/3"  # the total counts the cases that run...
    assert "3/3 cases passed, 1 skipped" in out and code == 0  # ...and agrees with the summary
    assert "skipped: gelu nvfp4 float32: NVFP4 is checked in bfloat16 only" in out
    rows = [line for line in out.splitlines() if line.startswith("gelu ")]
    assert len(rows) == 3
    # High precision, element-wise: a pass says how much of the tolerance the worst element used, not a relative
    # error of some tiny element (issue #37: ok rows printed max_rel=1.82e+02).
    assert "% of the tolerance [rtol=" in rows[0] and "max_rel" not in rows[0]
    assert re.search(r" dB \[SQNR >= 10 dB\]$", rows[2]) and "inf" not in rows[2]  # quantized: the SQNR, its floor


def test_check_rows_say_what_was_compared_without_alarming_numbers():
    """A pass reads as a pass; a failure gives the raw errors and how many elements are out."""
    from refops.testing.check_matrix import _error_size
    from refops.testing.tensor_report import compare_tensors

    expected = torch.tensor([1.0, 1e-9, -2.0], dtype=torch.float64)
    close = compare_tensors("output", expected + torch.tensor([0.01, 1e-9, 0.0], dtype=torch.float64), expected,
                            tier="tolerance", rtol=0.25, atol=0.5)
    assert close.max_rel_error > 0.9  # the element of 1e-9 is off by 100 %: within atol, and alarming to print
    assert _error_size(close) == "1.3% of the tolerance [rtol=0.25, atol=0.5]"  # 0.01 / (0.5 + 0.25 * 1)
    same = compare_tensors("output", expected, expected, tier="tolerance", rtol=0.25, atol=0.5)
    assert _error_size(same) == "identical [rtol=0.25, atol=0.5]"
    exact = compare_tensors("output", expected, expected, tier="sqnr", sqnr_floor_db=18)
    assert _error_size(exact) == "identical [SQNR >= 18 dB]"  # not "sqnr=infdB"
    off = compare_tensors("output", expected * 2, expected, tier="tolerance", rtol=0.25, atol=0.5)
    assert _error_size(off) == "max_abs=2.00e+00 max_rel=1.00e+00, 2/3 elements out [rtol=0.25, atol=0.5]"


def test_check_draws_no_progress_bar_into_redirected_output(capsys):
    """Issue #29: ``check > log`` held one line rewritten with \\r per case; off a terminal, no bar at all."""
    assert main(["check", "--reference-only", "--ops", "gelu", "--dtypes", "bfloat16", "--recipes", "mxfp8"]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.out and "\r" not in captured.err
    assert not [line for line in captured.out.splitlines() + captured.err.splitlines() if line.startswith("[#")]
    assert "2/2 cases passed" in captured.out


def test_check_says_which_recipe_settings_it_runs(capsys):
    """Issue #29: check ran TE's test recipes (NVFP4 without RHT or stochastic rounding) without saying so."""
    assert main(["check", "--reference-only", "--ops", "gelu", "--dtypes", "bfloat16",
                 "--recipes", "nvfp4", "fp8_delayed_scaling"]) == 0
    out = capsys.readouterr().out
    assert "TE's test settings (refops.testing.make_recipe), not the recipe defaults" in out
    assert "nvfp4 = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, " \
           "disable_2d_quantization=True)" in out
    assert "fp8_delayed_scaling = DelayedScaling(fp8_format=E4M3, amax_history_len=8)" in out
    assert "mxfp8 =" not in out  # only the recipes that ran


def test_trace_says_which_recipe_settings_it_runs(capsys):
    assert main(["trace", "--steps", "1", "--recipe", "nvfp4"]) == 0
    out = capsys.readouterr().out
    assert "recipe: nvfp4 = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, " \
           "disable_2d_quantization=True): TE's test settings (refops.testing.make_recipe), " \
           "not the recipe defaults" in out
    assert main(["trace", "--steps", "1", "--recipe", "mxfp8"]) == 0
    assert "recipe: mxfp8 = MXFP8BlockScaling() (the defaults)" in capsys.readouterr().out


def test_trace_shows_each_weight_becoming_quantized(capsys):
    """Issue #29: under --quantized-weights no event showed a weight becoming a quantized tensor."""
    assert main(["trace", "--steps", "1", "--recipe", "mxfp8", "--quantized-weights"]) == 0
    out = capsys.readouterr().out
    step = out[out.index("== training step 1"):out.index("== summary")]
    quantized = [line for line in step.splitlines() if "quantize_weight" in line]
    assert len(quantized) == 2, step  # both Linears' weights, at the first forward of the meta-built model
    assert "quantize_weight    BasicLinear.weight  (op=1.basic_ops.0, format=MXFP8Tensor, recipe=MXFP8BlockScaling, " \
           "usages=[rowwise, columnwise])" in quantized[0]
    assert "(op=3.basic_ops.0, " in quantized[1]
    lines = step.splitlines()
    first = next(i for i, line in enumerate(lines) if "quantize_weight" in line)
    assert "materialize        BasicLinear.weight" in lines[first + 1], "the weight is quantized, then placed"


def test_trace_writes_a_file_only_when_mermaid_is_given(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "--steps", "1", "--recipe", "mxfp8", "--quantized-weights"]) == 0
    assert list(tmp_path.iterdir()) == []
    assert "Mermaid" not in capsys.readouterr().out
    assert main(["trace", "--steps", "1", "--mermaid", "first.mmd"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["first.mmd"]


def test_bench_says_why_it_cannot_run_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmarks run for real (see docs/benchmarks.md)")
    assert main(["bench"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().out


@pytest.mark.slow  # a fresh interpreter imports torch
def test_bench_runs_the_fast_path_benchmark_module_in_a_subprocess(capfd):
    """``refops bench -- ARGS`` is ``python -m fastpath.benchmark ARGS`` in a child of this interpreter: refops does
    not import fastpath, and the benchmark ships in the package (its help needs no GPU)."""
    from refops.cli import bench_cmd

    assert bench_cmd.benchmark_command(["--quick"]) == [sys.executable, "-m", "fastpath.benchmark", "--quick"]
    assert main(["bench", "--", "--help"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("usage: python -m fastpath.benchmark") and "--parts PARTS" in out


def test_check_holds_a_quantized_pipeline_to_the_sqnr_floor_on_the_fast_path(monkeypatch):
    """Fast path vs reference: single ops element-wise; the quantized MLP by SQNR, as the pipeline suite does."""
    from refops.testing import check_matrix

    calls = []
    monkeypatch.setattr(check_matrix, "compare_backends", lambda factory, inputs, **kw: calls.append(kw) or kw)
    cpu = torch.device("cpu")
    check_matrix._run_case("mlp", "fp8_current_scaling", torch.float32, cpu, fastpath=True)
    check_matrix._run_case("mlp", None, torch.float32, cpu, fastpath=True)
    check_matrix._run_case("linear", "fp8_current_scaling", torch.float32, cpu, fastpath=True)
    assert [kw.get("tier", "tolerance") for kw in calls] == ["sqnr", "tolerance", "tolerance"]


# ------------------------------------------------------------ the check matrix from Python (no argv)
def test_run_check_matrix_returns_the_cases_that_ran_then_the_skipped_ones():
    from refops.testing.check_matrix import CaseResult, check_target, run_check_matrix

    target = check_target(reference_only=True)
    assert (target.fastpath, target.device, target.fastpath_unavailable) == (False, torch.device("cpu"), "")
    seen = []
    results = run_check_matrix(target.device, fastpath=False, ops=["gelu"], recipes=["nvfp4"],
                               dtypes=["float32", "bfloat16"], progress=lambda *step: seen.append(step))
    assert all(isinstance(r, CaseResult) for r in results)
    assert [(r.recipe, r.dtype, r.passed, bool(r.skipped)) for r in results] == [
        ("none", "float32", True, False), ("none", "bfloat16", True, False), ("nvfp4", "bfloat16", True, False),
        ("nvfp4", "float32", False, True)]
    assert results[-1].skipped == "NVFP4 is checked in bfloat16 only, as TE's tests do"
    assert [(done, total) for done, total, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert seen[-1][2] == "gelu nvfp4 bfloat16: ok"
    assert results[2].error.endswith(" dB [SQNR >= 10 dB]") and results[2].worst


def test_run_check_matrix_refuses_unknown_names():
    from refops.testing.check_matrix import run_check_matrix

    for kwargs, message in (({"ops": ["conv"]}, "unknown op 'conv'"), ({"recipes": ["fp8"]}, "unknown recipe 'fp8'"),
                            ({"dtypes": ["float16"]}, "unknown dtype 'float16'")):
        with pytest.raises(ValueError, match=message):
            run_check_matrix(torch.device("cpu"), fastpath=False, **kwargs)
