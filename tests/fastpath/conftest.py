"""Fixtures for the fast-path tests: every test here needs CuPy and a CUDA GPU and skips with the reason otherwise."""

from __future__ import annotations

import pytest

import fastpath
from refops.kernels import get_backend, register_backend

# Works from a source checkout too (no installed entry point needed).
register_backend("fastpath", fastpath.make_backend)


@pytest.fixture(scope="session")
def fastpath_backend():
    reason = fastpath.unavailable_reason()
    if reason:
        pytest.skip(f"fastpath unavailable: {reason}")
    return get_backend("fastpath")


@pytest.fixture(scope="session")
def reference_backend():
    return get_backend("reference")


@pytest.fixture
def cuda():
    """The CUDA device the differential tests run on."""
    import torch

    reason = fastpath.unavailable_reason()
    if reason:
        pytest.skip(f"fastpath unavailable: {reason}")
    return torch.device("cuda", torch.cuda.current_device())
