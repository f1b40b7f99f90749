"""``python -m refops conformance`` on the CPU: its refusals, its tables and its record.

The command needs TransformerEngine and a CUDA GPU. Here it runs against refops itself put
under TE's module names (``tests/refops/_fake_te.py``) on the CPU device, passed in through
``conformance_cmd.run(args, device=..., device_info=...)`` (the library's ``run_conformance`` takes the
same two): every row then passes, and a bug planted in the stand-in shows as a failing row with its
evidence. (Not to be confused with ``test_conformance.py``, which tests ``check_lifecycle``.)
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys

import pytest
import torch

import refops
from refops.__main__ import main
from refops.cli import conformance_cmd
from refops.testing import conformance
from refops.testing.conformance import ConformanceRecord, DeviceInfo, NotRun, Row, TierTable, lifecycle_tier, \
    module_tier, runner, tiers

from _fake_te import flip_first_code, install_refops_as_te

CPU = torch.device("cpu")
BLACKWELL = DeviceInfo("fake CPU", (10, 0))
HOPPER = DeviceInfo("fake H200", (9, 0))


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    conformance_cmd.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["conformance", *argv])


def _run(*argv: str, info: DeviceInfo = BLACKWELL) -> int:
    return conformance_cmd.run(_args(*argv), device=CPU, device_info=info)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# ------------------------------------------------------------------------- refusals
@pytest.mark.slow  # a fresh interpreter imports torch
def test_without_a_gpu_it_names_transformer_engine_and_exits_2_without_a_traceback():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal without one cannot be seen here")
    done = subprocess.run([sys.executable, "-m", "refops", "conformance"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("refops conformance: checks TransformerEngine on a CUDA GPU, and no CUDA GPU is "
                               "visible to torch here")
    assert any("pip install --no-build-isolation 'transformer_engine[pytorch]'" in line for line in lines), lines


def test_without_te_it_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    assert _run() == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("refops conformance: needs TransformerEngine, which is not installed here "
                          "(ModuleNotFoundError: ")
    assert err.endswith("; install it with: pip install --no-build-isolation 'transformer_engine[pytorch]'")
    assert len(err.splitlines()) == 1


def test_gemm_numerics_without_refops_gemm_numerics_is_refused(monkeypatch, capsys):
    install_refops_as_te(monkeypatch)
    monkeypatch.delattr(refops.kernels, "gemm_numerics", raising=False)
    assert _run("--gemm-numerics", "hopper") == 2
    assert "--gemm-numerics needs refops.gemm_numerics(name)" in capsys.readouterr().err


def test_unknown_choices_are_refused_by_the_parser():
    with pytest.raises(SystemExit):
        _args("--recipes", "fp8")
    with pytest.raises(SystemExit):
        main(["conformance", "--tiers", "kernels"])


# --------------------------------------------------------------------- a full small run
@pytest.mark.slow
def test_every_tier_runs_against_refops_as_te_and_writes_its_record(monkeypatch, capsys, tmp_path):
    install_refops_as_te(monkeypatch, version="0.0+refops")
    code = _run("--recipes", "none", "fp8_current_scaling", "--dtypes", "bfloat16", "--pipelines", "linear",
                "--ops", "Bias", "Linear", "--out", str(tmp_path))
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("# refops conformance of TransformerEngine 0.0+refops\n")
    assert "**every row passes** (Quantizer tier: 9/9 rows pass; Module tier: 3/3 rows pass; " \
           "Lifecycle tier: 5/5 rows pass)" in out
    assert "| GPU | fake CPU (compute capability 10.0), cpu |" in out
    assert "| recipes (module and lifecycle tiers) | TE's test settings (refops.testing.make_recipe), not the " \
           "recipe defaults: fp8_current_scaling = Float8CurrentScaling(fp8_format=E4M3) |" in out
    for title in ("## Quantizer tier", "## Module tier", "## Lifecycle tier"):
        assert title in out
    assert "| fp8_current_scaling+pow2 | grad_output | Float8CurrentScalingQuantizer(dtype=kFloat8E4M3, " \
           "force_pow_2_scales=True) | 194/194 | 0/1735552 | 0/194 | **pass** | 194 runs bit-identical |" in out
    assert "| linear | fp8_current_scaling | bfloat16 | quantized | **pass** |" in out
    assert "quantized weight codes identical: 100.0%" in out
    # 16 properties: the 3 of a conversion are not checked (the tier gives no convert=).
    assert "| Linear | fp8_current_scaling | quantized | float32 | **pass** | 13 of 16 properties held, 3 not " \
           "applicable or not checked |" in out
    assert "- mxfp8: not selected (--recipes)" in out
    record = json.loads((tmp_path / "conformance.json").read_text())
    assert record["ok"] is True and record["environment"]["TransformerEngine"] == "0.0+refops"
    assert [t["tier"] for t in record["tiers"]] == ["quantizers", "modules", "lifecycle"]
    lifecycle = record["tiers"][2]
    assert {r["result"] for r in lifecycle["rows"]} == {"pass"}
    assert set(lifecycle["rows"][0]["details"]) == {"te", "reference"}
    assert len(lifecycle["rows"][0]["details"]["te"]) == 16
    assert (tmp_path / "conformance.md").read_text().strip() == out[: out.index("\nrefops conformance: wrote")].strip()


def test_below_compute_capability_10_mxfp8_and_nvfp4_are_never_compared(monkeypatch, capsys):
    install_refops_as_te(monkeypatch)
    assert _run("--recipes", "mxfp8", "nvfp4", "--pipelines", "linear", "--ops", "Bias", info=HOPPER) == 1
    out = capsys.readouterr().out
    assert "**nothing ran**" in out
    reason = ("needs compute capability 10.0 (this GPU: 9.0); below it TE's MXFP8 quantizer returns garbage and "
              "its NVFP4 kernels trap, so nothing is compared against them")
    for line in ("- mxfp8 (1D blocks): ", "- mxfp8 (every pipeline): ", "- nvfp4 (every op): ",
                 "- nvfp4+defaults (the defaults: RHT on column-wise inputs and grads, 2D weights, stochastic "
                 "rounding of grads): "):
        assert line + reason in out, line
    assert not [line for line in out.splitlines() if line.startswith(("| mxfp8", "| nvfp4", "| linear", "| Bias"))]


def test_what_te_says_it_cannot_run_is_not_run_with_its_reason(monkeypatch, capsys):
    install_refops_as_te(monkeypatch, available={"is_fp8_block_scaling_available": (False, "needs sm_90 or later")})
    assert _run("--tiers", "quantizers", "--recipes", "fp8_block_scaling", "mxfp8") == 0
    out = capsys.readouterr().out
    assert ("- fp8_block_scaling (1x128 inputs and grads, 128x128 weights): TransformerEngine says it cannot run "
            "here: needs sm_90 or later") in out
    assert "| mxfp8 | input |" in out and "| fp8_block_scaling |" not in out


# ------------------------------------------------------------------ failures show
@pytest.mark.slow
def test_a_planted_quantizer_bug_fails_its_rows_with_the_evidence(monkeypatch, capsys):
    install_refops_as_te(monkeypatch, quantizers={"MXFP8Quantizer": flip_first_code(refops.MXFP8Quantizer)})
    assert _run("--tiers", "quantizers", "--recipes", "mxfp8", "fp8_current_scaling") == 1
    out = capsys.readouterr().out
    assert "FAILURES: see the rows marked FAIL" in out and "Quantizer tier: 9/15 rows pass, 6 FAIL" in out
    table = out[out.index("| recipe | role |"):]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert all("**FAIL**" in line for line in rows[:6]), "failures lead the table"
    first = rows[0]
    assert first.startswith("| mxfp8 | input | MXFP8Quantizer(dtype=kFloat8E4M3) | 188/194 | 94/1718272 | 0/53696 |")
    assert "normal/float32/rowwise: differs" in first and "first mismatch: normal/float32/rowwise at [0, 0]" in first


def test_a_te_op_that_flips_requires_grad_fails_the_lifecycle_row_and_the_reference_shows_it_is_te(
        monkeypatch, capsys):
    class Bias(refops.ops.Bias):
        def reset_parameters(self):  # TE's Bias makes a new Parameter: requires_grad comes back True
            super().reset_parameters()
            self.bias.requires_grad_(True)

    install_refops_as_te(monkeypatch, ops={"Bias": Bias})
    assert _run("--tiers", "lifecycle", "--recipes", "none", "--ops", "Bias") == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| Bias |"))
    assert "**FAIL**" in row and "requires_grad_kept: " in row and "requires_grad became True on bias" in row


def _delayed_scaling_lifecycle_rows(monkeypatch, op: str) -> list:
    install_refops_as_te(monkeypatch)
    setup = tiers.Setup(te=refops.testing.transformer_engine.import_te("test"), device=CPU,
                                    capability=(10, 0), recipes=["fp8_delayed_scaling"], high_precision=False,
                                    lifecycle_ops=(op,))
    tables, planned = tiers.plan_tiers(setup, ["lifecycle"])
    assert [p.cells["weights"] for p in planned] == ["high precision", "quantized"]
    return planned


def test_scales_that_move_between_steps_are_no_violation_of_the_reference(monkeypatch):
    """Under delayed scaling the scales move between two steps. The reference used to violate
    no_stale_cache_after_replacement for it (grads before and after a replacement differ); an untouched twin run
    for the same steps is now the control, so neither TE's row nor the reference's shows it."""
    row = _delayed_scaling_lifecycle_rows(monkeypatch, "BasicLinear")[0].run()
    assert row.passed
    assert "not a verdict on TE" not in row.evidence
    for side in ("te", "reference"):
        assert row.details[side]["no_stale_cache_after_replacement"][0] == "held"


def test_a_violation_the_reference_shares_is_not_a_verdict(monkeypatch):
    """A bug planted in refops' fuser (it keeps the parameters of its first forward) is in the stand-in for TE and
    in the reference alike: the clause is reported, and does not fail TE's row."""
    from refops.ops.fuser import OperationFuser

    refresh = OperationFuser._refresh_parameter_cache
    monkeypatch.setattr(OperationFuser, "_refresh_parameter_cache",
                        lambda self: refresh(self) if self._param_signature is None else False)
    row = _delayed_scaling_lifecycle_rows(monkeypatch, "Sequential")[0].run()
    assert row.passed
    assert "not a verdict on TE, the reference violates it too: no_stale_cache_after_replacement" in row.evidence
    assert row.details["te"]["no_stale_cache_after_replacement"][0] == "violated"
    assert "got no grad" in row.details["reference"]["no_stale_cache_after_replacement"][1]


