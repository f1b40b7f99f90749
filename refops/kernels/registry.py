"""Which backend runs the kernels: registration and selection.

``refops`` knows only its own reference backend. Other backends announce
themselves through the ``refops.backends`` entry-point group (``fastpath`` does
so in ``pyproject.toml``), or register at run time with :func:`register_backend`.
That is how a user can select ``"fastpath"`` while ``refops`` never imports it.
"""

from __future__ import annotations

import importlib.metadata
import threading
from typing import Callable

from .interface import KernelBackend
from .reference import ReferenceKernels

__all__ = ["register_backend", "available_backends", "get_backend", "current_backend", "use_backend"]

_ENTRY_POINT_GROUP = "refops.backends"
_factories: dict[str, Callable[[], KernelBackend]] = {"reference": ReferenceKernels}
_instances: dict[str, KernelBackend] = {}
_state = threading.local()


def register_backend(name: str, factory: Callable[[], KernelBackend]) -> None:
    """Make ``factory()`` available as backend ``name`` (built on first use)."""
    _factories[name] = factory
    _instances.pop(name, None)


def _entry_point_factories() -> dict[str, Callable[[], KernelBackend]]:
    found = {}
    for ep in importlib.metadata.entry_points(group=_ENTRY_POINT_GROUP):
        found[ep.name] = ep
    return found


def available_backends() -> list[str]:
    """Names of every registered or installed backend (installed ones may still be unusable)."""
    return sorted(set(_factories) | set(_entry_point_factories()))


def get_backend(name: str) -> KernelBackend:
    """The backend called ``name``, built once. Raises with the reason when it cannot be used."""
    if name in _instances:
        return _instances[name]
    factory = _factories.get(name)
    if factory is None:
        ep = _entry_point_factories().get(name)
        if ep is None:
            raise ValueError(f"unknown kernel backend {name!r}; available: {available_backends()}")
        factory = ep.load()
    backend = factory()
    if not isinstance(backend, KernelBackend):
        raise TypeError(f"backend factory for {name!r} returned {type(backend).__name__}, not a KernelBackend")
    _instances[name] = backend
    return backend


def current_backend() -> KernelBackend:
    """The backend ops call right now (the reference unless :func:`use_backend` chose another)."""
    backend = getattr(_state, "backend", None)
    if backend is None:
        backend = get_backend("reference")
        _state.backend = backend
    return backend


class use_backend:
    """Select the kernel backend, for good or for the duration of a ``with`` block.

    ``refops.use_backend("fastpath")`` switches at once; used as a context manager
    it restores the previous backend on exit. Accepts a name or a backend object.
    """

    def __init__(self, backend: str | KernelBackend) -> None:
        self._previous = current_backend()
        self.backend = backend if isinstance(backend, KernelBackend) else get_backend(backend)
        _state.backend = self.backend

    def __enter__(self) -> KernelBackend:
        return self.backend

    def __exit__(self, *exc: object) -> None:
        _state.backend = self._previous
