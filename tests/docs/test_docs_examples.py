"""Every ```python block in docs/ runs: the blocks of one page run in order, in one namespace.

Pages are the Markdown files under ``docs/``, subfolders included; folders whose name
starts with ``_`` (``_build``, ``_generated``, ``_ext``) hold build machinery, not pages.
Other fences (```bash, ```text, ```{mermaid}...) are shown, not run.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest
import torch

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(
    p for p in DOCS.rglob("*.md") if not any(part.startswith("_") for part in p.relative_to(DOCS).parts[:-1])
)
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: pathlib.Path) -> list[str]:
    """The page's ```python blocks, in order."""
    return _BLOCK.findall(page.read_text())


PAGES_WITH_EXAMPLES = [p for p in PAGES if python_blocks(p)]


def test_docs_have_pages():
    assert PAGES, f"no Markdown pages under {DOCS}"
    names = {str(p.relative_to(DOCS)) for p in PAGES_WITH_EXAMPLES}
    guide = {"getting-started.md", "primer.md", "lifecycle.md", "oracle.md", "fastpath.md", "benchmarks.md"}
    recipes = {f"recipes/{name}.md" for name in ("index", "formats", "delayed-scaling", "current-scaling",
                                                  "mxfp8", "fp8-block", "nvfp4")}
    missing = (guide | recipes) - names
    assert not missing, f"guide pages without a runnable example: {sorted(missing)}"


def test_the_block_pattern_finds_only_python_fences():
    text = "```python\nx = 1\n```\n\n```bash\nexit 1\n```\n\n```{mermaid}\ngraph\n```\n\n```python\ny = 2\n```\n"
    assert _BLOCK.findall(text) == ["x = 1\n", "y = 2\n"]


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=[str(p.relative_to(DOCS)) for p in PAGES_WITH_EXAMPLES])
def test_page_examples_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    if torch.cuda.is_initialized() and any("run_on_ranks" in b for b in blocks):
        pytest.skip("the example forks gloo ranks, which cannot run backward in a process that has used CUDA (the CPU suite runs it)")
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    monkeypatch.chdir(tmp_path)  # a page that writes files writes them here
    previous_device = torch.get_default_device()
    torch.manual_seed(0)
    try:
        for i, code in enumerate(blocks):
            try:
                exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)
            except Exception as exc:  # pragma: no cover - the message is the point
                raise AssertionError(f"{page.name}: code block {i} failed: {exc!r}\n{code}") from exc
    finally:
        torch.set_default_device(previous_device)
    assert os.getcwd() == str(tmp_path), f"{page.name} changed the working directory"
