"""The report of :func:`refops.testing.check_quantizer`: every case run, the first mismatches, the notes."""

from __future__ import annotations

import dataclasses

__all__ = ["QuantizerMismatch", "CaseRun", "QuantizerCheckReport"]


@dataclasses.dataclass(frozen=True)
class QuantizerMismatch:
    """One element where the candidate differs: where, from which input, expected and got code and scale."""

    case: str
    dtype: str
    usage: str
    index: tuple[int, ...]
    input: float
    expected_code: str
    got_code: str
    expected_scale: str
    got_scale: str

    def __str__(self) -> str:
        return (
            f"{self.case}/{self.dtype}/{self.usage} at {list(self.index)}: input {self.input!r}: "
            f"expected {self.expected_code} scale {self.expected_scale}, got {self.got_code} scale {self.got_scale}"
        )


@dataclasses.dataclass(frozen=True)
class CaseRun:
    """One case in one dtype and one orientation, and how the candidate did."""

    case: str
    dtype: str
    usage: str
    shape: tuple[int, ...]
    #: "ok", "differs", "candidate raised", "both reject", "reference rejects" or "skipped".
    status: str
    elements: int = 0
    code_mismatches: int = 0
    scale_mismatches: int = 0
    scales: int = 0
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("differs", "candidate raised")


@dataclasses.dataclass
class QuantizerCheckReport:
    """Every case run, the first mismatches and what the check could not see."""

    subject: str
    reference: str
    output: str
    runs: list[CaseRun]
    mismatches: list[QuantizerMismatch]
    notes: list[str]

    @property
    def ok(self) -> bool:
        """True when no case differs and the candidate raised nowhere the reference did not."""
        return not self.failures

    @property
    def failures(self) -> list[CaseRun]:
        return [r for r in self.runs if r.failed]

    def __getitem__(self, key: tuple[str, str, str]) -> CaseRun:
        """The run of ``(case, dtype, usage)``, e.g. ``report["ties", "float32", "rowwise"]``."""
        for r in self.runs:
            if (r.case, r.dtype, r.usage) == tuple(key):
                return r
        raise KeyError(f"no run {key!r}")

    def assert_ok(self) -> None:
        """Raise :class:`AssertionError` with the failing runs and the first mismatches."""
        if not self.ok:
            raise AssertionError(str(self))

    def __str__(self) -> str:
        """A title, one row per run (runs skipped by the protocol are counted, and explained in the notes),
        the first mismatches and the notes."""
        compared = len([r for r in self.runs if r.status in ("ok", "differs", "candidate raised")])
        verdict = "ok" if self.ok else f"FAILED: {len(self.failures)} of {compared} compared runs differ"
        elements = "values differ" if self.output.startswith("dequantized") else "codes differ"
        lines = [
            f"check_quantizer: {self.subject} against {self.reference}: {verdict}",
            f"output convention: {self.output}",
            f"{'case':<16}{'dtype':<10}{'usage':<11}{'shape':<14}{'result':<18}{elements:>16}{'scales differ':>15}",
        ]
        for r in self.runs:
            if r.status == "skipped":
                continue
            shape = "x".join(map(str, r.shape))
            counts = ""
            if r.status in ("ok", "differs"):
                scales = f"{r.scale_mismatches:>8}/{r.scales:<6}" if r.scales else f"{'-':>8} {'':<6}"
                counts = f"{r.code_mismatches:>9}/{r.elements:<6}{scales}"
            extra = f"  {r.detail}" if r.detail and r.status != "ok" else ""
            lines.append(f"{r.case:<16}{r.dtype:<10}{r.usage:<11}{shape:<14}{r.status:<18}{counts}{extra}".rstrip())
        skipped = sum(r.status == "skipped" for r in self.runs)
        if skipped:
            lines.append(f"({skipped} runs skipped: see the notes)")
        if self.mismatches:
            lines.append("first mismatches:")
            lines += [f"  {m}" for m in self.mismatches]
        if self.notes:
            lines.append("notes:")
            lines += [f"  - {n}" for n in self.notes]
        return "\n".join(lines)
