"""Fixtures for the fast-path tests: the kernel tests need CuPy and a CUDA GPU and skip with the reason otherwise;
the compile checks need only nvcc (the ``nvcc`` fixture).

The compile checks carry the ``compile`` marker (``-m "not compile"`` leaves them out). Those that declare their
builds (``@pytest.mark.compile(Build(...))``, see ``_nvcc_builds.py``) get them from the ``nvcc_builds`` fixture:
every selected build starts when collection ends, on all cores, and the compile checks run last, so that nvcc works
while the rest of the suite runs; results are cached on disk by content.
"""

from __future__ import annotations

import contextlib
import os

import pytest
from _nvcc_builds import Build, NvccBuilds, cache_dir

import fastpath
from refops.kernels import get_backend, register_backend

_BUILDS = pytest.StashKey[NvccBuilds]()
_ANNOUNCED = pytest.StashKey[bool]()

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


@pytest.fixture(scope="session")
def nvcc_builds(nvcc, pytestconfig) -> NvccBuilds:
    """The session's builds (started at the end of collection, or now when none was selected then)."""
    builds = pytestconfig.stash.get(_BUILDS, None)
    if builds is None:
        builds = pytestconfig.stash[_BUILDS] = NvccBuilds(nvcc, os.cpu_count() or 1, cache_dir())
    return builds


def declared_builds(item: pytest.Item) -> list[Build]:
    return [build for marker in item.iter_markers("compile") for build in marker.args]


def pytest_collection_modifyitems(config, items):
    """Every test that uses nvcc is a compile check (``compile`` marker); the compile checks go last, in order."""
    for item in items:
        if "nvcc" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("compile"):
            item.add_marker("compile")
    items[:] = [i for i in items if not i.get_closest_marker("compile")] + [
        i for i in items if i.get_closest_marker("compile")]


def pytest_collection_finish(session):
    """Start every selected compile check's builds now, in the background (nothing starts without nvcc)."""
    from fastpath import compile_check

    wanted = [build for item in session.items for build in declared_builds(item)]
    found = compile_check.find_nvcc() if wanted else None
    if found is None:
        return
    builds = session.config.stash[_BUILDS] = NvccBuilds(found, os.cpu_count() or 1, cache_dir())
    for build in wanted:
        builds.start(build)


def compile_checks_line(config: pytest.Config, items: list[pytest.Item]) -> str:
    """The line printed before the first compile check: what runs now and why it may be quiet for a while."""
    total = sum(1 for item in items if item.get_closest_marker("compile"))
    builds = config.stash.get(_BUILDS, None)
    unfinished = "" if builds is None else f", {builds.unfinished()} nvcc builds still running"
    where = cache_dir()
    cached = f"cached by content in {where}" if where is not None else "the cache is off (REFOPS_NVCC_CACHE=off)"
    return (f"refops: {total} nvcc compile checks of the CUDA kernels run now{unfinished}; uncached they take about "
            f"1.5 minutes on 2 cores, with no output meanwhile ({cached}; -m \"not compile\" leaves them out)")


def pytest_runtest_setup(item):
    """Before the first compile check, one line on the terminal: the builds can take a minute or two in silence."""
    if not item.get_closest_marker("compile") or item.config.stash.get(_ANNOUNCED, False):
        return
    item.config.stash[_ANNOUNCED] = True
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    capture = item.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    writer = getattr(reporter, "_tw", None)  # mid-line after the progress dots (-q) or a test's name (-v)
    mid_line = writer is None or writer.width_of_current_line > 0
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        reporter.write(("\n" if mid_line else "") + compile_checks_line(item.config, item.session.items) + "\n")


def pytest_sessionfinish(session):
    builds = session.config.stash.get(_BUILDS, None)
    if builds is not None:
        builds.close()
