"""The docs' browser check (docs/_check/browser_check.py): its pure parts, its verdict on small pages made to fail
one way each, and the real docs, built and opened in headless Chromium.

The browser tests skip where Chromium or playwright is missing (CI has neither); the pure tests run everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_check"))
try:
    import browser_check as bc
finally:
    sys.path.remove(str(ROOT / "docs" / "_check"))

HAVE_PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
NO_BROWSER = ("Chromium not installed: apt-get install chromium; pip install -e '.[docs-check]'"
              f" (found: {bc.DEFAULT_CHROMIUM} {'yes' if bc.DEFAULT_CHROMIUM.is_file() else 'no'}, "
              f"playwright {'yes' if HAVE_PLAYWRIGHT else 'no'})")
needs_browser = pytest.mark.skipif(not (bc.DEFAULT_CHROMIUM.is_file() and HAVE_PLAYWRIGHT), reason=NO_BROWSER)


# --- pure parts ---------------------------------------------------------------------------------------------------


def _page(**changes) -> bc.PageResult:
    fields = dict(page="p.html", diagrams=[], images=[], wide=[], math_total=0, math_unrendered=0, math_errors=[],
                  console_errors=[], failed_requests=[])
    fields.update(changes)
    return bc.PageResult(**fields)


def _diagram(**changes) -> bc.Diagram:
    fields = dict(rendered=True, width=400.0, height=200.0, min_text_px=16.0, error=None,
                  diagram_type="sequenceDiagram")
    fields.update(changes)
    return bc.Diagram(**fields)


def test_page_list_is_the_builds_docnames(tmp_path):
    (tmp_path / "recipes").mkdir()
    for page in ("index.html", "recipes/nvfp4.html", "genindex.html", "search.html"):
        (tmp_path / page).write_text("<html></html>")
    (tmp_path / "searchindex.js").write_text(
        'Search.setIndex({"alltitles":{},"docnames":["recipes/nvfp4","index"],"envversion":{}})')
    assert bc.page_list(tmp_path) == ["index.html", "recipes/nvfp4.html"]  # sorted; genindex and search left out

    (tmp_path / "searchindex.js").write_text('Search.setIndex({"docnames":["index","gone"]})')
    with pytest.raises(FileNotFoundError, match=r"did not write: \['gone.html'\]"):
        bc.page_list(tmp_path)
    (tmp_path / "searchindex.js").write_text("Search.setIndex({})")
    with pytest.raises(ValueError, match="no docnames"):
        bc.page_list(tmp_path)
    (tmp_path / "searchindex.js").unlink()
    with pytest.raises(FileNotFoundError, match="not a Sphinx HTML build"):
        bc.page_list(tmp_path)


def test_a_page_with_nothing_wrong_has_no_failures():
    good = _page(diagrams=[_diagram(), _diagram(min_text_px=None)], images=[bc.Image("a.png", 640)],
                 math_total=3)
    assert bc.failures(good) == []


@pytest.mark.parametrize("changes, expected", [
    (dict(diagrams=[_diagram(rendered=False, width=0, height=0)]), "diagram 1 (sequenceDiagram): did not render"),
    (dict(diagrams=[_diagram(rendered=False, error="Syntax error in text mermaid version 11.16.0")]),
     "diagram 1 (sequenceDiagram): Mermaid could not draw it: Syntax error in text"),
    (dict(diagrams=[_diagram(), _diagram(height=0)]), "diagram 2 (sequenceDiagram): rendered an empty SVG"),
    (dict(diagrams=[_diagram(min_text_px=4.7)]), "its smallest text is 4.7 px (< 9 px)"),
    (dict(images=[bc.Image("_images/x.png", 0)]), "image '_images/x.png' did not load"),
    (dict(failed_requests=["http://h/_images/x.png (HTTP 404)"]), "request failed: http://h/_images/x.png (HTTP 404)"),
    (dict(wide=[bc.Wide("code", "import torch", 107, 1046, 800)]),
     "code block wider than its column (1046 px in 800 px, longest line 107 characters): 'import torch'"),
    (dict(wide=[bc.Wide("table", "Topic | refops", 0, 2378, 800)]),
     "table wider than its column (2378 px in 800 px): 'Topic | refops'"),
    (dict(math_total=5, math_unrendered=2), "2 of 5 math elements not typeset"),
    (dict(math_errors=["Undefined control sequence \\nope"]), "math error: Undefined control sequence \\nope"),
    (dict(console_errors=["uncaught: ReferenceError: x is not defined"]), "JavaScript error: uncaught: Reference"),
    (dict(timed_out=True), "not done after 20 s"),
])
def test_each_defect_is_a_failure_with_its_reason(changes, expected):
    found = bc.failures(_page(**changes))
    assert len(found) == 1 and expected in found[0], found


def test_the_diagram_text_threshold_is_the_callers():
    page = _page(diagrams=[_diagram(min_text_px=10.5)])
    assert bc.failures(page) == []
    assert "10.5 px (< 12 px)" in bc.failures(page, min_diagram_text_px=12)[0]


def test_the_readme_has_a_row_per_page_and_every_failure():
    bad = _page(page="recipes/nvfp4.html", diagrams=[_diagram(), _diagram(min_text_px=5.0)],
                images=[bc.Image("a.png", 0), bc.Image("b.png", 9)], math_total=4, math_unrendered=1,
                wide=[bc.Wide("code", "x = a | b", 95, 900, 800), bc.Wide("table", "h", 0, 900, 800)],
                console_errors=["boom"], screenshot="recipes--nvfp4.png")
    bad.failures = bc.failures(bad)
    good = _page(page="index.html")
    report = bc.Report(pages=[good, bad], chromium="Chromium 1", viewport={"width": 1280, "height": 900},
                       min_diagram_text_px=9.0, command="python3 docs/_check/browser_check.py --out x", date="d")
    text = bc.readme(report)
    assert "**1 of 2 pages pass.**" in text and "`python3 docs/_check/browser_check.py --out x`" in text
    assert "| index.html | pass | 0/0 |  | 0/0 | 0/0 |  |  |  |  |" in text
    assert ("| recipes/nvfp4.html | FAIL | 2/2 | 1 | 1/2 | 3/4 | 1 | 1 | 1 | "
            "[recipes--nvfp4.png](recipes--nvfp4.png) |") in text
    assert "### recipes/nvfp4.html" in text and "### index.html" not in text
    assert "'x = a \\| b'" in text  # a | in a failure cannot split a Markdown line into table cells
    for failure in bad.failures:
        assert failure.replace("|", "\\|") in text
    data = report.to_json()
    assert data["ok"] is False and len(data["failures"]) == len(bad.failures) == 6
    assert json.loads(json.dumps(data))["pages"][1]["wide"][0]["longest_line_chars"] == 95


def test_without_chromium_the_command_says_so_and_exits_2(tmp_path, capsys):
    assert bc.main(["--out", str(tmp_path), "--no-build", "--chromium", str(tmp_path / "no-chromium")]) == 2
    assert "no Chromium at" in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()


# --- the check in a browser, on pages made to fail ------------------------------------------------------------------

HEAD = ('<!DOCTYPE html><html><head><meta charset="utf-8">'
        '<script src="_static/mermaid.min.js"></script>'
        '<script>mermaid.initialize({startOnLoad: true, theme: "default"});</script>'
        '<script>window.MathJax = {"options": {"processHtmlClass": "math"}}</script>'
        '<script defer="defer" src="_static/mathjax/tex-chtml.js"></script></head>'
        '<body><div class="body" style="width: 600px">')
FLOWCHART = '<pre class="mermaid">flowchart LR\n  a[read] --> b[write]</pre>'
SHORT_CODE = "<pre>x = 1\ny = 2</pre>"
TABLE = "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>"
GOOD = FLOWCHART + '<img src="ok.png">' + SHORT_CODE + TABLE + '<span class="math">\\(x^2\\)</span>'
WIDE_SEQUENCE = "sequenceDiagram\n" + "".join(
    f"  participant P{i} as a_participant_with_a_long_name_{i}\n" for i in range(12)) + "  P0->>P11: call\n"
PAGES = {
    "good.html": GOOD,
    "wide-code.html": FLOWCHART + "<pre>short\n" + "x" * 200 + "</pre>",
    "broken-image.html": FLOWCHART + '<img src="_images/missing.png">',
    "mermaid-syntax-error.html": FLOWCHART + '<pre class="mermaid">sequenceDiagram\n  this is (((not mermaid</pre>',
    "unreadable-diagram.html": f'<pre class="mermaid">{WIDE_SEQUENCE}</pre>',
    "wide-table.html": "<table><tr><td>" + "a_very_long_unbreakable_word_" * 40 + "</td></tr></table>",
    "math-error.html": '<span class="math">\\(\\frac{1}{2} \\notacommand\\)</span>',
    "math-syntax-error.html": '<span class="math">\\(\\frac{1}{2}}\\)</span>',
    "js-error.html": GOOD + "<script>undefinedFunction()</script>",
}


def _bundled(package: str, relative: str) -> pathlib.Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (the docs extra): pip install -e '.[docs-check]'")
    return pathlib.Path(spec.submodule_search_locations[0]) / relative


@pytest.fixture(scope="module")
def synthetic_site(tmp_path_factory) -> pathlib.Path:
    """A tiny site with the docs' own Mermaid and MathJax scripts, a good page, and one page per defect."""
    site = tmp_path_factory.mktemp("site")
    (site / "_static").mkdir()
    shutil.copyfile(_bundled("mermaidx", "assets/mermaid.js"), site / "_static" / "mermaid.min.js")
    shutil.copytree(_bundled("sphinx-mathjax-offline", "static/mathjax"), site / "_static" / "mathjax")
    matplotlib = pytest.importorskip("matplotlib.pyplot")
    figure = matplotlib.figure(figsize=(2, 1))
    figure.savefig(site / "ok.png")
    matplotlib.close(figure)
    for name, body in PAGES.items():
        (site / name).write_text(HEAD + body + "</div></body></html>", encoding="utf-8")
    return site


