"""The lifecycle tier: any module factory against the parameter-lifecycle contract (``docs/lifecycle.md``)."""

from .check import PROPERTIES, Property, check_lifecycle
from .report import Kind, LifecycleReport, PropertyResult, Status

__all__ = ["check_lifecycle", "LifecycleReport", "PropertyResult", "Status", "Kind", "Property", "PROPERTIES"]
