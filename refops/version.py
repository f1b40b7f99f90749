"""The version of refops (one home: the package, its records and the conformance report read it here)."""

__version__ = "0.1.0"
