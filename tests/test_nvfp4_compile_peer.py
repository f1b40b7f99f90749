"""The plain-torch NVFP4 peer of benchmarks/nvfp4_vs_compile.py gives refops's bytes (checked here on the CPU,
uncompiled; the script asserts it again on the GPU before timing)."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import nvfp4_vs_compile as bench  # noqa: E402

NAMES = ["data", "block scales", "amax", "column-wise data", "column-wise block scales"]


def _ties_at_every_midpoint(dtype: torch.dtype) -> torch.Tensor:
    """A global amax of 2688 makes S_enc 1, and a block whose amax is 6 gets scale 1: its values are encoded as is."""
    x = torch.randn(32, 64, dtype=torch.float32)
    x[0, 0] = 2688.0
    mids = torch.tensor(bench.MIDPOINTS)
    x[1, :16] = torch.cat([torch.tensor([6.0]), mids, -mids, torch.tensor([0.0])])
    x[2, :16] = 0.0  # an all-zero block
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("columnwise", [False, True], ids=["row", "row+col"])
@pytest.mark.parametrize("inputs", ["random", "ties"])
def test_the_peer_gives_refops_bytes(dtype, columnwise, inputs):
    x = (torch.randn(64, 128) * 5).to(dtype) if inputs == "random" else _ties_at_every_midpoint(dtype)
    got = bench.refops_fastpath(columnwise)(x)  # the reference backend on the CPU
    want = bench.peer(x, columnwise)
    assert len(got) == len(want) == (5 if columnwise else 3)
    for name, a, b in zip(NAMES, got, want):
        assert torch.equal(a.reshape(b.shape), b), name


def test_ties_round_to_the_even_code():
    mids = torch.tensor(bench.MIDPOINTS)
    assert bench.e2m1_codes(mids).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert bench.e2m1_codes(-mids).tolist() == [8, 10, 10, 12, 12, 14, 14]


def test_without_a_gpu_the_script_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only message")
    assert bench.main([]) == 0
    assert "no GPU: nothing measured" in capsys.readouterr().out
