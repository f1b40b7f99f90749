"""Hopper has no E2M1 conversion instruction, which is why the fast path encodes NVFP4 in software.

``cvt.rn.satfinite.e2m1x2.f32`` (two fp32 values to two E2M1 codes, round to nearest even, saturating) is what
an NVFP4 quantize kernel on Blackwell rounds with. ptxas rejects it for sm_90 and sm_90a and accepts it for the
Blackwell targets, so on the H200 each code takes a product and four exact fp32 operations
(``e2m1_rne_min3`` in ``fastpath/kernels/nvfp4.cu``). ``benchmarks/nvfp4_issue_bound.py`` turns that cost into
the issue-rate bound that ``docs/benchmarks.md`` reports. Needs only nvcc (CPU machines included; the ``nvcc``
fixture: without it the tests fail when CI is set and skip otherwise).
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest

PACK_E2M1 = r"""
extern "C" __global__ void pack_e2m1(const float* x, unsigned short* out) {
    unsigned short r;
    asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n cvt.u16.u8 %0, t;\n}"
        : "=h"(r) : "f"(x[0]), "f"(x[1]));
    out[0] = r;
}
"""


def _compile(nvcc: str, tmp_path: pathlib.Path, target: str) -> subprocess.CompletedProcess:
    source = tmp_path / "pack_e2m1.cu"
    source.write_text(PACK_E2M1)
    cmd = [nvcc, "-gencode", f"arch=compute_{target},code=sm_{target}", "-c", str(source),
           "-o", str(tmp_path / f"pack_e2m1_{target}.o")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("target", ["90", "90a"])
def test_hopper_rejects_the_e2m1_conversion(nvcc, tmp_path, target):
    done = _compile(nvcc, tmp_path, target)
    message = done.stdout + done.stderr
    assert done.returncode != 0, f"sm_{target} compiled cvt.rn.satfinite.e2m1x2.f32:\n{message}"
    assert "e2m1x2" in message and f"sm_{target}" in message, message


def test_blackwell_accepts_the_e2m1_conversion(nvcc, tmp_path):
    done = _compile(nvcc, tmp_path, "100a")
    assert done.returncode == 0, f"sm_100a rejected cvt.rn.satfinite.e2m1x2.f32:\n{done.stdout + done.stderr}"
