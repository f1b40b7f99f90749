"""Fixtures for the distributed tests: every case runs on 2 ranks started by ``refops.distributed.run_on_ranks``.

On the CPU (the default) the ranks are forked and join a gloo group; with ``--device cuda`` they are
spawned and join an NCCL group, one GPU each, and the tests skip when fewer than 2 GPUs exist.
Rank functions live at module level so that a spawned rank can import them.
"""

from __future__ import annotations

import functools

import pytest
import torch

from refops.distributed import run_on_ranks

WORLD_SIZE = 2
TIMEOUT_S = 120.0


@pytest.fixture
def ranks(request: pytest.FixtureRequest):
    """``ranks(fn, *args)`` runs ``fn(rank, world_size, *args)`` on 2 ranks and returns the per-rank results."""
    device = torch.device(request.config.getoption("--device"))
    if device.type == "cuda":
        if torch.cuda.device_count() < WORLD_SIZE:
            pytest.skip(f"NCCL tests need {WORLD_SIZE} GPUs; torch sees {torch.cuda.device_count()}")
        backend = "nccl"
    else:
        backend = "gloo"
    return functools.partial(_run, backend=backend)


@pytest.fixture(scope="session")
def cpu_ranks(request: pytest.FixtureRequest):
    """``cpu_ranks(fn, *args, timeout=...)`` on 2 forked gloo CPU ranks, for the FSDP2, DTensor and checkpoint cases.

    They run in the CPU suite only: under ``--device cuda`` the test process uses CUDA, after which a forked
    rank can neither touch CUDA nor run autograd's backward.
    """
    if request.config.getoption("--device") != "cpu":
        pytest.skip("the FSDP2, DTensor and checkpoint cases run on 2 gloo CPU ranks (the CPU suite runs them)")
    return lambda fn, *args, timeout=TIMEOUT_S: run_on_ranks(fn, WORLD_SIZE, *args, backend="gloo", timeout=timeout)


def _run(fn, *args, backend: str):
    return run_on_ranks(fn, WORLD_SIZE, *args, backend=backend, timeout=TIMEOUT_S)
