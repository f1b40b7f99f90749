"""pytest plugin: a ``--device`` option and fixtures for testing against refops.

Enable it in one of two ways:

* ``pytest_plugins = ["refops.testing.pytest_plugin"]`` in the **top-level**
  ``conftest.py`` (the one in pytest's rootdir). pytest refuses ``pytest_plugins``
  in a nested ``conftest.py`` (``tests/unit/conftest.py``): a plugin affects the
  whole run, not one folder, so such a run stops with "Defining 'pytest_plugins'
  in a non-top-level conftest is no longer supported" (pytest's rule, not
  refops'; it passes only when that folder happens to be the one pytest starts
  in, which is why it can seem to work);
* or ``-p refops.testing.pytest_plugin`` on the command line, or in the
  configuration (``addopts = "-p refops.testing.pytest_plugin"`` under
  ``[tool.pytest.ini_options]``), which works wherever the tests live.

``--device cuda`` runs device-parametrized tests on the GPU; with no GPU such a
run stops at once with the reason.
"""

from __future__ import annotations

import random

import pytest
import torch

from ..ops.placement import explicit_default_device

__all__ = ["pytest_addoption", "device", "reset_rng", "oracle", "quantizer_checker", "Oracle"]

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
    # Restore exactly what was there: "no default set" must not become "set to cpu", since an op
    # built without a device goes to CUDA in the first case and to the CPU in the second.
    previous = explicit_default_device()
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


class Oracle:
    """The oracle bound to the test's device: ``check_quantizer``, ``compare``, ``compare_backends``,
    ``check_lifecycle``, ``recipe``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def check_quantizer(self, candidate, quantizer_or_recipe, **kwargs):
        """:func:`refops.testing.check_quantizer` with inputs on this device: check a kernel's quantizer first."""
        from .quantizers import check_quantizer

        kwargs.setdefault("device", self.device)
        return check_quantizer(candidate, quantizer_or_recipe, **kwargs)

    def compare(self, candidate, reference, inputs, **kwargs):
        """:func:`refops.testing.compare_modules`; ``assert_ok()`` on the result raises with the evidence."""
        from .modules import compare_modules

        return compare_modules(candidate, reference, inputs, **kwargs)

    def compare_backends(self, factory, inputs, **kwargs):
        """:func:`refops.testing.compare_backends`."""
        from .modules import compare_backends

        return compare_backends(factory, inputs, **kwargs)

    def check_lifecycle(self, factory, **kwargs):
        """:func:`refops.testing.check_lifecycle` on this device."""
        from .lifecycle import check_lifecycle

        return check_lifecycle(factory, device=self.device, **kwargs)

    def recipe(self, name: str):
        """A recipe by TE's test name (``refops.testing.RECIPE_NAMES``)."""
        from .recipes import make_recipe

        return make_recipe(name)


@pytest.fixture
def oracle(device: torch.device) -> Oracle:
    """The refops oracle on the ``--device`` device."""
    return Oracle(device)


@pytest.fixture
def quantizer_checker(oracle: Oracle):
    """``quantizer_checker(candidate, recipe_or_quantizer, **kwargs)``: :func:`refops.testing.check_quantizer`
    on the ``--device`` device; ``.assert_ok()`` on its report raises with the first mismatches."""
    return oracle.check_quantizer