@pytest.fixture(scope="module")
def synthetic_report(synthetic_site, tmp_path_factory) -> bc.Report:
    out = tmp_path_factory.mktemp("report")
    return bc.check_pages(synthetic_site, out, pages=sorted(PAGES), screenshots=["good.html"])


@needs_browser
def test_a_good_page_passes(synthetic_report):
    good = next(p for p in synthetic_report.pages if p.page == "good.html")
    assert good.failures == [], good.failures
    assert len(good.diagrams) == 1 and good.diagrams[0].rendered and good.diagrams[0].min_text_px >= 12
    assert good.images[0].natural_width > 0 and good.math_total == 1 and good.math_unrendered == 0
    assert good.screenshot == "good.png"


@needs_browser
@pytest.mark.parametrize("page, expected", [
    ("wide-code.html", ["code block wider than its column"]),
    ("broken-image.html", ["image '_images/missing.png' did not load", "missing.png (HTTP 404)"]),
    ("mermaid-syntax-error.html", ["diagram 2 (sequenceDiagram): Mermaid could not draw it: Syntax error in text"]),
    ("unreadable-diagram.html", ["diagram 1 (sequenceDiagram): unreadable, its smallest text is"]),
    ("wide-table.html", ["table wider than its column"]),
    ("math-error.html", ["math error: Undefined control sequence \\notacommand"]),
    ("math-syntax-error.html", ["math error: Extra close brace"]),
    ("js-error.html", ["JavaScript error: uncaught: ReferenceError: undefinedFunction is not defined"]),
])
def test_a_broken_page_fails_with_each_defect_named(synthetic_report, page, expected):
    result = next(p for p in synthetic_report.pages if p.page == page)
    assert len(result.failures) == len(expected), result.failures
    for failure, want in zip(result.failures, expected):
        assert want in failure, result.failures
    assert result.screenshot == page.removesuffix(".html") + ".png"  # a failing page is always photographed


