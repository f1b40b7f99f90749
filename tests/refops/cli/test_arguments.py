"""Issue #38 item 5: every command checks its arguments and output paths before any work, says what is wrong in
one line with exit status 2 (argparse's), and never exits 0 when it did not do what was asked.

The checks are :mod:`refops.cli.arguments`; the work they must come before is replaced here by a function that
fails the test if it runs, so "before any work" is what is asserted, not assumed.
"""

from __future__ import annotations

import argparse
import errno
import pathlib
import tempfile

import pytest
import torch

from refops.__main__ import main
from refops.cli import check_cmd, conformance_cmd, trace_cmd
from refops.cli.arguments import output_file, output_folder
from refops.demo import run_demo
from refops.testing.conformance import ConformanceRecord, DeviceInfo

from _fake_te import install_refops_as_te


def _no_work(*args, **kwargs):
    raise AssertionError("the command started its work before refusing its arguments")


def _refused(capsys, argv: list[str]) -> str:
    """Run ``refops ARGV``; assert it exits 2 with one line and no traceback; return the line, less its hint."""
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert len(captured.err.splitlines()) == 1, captured.err  # no usage block either
    line = captured.err.strip()
    hint = f" (see refops {argv[0]} --help)"
    assert line.endswith(hint), line
    return line[: -len(hint)]


@pytest.fixture
def no_demo(monkeypatch):
    monkeypatch.setattr(trace_cmd, "run_demo", _no_work)


@pytest.fixture
def no_conformance(monkeypatch):
    monkeypatch.setattr(conformance_cmd, "plan_conformance", _no_work)


# --------------------------------------------------------------------------- trace
@pytest.mark.parametrize("steps", ["-2", "0"])
def test_trace_refuses_fewer_than_one_step(capsys, no_demo, steps):
    """``--steps -2`` exited 0 and claimed identity kept for parameters still on meta."""
    line = _refused(capsys, ["trace", "--steps", steps])
    assert line.endswith(f"argument --steps: must be at least 1, got {steps}: the trace and its checks are about "
                         "training steps")


def test_trace_refuses_zero_steps_with_a_diagram_and_writes_nothing(tmp_path, capsys, no_demo):
    """``--steps 0 --mermaid F`` exited 0 without writing F or saying why."""
    diagram = tmp_path / "first.mmd"
    assert "argument --steps" in _refused(capsys, ["trace", "--steps", "0", "--mermaid", str(diagram)])
    assert list(tmp_path.iterdir()) == []


def test_trace_refuses_a_diagram_it_cannot_write_before_the_demo(tmp_path, capsys, no_demo):
    a_file = tmp_path / "a_file"
    a_file.write_text("kept\n")
    for path, reason in ((tmp_path / "missing" / "d.mmd", f"its folder {tmp_path / 'missing'} does not exist"),
                         (a_file / "d.mmd", f"its folder {a_file} is not a folder"),
                         (tmp_path, "is a folder; give the path of a file")):
        line = _refused(capsys, ["trace", "--mermaid", str(path)])
        assert line.startswith("refops trace: error: argument --mermaid: ") and reason in line, line
    assert a_file.read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_trace_refuses_a_folder_that_takes_no_new_file(tmp_path, capsys, monkeypatch, no_demo):
    """A read-only folder, as root sees one too (``os.access`` would say yes): the probe's file cannot be made."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    line = _refused(capsys, ["trace", "--mermaid", str(tmp_path / "d.mmd")])
    assert line.endswith(f"cannot write into {tmp_path} (for {tmp_path / 'd.mmd'}): Read-only file system")


def test_trace_probes_an_existing_diagram_without_changing_it(tmp_path):
    diagram = tmp_path / "old.mmd"
    diagram.write_text("old\n")
    assert output_file(str(diagram)) == diagram and diagram.read_text() == "old\n"
    assert output_file(str(tmp_path / "new.mmd")) == tmp_path / "new.mmd"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.mmd"]  # the probe's file is gone


def test_trace_says_when_the_diagram_could_not_be_written_after_all(tmp_path, capsys, monkeypatch):
    """The disk filled between the check and the write: exit 2 and one line, not a traceback after the demo."""
    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    assert main(["trace", "--steps", "1", "--mermaid", str(tmp_path / "d.mmd")]) == 2
    captured = capsys.readouterr()
    assert "== summary" in captured.out and "wrote the first training step" not in captured.out
    assert captured.err.strip() == f"refops trace: error: could not write {tmp_path / 'd.mmd'}: No space left on device"


def test_trace_refuses_quantized_weights_without_a_recipe(capsys, no_demo):
    line = _refused(capsys, ["trace", "--quantized-weights"])
    assert line == "refops trace: error: --quantized-weights needs --recipe"


def test_the_demo_itself_refuses_fewer_than_one_step():
    with pytest.raises(ValueError, match=r"run_demo: steps must be >= 1 \(got 0\)"):
        run_demo(steps=0)


# --------------------------------------------------------------------- conformance
def test_conformance_refuses_an_out_it_cannot_write_before_running_anything(tmp_path, capsys, no_conformance):
    """``--out`` at an existing file or an uncreatable folder ran every tier, then lost the record to a traceback."""
    a_file = tmp_path / "a_file"
    a_file.write_text("kept\n")
    taken = tmp_path / "taken"
    (taken / "conformance.json").mkdir(parents=True)
    for out, reason in ((a_file, f"{a_file} is a file, not a folder"),
                        (a_file / "run", f"cannot make the folder {a_file / 'run'}: {a_file} is a file"),
                        (taken, f"cannot write {taken / 'conformance.json'}: it is a folder")):
        line = _refused(capsys, ["conformance", "--out", str(out)])
        assert line == f"refops conformance: error: argument --out: {reason}", line
    assert a_file.read_text() == "kept\n"


def test_conformance_accepts_a_folder_it_can_make_and_makes_nothing_before_the_run(tmp_path):
    out = tmp_path / "new" / "run"
    assert output_folder("conformance.md")(str(out)) == out
    assert list(tmp_path.iterdir()) == []


def test_conformance_says_when_the_record_could_not_be_written_after_all(tmp_path, capsys, monkeypatch):
    install_refops_as_te(monkeypatch)

    def full_disk(self, directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ConformanceRecord, "write", full_disk)
    parser = argparse.ArgumentParser()
    conformance_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["conformance", "--tiers", "lifecycle", "--recipes", "none", "--ops", "Bias",
                              "--out", str(tmp_path)])
    code = conformance_cmd.run(args, device=torch.device("cpu"), device_info=DeviceInfo("fake CPU", (10, 0)))
    assert code == 2  # every row passed, but the record asked for is not on disk
    captured = capsys.readouterr()
    assert "# refops conformance of TransformerEngine" in captured.out  # the record is not lost: it is printed
    assert captured.err.strip() == (f"refops conformance: error: could not write the record into {tmp_path} "
                                    "([Errno 28] No space left on device); its Markdown is printed above")


# --------------------------------------------------------------------------- check
@pytest.mark.parametrize("option", ["--ops", "--recipes", "--dtypes"])
def test_check_refuses_an_empty_selection(capsys, monkeypatch, option):
    """``--ops`` with no names meant "every op": an empty "only these" now is an error."""
    monkeypatch.setattr(check_cmd, "run_check_matrix", _no_work)
    assert f"argument {option}: expected at least one argument" in _refused(capsys, ["check", option])
