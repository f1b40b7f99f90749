"""``python3 -m tests.recall``: print the generated docs section; ``--write-docs`` writes it into the page."""

import pathlib
import sys

from .corpus import render_page_section, write_docs_page

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "oracle-recall.md"

if "--write-docs" in sys.argv:
    write_docs_page(PAGE)
else:
    print(render_page_section())
