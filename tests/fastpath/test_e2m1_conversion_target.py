"""Hopper has no E2M1 conversion instruction, which is why the fast path encodes NVFP4 in software.

``cvt.rn.satfinite.e2m1x2.f32`` (two fp32 values to two E2M1 codes, round to nearest even, saturating) is what
an NVFP4 quantize kernel on Blackwell rounds with. ptxas rejects it for sm_90 and sm_90a and accepts it for the
Blackwell targets, so on the H200 each code takes a product and four exact fp32 operations
(``e2m1_rne_min3`` in ``fastpath/kernels/nvfp4.cu``). GPU run 45 turned that cost into the
issue-rate bound that ``docs/benchmarks.md`` reports. Needs only nvcc (CPU machines included; the ``nvcc``
fixture: without it the tests fail when CI is set and skip otherwise). The three nvcc runs go with the other compile
checks (``_nvcc_builds.py``).
"""

from __future__ import annotations

import pytest
from _nvcc_builds import Build

PACK_E2M1 = r"""
extern "C" __global__ void pack_e2m1(const float* x, unsigned short* out) {
    unsigned short r;
    asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n cvt.u16.u8 %0, t;\n}"
        : "=h"(r) : "f"(x[0]), "f"(x[1]));
    out[0] = r;
}
"""


def pack_build(target: str) -> Build:
    return Build("pack_e2m1.cu", ("-gencode", f"arch=compute_{target},code=sm_{target}"), "object", text=PACK_E2M1)


@pytest.mark.parametrize("target", [pytest.param(t, marks=pytest.mark.compile(pack_build(t))) for t in ["90", "90a"]])
def test_hopper_rejects_the_e2m1_conversion(nvcc_builds, target):
    done = nvcc_builds.result(pack_build(target))
    assert not done.ok, f"sm_{target} compiled cvt.rn.satfinite.e2m1x2.f32:\n{done.output}"
    assert "e2m1x2" in done.output and f"sm_{target}" in done.output, done.output


@pytest.mark.compile(pack_build("100a"))
def test_blackwell_accepts_the_e2m1_conversion(nvcc_builds):
    done = nvcc_builds.result(pack_build("100a"))
    assert done.ok, f"sm_100a rejected cvt.rn.satfinite.e2m1x2.f32:\n{done.output}"