@needs_browser
def test_a_page_without_the_mermaid_script_fails(synthetic_site, tmp_path):
    (synthetic_site / "no-script.html").write_text(
        HEAD.replace("_static/mermaid.min.js", "_static/absent.js") + FLOWCHART + "</div></body></html>")
    report = bc.check_pages(synthetic_site, tmp_path, pages=["no-script.html"], screenshots=[], timeout_s=3)
    failures = report.pages[0].failures
    assert any("did not render" in f or "not done after" in f for f in failures), failures
    assert any("absent.js (HTTP 404)" in f for f in failures), failures


@needs_browser
def test_the_command_exits_1_on_a_failure_and_0_on_a_good_page(synthetic_site, tmp_path, capsys):
    common = ["--no-build", "--html", str(synthetic_site), "--out", str(tmp_path)]
    assert bc.main([*common, "--page", "good.html", "--page", "wide-code.html"]) == 1
    printed = capsys.readouterr().out
    assert "FAIL wide-code.html: code block wider than its column" in printed
    assert "1 of 2 pages pass" in printed
    assert (tmp_path / "wide-code.png").is_file()
    assert json.loads((tmp_path / "report.json").read_text())["ok"] is False

    assert bc.main([*common, "--page", "good.html", "--screenshot", "good.html"]) == 0
    assert not (tmp_path / "wide-code.png").exists()  # the earlier run's screenshot does not read as this run's
    assert (tmp_path / "good.png").is_file() and "**1 of 1 pages pass.**" in (tmp_path / "README.md").read_text()
    assert bc.main([*common, "--page", "good.html", "--screenshot", "other.html"]) == 2


