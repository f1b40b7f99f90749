"""The quantized operands of the fast path's GEMMs, read through the kernel interface's seam.

A GEMM sees a quantized tensor only as the plain arrays of its ``gemm_operand(usage)``
(``refops.kernels.GemmOperand``: bytes, scales and the names of their layout, :mod:`refops.layouts`), as the
reference backend does; nothing here reads a quantized tensor's attributes or imports ``refops.quantization``.
"""

from __future__ import annotations

from typing import Optional

import torch

from refops.kernels.gemm_operand import GemmOperand, gemm_operand_of, is_gemm_operand_source

__all__ = ["read_operand"]


def read_operand(t: object, usage: str, name: str) -> Optional[GemmOperand]:
    """``t``'s ``GemmOperand`` for ``usage`` without its exact values, or None: ``t`` is not quantized, or the fast
    path leaves the GEMM to the reference (which raises the errors): a quantized tensor of fewer than 2 dims, or
    without ``usage`` data (a ``GemmOperand`` given directly is 2-D; one of the other usage is refused likewise)."""
    if not is_gemm_operand_source(t) or (isinstance(t, torch.Tensor) and t.dim() < 2):
        return None
    try:
        return gemm_operand_of(t, usage, name, values=False)
    except ValueError:  # the usage this GEMM reads is missing
        return None
