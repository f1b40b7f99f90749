"""What a page's example prints, produced by running the page's own code blocks at build time.

A ```python block whose first line is ``# output: NAME`` has its printed output written to
``_generated/output-PAGE-NAME.txt`` (``PAGE`` the page's path under ``docs/`` without ``.md``, ``/`` written as
``-``: ``recipes-delayed-scaling``); the page shows it with a
``{literalinclude}`` right after the block. The blocks of a page run in order in one namespace, with torch's
seed set to 0 first, exactly as ``tests/docs/test_docs_examples.py`` runs them, so the output shown is the output
of the code shown and cannot go stale.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pathlib
import re
import tempfile
from typing import Callable

__all__ = ["OUTPUTS", "MARKER", "page_outputs", "marked_blocks", "output_name"]

DOCS = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"\A# output: ([a-z0-9-]+)\n")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)  # the pattern the docs-examples test uses


def _pages() -> list[pathlib.Path]:
    return sorted(p for p in DOCS.rglob("*.md") if not any(part.startswith("_") for part in p.relative_to(DOCS).parts))


def marked_blocks(page: pathlib.Path) -> list[str]:
    """The ``NAME`` of every ``# output: NAME`` block of ``page``, in order."""
    return [m.group(1) for m in (MARKER.match(b) for b in _BLOCK.findall(page.read_text())) if m]


@functools.lru_cache(maxsize=None)
def page_outputs(page: pathlib.Path) -> dict[str, str]:
    """``{NAME: what the block printed}``: every block of ``page`` runs, in order, in one namespace."""
    import torch

    namespace: dict = {"__name__": f"docs_{page.stem}"}
    outputs: dict[str, str] = {}
    previous_dir, previous_device = os.getcwd(), torch.get_default_device()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)  # a page that writes files writes them here
        try:
            for i, code in enumerate(_BLOCK.findall(page.read_text())):
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)
                marker = MARKER.match(code)
                if marker:
                    outputs[marker.group(1)] = printed.getvalue()
        finally:
            os.chdir(previous_dir)
            torch.set_default_device(previous_device)
    return outputs


def output_name(page: pathlib.Path, name: str) -> str:
    """The generated file of block ``name`` of ``page``."""
    return f"output-{page.relative_to(DOCS).with_suffix('').as_posix().replace('/', '-')}-{name}.txt"


def _maker(page: pathlib.Path, name: str) -> Callable[[], bytes]:
    def make() -> bytes:
        text = page_outputs(page)[name]
        if not text:
            raise RuntimeError(f"block_outputs: the '# output: {name}' block of {page.name} printed nothing")
        return text.encode()

    return make


#: File name -> function returning its bytes, one per marked block of every page.
OUTPUTS: dict[str, Callable[[], bytes]] = {
    output_name(page, name): _maker(page, name) for page in _pages() for name in marked_blocks(page)
}
