"""The shared helpers of tests/refops/ (``_cases.py``, ``_quantized.py``, ``_fake_te.py``, ...) importable from every subfolder.

The tests are laid out like the package (``tests/refops/ops/`` for ``refops/ops/``, ``tests/refops/testing/modules/``
for ``refops/testing/modules/``, ...) and import the helpers kept here by their plain names (``from _cases import ...``).
pytest's default import mode puts only a test file's own folder on ``sys.path``; this puts tests/refops/ there too,
before any test module of the tree is imported.
"""

import pathlib
import sys

HELPERS = str(pathlib.Path(__file__).resolve().parent)
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)
