"""The command line: trace, check and bench, as a newcomer runs them."""

from __future__ import annotations

import pathlib

import pytest
import torch

from refops.__main__ import main


def test_trace_prints_every_step_and_the_identity_summary(capsys):
    assert main(["trace", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "== construction" in out and "== training step 2" in out
    assert "materialize        BasicLinear.weight" in out
    assert "every parameter kept its identity through materialization: True" in out
    assert "holds the live parameters: True" in out


def test_trace_with_a_recipe_quantized_weights_and_a_mermaid_diagram(tmp_path, capsys):
    diagram = tmp_path / "first_step.mmd"
    assert main(["trace", "--steps", "1", "--recipe", "mxfp8", "--quantized-weights", "--mermaid", str(diagram)]) == 0
    out = capsys.readouterr().out
    assert "weights: MXFP8Tensor" in out
    text = diagram.read_text()
    assert text.startswith("sequenceDiagram") and "materialize weight" in text


def test_trace_distributed_runs_the_fsdp2_demo_on_two_ranks(capsys):
    """``--distributed 2``: 2 gloo ranks build on meta, shard, materialize and train; each rank's events print."""
    if torch.cuda.is_initialized():
        pytest.skip("the demo forks gloo ranks, which cannot run backward in a process that has used CUDA (the CPU suite runs it)")
    assert main(["trace", "--distributed", "2", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    for rank in (0, 1):
        for phase in ("build on meta", "fully_shard, to_empty, reset_parameters", "training step 1", "training step 2"):
            assert f"== rank {rank}: {phase} (" in out, (rank, phase)
    assert "materialize        BasicLinear.weight  (device=cpu, dtype=torch.float32, kept_identity=True, " \
           "local_shape=[32, 32])" in out
    assert "1.weight [32, 32]" in out  # rank 0 holds half the rows of the 64x32 weight
    assert "every parameter is still the same DTensor object: True" in out
    assert "full_tensor() equals a single-process eager build (bit for bit): True" in out


def test_trace_distributed_refuses_options_it_does_not_use():
    with pytest.raises(SystemExit, match="--distributed runs its own"):
        main(["trace", "--distributed", "2", "--recipe", "mxfp8"])
    with pytest.raises(SystemExit, match="N >= 1"):
        main(["trace", "--distributed", "0"])


def test_check_reference_against_float64(capsys):
    code = main(["check", "--reference-only", "--ops", "linear", "mlp", "--dtypes", "bfloat16",
                 "--recipes", "fp8_current_scaling", "nvfp4"])
    out = capsys.readouterr().out
    assert "reference vs float64 torch" in out
    assert "6/6 cases passed, 0 skipped" in out and code == 0


def test_check_progress_and_summary_agree_skips_are_listed_and_the_worst_error_is_shown(capsys):
    code = main(["check", "--reference-only", "--ops", "gelu", "--dtypes", "float32", "bfloat16",
                 "--recipes", "nvfp4"])
    out = capsys.readouterr().out
    progress = [line for line in out.replace("\r", "\n").splitlines() if line.startswith("[")]
    assert progress[-1].split()[1] == "3/3"  # the total counts the cases that run...
    assert "3/3 cases passed, 1 skipped" in out and code == 0  # ...and agrees with the summary
    assert "skipped: gelu nvfp4 float32: NVFP4 is checked in bfloat16 only" in out
    rows = [line for line in out.splitlines() if line.startswith("gelu ")]
    assert len(rows) == 3
    assert "max_abs=" in rows[0] and "max_rel=" in rows[0] and "[rtol=" in rows[0]  # high precision: element-wise
    assert "sqnr=" in rows[2] and "dB [SQNR >= 10 dB]" in rows[2]  # quantized: the SQNR and its floor


def test_bench_says_why_it_cannot_run_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmarks run for real (see docs/benchmarks.md)")
    assert main(["bench"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().out
    assert pathlib.Path(__file__).resolve().parents[2].joinpath("benchmarks").is_dir()


def test_check_holds_a_quantized_pipeline_to_the_sqnr_floor_on_the_fast_path(monkeypatch):
    """Fast path vs reference: single ops element-wise; the quantized MLP by SQNR, as the pipeline suite does."""
    from refops.cli import check_cmd

    calls = []
    monkeypatch.setattr(check_cmd, "compare_backends", lambda factory, inputs, **kw: calls.append(kw) or kw)
    cpu = torch.device("cpu")
    check_cmd._run_case("mlp", "fp8_current_scaling", torch.float32, cpu, fastpath=True)
    check_cmd._run_case("mlp", None, torch.float32, cpu, fastpath=True)
    check_cmd._run_case("linear", "fp8_current_scaling", torch.float32, cpu, fastpath=True)
    assert [kw.get("tier", "tolerance") for kw in calls] == ["sqnr", "tolerance", "tolerance"]
