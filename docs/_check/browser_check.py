"""The built docs, checked in a real browser: every page opened in headless Chromium.

``python3 docs/_check/browser_check.py --out DIR`` builds the docs (``sphinx -W --keep-going -b html docs
docs/_build/html``; ``--no-build`` reuses that tree, ``--html PATH`` checks another one), serves the tree on a
localhost port and opens every page the build wrote at a fixed viewport. A page fails on

- a Mermaid diagram that did not render to an SVG of non-zero size, that rendered Mermaid's "Syntax error in text"
  picture, or whose smallest label is drawn smaller than ``--min-diagram-text-px`` (Mermaid scales a wide diagram
  down to the column: the issue's unreadable lifecycle diagram had 5 px text);
- an image that did not load (``naturalWidth == 0``) or any request of the page that failed or answered >= 400
  (a figure that the build did not copy);
- a code block (``<pre>``) or a table wider than its column (``scrollWidth > clientWidth``: the reader has to
  scroll sideways, and at print or narrower widths the text is cut);
- math that MathJax did not typeset or typeset as an error;
- a JavaScript error (console ``error`` messages and uncaught exceptions).

It writes ``DIR/report.json`` (every measurement), ``DIR/README.md`` (a page-by-page table and each failure) and
full-page screenshots of the pages named by ``--screenshot`` (the lifecycle page and two recipe pages unless told
otherwise) and of every page that fails (``--no-failure-screenshots``: not those; a long page's is about 0.5 MB,
and the record in ``benchmarks/results/docs-browser-check/`` keeps only the three). Exit status 0 when every page
passes, 1 when one fails, 2 when the check could not run (no Chromium, no playwright, the build failed).

It lives beside ``docs/_ext`` (the build's own extensions) because it checks the build and needs nothing of refops:
it is a tool of the docs, not part of the package (not shipped in the wheel) nor a benchmark. The directory starts
with ``_`` so that neither Sphinx nor the page list of ``tests/docs/test_sphinx_build.py`` treats it as a page.
``tests/docs/test_browser_check.py`` runs it; docs/architecture.md#checking-the-docs-in-a-browser says how to.
Needs the ``docs-check`` extra (``pip install -e '.[docs-check]'``) and a Chromium (Debian:
``apt-get install chromium``), found at ``--chromium`` (default ``/usr/bin/chromium``); playwright's own browser
download is not used, so the check runs without network.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import http.server
import io
import json
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Iterator, Optional, Sequence

__all__ = [
    "DEFAULT_CHROMIUM", "DEFAULT_SCREENSHOTS", "VIEWPORT", "Diagram", "Image", "Report", "PageResult", "Wide",
    "build_docs", "check_pages", "failures", "main", "page_list", "readme", "serve",
]

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DEFAULT_HTML = DOCS / "_build" / "html"
DEFAULT_CHROMIUM = pathlib.Path("/usr/bin/chromium")
#: A laptop screen: alabaster (``html_theme_options["page_width"]`` in docs/conf.py, 1100 px) then shows its
#: sidebar and an 860 px body whose code blocks are 800 px wide; the column a reader actually gets.
VIEWPORT = {"width": 1280, "height": 900}
#: The pages whose screenshots the records keep (issue #37: the lifecycle page and two recipe pages).
DEFAULT_SCREENSHOTS = ("lifecycle.html", "recipes/delayed-scaling.html", "recipes/nvfp4.html")
#: Smaller than this, a diagram's labels cannot be read at the page's width (the body text is 17 px).
MIN_DIAGRAM_TEXT_PX = 9.0
#: Mermaid renders after the load event; MathJax typesets after it too. A page that is not done by then is broken.
PAGE_TIMEOUT_S = 20.0
#: Mermaid marks a block ``data-processed`` before it renders it, and a block that failed stays without an SVG:
#: once every block is processed and nothing changed for this long, the page is done.
SETTLE_S = 1.0
#: Mermaid 11's error picture says this (its ``errorRenderer``); older releases said the same.
MERMAID_ERROR_TEXT = "Syntax error in text"
#: A sideways overflow of a pixel or less is rounding, not a block that runs off the column.
OVERFLOW_SLACK_PX = 1


# --- what a page is measured to be ------------------------------------------------------------------------------


@dataclasses.dataclass
class Diagram:
    """One Mermaid block (``.mermaid`` element) as the browser left it."""

    rendered: bool  # an SVG that is not Mermaid's error picture
    width: float
    height: float
    min_text_px: Optional[float]  # the smallest label as drawn on screen (font size times the SVG's scale)
    error: Optional[str]  # Mermaid's error text, when it drew one
    diagram_type: str  # the source's first line: sequenceDiagram, flowchart LR...


@dataclasses.dataclass
class Image:
    src: str
    natural_width: int


@dataclasses.dataclass
class Wide:
    """A code block or table wider than its column."""

    kind: str  # "code" or "table"
    first_line: str
    longest_line_chars: int  # the widest line, in characters: what to shorten (0 for a table)
    scroll_width: int
    client_width: int


@dataclasses.dataclass
class PageResult:
    page: str
    diagrams: list[Diagram]
    images: list[Image]
    wide: list[Wide]
    math_total: int
    math_unrendered: int
    math_errors: list[str]
    console_errors: list[str]
    failed_requests: list[str]
    timed_out: bool = False
    failures: list[str] = dataclasses.field(default_factory=list)
    screenshot: Optional[str] = None


@dataclasses.dataclass
class Report:
    pages: list[PageResult]
    chromium: str
    viewport: dict[str, int]
    min_diagram_text_px: float
    command: str
    date: str

    @property
    def ok(self) -> bool:
        return all(not p.failures for p in self.pages)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **dataclasses.asdict(self),
                "failures": [f"{p.page}: {f}" for p in self.pages for f in p.failures]}


def failures(result: PageResult, min_diagram_text_px: float = MIN_DIAGRAM_TEXT_PX) -> list[str]:
    """Every reason ``result``'s page fails, one message each, in page order of the checks; empty when it passes."""
    out = []
    if result.timed_out:
        out.append(f"not done after {PAGE_TIMEOUT_S:.0f} s: a diagram or the math never finished rendering")
    for n, d in enumerate(result.diagrams, 1):
        what = f"diagram {n} ({d.diagram_type or 'empty'})"
        if d.error is not None:
            out.append(f"{what}: Mermaid could not draw it: {d.error}")
        elif not d.rendered:
            out.append(f"{what}: did not render (no SVG; is the Mermaid script loaded?)")
        elif d.width <= 0 or d.height <= 0:
            out.append(f"{what}: rendered an empty SVG ({d.width:.0f} x {d.height:.0f} px)")
        elif d.min_text_px is not None and d.min_text_px < min_diagram_text_px:
            out.append(f"{what}: unreadable, its smallest text is {d.min_text_px:.1f} px "
                       f"(< {min_diagram_text_px:g} px): too wide for the column, split or narrow it")
    for image in result.images:
        if image.natural_width <= 0:
            out.append(f"image {image.src!r} did not load")
    for request in result.failed_requests:
        out.append(f"request failed: {request}")
    for w in result.wide:
        chars = f", longest line {w.longest_line_chars} characters" if w.longest_line_chars else ""
        what = "code block" if w.kind == "code" else w.kind
        out.append(f"{what} wider than its column ({w.scroll_width} px in {w.client_width} px{chars}): "
                   f"{w.first_line!r}")
    if result.math_unrendered:
        out.append(f"{result.math_unrendered} of {result.math_total} math elements not typeset (is MathJax loaded?)")
    for error in result.math_errors:
        out.append(f"math error: {error}")
    for error in result.console_errors:
        out.append(f"JavaScript error: {error}")
    return out


