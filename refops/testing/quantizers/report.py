"""The report of :func:`refops.testing.check_quantizer`: what failed first, then what passed, then what was not compared.

A report of a failing candidate leads with the failing runs (one row each) and
their first mismatching elements; the runs that passed are summarized by usage,
by layout and by case, not listed (:meth:`QuantizerCheckReport.table` lists every
run). A run is one case in one dtype, one orientation and one input layout
(:mod:`.input_layouts`): ``report["ties", "float32", "rowwise"]`` is the run on the
contiguous input, ``report["ties", "float32", "rowwise", "non-contiguous"]`` the run
on the same values laid out otherwise. A row that fails with every code and every
scale equal says what differs (the amax, the data's strides, the input written to).
Every scale the report shows is a ``scale_inv`` (the decode factor the tensor
stores: ``RN(1/scale)`` for per-tensor FP8, the E8M0 or E4M3 block scale for
MXFP8 and NVFP4), and its columns say so.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Optional

from .input_layouts import CONTIGUOUS

__all__ = ["QuantizerMismatch", "CaseRun", "QuantizerCheckReport", "COMPARED", "FAILED", "fails_alike"]

#: The statuses of a run whose result was compared with the reference's.
COMPARED = ("ok", "differs", "candidate raised")
#: The statuses that fail the check.
FAILED = ("differs", "candidate raised")


@dataclasses.dataclass(frozen=True)
class QuantizerMismatch:
    """One element where the candidate differs: where, from which input, expected and got code and scale_inv."""

    case: str
    dtype: str
    usage: str
    index: tuple[int, ...]
    input: float
    expected_code: str
    got_code: str
    #: The stored decode scale of the element's block (``scale_inv``), as the reference has it.
    expected_scale_inv: str
    #: The candidate's ``scale_inv`` for that block ("-" when it returned dequantized values).
    got_scale_inv: str
    #: The layout of the input the candidate was given (:mod:`.input_layouts`).
    layout: str = "contiguous"

    @property
    def expected_scale(self) -> str:
        """Former name of :attr:`expected_scale_inv` (it always held the ``scale_inv``)."""
        return self.expected_scale_inv

    @property
    def got_scale(self) -> str:
        """Former name of :attr:`got_scale_inv`."""
        return self.got_scale_inv

    def __str__(self) -> str:
        where = "" if self.layout == CONTIGUOUS else f" [{self.layout}]"
        return (
            f"{self.case}/{self.dtype}/{self.usage}{where} at {list(self.index)}: input {self.input!r}: "
            f"expected {self.expected_code} scale_inv {self.expected_scale_inv}, "
            f"got {self.got_code} scale_inv {self.got_scale_inv}"
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
    #: Elements compared (codes, or dequantized values).
    elements: int = 0
    #: Elements whose code (or dequantized value) differs.
    code_mismatches: int = 0
    #: ``scale_inv`` entries that differ, of :attr:`scales`.
    scale_mismatches: int = 0
    #: ``scale_inv`` entries compared (0: none, as for dequantized values).
    scales: int = 0
    #: Elements whose scaled value passes the format's max (or is infinite): the clamp before the cast
    #: decides their code (for NVFP4: infinite inputs, whose E4M3 block scale the clamp decides).
    past_max: int = 0
    detail: str = ""
    #: The layout of the input the candidate was given (:mod:`.input_layouts`); the reference's result
    #: it is compared with is always the one on the contiguous tensor of the same values.
    layout: str = "contiguous"

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    @property
    def name(self) -> str:
        """``ties float32 rowwise``, with the layout when not contiguous: ``ties float32 rowwise [non-contiguous]``."""
        where = "" if self.layout == CONTIGUOUS else f" [{self.layout}]"
        return f"{self.case} {self.dtype} {self.usage}{where}"


def fails_alike(run: CaseRun, contiguous: Optional[CaseRun]) -> bool:
    """Whether ``run`` (in another layout) fails exactly as its contiguous run does: the same bug, not a layout's."""
    if contiguous is None or run.layout == CONTIGUOUS or not run.failed:
        return False
    same = ("status", "code_mismatches", "scale_mismatches", "detail")
    return all(getattr(run, field) == getattr(contiguous, field) for field in same)


