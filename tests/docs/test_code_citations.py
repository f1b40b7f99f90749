"""Every document the code cites is in the repository: a docs page, and a section of it that exists.

The format (``tests/docs/_code_citations.py``): ``docs/<page>.md`` or ``docs/<page>.md#<anchor>``, the
anchor being the MyST heading anchor of one of the page's sections. A citation of the research notes the
code was first written against (``recipes-numerics``, ``te-ops-semantics``, ``ecosystem-notes``,
``../shared/spec``, a ``§`` section number) is a failure: a user of the package cannot follow it. Each
failure names the file and line, so that the test keeps working while code moves between files.
"""

from __future__ import annotations

import pathlib

import pytest

from _code_citations import (
    CITATION,
    DOCS,
    Citation,
    citations,
    code_files,
    docs_pages,
    myst_settings,
    page_anchors,
    spec_citations,
)

THIS_TEST = {pathlib.Path(__file__).resolve(), pathlib.Path(__file__).with_name("_code_citations.py").resolve()}
CODE = [p for p in code_files() if p.resolve() not in THIS_TEST]
PAGES = docs_pages()
CITED = citations(CODE + PAGES)


def _report(problems: list[str], what: str) -> str:
    return f"{len(problems)} {what}:\n" + "\n".join(problems)


def test_the_code_cites_the_docs():
    assert CODE, "no code files found"
    assert len({c.page for c in CITED}) >= 5 and any(c.anchor for c in CITED), (
        f"only {len(CITED)} citations found: is the pattern still {CITATION.pattern!r}?"
    )


def test_nothing_cites_the_spec():
    problems = spec_citations(CODE + PAGES)
    assert not problems, _report(problems, "citations of documents that are not in the repository (cite the "
                                           "docs page and section instead: docs/<page>.md#<anchor>)")


def test_every_cited_page_exists():
    problems = [f"{c.where}: {c.text}: there is no page docs/{c.page}" for c in CITED if not (DOCS / c.page).is_file()]
    assert not problems, _report(problems, "citations of missing pages")


def test_every_cited_section_is_a_heading_of_its_page():
    pytest.importorskip("myst_parser", reason="MyST-Parser computes the heading anchors: pip install -e '.[test]'")
    anchors: dict[str, list[str]] = {}
    problems = []
    for c in CITED:
        if c.anchor is None or not (DOCS / c.page).is_file():
            continue  # a missing page is the test above's failure
        if c.page not in anchors:
            anchors[c.page] = page_anchors(DOCS / c.page)
        if c.anchor not in anchors[c.page]:
            problems.append(f"{c.where}: {c.text}: docs/{c.page} has no section with the anchor {c.anchor!r} "
                            f"(its anchors: {', '.join(anchors[c.page])})")
    assert not problems, _report(problems, "citations of missing sections")


# ------------------------------------------------------------------------------ the checker itself
def test_the_pattern_reads_the_one_format():
    line = ("see ``docs/recipes/mxfp8.md#layout``, docs/lifecycle.md and (docs/te-ops.md#tolerances). "
            "Not tests/docs/x.md, not mydocs/y.md, not f'docs/{page}.md'.")
    found = [(m.group(1), m.group(2)) for m in CITATION.finditer(line)]
    assert found == [("recipes/mxfp8.md", "layout"), ("lifecycle.md", None), ("te-ops.md", "tolerances")]


def test_spec_citations_are_found_with_file_and_line(tmp_path, monkeypatch):
    import _code_citations

    monkeypatch.setattr(_code_citations, "ROOT", tmp_path)
    source = tmp_path / "m.py"
    source.write_text('"""Scales (recipes-numerics §2.3)."""\n# numerics §4\n# spec distributed.md, F5\n'
                      "# docs/lifecycle.md#the-states-of-a-parameter (lifecycle.md, a file name)\n")
    problems = spec_citations([source])
    assert [p.split(": ")[0] for p in problems] == ["m.py:1", "m.py:1", "m.py:2", "m.py:3"]
    assert citations([source]) == [Citation("m.py:4", "lifecycle.md", "the-states-of-a-parameter")]


def test_anchors_are_mysts():
    pytest.importorskip("myst_parser")
    assert myst_settings()["myst_heading_anchors"] >= 2, "the citations name sections: docs/conf.py must anchor them"
    anchors = page_anchors(DOCS / "recipes" / "index.md")
    assert "roles-usages-and-gemms" in anchors and "the-scale-from-an-amax" in anchors
    assert "building-a-model-the-teops-way" in page_anchors(DOCS / "getting-started.md")  # a code span kept
