"""Lifecycle events, recorded from the real code paths.

Every lifecycle step in :mod:`refops.ops` calls :func:`record` with the kind of
event and what it acted on. Nothing is stored unless a :class:`trace` context is
active, so recording costs one truthiness check on the hot path.

Example::

    with refops.trace() as t:
        model(x).sum().backward()
    print(t.render_text())
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Event", "EVENT_KINDS", "trace", "record", "is_tracing"]

#: Every event kind the library emits, in the order they first occur in a
#: typical training step. The docs and the trace renderer rely on this list.
EVENT_KINDS: dict[str, str] = {
    "construct": "an op was constructed (device, dtype, deferred or not)",
    "recipe_state": "an op's recipe state (quantizers) was reset for a recipe",
    "first_forward_hook": "pre_first_fuser_forward ran on a top-level op",
    "materialize": "a parameter received its storage and initial values",
    "alias_sync": "a container re-pointed its aliases at its basic ops' parameters",
    "cache_refresh": "the fuser rebuilt its parameter cache (and why)",
    "backward_selection": "the fuser chose the first op that needs backward",
    "fusion_plan": "the fuser chose its forward and backward op lists",
    "forward_op": "an op (basic or fused) ran forward",
    "backward_op": "an op (basic or fused) ran backward",
    "scale_update": "delayed-scaling amax history and scales were updated",
    "checkpoint": "state was saved to or loaded from a state dict",
}


@dataclasses.dataclass(frozen=True)
class Event:
    """One lifecycle event: what happened (``kind``), to what (``subject``), and details."""

    kind: str
    subject: str
    details: dict[str, Any]

    def __str__(self) -> str:
        extra = ", ".join(f"{k}={_fmt(v)}" for k, v in self.details.items())
        return f"{self.kind:<18} {self.subject}" + (f"  ({extra})" if extra else "")


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


_active: list["trace"] = []


def is_tracing() -> bool:
    """True while at least one :class:`trace` context is recording."""
    return bool(_active)


def record(kind: str, subject: str, **details: Any) -> None:
    """Append an event to every active trace. A no-op when nothing is tracing."""
    if not _active:
        return
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown trace event kind {kind!r}; known kinds: {sorted(EVENT_KINDS)}")
    event = Event(kind, subject, dict(details))
    for t in _active:
        if t.kinds is None or kind in t.kinds:
            t.events.append(event)


class trace:
    """Context manager that records lifecycle events.

    Args:
        kinds: record only these event kinds (default: all of :data:`EVENT_KINDS`).
    """

    def __init__(self, kinds: list[str] | None = None) -> None:
        if kinds is not None:
            unknown = set(kinds) - set(EVENT_KINDS)
            if unknown:
                raise ValueError(f"unknown trace event kinds {sorted(unknown)}")
        self.kinds = None if kinds is None else set(kinds)
        self.events: list[Event] = []

    def __enter__(self) -> "trace":
        _active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _active.remove(self)

    def of_kind(self, kind: str) -> list[Event]:
        """The recorded events of one kind, in order."""
        return [e for e in self.events if e.kind == kind]

    def render_text(self) -> str:
        """One line per event, numbered."""
        return "\n".join(f"{i:3d}. {e}" for i, e in enumerate(self.events, 1))
