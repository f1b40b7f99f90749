"""benchmarks/gpu/hopper_gemm_shares.py on the CPU: it imports, its helpers work, without a GPU it says why."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "hopper_gemm_shares.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("hopper_gemm_shares", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bit_share(script):
    a = torch.tensor([1.0, 2.0, float("nan"), -0.0])
    b = torch.tensor([1.0, 2.5, float("nan"), 0.0])
    assert script.bit_share(a, b) == 0.5  # -0.0 and +0.0 differ in bits; equal NaNs agree
    assert script.bit_share(a.bfloat16(), a.bfloat16()) == 1.0
    with pytest.raises(ValueError):
        script.bit_share(a, a.double())


def test_record_flushes_json_and_markdown_after_every_row(script, tmp_path):
    record = script.Record(tmp_path, {"device": "cpu"})
    record.add("A", {"M": 16, "hopper": 1.0, "exact": 0.25})
    record.error("B", "Traceback: boom")
    data = json.loads((tmp_path / "hopper_shares.json").read_text())
    assert data["parts"]["A"][0]["hopper"] == 1.0 and "boom" in data["errors"]["B"]
    md = (tmp_path / "hopper_shares.md").read_text()
    assert "| M | hopper | exact |" in md and "100.00 %" in md and "25.00 %" in md and "boom" in md


def test_part_helpers_compute_the_reference_on_cpu(script):
    device = torch.device("cpu")
    a, b = script.fp8_operand((16, 32), device, 0), script.fp8_operand((16, 32), device, 1)
    hopper = script.reference_gemm(a, b, numerics="hopper", role="fprop", out_dtype=torch.bfloat16)
    exact = script.reference_gemm(a, b, numerics="exact", role="fprop", out_dtype=torch.bfloat16)
    assert hopper.shape == exact.shape == (16, 16) and 0.0 <= script.bit_share(hopper, exact) <= 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script measures for minutes")
def test_without_a_hopper_gpu_it_says_why(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "compute capability 9.0" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
