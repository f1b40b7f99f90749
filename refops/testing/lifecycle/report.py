"""The result of a lifecycle conformance check: one status and its evidence per property.

A property is *held*, *violated*, *not checked* (it needs forward inputs that were
not given) or *not applicable* (the module has nothing it could apply to, for
example no parameters or no ``reset_parameters()``, or it follows a documented
PyTorch convention that the property is not about). The evidence always says
why, with the names, ids, devices and maximum differences involved.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Iterator

__all__ = ["Status", "PropertyResult", "LifecycleReport"]


class Status(str, enum.Enum):
    """The outcome of checking one property."""

    HELD = "held"
    VIOLATED = "violated"
    NOT_CHECKED = "not checked"
    NOT_APPLICABLE = "not applicable"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class PropertyResult:
    """One property of the lifecycle contract, as checked on one module."""

    #: The property's identifier, for example ``"no_stale_cache_after_replacement"``.
    name: str
    #: Held, violated, not checked or not applicable.
    status: Status
    #: What was observed (names, ids, devices, maximum differences), or why the
    #: property was not checked or does not apply.
    evidence: str
    #: The property, stated as a promise.
    description: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.status}: {self.evidence}"


@dataclasses.dataclass(frozen=True)
class LifecycleReport:
    """Every property's result for one module factory, in a fixed order."""

    #: A short name for what was checked (the class of the built module).
    subject: str
    #: The device the module was materialized on.
    device: str
    #: One :class:`PropertyResult` per property.
    results: tuple[PropertyResult, ...]

    def __iter__(self) -> Iterator[PropertyResult]:
        return iter(self.results)

    def __getitem__(self, name: str) -> PropertyResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(f"no property named {name!r}; known: {[r.name for r in self.results]}")

    @property
    def statuses(self) -> dict[str, Status]:
        """``{property name: status}``, in report order."""
        return {r.name: r.status for r in self.results}

    @property
    def violations(self) -> list[PropertyResult]:
        """The violated properties, in report order."""
        return [r for r in self.results if r.status is Status.VIOLATED]

    @property
    def ok(self) -> bool:
        """True when no property is violated (not checked and not applicable are not failures)."""
        return not self.violations

    def assert_ok(self) -> None:
        """Raise :class:`AssertionError` listing every violated property with its evidence."""
        if self.ok:
            return
        count = len(self.violations)
        lines = [f"{self.subject} on {self.device} violates {count} lifecycle propert{'y' if count == 1 else 'ies'}:"]
        lines += [f"  - {r.name}: {r.evidence}" for r in self.violations]
        raise AssertionError("\n".join(lines))

    def __str__(self) -> str:
        """A title with the counts, then a table with one row per property: the violated ones first, then
        those held, then those not checked and not applicable (their evidence says why)."""
        order = [Status.VIOLATED, Status.HELD, Status.NOT_CHECKED, Status.NOT_APPLICABLE]
        ordered = sorted(self.results, key=lambda r: order.index(r.status))
        rows = [("property", "status", "evidence")] + [(r.name, str(r.status), r.evidence) for r in ordered]
        widths = [max(len(row[column]) for row in rows) for column in (0, 1)]
        rows.insert(1, ("-" * widths[0], "-" * widths[1], "-" * len("evidence")))
        counts = ", ".join(f"{sum(r.status is s for r in self.results)} {s}" for s in order
                           if any(r.status is s for r in self.results))
        verdict = "ok" if self.ok else f"VIOLATED ({len(self.violations)} of {len(self.results)} properties)"
        title = f"lifecycle conformance of {self.subject} on {self.device}: {verdict}: {counts}"
        return "\n".join([title] + [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows])
