"""Citations of the documentation in the code: where they are, and the sections each docs page has.

The one citation format: ``docs/<page>.md`` for a whole page, ``docs/<page>.md#<anchor>`` for one of its
sections, where ``<anchor>`` is the MyST heading anchor of a heading of that page (``myst_heading_anchors``
in ``docs/conf.py``): the heading's text (code spans included, math left out) lowercased, spaces turned
into hyphens, other punctuation dropped, and ``-1``, ``-2``, ... appended to a repeated heading. So
``## Roles, usages and GEMMs`` in ``docs/recipes/index.md`` is
``docs/recipes/index.md#roles-usages-and-gemms``.

Scanned: every text file of the code (``refops/``, ``fastpath/``, ``tests/``, ``benchmarks/``, whatever
file the code has moved to), the top-level ``README.md`` and ``pyproject.toml``, and the docs pages. The
run records in ``benchmarks/results/`` are output, not code, and are left alone.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from typing import Callable, Iterator, Optional

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CODE_DIRS = ("refops", "fastpath", "tests", "benchmarks")
TOP_LEVEL_FILES = ("README.md", "pyproject.toml")
CODE_SUFFIXES = {".py", ".pyi", ".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".hpp", ".toml", ".cfg", ".ini", ".sh",
                 ".txt", ".md"}
SKIPPED_DIRS = {".git", "__pycache__", ".pytest_cache", "_build", "_generated", "node_modules", ".venv"}
#: Folders of run records (output of the benchmarks, kept as they were written), relative to the root.
RECORD_DIRS = ("benchmarks/results",)

#: ``docs/<page>.md`` with an optional ``#<anchor>``; not when ``docs/`` is part of a longer path
#: (``tests/docs/...``) or of a word.
CITATION = re.compile(r"(?<![\w.-])(?<!\w/)docs/((?:[\w.-]+/)*[\w.-]+\.md)(?:#([\w-]*))?")

#: What the code cited before the docs had the text: the research notes of ``../shared/spec/``, which are not
#: in the repository. Each pattern with what to write instead.
SPEC_CITATIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"recipes-numerics", re.I), "the spec's recipes-numerics.md"),
    (re.compile(r"te-ops-semantics", re.I), "the spec's te-ops-semantics.md"),
    (re.compile(r"ecosystem[- ]notes", re.I), "the spec's ecosystem-notes.md"),
    (re.compile(r"shared/spec"), "the spec folder ../shared/spec/"),
    (re.compile(r"§"), "a numbered section (§) of a spec file"),
)
#: A file "of the spec" (``spec distributed.md``): ``lifecycle.md``, ``distributed.md`` and ``architecture.md``
#: were also names of spec files, which this spells out; ``docs/distributed.md`` is the docs page.
SPEC_FILE = re.compile(r"\bspec(?:'s)?\s+[\w-]+\.md\b", re.I)


@dataclasses.dataclass(frozen=True)
class Citation:
    """One ``docs/<page>.md[#<anchor>]`` in a file; ``anchor`` is None for a whole page."""

    where: str  # "path:line", the path relative to the repository root
    page: str  # relative to docs/
    anchor: Optional[str]

    @property
    def text(self) -> str:
        return f"docs/{self.page}" + ("" if self.anchor is None else f"#{self.anchor}")


def _is_skipped(path: pathlib.Path) -> bool:
    relative = path.relative_to(ROOT)
    if any(part in SKIPPED_DIRS for part in relative.parts):
        return True
    return any(relative.as_posix().startswith(d + "/") for d in RECORD_DIRS)


def code_files() -> list[pathlib.Path]:
    """The text files of the code folders and the top-level files, sorted."""
    files = [ROOT / name for name in TOP_LEVEL_FILES if (ROOT / name).is_file()]
    for folder in CODE_DIRS:
        if (ROOT / folder).is_dir():
            files += [p for p in (ROOT / folder).rglob("*")
                      if p.is_file() and p.suffix in CODE_SUFFIXES and not _is_skipped(p)]
    return sorted(set(files))


def docs_pages() -> list[pathlib.Path]:
    """The Markdown pages of docs/ (folders starting with ``_`` hold build machinery, not pages)."""
    return sorted(p for p in DOCS.rglob("*.md")
                  if not any(part.startswith("_") for part in p.relative_to(DOCS).parts[:-1]))


def _lines(path: pathlib.Path) -> Iterator[tuple[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return
    relative = path.relative_to(ROOT).as_posix()
    for number, line in enumerate(text.splitlines(), start=1):
        yield f"{relative}:{number}", line


def citations(files: list[pathlib.Path]) -> list[Citation]:
    """Every docs citation in ``files``, in file and line order."""
    found = []
    for path in files:
        for where, line in _lines(path):
            for match in CITATION.finditer(line):
                found.append(Citation(where, match.group(1), match.group(2)))
    return found


def spec_citations(files: list[pathlib.Path]) -> list[str]:
    """``"path:line: what"`` for every citation of the spec left in ``files``."""
    found = []
    for path in files:
        for where, line in _lines(path):
            for pattern, what in SPEC_CITATIONS:
                if pattern.search(line):
                    found.append(f"{where}: cites {what}: {line.strip()[:160]}")
            for match in SPEC_FILE.finditer(line):
                found.append(f"{where}: cites {match.group(0)!r}, a file of the spec: {line.strip()[:160]}")
    return found


# ------------------------------------------------------------------------------------- anchors
def myst_settings() -> dict:
    """The MyST settings of docs/conf.py that decide the anchors, read without running conf.py."""
    settings = {"myst_heading_anchors": 0, "myst_enable_extensions": [], "myst_heading_slug_func": None}
    tree = ast.parse((DOCS / "conf.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in settings:
                settings[name] = ast.literal_eval(node.value)
    return settings


def _slug_function(name: Optional[str]) -> Callable[[str], str]:
    from myst_parser.slugs import SLUG_PRESETS, github_slugify

    if name is None:
        return github_slugify
    if name not in SLUG_PRESETS:
        raise ValueError(f"docs/conf.py: myst_heading_slug_func = {name!r} is not a MyST preset; teach "
                         f"tests/docs/_code_citations.py to compute it")
    return SLUG_PRESETS[name]


def page_anchors(page: pathlib.Path) -> list[str]:
    """The heading anchors MyST gives ``page``, in order (needs ``myst_parser``)."""
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser
    from myst_parser.slugs import unique_slug

    settings = myst_settings()
    depth = settings["myst_heading_anchors"]
    slugify = _slug_function(settings["myst_heading_slug_func"])
    parser = create_md_parser(MdParserConfig(enable_extensions=set(settings["myst_enable_extensions"])),
                              RendererHTML)
    tokens = parser.parse(page.read_text(encoding="utf-8"))
    anchors: list[str] = []
    for i, token in enumerate(tokens):
        if token.type != "heading_open" or int(token.tag[1:]) > depth:
            continue
        inline = tokens[i + 1]
        title = "".join(c.content for c in (inline.children or []) if c.type in ("text", "code_inline"))
        slug = slugify(title)
        if slug:  # an empty slug gets no anchor
            anchors.append(unique_slug(slug, anchors))
    return anchors