def test_clauses_ignore_what_differs_between_two_runs():
    a = "after setattr(weight) the grad of weight changed (max |diff| 1.13); replaced w (id 0x7f01 -> 0x7f02)"
    b = "after setattr(weight) the grad of weight changed (max |diff| 2.5); replaced w (id 0x1 -> 0x2)"
    assert lifecycle_tier._clauses(a) == lifecycle_tier._clauses(b) == [
        "after setattr(weight) the grad of weight changed", "replaced w"]
    assert lifecycle_tier._clauses("construction allocated 2048 bytes on cuda:0") == [
        "construction allocated bytes on cuda:0"]


def test_a_row_that_raises_is_a_failing_row_and_the_others_still_run(monkeypatch, capsys):
    install_refops_as_te(monkeypatch)
    real = module_tier.build_pair

    def build_pair(pipeline, **kwargs):
        if pipeline == "linear_gelu_linear":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(pipeline, **kwargs)

    monkeypatch.setattr(module_tier, "build_pair", build_pair)
    assert _run("--tiers", "modules", "--recipes", "none", "--dtypes", "float32",
                "--pipelines", "linear", "linear_gelu_linear") == 1
    out = capsys.readouterr().out
    assert ("| linear_gelu_linear | none | float32 | high precision | **FAIL** | raised RuntimeError: CUDA error: "
            "an illegal memory access was encountered |") in out
    assert "| linear | none | float32 | high precision | **pass** |" in out


