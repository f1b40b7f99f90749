"""Fixtures for the fast-path tests: the kernel tests need CuPy and a CUDA GPU and skip with the reason otherwise;
the compile checks need only nvcc (the ``nvcc`` fixture)."""

from __future__ import annotations

import os

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


@pytest.fixture(scope="session")
def nvcc() -> str:
    """nvcc's path, for the compile checks that need no GPU. Without nvcc they fail when the environment variable
    CI is set (CI must run them) and skip, saying why, otherwise."""
    from fastpath import compile_check

    found = compile_check.find_nvcc()
    if found is None:
        message = compile_check.missing_nvcc_message()
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so the kernel compile checks must run")
        pytest.skip(message)
    return found