@dataclasses.dataclass
class QuantizerCheckReport:
    """Every case run, the first mismatches, what was compared and what was not.

    ``ok`` needs at least one compared run and no failing one: a check that
    compared nothing fails (:attr:`nothing_compared`).
    """

    subject: str
    reference: str
    output: str
    runs: list[CaseRun]
    mismatches: list[QuantizerMismatch]
    #: What could not be compared, and why (one sentence each).
    not_compared: list[str]
    #: What was compared, and by which criterion (one sentence each).
    compared: list[str] = dataclasses.field(default_factory=list)
    #: The recipe role whose quantizer was checked ("" when a quantizer was given).
    role: str = ""

    @property
    def notes(self) -> list[str]:
        """Former name of :attr:`not_compared`."""
        return self.not_compared

    @property
    def compared_runs(self) -> list[CaseRun]:
        """The runs whose result was compared with the reference's."""
        return [r for r in self.runs if r.status in COMPARED]

    @property
    def nothing_compared(self) -> bool:
        """True when no run was compared (every one skipped, or rejected by the reference)."""
        return not self.compared_runs

    @property
    def ok(self) -> bool:
        """True when some run was compared, none differs and the candidate raised nowhere the reference did not."""
        return not self.failures and not self.nothing_compared

    @property
    def failures(self) -> list[CaseRun]:
        return [r for r in self.runs if r.failed]

    def __getitem__(self, key: tuple[str, ...]) -> CaseRun:
        """The run of ``(case, dtype, usage)`` on the contiguous input, e.g. ``report["ties", "float32", "rowwise"]``,
        or of ``(case, dtype, usage, layout)``: ``report["ties", "float32", "rowwise", "storage offset"]``."""
        key = tuple(key)
        if len(key) not in (3, 4):
            raise KeyError(f"a run is (case, dtype, usage) or (case, dtype, usage, layout), got {key!r}")
        wanted = key if len(key) == 4 else key + (CONTIGUOUS,)
        for r in self.runs:
            if (r.case, r.dtype, r.usage, r.layout) == wanted:
                return r
        layouts = sorted({r.layout for r in self.runs if (r.case, r.dtype, r.usage) == wanted[:3]})
        ran = f"; that run has the layouts {layouts}" if layouts else ""
        raise KeyError(f"no run {key!r}{ran}")

    @property
    def layouts(self) -> list[str]:
        """The input layouts some run was given, contiguous first."""
        return list(dict.fromkeys([CONTIGUOUS] + [r.layout for r in self.runs]))

    def assert_ok(self) -> None:
        """Raise :class:`AssertionError` with the failing runs and the first mismatches."""
        if not self.ok:
            raise AssertionError(str(self))

    # ----------------------------------------------------------------- text
    def _verdict(self) -> str:
        compared = len(self.compared_runs)
        if self.nothing_compared:
            return f"FAILED: nothing was compared ({len(self.runs)} runs: {_status_counts(self.runs)})"
        if self.failures:
            only = sum(r.layout != CONTIGUOUS and not self._fails_as_contiguous(r) for r in self.failures)
            layouts = f" ({only} only in another input layout)" if only else ""
            return f"FAILED: {len(self.failures)} of {compared} compared runs differ{layouts}"
        return f"ok: {compared} of {compared} compared runs pass"

    def _contiguous_run(self, r: CaseRun) -> Optional[CaseRun]:
        try:
            return self[r.case, r.dtype, r.usage]
        except KeyError:
            return None

    def _fails_as_contiguous(self, r: CaseRun) -> bool:
        return fails_alike(r, self._contiguous_run(r))

    def _header(self) -> str:
        elements = "values differ" if self.output.startswith("dequantized") else "codes differ"
        return (f"{'case':<16}{'dtype':<10}{'usage':<11}{'layout':<18}{'shape':<14}{'result':<18}{elements:>16}"
                f"{'scale_inv differ':>18}")

    def _row(self, r: CaseRun) -> str:
        shape = "x".join(map(str, r.shape))
        counts = ""
        if r.status in ("ok", "differs") and r.elements:
            scales = f"{r.scale_mismatches:>11}/{r.scales:<6}" if r.scales else f"{'-':>11} {'':<6}"
            counts = f"{r.code_mismatches:>9}/{r.elements:<6}{scales}"
        detail = r.detail
        if r.status == "differs" and r.elements and not r.code_mismatches and not r.scale_mismatches:
            # The counts show 0 differences: the row says what does differ.
            scales = " and every scale_inv" if r.scales else ""
            detail = f"every code{scales} equal; {detail}" if detail else f"every code{scales} equal"
        extra = f"  {detail}" if detail and r.status != "ok" else ""
        layout = r.layout if r.layout == CONTIGUOUS else f"[{r.layout}]"
        return f"{r.case:<16}{r.dtype:<10}{r.usage:<11}{layout:<18}{shape:<14}{r.status:<18}{counts}{extra}".rstrip()

    def table(self) -> str:
        """Every run, one row each, in matrix order (skipped runs included)."""
        return "\n".join([self._header()] + [self._row(r) for r in self.runs])

    def _passed_summary(self) -> list[str]:
        """How many compared runs passed: per usage, then per case (``ok/compared``)."""
        compared = self.compared_runs
        passed = [r for r in compared if r.status == "ok"]
        if not compared:
            return []
        role = f" (role {self.role})" if self.role else ""
        per_usage = ", ".join(
            f"{usage} {sum(r.usage == usage for r in passed)}/{sum(r.usage == usage for r in compared)}"
            for usage in dict.fromkeys(r.usage for r in compared)
        )
        cases = dict.fromkeys(r.case for r in compared)
        per_case = ", ".join(
            f"{c} {sum(r.case == c for r in passed)}/{sum(r.case == c for r in compared)}" for c in cases
        )
        lines = [f"passed{role}: {len(passed)} of {len(compared)} compared runs; by usage: {per_usage}"]
        layouts = dict.fromkeys(r.layout for r in compared)
        if set(layouts) != {CONTIGUOUS}:
            lines.append("  by layout: " + ", ".join(
                f"{layout} {sum(r.layout == layout for r in passed)}/{sum(r.layout == layout for r in compared)}"
                for layout in layouts))
        return lines + [f"  by case: {per_case}"]

    def __str__(self) -> str:
        """What failed first (rows and first mismatches), then a summary of what passed, what was compared,
        the runs not compared, and what could not be compared."""
        role = f" (role {self.role})" if self.role else ""
        lines = [
            f"check_quantizer: {self.subject} against {self.reference}{role}: {self._verdict()}",
            f"output convention: {self.output}",
        ]
        if self.failures:
            alike = [r for r in self.failures if self._fails_as_contiguous(r)]
            lines.append(f"failed runs ({len(self.failures)}):")
            lines.append(self._header())
            lines += [self._row(r) for r in self.failures if r not in alike]
            if alike:
                lines.append(f"  and {len(alike)} runs in another input layout that fail as their contiguous run "
                             f"does: {', '.join(r.name for r in alike[:4])}{' ...' if len(alike) > 4 else ''}")
        if self.mismatches:
            lines.append("first mismatches (the first of every failing run first):")
            lines += [f"  {m}" for m in self.mismatches]
        lines += self._passed_summary()
        others = [r for r in self.runs if r.status not in COMPARED]
        if others:
            lines.append(f"runs not compared: {_status_counts(others)}")
            rejected = sorted({r.case for r in others if r.status != "skipped"})
            if rejected:
                lines.append(f"  rejected by the reference: {', '.join(rejected)}")
        if self.compared:
            lines.append("compared:")
            lines += [f"  - {c}" for c in self.compared]
        if self.not_compared:
            lines.append("not compared:")
            lines += [f"  - {n}" for n in self.not_compared]
        return "\n".join(lines)


def _status_counts(runs: list[CaseRun]) -> str:
    """``"58 skipped, 2 both reject"``."""
    return ", ".join(f"{n} {status}" for status, n in Counter(r.status for r in runs).items())
