"""The command line: ``python -m refops {trace,check,bench,conformance}`` (also the ``refops`` console script)."""