# --- the real docs --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs_report(tmp_path_factory) -> tuple[bc.Report, pathlib.Path, pathlib.Path]:
    pytest.importorskip("sphinx", reason="Sphinx is not installed; install the test extra: pip install -e '.[test]'")
    html = tmp_path_factory.mktemp("html")
    bc.build_docs(html)
    out = tmp_path_factory.mktemp("docs-browser-check")
    # Failing pages are not photographed here: the report names them, and a run of the command does.
    return bc.check_pages(html, out, failure_screenshots=False), html, out


@needs_browser
def test_every_page_of_the_docs_is_opened_and_recorded(docs_report):
    report, html, out = docs_report
    assert [p.page for p in report.pages] == bc.page_list(html)
    assert {"index.html", "lifecycle.html", "recipes/nvfp4.html"} <= {p.page for p in report.pages}
    assert sum(len(p.diagrams) for p in report.pages) >= 3 and sum(len(p.images) for p in report.pages) >= 6
    assert json.loads((out / "report.json").read_text())["pages"][0]["page"] == report.pages[0].page
    for shot in ("lifecycle.png", "recipes--delayed-scaling.png", "recipes--nvfp4.png"):
        data = (out / shot).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 20_000, shot
        assert f"[{shot}]({shot})" in (out / "README.md").read_text()


@needs_browser
def test_the_docs_render_in_the_browser(docs_report):
    """Every diagram drawn and readable, every figure loaded, nothing wider than its column, no error."""
    report, _, _ = docs_report
    failing = [f"{p.page}: {f}" for p in report.pages for f in p.failures]
    assert not failing, f"{len(failing)} failures in the browser (details: python3 docs/_check/browser_check.py " \
                        "--out DIR):\n" + "\n".join(failing)