# --------------------------------------------------------- gemm numerics and progress
def test_gemm_numerics_wraps_the_reference_only_and_reports_bit_identical_shares(monkeypatch, capsys):
    install_refops_as_te(monkeypatch)
    entered = []

    class gemm_numerics:  # refops.gemm_numerics as issue #26 defines it: a context manager taking a name
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            entered.append((self.name, refops.QuantizedTensor is not None))
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(refops.kernels, "gemm_numerics", gemm_numerics, raising=False)
    assert _run("--tiers", "modules", "--recipes", "fp8_current_scaling", "--dtypes", "bfloat16",
                "--pipelines", "linear", "--gemm-numerics", "hopper") == 0
    out = capsys.readouterr().out
    assert "| pipeline | recipe | dtype | weights | bit-identical elements (reference under gemm_numerics) |" in out
    assert "output 100.0%, input grad 100.0%, 0.weight.grad 100.0%, 0.bias.grad 100.0% | **pass** |" in out
    assert "| reference GEMM numerics | refops.gemm_numerics('hopper') |" in out
    assert entered and {name for name, _ in entered} == {"hopper"}
    # Every forward and backward of the reference and of its legitimately different twin in compare_modules' training
    # script, and the shares' run, for two rows: each side's steps enter the reference context.
    assert len(entered) > 6 and len(entered) % 2 == 0


