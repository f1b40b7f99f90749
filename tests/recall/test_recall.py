"""The recall corpus: every re-created bug caught, every fixed twin passing, or an xfail that says why not."""

from __future__ import annotations

import pathlib

import pytest

from tests.recall import ALL_CASES, recall_figures, recall_table, run_corpus
from tests.recall.corpus import from_home_trackers
from tests.recall.known_gaps import FAILED_TWINS, MISSED_BUGS

DOCS_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "oracle-recall.md"
BY_NAME = {case.name: case for case in ALL_CASES}


def _params(gaps: dict[str, str]) -> list:
    return [pytest.param(name, id=name, marks=pytest.mark.xfail(strict=True, reason=gaps[name]))
            if name in gaps else pytest.param(name, id=name) for name in BY_NAME]


def _result(name: str):
    return next(r for r in run_corpus() if r.case.name == name)


@pytest.mark.parametrize("name", _params(MISSED_BUGS))
def test_bug_caught(name: str) -> None:
    assert _result(name).caught, f"the oracle passed the re-created bug {name}"


@pytest.mark.parametrize("name", _params(FAILED_TWINS))
def test_twin_passes(name: str) -> None:
    assert _result(name).twin_passes, f"the oracle failed {name}'s correct twin (a false alarm)"


@pytest.mark.parametrize("name", sorted(MISSED_BUGS))
def test_missed_bug_is_real(name: str) -> None:
    """A miss counts against the oracle only if the re-creation does change something."""
    shows_defect = BY_NAME[name].shows_defect
    assert shows_defect is not None, f"{name} is recorded as missed but cannot show its defect"
    assert shows_defect(), f"{name}'s bug and twin do not differ even where the defect should show"


def test_known_gaps_name_real_cases() -> None:
    assert set(MISSED_BUGS) <= set(BY_NAME) and set(FAILED_TWINS) <= set(BY_NAME)


def test_corpus_size_and_sources() -> None:
    assert sum(from_home_trackers(c) for c in ALL_CASES) >= 30, "at least 30 bugs from TE's, torchao's, PyTorch's"
    assert len(BY_NAME) == len(ALL_CASES), "case names must be unique"
    assert all("/issues/" in c.source_url or "/pull/" in c.source_url or "/commit/" in c.source_url
               for c in ALL_CASES)


def test_docs_table_is_current() -> None:
    """The page's table and figures are what the corpus produces now (regenerate: see known_gaps)."""
    text = DOCS_PAGE.read_text()
    results = run_corpus()
    assert recall_table(results) in text, "docs/oracle-recall.md's table is stale"
    assert recall_figures(results) in text, "docs/oracle-recall.md's recall figures are stale"
