"""The CPU speed scripts (``bench_reference.py``, ``bench_fuser_host.py``) run in quick mode and print their ratios.

No timing is asserted (the figures depend on the machine): what is checked is that every row is printed,
that the byte-identity assertions of ``bench_reference.py`` ran and held for every recipe, and that the
fuser benchmark prints the fixed and per-op costs with their targets.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "benchmarks"


def _run(script: str, tmp_path: pathlib.Path) -> str:
    done = subprocess.run([sys.executable, str(SCRIPTS / script), "--quick", "--threads", "1"], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_bench_reference_prints_the_ratio_table_after_checking_byte_identity(tmp_path):
    out = _run("bench_reference.py", tmp_path)
    assert "recipe" in out and "refops ms" in out and "peer ms" in out and "ratio" in out, out
    for recipe in ("per-tensor FP8", "block FP8 1x128", "block FP8 128x128", "MXFP8 vs plain torch", "NVFP4"):
        rows = [line for line in out.splitlines() if line.startswith(recipe)]
        assert len(rows) == 2, (recipe, out)  # fp32 and bf16 input
        assert all(float(row.rsplit("|", 1)[1]) > 0 for row in rows), rows
    assert "byte-identical outputs: asserted for every row" in out, out
    assert ("MXFP8 vs torchao" in out) or ("torchao not installed: skipped" in out), out


def test_bench_reference_refuses_a_peer_that_differs(monkeypatch):
    """The assertion the script relies on fails when one byte differs."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        bench = __import__("bench_reference")
    finally:
        sys.path.remove(str(SCRIPTS))
    data = torch.arange(8, dtype=torch.uint8)
    bench.check_identical("same", (data, torch.ones(1)), (data.clone(), torch.ones(1)))
    changed = data.clone()
    changed[3] ^= 1
    with pytest.raises(AssertionError, match="differ"):
        bench.check_identical("changed", (data,), (changed,))


def test_bench_fuser_host_prints_fixed_and_per_op_costs(tmp_path):
    out = _run("bench_fuser_host.py", tmp_path)
    for mode in ("forward", "forward+backward"):
        assert f"{mode}: fixed cost per forward refops" in out, out
        assert f"{mode}: 4-op pipeline refops" in out, out
    assert "target < 200 us" in out and "target < 2.0" in out, out
    assert "targets:" in out, out
    # The floor table: each op's ATen dispatch count on both sides (GELU's tanh formula is nine steps).
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]] for line in out.splitlines()
            if line.startswith(("BasicLinear ", "Bias ", "GELU "))}
    assert set(rows) == {"BasicLinear", "Bias", "GELU"}, out
    assert rows["GELU"][:2] == ["9", "1"] and rows["Bias"][:2] == ["1", "1"], out
    # Then the kernel alone, the op's hook alone and torch.nn's module, each a positive time.
    assert all(float(row[i]) > 0 for row in rows.values() for i in (2, 3, 4)), out
