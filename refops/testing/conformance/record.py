"""The record of a conformance run (:func:`run_conformance`, ``python -m refops conformance``): one table per
tier, every row with its evidence.

A row is one comparison that ran (``pass`` or ``fail``) with the evidence that decided it; what
did not run is listed apart, each with its reason (a recipe this GPU cannot run, a dtype a recipe
is not checked in, a tier left out by the options). The record is written as Markdown (for people
and the docs) and JSON (for tools), from the same data.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any, Optional

__all__ = ["Row", "NotRun", "TierTable", "ConformanceRecord", "RECORD_FILES"]

#: The files :meth:`ConformanceRecord.write` writes (``refops conformance --out DIR``).
RECORD_FILES = ("conformance.md", "conformance.json")


@dataclasses.dataclass
class Row:
    """One comparison: its coordinates (``cells``, by column), its result and the evidence."""

    cells: dict[str, str]
    passed: bool
    evidence: str
    #: Anything more a tool may want (counts, every property's status...), written to the JSON only.
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def result(self) -> str:
        return "pass" if self.passed else "FAIL"


@dataclasses.dataclass(frozen=True)
class NotRun:
    """Something the run did not compare, and why."""

    what: str
    why: str


@dataclasses.dataclass
class TierTable:
    """One tier's rows, what it compares and by which criterion, and what it did not run."""

    tier: str
    title: str
    #: What the tier compares and by which criterion, in a sentence or two.
    criterion: str
    columns: list[str]
    rows: list[Row] = dataclasses.field(default_factory=list)
    not_run: list[NotRun] = dataclasses.field(default_factory=list)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    def summary(self) -> str:
        """``"12/12 rows pass"``, ``"10/12 rows pass, 2 FAIL"``, or ``"nothing ran"``."""
        if not self.rows:
            return "nothing ran"
        passed = len(self.rows) - len(self.failures)
        tail = f", {len(self.failures)} FAIL" if self.failures else ""
        return f"{passed}/{len(self.rows)} rows pass{tail}"


@dataclasses.dataclass
class ConformanceRecord:
    """Everything one run found: the environment, a table per tier, and what was not run."""

    #: ``{"TransformerEngine": "2.20.2", "GPU": "NVIDIA H200 (compute capability 9.0)", ...}``.
    environment: dict[str, str]
    tiers: list[TierTable]
    #: What the options left out (tiers, recipes), beyond each tier's own list.
    not_run: list[NotRun] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every row that ran passed (and something ran)."""
        return any(t.rows for t in self.tiers) and not any(t.failures for t in self.tiers)

    def tier(self, name: str) -> TierTable:
        for table in self.tiers:
            if table.tier == name:
                return table
        raise KeyError(f"no tier {name!r} in this record; tiers: {[t.tier for t in self.tiers]}")

    # ------------------------------------------------------------------ Markdown
    def to_markdown(self) -> str:
        """The record as a Markdown page: the verdict, the environment, then each tier's table."""
        te = self.environment.get("TransformerEngine", "?")
        lines = [f"# refops conformance of TransformerEngine {te}", ""]
        verdict = "every row passes" if self.ok else ("FAILURES: see the rows marked FAIL" if any(
            t.rows for t in self.tiers) else "nothing ran")
        lines += [f"**{verdict}** ({'; '.join(f'{t.title}: {t.summary()}' for t in self.tiers)}); "
                  f"{self.seconds:.0f} s.", ""]
        lines += ["| | |", "|---|---|"]
        lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in self.environment.items()]
        lines.append("")
        for table in self.tiers:
            lines += [f"## {table.title}", "", table.criterion, ""]
            if table.rows:
                lines.append("| " + " | ".join([*table.columns, "result", "evidence"]) + " |")
                lines.append("|" + "---|" * (len(table.columns) + 2))
                for row in sorted(table.rows, key=lambda r: r.passed):  # failures first
                    cells = [_cell(row.cells.get(c, "")) for c in table.columns]
                    lines.append("| " + " | ".join([*cells, f"**{row.result}**", _cell(row.evidence)]) + " |")
                lines.append("")
            else:
                lines += ["Nothing ran in this tier.", ""]
            if table.not_run:
                lines.append("Not run:")
                lines += [f"- {n.what}: {n.why}" for n in table.not_run]
                lines.append("")
        if self.not_run:
            lines += ["## Not run", ""]
            lines += [f"- {n.what}: {n.why}" for n in self.not_run]
            lines.append("")
        return "\n".join(lines)

    # ---------------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready data (every row's cells, result, evidence and details)."""
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "environment": dict(self.environment),
            "tiers": [
                {
                    "tier": t.tier,
                    "title": t.title,
                    "criterion": t.criterion,
                    "columns": list(t.columns),
                    "summary": t.summary(),
                    "rows": [
                        {"cells": dict(r.cells), "result": r.result.lower(), "evidence": r.evidence,
                         "details": r.details}
                        for r in t.rows
                    ],
                    "not_run": [dataclasses.asdict(n) for n in t.not_run],
                }
                for t in self.tiers
            ],
            "not_run": [dataclasses.asdict(n) for n in self.not_run],
        }

    def write(self, directory: pathlib.Path | str) -> list[pathlib.Path]:
        """Write ``conformance.md`` and ``conformance.json`` into ``directory`` (made if needed)."""
        out = pathlib.Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        md, js = (out / name for name in RECORD_FILES)
        md.write_text(self.to_markdown() + "\n")
        js.write_text(json.dumps(_plain(self.to_json()), indent=1, allow_nan=False) + "\n")
        return [md, js]


def _cell(text: Optional[str]) -> str:
    """Text safe inside a Markdown table cell (no pipe, no line break)."""
    return str(text or "").replace("|", "\\|").replace("\n", "; ")


def _plain(value: Any) -> Any:
    """JSON's own types only: non-finite floats as strings ("inf"), anything else unknown as its ``str``."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