def test_the_progress_bar_is_drawn_on_a_terminal_only(monkeypatch, capsys):
    install_refops_as_te(monkeypatch)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert _run("--tiers", "lifecycle", "--recipes", "none", "--ops", "Bias", "LayerNorm") == 0
    drawn = terminal.getvalue()
    assert "\r[" in drawn and "2/2 lifecycle: LayerNorm none high precision float32: pass" in drawn
    monkeypatch.undo()
    install_refops_as_te(monkeypatch)
    assert _run("--tiers", "lifecycle", "--recipes", "none", "--ops", "Bias") == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err + captured.out


# ------------------------------------------------------------------- record format
def _record() -> ConformanceRecord:
    table = TierTable("modules", "Module tier", "what and how.", ["pipeline", "dtype"])
    table.rows = [Row({"pipeline": "linear", "dtype": "bf16"}, True, "ok, sqnr=inf", {"sqnr": float("inf")}),
                  Row({"pipeline": "a|b", "dtype": "fp32"}, False, "output: off\nby 2", {})]
    table.not_run = [NotRun("nvfp4, float32", "bfloat16 only")]
    return ConformanceRecord({"TransformerEngine": "2.20.2", "GPU": "H200"}, [table],
                             [NotRun("lifecycle tier", "not selected (--tiers)")], seconds=12.4)


def test_the_markdown_record_leads_with_failures_and_escapes_cells():
    text = _record().to_markdown()
    lines = text.splitlines()
    assert lines[0] == "# refops conformance of TransformerEngine 2.20.2"
    assert lines[2] == "**FAILURES: see the rows marked FAIL** (Module tier: 1/2 rows pass, 1 FAIL); 12 s."
    header = lines.index("| pipeline | dtype | result | evidence |")
    assert lines[header + 1] == "|---|---|---|---|"
    assert lines[header + 2] == "| a\\|b | fp32 | **FAIL** | output: off; by 2 |"
    assert lines[header + 3] == "| linear | bf16 | **pass** | ok, sqnr=inf |"
    assert "Not run:\n- nvfp4, float32: bfloat16 only" in text
    assert text.rstrip().endswith("## Not run\n\n- lifecycle tier: not selected (--tiers)")


