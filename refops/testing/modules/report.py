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
    """Every comparison made, in order, and which tiers ran; ``ok`` when all passed."""

    comparisons: list[TensorComparison]
    #: One entry per tier: what it compared, or why it did not run (see ``docs/oracle.md``).
    tiers: list[TierRun] = dataclasses.field(default_factory=list)

    def tier(self, name: str) -> TierRun:
        """The entry of tier ``name`` ("bytes (exact)", "recipe state (exact)", "tolerance", "SQNR")."""
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

    def __getitem__(self, name: str) -> TensorComparison:
        for c in self.comparisons:
            if c.name == name:
                return c
        raise KeyError(name)

    def __str__(self) -> str:
        verdict = "all comparisons passed" if self.ok else f"{len(self.failures)} comparison(s) failed"
        tiers = ["tiers:", *(f"  {t}" for t in self.tiers)] if self.tiers else []
        return "\n".join([verdict, *tiers, *map(str, self.comparisons)])

    def assert_ok(self) -> None:
        """Raise AssertionError listing every failed comparison with its evidence."""
        if not self.ok:
            skipped = [f"  {t}" for t in self.tiers if not t.ran]
            raise AssertionError(
                "the candidate differs from the reference:\n" + "\n".join(map(str, self.failures))
                + ("\ntiers that did not run:\n" + "\n".join(skipped) if skipped else "")
            )