# --- the pages of a build -----------------------------------------------------------------------------------------


def page_list(html_dir: pathlib.Path) -> list[str]:
    """Every page the build wrote from a source, as paths relative to ``html_dir`` (``recipes/nvfp4.html``).

    The list is the build's own: the ``docnames`` of ``searchindex.js``, one per source page. Left out are the
    pages Sphinx generates without a source (``genindex``, ``py-modindex``, ``search``): lists of links with no
    diagram, figure, code block or math of the docs' own, and ``search`` renders only after a query. The build
    has no ``_modules/`` (no ``sphinx.ext.viewcode``); a source listing would be Sphinx's, not the docs'.
    """
    index = html_dir / "searchindex.js"
    if not index.is_file():
        raise FileNotFoundError(f"{index} is missing: {html_dir} is not a Sphinx HTML build")
    found = re.search(r'"docnames":(\[[^\]]*\])', index.read_text(encoding="utf-8"))
    if found is None:
        raise ValueError(f"{index} has no docnames list: not a searchindex.js this check knows")
    pages = sorted(f"{name}.html" for name in json.loads(found.group(1)))
    missing = [p for p in pages if not (html_dir / p).is_file()]
    if missing:
        raise FileNotFoundError(f"the search index names pages the build did not write: {missing}")
    return pages