def test_the_json_record_is_strict_json(tmp_path):
    record = _record()
    paths = record.write(tmp_path / "run")
    assert [p.name for p in paths] == ["conformance.md", "conformance.json"]
    data = json.loads(paths[1].read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["ok"] is False and data["environment"] == {"TransformerEngine": "2.20.2", "GPU": "H200"}
    rows = data["tiers"][0]["rows"]
    assert [r["result"] for r in rows] == ["pass", "fail"] and rows[0]["details"] == {"sqnr": "inf"}
    assert data["tiers"][0]["summary"] == "1/2 rows pass, 1 FAIL"
    assert data["not_run"] == [{"what": "lifecycle tier", "why": "not selected (--tiers)"}]


def test_a_record_in_which_nothing_ran_is_not_ok():
    record = ConformanceRecord({}, [TierTable("quantizers", "Quantizer tier", ".", ["recipe"])])
    assert not record.ok and "**nothing ran**" in record.to_markdown()
    with pytest.raises(KeyError, match="no tier 'modules' in this record; tiers: \\['quantizers'\\]"):
        record.tier("modules")


# -------------------------------------------------------- the GPU scripts' CPU-side checks
def _repro_script():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "gpu" / "te_lifecycle_repros.py"
    spec = importlib.util.spec_from_file_location("te_lifecycle_repros", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_lifecycle_repro_is_valid_python_with_one_verdict_per_branch():
    script = _repro_script()
    names = [r.name for r in script.REPROS]
    assert len(names) == len(set(names)) == 11
    for repro in script.REPROS:
        code = script.HEADER + __import__("textwrap").dedent(repro.code)
        compile(code, repro.name, "exec")
        assert repro.suspect in ("TE bug", "oracle false positive"), repro.name
        assert 'print("BUG: ' in code or 'print(f"BUG: ' in code, repro.name
        assert 'print("ok' in code or 'print(f"ok' in code, repro.name


def test_the_repro_script_says_what_it_needs_without_te(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)
    assert _repro_script().main([str(tmp_path / "out")]) == 2
    assert "te_lifecycle_repros: needs TransformerEngine" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_repro_runner_classifies_verdicts_and_crashes():
    script = _repro_script()
    ok = script.Repro("fine", "p", "oracle false positive", "c", 'print("noise")\nprint("ok: fine")\n')
    bug = script.Repro("bad", "p", "TE bug", "c", 'print("BUG: broken")\n')
    crash = script.Repro("crash", "p", "TE bug", "c", 'raise RuntimeError("CUDA error: trap")\n')
    header = script.HEADER
    script.HEADER = ""  # no TE here: the runner is what is tested
    try:
        results = [script.run_repro(r, timeout=60) for r in (ok, bug, crash)]
    finally:
        script.HEADER = header
    assert [(r["verdict"], r["as_suspected"]) for r in results] == [("ok", True), ("BUG", True), ("crashed", False)]
    assert results[0]["output"] == "ok: fine" and results[2]["output"] == "RuntimeError: CUDA error: trap"
    text = script.markdown(results, "2.20.2", "H200")
    assert "| bad | p | TE bug | **BUG** | yes | BUG: broken |" in text


def test_the_record_names_the_commit_given_by_refops_commit(monkeypatch):
    """A copy of the tree on a remote GPU machine may carry another .git: the caller names the commit."""
    monkeypatch.setenv("REFOPS_COMMIT", "abc1234")
    assert runner.commit() == "commit abc1234"
    monkeypatch.delenv("REFOPS_COMMIT")
    assert runner.commit() != "commit abc1234"


def test_a_refops_extension_is_listed_on_te_s_row_not_held_against_it(monkeypatch):
    """Materializing in place keeps parameter objects: refops promises it, TE does not. A TE op that makes new
    Parameters violates only that: its row passes and names the extension; any other violation still fails it."""
    from refops.testing.lifecycle.report import Kind, LifecycleReport, PropertyResult, Status

    def report(*failing):
        results = [PropertyResult(name, status, evidence, kind=kind) for name, status, evidence, kind in failing]
        results.append(PropertyResult("aliases_preserved", Status.HELD, "held"))
        return LifecycleReport("op", "cpu", tuple(results))

    extension = ("identity_through_materialization", Status.NOT_KEPT, "reset_parameters: replaced weight",
                 Kind.EXTENSION)
    other = ("requires_grad_kept", Status.VIOLATED, "reset_parameters: requires_grad became True on weight",
             Kind.PROMISE)
    case = type("Case", (), {"factory": None, "inputs": None})()
    setup = tiers.Setup.__new__(tiers.Setup)
    object.__setattr__(setup, "device", torch.device("cpu"))
    object.__setattr__(setup, "seed", 0)
    for te_side, fails in (((extension,), False), ((extension, other), True)):
        answers = iter([report(*te_side), report()])
        monkeypatch.setattr(lifecycle_tier, "check_lifecycle", lambda *a, **k: next(answers))
        row = lifecycle_tier._run_lifecycle(setup, case, case, {"op": "Linear"})
        assert row.passed is not fails, row.evidence
        assert "refops extensions TE does not promise (not a verdict on TE): identity_through_materialization" \
            in row.evidence
        assert ("requires_grad_kept: " in row.evidence) is fails


# ------------------------------------------------------------ the library entry points (no argv)
def test_run_conformance_from_python_returns_the_record_and_reports_progress(monkeypatch):
    """``run_conformance`` is the command without its printing: the record comes back; the progress callback sees
    every row with the total."""
    install_refops_as_te(monkeypatch, version="0.0+refops")
    calls = []
    record = conformance.run_conformance(tiers=["lifecycle"], recipes=["none"], ops=["Bias", "LayerNorm"],
                                         device=CPU, device_info=BLACKWELL,
                                         progress=lambda done, total, label: calls.append((done, total, label)))
    assert isinstance(record, ConformanceRecord) and record.ok
    assert [t.tier for t in record.tiers] == ["lifecycle"]
    assert [r.cells["op"] for r in record.tier("lifecycle").rows] == ["Bias", "LayerNorm"]
    assert [(d, t) for d, t, _ in calls] == [(1, 2), (2, 2)]
    assert calls[-1][2] == "lifecycle: LayerNorm none high precision float32: pass"
    assert record.environment["TransformerEngine"] == "0.0+refops"
    assert conformance.NotRun("quantizers tier", "not selected (--tiers)") in record.not_run


def test_plan_conformance_lists_the_rows_before_running_any(monkeypatch):
    install_refops_as_te(monkeypatch)
    plan = conformance.plan_conformance(tiers=["modules"], recipes=["fp8_current_scaling"], dtypes=["bfloat16"],
                                        pipelines=["linear"], device=CPU, device_info=BLACKWELL)
    assert [p.cells for p in plan.planned] == [
        {"pipeline": "linear", "recipe": "fp8_current_scaling", "dtype": "bfloat16", "weights": w}
        for w in ("high precision", "quantized")]
    assert all(not t.rows for t in plan.tables)
    assert "high precision (no recipe)" in [n.what for n in plan.not_run]


def test_run_conformance_refuses_unknown_names_and_says_every_reason_it_cannot_start(monkeypatch):
    for kwargs, message in (({"tiers": ["kernels"]}, "unknown tier 'kernels'"),
                            ({"recipes": ["fp8"]}, "unknown recipe 'fp8'"),
                            ({"dtypes": ["float64"]}, "unknown dtype 'float64'"),
                            ({"pipelines": ["mlp"]}, "unknown pipeline 'mlp'"),
                            ({"ops": ["GELU"]}, "unknown op 'GELU'"),
                            ({"device": CPU}, "device and device_info go together")):
        with pytest.raises(ValueError, match=message):
            conformance.run_conformance(**kwargs)
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(conformance.ConformanceUnavailable) as raised:
        conformance.run_conformance()
    reasons = raised.value.reasons
    assert len(reasons) == 2 and reasons[0].startswith("checks TransformerEngine on a CUDA GPU")
    assert reasons[1].startswith("needs TransformerEngine, which is not installed here")
    assert str(raised.value).startswith("the conformance run cannot start: checks TransformerEngine")
    assert isinstance(raised.value, conformance.ConformanceError)
