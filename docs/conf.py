"""Sphinx configuration for the refops documentation (MyST Markdown, autodoc, Mermaid).

Build: ``python3 -m sphinx -W --keep-going -b html docs docs/_build/html``. Diagrams and
figures are generated from refops itself at the start of every build
(``docs/_ext/refops_artifacts.py``), into ``docs/_generated/`` (ignored by git).
The built pages load no script from the network: Mermaid and MathJax come from pinned packages
(``docs/_ext/mermaid_offline.py``, ``sphinx-mathjax-offline``), so the docs read offline too.
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")  # figures are drawn at build time, without a display

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

project = "refops"
author = "the refops authors"
copyright = "the refops authors, Apache-2.0"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinxcontrib.mermaid",
    "mermaid_offline",  # after sphinxcontrib.mermaid: replaces its CDN loader with the local script
    "sphinx-mathjax-offline",  # MathJax from the package, not from a CDN
    "refops_artifacts",
    "benchmark_figures",
]

#: The GPU run record (a directory of benchmarks/results/) whose figures docs/benchmarks.md shows:
#: the one place to change when a new verification run replaces it.
refops_figures_run = "h200-2026-12-01-run45"

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
# An override without a docstring of its own is documented once, on the class that defines
# the contract (BasicOperation.op_forward, Quantizer.make_empty...), not repeated on every op.
autodoc_inherit_docstrings = False
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = "refops"
html_theme_options = {"description": "A readable reference for TransformerEngine-style fusible ops", "page_width": "1100px"}
html_static_path = ["_static"]
# Tables fit the column: long words and inline code in cells may wrap (why: docs/_static/refops.css).
html_css_files = ["refops.css"]
