"""The quantizer tier: a candidate quantizing kernel against the reference, bit for bit, on adversarial inputs."""

from .check import check_quantizer
from .report import CaseRun, QuantizerCheckReport, QuantizerMismatch

__all__ = ["check_quantizer", "CaseRun", "QuantizerCheckReport", "QuantizerMismatch"]
