"""``GemmOperand``: what a GEMM reads of a quantized tensor, as plain arrays.

The kernel interface's ``gemm`` takes plain tensors or quantized operands. A quantized tensor
(``refops.quantization``) describes itself to the GEMM through ``gemm_operand(usage)``, which
returns this frozen record: plain arrays (the bytes, the scale inverses, the exact fp32 values)
and the names of their format and layout. ``refops.kernels`` therefore never imports
``refops.quantization``; the quantization package is built on top of the kernels, not the
other way round (``tests/kernels/test_gemm_seam.py`` checks it in a fresh interpreter).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

__all__ = ["GemmOperand", "FORMATS", "gemm_operand_of", "is_gemm_operand_source"]

#: Format names a ``GemmOperand`` may carry (one per ``QuantizedTensor`` class).
FORMATS = ("float8", "float8_block", "mxfp8", "nvfp4")


@dataclasses.dataclass(frozen=True)
class GemmOperand:
    """One quantized GEMM operand, read in the usage blocked along the contracted dim.

    * ``format``: ``"float8"`` (per-tensor FP8, delayed or current scaling), ``"float8_block"``,
      ``"mxfp8"`` or ``"nvfp4"``.
    * ``usage``: ``"rowwise"`` (the tensor's last dim is contracted) or ``"columnwise"``
      (its leading dims, flattened, are contracted).
    * ``shape``: the tensor's nominal shape flattened to 2-D, ``(rows, last dim)``.
    * ``values``: the exact fp32 dequantization, ``shape``; None when not asked for.
    * ``data``: for ``"float8"``, the FP8 bytes (``uint8``) as the GEMM reads them, 2-D row-major
      with the contracted dim last: the row-wise data ``(rows, last)`` or the column-wise
      (transposed) copy ``(last, rows)``. None for the block-scaled formats, whose GEMMs the
      reference computes from ``values``.
    * ``scale_inv``: for ``"float8"``, the one-element fp32 scale inverse; else None.
    * ``fp8_dtype``: for ``"float8"``, ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
    * ``hadamard``: the data is in the random-Hadamard-transform domain (NVFP4 column-wise
      with RHT); the transform cancels only when both operands carry it.
    """

    format: str
    usage: str
    shape: tuple[int, int]
    values: Optional[torch.Tensor] = None
    data: Optional[torch.Tensor] = None
    scale_inv: Optional[torch.Tensor] = None
    fp8_dtype: Optional[torch.dtype] = None
    hadamard: bool = False

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"GemmOperand: format must be one of {FORMATS}, got {self.format!r}")
        if self.usage not in ("rowwise", "columnwise"):
            raise ValueError(f"GemmOperand: usage must be 'rowwise' or 'columnwise', got {self.usage!r}")

    @property
    def contracted(self) -> int:
        """The length of the contracted dim (K)."""
        return self.shape[1] if self.usage == "rowwise" else self.shape[0]

    @property
    def device(self) -> torch.device:
        for t in (self.data, self.values, self.scale_inv):
            if t is not None:
                return t.device
        return torch.device("cpu")


def is_gemm_operand_source(t: object) -> bool:
    """``t`` is a quantized operand: a ``GemmOperand`` or a tensor that produces one."""
    return isinstance(t, GemmOperand) or callable(getattr(t, "gemm_operand", None))


def gemm_operand_of(t: object, usage: str, name: str, *, values: bool = True) -> GemmOperand:
    """``t``'s ``GemmOperand`` for ``usage`` (``t`` itself when it already is one)."""
    if isinstance(t, GemmOperand):
        if t.usage != usage:
            raise ValueError(f"gemm: operand {name} is a GemmOperand of {t.usage} data; this GEMM reads {usage} data")
        return t
    return t.gemm_operand(usage, values=values, name=name)  # type: ignore[attr-defined]
