"""What ``compare_modules`` returns: every comparison made and which tiers ran (:class:`ComparisonReport`)."""

from __future__ import annotations

import dataclasses

from ..tensor_report import TensorComparison

__all__ = ["TierRun", "ComparisonReport"]


@dataclasses.dataclass(frozen=True)
class TierRun:
    """Whether one tier of the comparison policy ran, on how many tensors, and why (not)."""

    #: "bytes (exact)", "recipe state (exact)", "tolerance" or "SQNR".
    tier: str
    ran: bool
    count: int
    why: str

    def __str__(self) -> str:
        return f"{'ran    ' if self.ran else 'NOT RUN'} {self.tier:<21} {self.count:>3} comparisons: {self.why}"


@dataclasses.dataclass
class ComparisonReport:
    """Every comparison made, in order, and which tiers ran; ``ok`` when all passed.

    ``print(report)`` leads with the verdict, the failures (each with its evidence and ``why:``) and the step of
    the training script at which each tensor first differs; then the tiers; then the passes, counted by scenario.
    ``report.table()`` lists every comparison.
    """

    comparisons: list[TensorComparison]
    #: One entry per tier: what it compared, or why it did not run (see ``docs/oracle.md``).
    tiers: list[TierRun] = dataclasses.field(default_factory=list)

    def tier(self, name: str) -> TierRun:
        """The entry of tier ``name`` ("scenarios", "bytes (exact)", "recipe state (exact)", "numerics", ...)."""
        for t in self.tiers:
            if t.tier == name:
                return t
        raise KeyError(f"no tier {name!r}; tiers: {[t.tier for t in self.tiers]}")

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def failures(self) -> list[TensorComparison]:
        return [c for c in self.comparisons if not c.passed]

    def first_differences(self) -> dict[str, str]:
        """``{tensor: "<scenario>, <step>"}``: where in the script each failing tensor first failed, in order."""
        first: dict[str, str] = {}
        for c in self.failures:
            tensor = c.name.rpartition(": ")[2] if c.scenario and c.scenario != "one step" else c.name
            where = ", ".join(p for p in (c.scenario or "one step", c.step) if p)
            first.setdefault(tensor, where)
        return first

    def __getitem__(self, name: str) -> TensorComparison:
        for c in self.comparisons:
            if c.name == name:
                return c
        raise KeyError(name)

    def table(self) -> str:
        """Every comparison, one line each, in the order they were made."""
        return "\n".join(map(str, self.comparisons))

    def __str__(self) -> str:
        verdict = "all comparisons passed" if self.ok else f"{len(self.failures)} comparison(s) failed"
        lines = [verdict]
        if not self.ok:
            lines += [str(c) for c in self.failures]
            lines += ["first differs:", *(f"  {tensor}: at {where}" for tensor, where in self.first_differences().items())]
        if self.tiers:
            lines += ["tiers:", *(f"  {t}" for t in self.tiers)]
        passed: dict[str, int] = {}
        for c in self.comparisons:
            if c.passed:
                key = c.scenario or c.kind or "other"
                passed[key] = passed.get(key, 0) + 1
        if passed:
            lines.append("passed: " + ", ".join(f"{where} {n}" for where, n in passed.items())
                         + " (report.table() lists every comparison)")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        """Raise AssertionError listing every failed comparison with its evidence."""
        if not self.ok:
            skipped = [f"  {t}" for t in self.tiers if not t.ran]
            raise AssertionError(
                "the candidate differs from the reference:\n" + "\n".join(map(str, self.failures))
                + "\nfirst differs:\n" + "\n".join(f"  {t}: at {w}" for t, w in self.first_differences().items())
                + ("\ntiers that did not run:\n" + "\n".join(skipped) if skipped else "")
            )
