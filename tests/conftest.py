import os

import pytest
import torch

pytest_plugins = ["refops.testing.pytest_plugin"]


def pytest_configure(config):
    """Pin torch's default device to the CPU for the suite's own tests.

    Many tests build ops without a ``device`` and feed CPU tensors. With no default set, refops places
    such parameters on the current CUDA device when there is one (TE's rule, ``refops.ops.placement``),
    so on a GPU machine those tests would meet CPU inputs with CUDA parameters. Setting the CPU
    explicitly keeps the suite the same on every machine; the ``device`` fixture switches per test
    (``--device cuda``), and the tests of the placement rule unset the default themselves.
    """
    torch.set_default_device("cpu")


def pytest_collection_modifyitems(config, items):
    """``REFOPS_TEST_SHARD=i/n`` keeps every n-th collected test from the i-th (0-based) and deselects the rest.

    For running one suite as n independent processes where pytest-xdist cannot be used, e.g. each under its
    own ``compute-sanitizer`` (which crashes with xdist's workers).
    """
    shard = os.environ.get("REFOPS_TEST_SHARD")
    if not shard:
        return
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise pytest.UsageError(f"REFOPS_TEST_SHARD={shard!r}: expected 'i/n' with 0 <= i < n")
    i, n = int(index), int(count)
    kept = [item for position, item in enumerate(items) if position % n == i]
    config.hook.pytest_deselected(items=[item for position, item in enumerate(items) if position % n != i])
    items[:] = kept
