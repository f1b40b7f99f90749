"""The result of a lifecycle conformance check: one status and its evidence per property.

Every property is either a *promise* (what PyTorch and TransformerEngine promise of a module:
the values ``reset_parameters()`` and ``to_empty()`` give, ``requires_grad`` and aliases kept,
no stale cache, loading, copying, checkpoints) or a refops *extension* (what refops adds:
parameter objects kept through materialization, materializing by itself at the first
forward). A promise is *held* or *violated*; an extension is *kept* or *not kept*, and a
not-kept extension fails the report only in strict mode. Either can be *not checked* (it
needs an argument that was not given, such as forward inputs) or *not applicable* (the
module has nothing it could apply to, for example no parameters, or it follows a documented
PyTorch convention that the property is not about). The evidence always says why, with the
names, ids, devices and maximum differences involved.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Iterator

__all__ = ["Kind", "Status", "PropertyResult", "LifecycleReport"]


class Kind(str, enum.Enum):
    """Whose promise a property states."""

    #: PyTorch's or TransformerEngine's: a module that breaks it is wrong.
    PROMISE = "promise"
    #: refops': reported kept or not kept; it counts only under ``strict=True``.
    EXTENSION = "refops extension"

    def __str__(self) -> str:
        return self.value


class Status(str, enum.Enum):
    """The outcome of checking one property."""

    HELD = "held"
    VIOLATED = "violated"
    #: An extension that the module keeps (the outcome a promise calls held).
    KEPT = "kept"
    #: An extension that the module does not keep: not a violation unless the check was strict.
    NOT_KEPT = "not kept"
    NOT_CHECKED = "not checked"
    NOT_APPLICABLE = "not applicable"

    def __str__(self) -> str:
        return self.value


#: The order of the report's table: what fails first, then what holds, then what was not looked at.
TABLE_ORDER = (Status.VIOLATED, Status.NOT_KEPT, Status.HELD, Status.KEPT, Status.NOT_CHECKED, Status.NOT_APPLICABLE)


@dataclasses.dataclass(frozen=True)
class PropertyResult:
    """One property of the lifecycle contract, as checked on one module."""

    #: The property's identifier, for example ``"no_stale_cache_after_replacement"``.
    name: str
    #: Held or violated (a promise), kept or not kept (an extension), not checked or not applicable.
    status: Status
    #: What was done and what was observed (names, ids, devices, maximum differences), or why the
    #: property was not checked or does not apply.
    evidence: str
    #: The property, stated as a promise.
    description: str = ""
    #: A promise of PyTorch or TE, or a refops extension.
    kind: Kind = Kind.PROMISE

    @property
    def verdict(self) -> str:
        """The status as the table shows it: ``"held"``, ``"not kept (refops extension)"``..."""
        return f"{self.status} ({self.kind})" if self.kind is Kind.EXTENSION else str(self.status)

    def __str__(self) -> str:
        return f"{self.name}: {self.verdict}: {self.evidence}"


@dataclasses.dataclass(frozen=True)
class LifecycleReport:
    """Every property's result for one module factory, in a fixed order."""

    #: A short name for what was checked (the class of the built module).
    subject: str
    #: The device the module was materialized on.
    device: str
    #: One :class:`PropertyResult` per property.
    results: tuple[PropertyResult, ...]
    #: Whether a refops extension that is not kept counts as a violation.
    strict: bool = False

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
        """The properties that fail the report, in report order: promises violated, and under
        ``strict`` also extensions not kept."""
        failing = (Status.VIOLATED, Status.NOT_KEPT) if self.strict else (Status.VIOLATED,)
        return [r for r in self.results if r.status in failing]

    @property
    def extensions_not_kept(self) -> list[PropertyResult]:
        """The refops extensions the module does not keep (failures only under ``strict``)."""
        return [r for r in self.results if r.status is Status.NOT_KEPT]

    @property
    def ok(self) -> bool:
        """True when no promise is violated (and, under ``strict``, every extension is kept where it applies).
        Not checked and not applicable are not failures."""
        return not self.violations

    def assert_ok(self) -> None:
        """Raise :class:`AssertionError` listing every failing property with its evidence."""
        if self.ok:
            return
        count = len(self.violations)
        lines = [f"{self.subject} on {self.device} violates {count} lifecycle propert{'y' if count == 1 else 'ies'}"
                 f"{' (strict: refops extensions count)' if self.strict else ''}:"]
        lines += [f"  - {r.name}: {r.evidence}" for r in self.violations]
        raise AssertionError("\n".join(lines))

    def __str__(self) -> str:
        """A title with the counts, then a table with one row per property: the failures first (violated,
        then extensions not kept), then those held and kept, then those not checked and not applicable
        (their evidence says why). An extension's status is marked "(refops extension)"."""
        ordered = sorted(self.results, key=lambda r: TABLE_ORDER.index(r.status))
        rows = [("property", "status", "evidence")] + [(r.name, r.verdict, r.evidence) for r in ordered]
        widths = [max(len(row[column]) for row in rows) for column in (0, 1)]
        rows.insert(1, ("-" * widths[0], "-" * widths[1], "-" * len("evidence")))
        counts = ", ".join(f"{sum(r.status is s for r in self.results)} {s}" for s in TABLE_ORDER
                           if any(r.status is s for r in self.results))
        verdict = "ok" if self.ok else f"VIOLATED ({len(self.violations)} of {len(self.results)} properties)"
        mode = " (strict)" if self.strict else ""
        title = f"lifecycle conformance of {self.subject} on {self.device}{mode}: {verdict}: {counts}"
        return "\n".join([title] + [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows])
