"""The command line: ``python -m refops {trace,check,bench}`` (also the ``refops`` console script)."""
