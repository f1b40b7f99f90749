"""Every ```python block in docs/ runs: the blocks of one page run in order, in one namespace."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def test_docs_have_pages():
    assert PAGES, f"no Markdown pages under {DOCS}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_examples_run(page):
    blocks = _BLOCK.findall(page.read_text())
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    torch.manual_seed(0)
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"{page.name}: code block {i} failed: {exc!r}\n{code}") from exc
