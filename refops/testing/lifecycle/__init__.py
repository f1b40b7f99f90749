"""The lifecycle tier: any module factory against the parameter-lifecycle contract (lifecycle.md)."""

from .check import check_lifecycle
from .report import LifecycleReport, PropertyResult, Status

__all__ = ["check_lifecycle", "LifecycleReport", "PropertyResult", "Status"]
