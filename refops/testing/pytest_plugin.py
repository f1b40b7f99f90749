"""pytest plugin: a ``--device`` option and fixtures for testing against refops.

Enable it with ``pytest_plugins = ["refops.testing.pytest_plugin"]`` in a
``conftest.py``. ``--device cuda`` runs device-parametrized tests on the GPU;
with no GPU such a run stops at once with the reason.
"""

from __future__ import annotations

import random

import pytest
import torch

__all__ = ["pytest_addoption", "device", "reset_rng"]

SEED = 1234


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("refops")
    group.addoption(
        "--device",
        action="store",
        default="cpu",
        help="device to run refops tests on: cpu (default) or cuda",
    )


def pytest_configure(config: pytest.Config) -> None:
    requested = config.getoption("--device")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {requested} was requested but torch reports no CUDA device")


@pytest.fixture
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device given by ``--device``, also set as torch's default device for the test."""
    dev = torch.device(request.config.getoption("--device"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    previous = torch.get_default_device()
    torch.set_default_device(dev)
    try:
        yield dev
    finally:
        torch.set_default_device(previous)


@pytest.fixture(autouse=True)
def reset_rng() -> None:
    """Every test starts from the same RNG state (torch CPU and CUDA, Python's random)."""
    torch.manual_seed(SEED)
    random.seed(SEED)
