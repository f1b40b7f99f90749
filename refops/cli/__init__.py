"""The command line: ``python -m refops {trace,check,bench,conformance}`` (also the ``refops`` console script).

Each command parses its options, calls the library and prints what it returns: the check matrix is
:mod:`refops.testing.check_matrix`, the conformance run :mod:`refops.testing.conformance`, the demo
:mod:`refops.demo`; ``bench`` runs the fast path's benchmark (``python -m fastpath.benchmark``).
"""
