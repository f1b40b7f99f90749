"""The primer and the recipe pages teach (issue #37, items 3 and 4).

Their examples use public API only and fit the page's column; what an example prints is shown from the
build's own run of it (``docs/_ext/block_outputs.py``); the recipes come in learning order; each recipe page
shows a figure of its own; the slips the issue lists stay fixed.
"""

from __future__ import annotations

import math
import pathlib
import re
import sys

import pytest
import torch

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = [DOCS / "primer.md", *sorted((DOCS / "recipes").glob("*.md"))]
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
ALL_PAGES = sorted(p for p in DOCS.rglob("*.md") if not any(part.startswith("_") for part in p.relative_to(DOCS).parts))
#: What a code block shows in alabaster's 800 px column without a scroll bar (81 already overflows, measured by
#: docs/_check/browser_check.py). Program output (```text) wraps instead (docs/_static/refops.css).
COLUMNS = 80


def _ext(name: str):
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(DOCS / "_ext"))


@pytest.mark.parametrize("page", ALL_PAGES, ids=[str(p.relative_to(DOCS)) for p in ALL_PAGES])
def test_code_blocks_fit_the_column(page):
    wide = [f"{len(line)}: {line}" for language, body in _FENCE.findall(page.read_text()) if language != "text"
            for line in body.splitlines() if len(line) > COLUMNS]
    assert not wide, f"{page.name}: code lines wider than {COLUMNS} columns:\n" + "\n".join(wide)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_examples_use_public_api_only(page):
    private = [line for language, body in _FENCE.findall(page.read_text()) if language == "python"
               for line in body.splitlines() if re.search(r"\.\_[a-z]", line)]
    assert not private, f"{page.name}: examples reach into private attributes:\n" + "\n".join(private)


def test_recipes_come_in_learning_order():
    toctree = re.search(r"```\{toctree\}\n(.*?)```", (DOCS / "recipes" / "index.md").read_text(), re.S).group(1)
    entries = [line for line in toctree.splitlines() if line and not line.startswith(":")]
    assert entries == ["formats", "current-scaling", "delayed-scaling", "mxfp8", "fp8-block", "nvfp4", "fused-activations"]
    current = (DOCS / "recipes" / "current-scaling.md").read_text()
    assert "as for delayed scaling" not in current, "current scaling's layout must stand alone"
    assert "current-scaling.md#layout" in (DOCS / "recipes" / "delayed-scaling.md").read_text()


def test_every_recipe_page_shows_a_figure_of_its_own():
    figures = _ext("recipe_figures").FIGURES
    for page, figure in {"index": "recipe-gemms.png", "current-scaling": "recipe-current-scaling.png",
                         "delayed-scaling": "recipe-delayed-timeline.png", "mxfp8": "recipe-mxfp8-blocks.png",
                         "fp8-block": "recipe-fp8-block-layouts.png", "nvfp4": "recipe-nvfp4-scales.png"}.items():
        assert figure in figures and f"_generated/{figure}" in (DOCS / "recipes" / f"{page}.md").read_text(), page
    assert "error-mxfp8.png" not in _ext("error_figures").FIGURES, "MXFP8's flat error curve teaches nothing"


def test_every_printed_output_is_included_after_its_block_and_generated():
    block_outputs = _ext("block_outputs")
    artifacts = _ext("refops_artifacts").ARTIFACTS
    for page in [DOCS / "primer.md", *sorted((DOCS / "recipes").glob("*.md"))]:
        text = page.read_text()
        for name in block_outputs.marked_blocks(page):
            file = block_outputs.output_name(page, name)
            assert file in artifacts, file
            block = text.index(f"```python\n# output: {name}\n")
            following = text[text.index("```\n", block + 10):]
            include = re.match(r"```\n\s*```\{literalinclude\} (\S+)", following)
            assert include and include.group(1).endswith(f"_generated/{file}"), f"{page.name}: {name} not shown"


def test_the_outputs_are_what_the_blocks_print():
    block_outputs = _ext("block_outputs")
    delayed = block_outputs.page_outputs(DOCS / "recipes" / "delayed-scaling.md")["steps"].splitlines()
    assert [line.split(":")[0] for line in delayed] == ["step 1", "step 2", "step 3"]
    sqnr = block_outputs.page_outputs(DOCS / "primer.md")["sqnr"]
    assert "inf dB" in sqnr and "infdB" not in sqnr


def test_the_slips_stay_fixed():
    from refops.formats import E4M3, E5M2

    # E5M2's relative step: 1/7 (at 1.75) to 1/4 (at 1), so 14.3 to 25 %; E4M3's 1/15 to 1/8.
    assert (round(100 / 7, 1), round(100 / 15, 1)) == (14.3, 6.7)
    formats = " ".join((DOCS / "recipes" / "formats.md").read_text().split())
    assert "14.3 to 25 % for E5M2" in formats and "6.7 to 12.5 % for E4M3" in formats
    # NVFP4: a block scale rounds to 0 below 448 * 2^-10 of the tensor's amax, 18.8 binades down.
    half_subnormal = torch.finfo(E4M3.torch_dtype).smallest_normal * torch.finfo(E4M3.torch_dtype).eps / 2
    assert E4M3.quantize(torch.tensor([half_subnormal])).float().item() == 0.0
    binades = round(math.log2(E4M3.max / half_subnormal), 1)
    nvfp4 = (DOCS / "recipes" / "nvfp4.md").read_text()
    assert binades == 18.8 and "18.8" in nvfp4 and "for 15 binades" not in nvfp4
    assert E5M2.max == 57344.0
    for page in PAGES:
        assert r"\_recent" not in page.read_text(), f"{page.name}: an escaped underscore renders as a backslash"