def build_docs(out: pathlib.Path = DEFAULT_HTML, docs: pathlib.Path = DOCS) -> None:
    """The docs build, as CI and docs/getting-started.md run it: warnings are errors. Raises on failure."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(docs), str(out)]
    done = subprocess.run(command, cwd=docs.parent, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the docs build failed ({' '.join(command)}):\n{done.stdout[-3000:]}{done.stderr[-5000:]}")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # failed requests are reported through the browser, page by page


@contextlib.contextmanager
def serve(html_dir: pathlib.Path) -> Iterator[str]:
    """Serve ``html_dir`` on a free localhost port for the duration; yields the base URL (ending in ``/``).

    Over HTTP rather than ``file://``: a missing figure is then a 404 the browser reports with its URL, and the
    pages are checked as a web server would deliver them.
    """
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-browser-check-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# --- measuring a page in the browser ----------------------------------------------------------------------------

#: Whether the page is done: each Mermaid block's state and whether MathJax has finished typesetting.
_STATE_JS = """() => Array.from(document.querySelectorAll('.mermaid')).map(
    b => (b.querySelector('svg') ? 'svg' : (b.getAttribute('data-processed') ? 'processed' : 'waiting')))"""

#: MathJax 3 typesets the page once at startup and resolves ``MathJax.startup.promise`` when done; a page whose
#: MathJax did not load has no promise, and its math is then counted as not typeset.
_MATHJAX_JS = """async (timeoutMs) => {
  const startup = window.MathJax && window.MathJax.startup;
  if (!document.querySelector('.math') || !startup || !startup.promise) return true;
  return await Promise.race([startup.promise.then(() => true, () => true),
                             new Promise(done => setTimeout(() => done(false), timeoutMs))]);
}"""

#: Mermaid replaces each block's text with its picture, its error picture included: keep the text, which names
#: the diagram in a failure message. Runs before the page's own scripts (an init script), so before Mermaid's.
_SOURCE_JS = """document.addEventListener('DOMContentLoaded', () => {
  document.querySelectorAll('.mermaid').forEach(b => b.setAttribute('data-mermaid-source', b.textContent));
});"""

#: Everything the checks need, measured once the page is done. Text is cut to keep the report readable.
_MEASURE_JS = """([errorText, slack]) => {
  const cut = (s, n) => {
    s = (s || '').trim().replace(/\\s+/g, ' ');
    return s.length > n ? s.slice(0, n - 1) + '…' : s;
  };
  // Mermaid replaces a block's text with its SVG (its error picture too); _SOURCE_JS kept the text.
  const diagrams = Array.from(document.querySelectorAll('.mermaid')).map(block => {
    const svg = block.querySelector('svg');
    const source = (block.getAttribute('data-mermaid-source') || (svg ? '' : block.textContent) || '').trim();
    if (!svg) {
      return {rendered: false, width: 0, height: 0, min_text_px: null, error: null,
              diagram_type: cut(source.split('\\n')[0], 60)};
    }
    const box = svg.getBoundingClientRect();
    // The SVG's textContent includes its <style>: the words drawn are those of its text and label elements.
    const words = Array.from(svg.querySelectorAll('text, foreignObject')).map(t => t.textContent.trim()).join(' ');
    const isError = svg.getAttribute('aria-roledescription') === 'error' || words.includes(errorText);
    const view = svg.viewBox && svg.viewBox.baseVal;
    const scale = view && view.width ? box.width / view.width : 1;
    let smallest = null;
    svg.querySelectorAll('text, foreignObject div, foreignObject span, foreignObject p').forEach(t => {
      if (!t.textContent.trim() || t.getClientRects().length === 0) return;
      const px = parseFloat(getComputedStyle(t).fontSize) * scale;
      if (smallest === null || px < smallest) smallest = px;
    });
    return {rendered: !isError, width: box.width, height: box.height,
            min_text_px: smallest === null ? null : Math.round(smallest * 10) / 10,
            error: isError ? cut(words, 120) : null, diagram_type: cut(source.split('\\n')[0], 60)};
  });
  const images = Array.from(document.images).map(
      i => ({src: i.getAttribute('src') || '', natural_width: i.naturalWidth}));
  const wide = [];
  document.querySelectorAll('pre').forEach(pre => {
    if (pre.closest('.mermaid') || pre.classList.contains('mermaid')) return;
    if (pre.scrollWidth > pre.clientWidth + slack) {
      const lines = pre.textContent.split('\\n');
      wide.push({kind: 'code', first_line: cut(lines.find(l => l.trim()) || '', 100),
                 longest_line_chars: Math.max(...lines.map(l => l.length)),
                 scroll_width: pre.scrollWidth, client_width: pre.clientWidth});
    }
  });
  // A table has no scroll box of its own: it runs past the column of the element that holds it.
  const body = document.querySelector('div.body') || document.body;
  document.querySelectorAll('table').forEach(table => {
    if (table.closest('pre, .highlight, .mermaid') || table.parentElement.closest('table')) return;
    const column = table.parentElement.clientWidth;
    const width = Math.ceil(table.getBoundingClientRect().width);
    if (width > Math.min(column, body.clientWidth) + slack) {
      const head = table.querySelector('tr');
      const header = head ? Array.from(head.cells).map(c => c.textContent.trim()).join(' | ') : '';
      wide.push({kind: 'table', first_line: cut(header, 100),
                 longest_line_chars: 0, scroll_width: width, client_width: Math.min(column, body.clientWidth)});
    }
  });
  const math = Array.from(document.querySelectorAll('.math'));
  return {diagrams, images, wide,
          math_total: math.length,
          math_unrendered: math.filter(m => !m.querySelector('mjx-container')).length,
          // A TeX error is an merror node; an undefined macro MathJax 3 (its noundefined extension) draws in red
          // instead, as an mtext with mathcolor red in the page's MathML copy.
          math_errors: [
            ...Array.from(document.querySelectorAll('mjx-merror')).map(
                e => cut(e.getAttribute('data-mjx-error') || e.textContent, 120)),
            ...Array.from(document.querySelectorAll('mjx-assistive-mml mtext[mathcolor="red"]')).map(
                e => 'Undefined control sequence ' + cut(e.textContent, 60)),
          ]};
}"""


def _wait_until_done(page: Any, timeout_s: float) -> bool:
    """Wait until MathJax has typeset and every Mermaid block is done; False on timeout."""
    deadline = time.monotonic() + timeout_s
    if not page.evaluate(_MATHJAX_JS, int(timeout_s * 1000)):
        return False
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        blocks = page.evaluate(_STATE_JS)
        if all(b == "svg" for b in blocks):
            return True
        if blocks != last:
            last, since = blocks, time.monotonic()
        elif "waiting" not in blocks and time.monotonic() - since >= SETTLE_S:
            return True  # every block processed, some without an SVG: Mermaid failed on them and is done
        page.wait_for_timeout(100)
    return False


def _measure(page: Any, url: str, name: str, timeout_s: float) -> PageResult:
    console: list[str] = []
    failed: list[str] = []
    page.on("console", lambda m: console.append(f"{m.text} ({m.location.get('url', '')})".replace(" ()", ""))
            if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"uncaught: {e.name}: {e.message}"))
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    page.on("response", lambda r: failed.append(f"{r.url} (HTTP {r.status})") if r.status >= 400 else None)
    page.add_init_script(_SOURCE_JS)
    page.goto(url + name, wait_until="load")
    done = _wait_until_done(page, timeout_s)
    data = page.evaluate(_MEASURE_JS, [MERMAID_ERROR_TEXT, OVERFLOW_SLACK_PX])
    # A 404 shows up twice, as the failed response and as the console's "Failed to load resource": once is enough.
    console = [c for c in console if not c.startswith("Failed to load resource")]
    return PageResult(page=name, diagrams=[Diagram(**d) for d in data["diagrams"]],
                      images=[Image(**i) for i in data["images"]], wide=[Wide(**w) for w in data["wide"]],
                      math_total=data["math_total"], math_unrendered=data["math_unrendered"],
                      math_errors=data["math_errors"], console_errors=console, failed_requests=failed,
                      timed_out=not done)


def _save_screenshot(page: Any, path: pathlib.Path) -> None:
    """A full-page screenshot, quantized to 256 colours when Pillow is there: text pages compress 3-5x smaller."""
    data = page.screenshot(full_page=True, type="png")
    try:
        from PIL import Image as PILImage
    except ImportError:  # the docs extra brings Pillow (matplotlib needs it); without it, the plain PNG
        path.write_bytes(data)
        return
    picture = PILImage.open(io.BytesIO(data)).convert("RGB").quantize(colors=256)
    picture.save(path, format="PNG", optimize=True)


def _remove_earlier_screenshots(out: pathlib.Path) -> None:
    """A screenshot left by an earlier run would read as this run's: remove those its report named (only those,
    so that ``--out`` may name a directory that holds other files)."""
    try:
        earlier = json.loads((out / "report.json").read_text(encoding="utf-8"))["pages"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    for page in earlier:
        shot = page.get("screenshot") if isinstance(page, dict) else None
        if isinstance(shot, str) and "/" not in shot and shot.endswith(".png"):
            (out / shot).unlink(missing_ok=True)


def check_pages(html_dir: pathlib.Path, out: pathlib.Path, pages: Optional[Sequence[str]] = None,
                screenshots: Sequence[str] = DEFAULT_SCREENSHOTS, failure_screenshots: bool = True,
                chromium: pathlib.Path = DEFAULT_CHROMIUM,
                min_diagram_text_px: float = MIN_DIAGRAM_TEXT_PX, timeout_s: float = PAGE_TIMEOUT_S,
                command: str = "") -> Report:
    """Open every page of ``html_dir`` (``pages``, default :func:`page_list`) in headless Chromium and measure it.

    Writes ``out/report.json``, ``out/README.md`` and the screenshots (of ``screenshots``, and of every page that
    fails unless ``failure_screenshots`` is false); returns the report.
    """
    from playwright.sync_api import sync_playwright  # the docs-check extra: imported here, so --help works without

    pages = list(page_list(html_dir) if pages is None else pages)
    unknown = [s for s in screenshots if s not in pages]
    if unknown:
        raise ValueError(f"--screenshot names pages that are not checked: {unknown}")
    out.mkdir(parents=True, exist_ok=True)
    _remove_earlier_screenshots(out)
    results = []
    with serve(html_dir) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), headless=True)
        try:
            version = browser.version
            for name in pages:
                context = browser.new_context(viewport=VIEWPORT)  # one per page: no cache or state carries over
                try:
                    page = context.new_page()
                    result = _measure(page, url, name, timeout_s)
                    result.failures = failures(result, min_diagram_text_px)
                    if name in screenshots or (failure_screenshots and result.failures):
                        shot = name.removesuffix(".html").replace("/", "--") + ".png"
                        _save_screenshot(page, out / shot)
                        result.screenshot = shot
                finally:
                    context.close()
                results.append(result)
        finally:
            browser.close()
    report = Report(pages=results, chromium=f"Chromium {version}", viewport=dict(VIEWPORT),
                    min_diagram_text_px=min_diagram_text_px, command=command,
                    date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    (out / "report.json").write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(readme(report), encoding="utf-8")
    return report


# --- the records ----------------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def readme(report: Report) -> str:
    """The run as Markdown: what ran, a page-by-page table, and every failure under its page."""
    passed = sum(1 for p in report.pages if not p.failures)
    lines = [
        "# The docs in a browser",
        "",
        f"`{report.command}`" if report.command else "",
        "",
        f"{report.date}; {report.chromium}, headless, viewport {report.viewport['width']}x"
        f"{report.viewport['height']}; diagrams fail below {report.min_diagram_text_px:g} px text. "
        f"**{passed} of {len(report.pages)} pages pass.**",
        "",
        "| page | result | diagrams rendered | unreadable diagrams | images loaded | math typeset | wide code blocks "
        "| wide tables | other errors | screenshot |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report.pages:
        rendered = sum(1 for d in p.diagrams if d.rendered and d.width > 0 and d.height > 0)
        small = sum(1 for d in p.diagrams if d.rendered and d.min_text_px is not None
                    and d.min_text_px < report.min_diagram_text_px)
        loaded = sum(1 for i in p.images if i.natural_width > 0)
        code = sum(1 for w in p.wide if w.kind == "code")
        tables = sum(1 for w in p.wide if w.kind == "table")
        errors = len(p.console_errors) + len(p.failed_requests) + len(p.math_errors) + int(p.timed_out)
        shot = f"[{p.screenshot}]({p.screenshot})" if p.screenshot else ""
        lines.append(f"| {p.page} | {'FAIL' if p.failures else 'pass'} | {rendered}/{len(p.diagrams)} | "
                     f"{small or ''} | {loaded}/{len(p.images)} | {p.math_total - p.math_unrendered}/{p.math_total} | "
                     f"{code or ''} | {tables or ''} | {errors or ''} | {shot} |")
    failing = [p for p in report.pages if p.failures]
    if failing:
        lines += ["", "## Failures", ""]
        for p in failing:
            lines.append(f"### {p.page}")
            lines.append("")
            lines += [f"- {_cell(f)}" for f in p.failures]
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


# --- the command ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="browser_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="where report.json, README.md and the "
                        "screenshots go")
    parser.add_argument("--build", action=argparse.BooleanOptionalAction, default=True,
                        help="build the docs first (default); --no-build checks the tree already built")
    parser.add_argument("--html", type=pathlib.Path, default=DEFAULT_HTML, help="the HTML tree (default %(default)s)")
    parser.add_argument("--page", action="append", dest="pages", metavar="PAGE",
                        help="check only this page (repeatable; default every page of the build)")
    parser.add_argument("--screenshot", action="append", dest="screenshots", metavar="PAGE",
                        help="a page to screenshot whether or not it fails (repeatable; default "
                        f"{', '.join(DEFAULT_SCREENSHOTS)})")
    parser.add_argument("--failure-screenshots", action=argparse.BooleanOptionalAction, default=True,
                        help="screenshot every page that fails too (default); a long page's is about 0.5 MB")
    parser.add_argument("--chromium", type=pathlib.Path, default=DEFAULT_CHROMIUM)
    parser.add_argument("--min-diagram-text-px", type=float, default=MIN_DIAGRAM_TEXT_PX)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns the exit status (0 pass, 1 a page fails, 2 the check could not run)."""
    args = _parser().parse_args(argv)
    if not args.chromium.is_file() or shutil.which(str(args.chromium)) is None:
        print(f"browser_check: no Chromium at {args.chromium} (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    try:
        from playwright.sync_api import Error as PlaywrightError
    except ImportError:
        print("browser_check: playwright is not installed: pip install -e '.[docs-check]'", file=sys.stderr)
        return 2
    if args.build:
        print(f"browser_check: building the docs into {args.html}", file=sys.stderr)
        try:
            build_docs(args.html)
        except RuntimeError as error:
            print(f"browser_check: {error}", file=sys.stderr)
            return 2
    pages = args.pages
    screenshots = args.screenshots if args.screenshots is not None else (
        [s for s in DEFAULT_SCREENSHOTS if pages is None or s in pages])
    command = "python3 docs/_check/browser_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        report = check_pages(args.html, args.out, pages=pages, screenshots=screenshots,
                             failure_screenshots=args.failure_screenshots, chromium=args.chromium,
                             min_diagram_text_px=args.min_diagram_text_px, command=command.strip())
    except (FileNotFoundError, ValueError) as error:
        print(f"browser_check: {error}", file=sys.stderr)
        return 2
    except PlaywrightError as error:  # Chromium would not start, or crashed: the check did not run
        print(f"browser_check: Chromium at {args.chromium} failed: {error}", file=sys.stderr)
        return 2
    for p in report.pages:
        for failure in p.failures:
            print(f"FAIL {p.page}: {failure}")
    passed = sum(1 for p in report.pages if not p.failures)
    print(f"browser_check: {passed} of {len(report.pages)} pages pass; report in {args.out / 'README.md'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
