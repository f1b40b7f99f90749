"""Sphinx extension: Mermaid diagrams render in the browser without network, also from files opened off disk.

sphinxcontrib-mermaid writes each diagram as ``<pre class="mermaid">`` (its text stays in the page) and, on each
page that has one, an inline ES module that imports mermaid, from a CDN unless ``mermaid_use_local`` names a file.
A browser rejects ES-module imports from ``file://`` pages, so that loader fails offline either way. This extension
replaces it: on a page with diagrams, mermaid's classic browser bundle (``_static/mermaid.min.js``, which sets
``globalThis.mermaid``) and one inline line that initializes it with ``startOnLoad``.

The bundle is the pinned copy that the ``mermaidx`` package ships (``mermaidx/assets/mermaid.js``; the docs and
test extras pin its version, so the build is reproducible and needs no network). MathJax comes from the pinned
``sphinx-mathjax-offline`` package the same way (``docs/conf.py``).
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
from typing import Any, Optional

import sphinxcontrib.mermaid as sphinx_mermaid
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

__all__ = ["SCRIPT_NAME", "bundled_script", "mermaid_version", "setup"]

logger = logging.getLogger(__name__)

#: The bundle's name under the build's ``_static/``.
SCRIPT_NAME = "mermaid.min.js"
INIT_SCRIPT = 'mermaid.initialize({startOnLoad: true, theme: "default"});'


def bundled_script() -> pathlib.Path:
    """mermaid's browser bundle as the installed ``mermaidx`` ships it (found without importing the package)."""
    spec = importlib.util.find_spec("mermaidx")
    if spec is None or not spec.submodule_search_locations:
        raise ExtensionError("mermaid_offline: the mermaidx package is not installed; it ships the Mermaid script "
                             "the docs use offline: pip install -e '.[docs]' (or '.[test]')")
    script = pathlib.Path(spec.submodule_search_locations[0]) / "assets" / "mermaid.js"
    if not script.is_file():
        raise ExtensionError(f"mermaid_offline: {script} is missing; the installed mermaidx is not the pinned one")
    return script


def mermaid_version(script: pathlib.Path) -> Optional[str]:
    """The Mermaid release a bundle was built from (its first ``version:"x.y.z"``), or None."""
    found = re.search(rb'version:"(\d+\.\d+\.\d+)"', script.read_bytes())
    return found.group(1).decode() if found else None


def _drop_cdn_loader(app: Sphinx) -> None:
    """Disconnect sphinxcontrib-mermaid's ES-module loader; an unknown version without it is an error, not a page
    that silently loads mermaid from the network."""
    ours = [listener for listener in app.events.listeners["html-page-context"]
            if listener.handler is sphinx_mermaid.install_js]
    if not ours:
        raise ExtensionError("mermaid_offline: sphinxcontrib.mermaid.install_js is not connected; this "
                             "sphinxcontrib-mermaid loads mermaid differently, check docs/_ext/mermaid_offline.py")
    for listener in ours:
        app.disconnect(listener.id)


def _on_page(app: Sphinx, pagename: str, templatename: str, context: dict,
             doctree: Optional[nodes.document]) -> None:
    if doctree is not None and doctree.next_node(sphinx_mermaid.mermaid) is not None:
        app.add_js_file(SCRIPT_NAME, priority=500)
        app.add_js_file(None, body=INIT_SCRIPT, priority=501)


def _copy_script(app: Sphinx, exception: Optional[Exception]) -> None:
    if exception is None and app.builder.format == "html":
        static = pathlib.Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundled_script(), static / SCRIPT_NAME)


def _check_script(app: Sphinx) -> None:
    script = bundled_script()
    logger.info("mermaid_offline: Mermaid %s from %s", mermaid_version(script), script)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinxcontrib.mermaid")
    _drop_cdn_loader(app)
    app.connect("builder-inited", _check_script)
    app.connect("html-page-context", _on_page)
    app.connect("build-finished", _copy_script)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
