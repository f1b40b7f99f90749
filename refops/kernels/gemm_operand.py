"""``GemmOperand``: what a GEMM reads of a quantized tensor, as plain arrays.

The kernel interface's ``gemm`` takes plain tensors or quantized operands. A quantized tensor
(``refops.quantization``) describes itself to the GEMM through ``gemm_operand(usage)``, which
returns this frozen record: plain arrays (the bytes, the scale inverses, the exact fp32 values)
and the names of their format and layout. A backend's GEMM reads nothing else of the tensor
(``tests/refops/kernels/test_gemm_operand.py`` checks the arrays for every recipe and usage, and that the
fast path touches no private attribute of a quantized tensor). ``refops.kernels`` therefore never
imports ``refops.quantization``; the quantization package is built on top of the kernels, not the
other way round (``tests/refops/kernels/test_gemm_numerics.py`` checks it in a fresh interpreter).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:  # annotations only: the interface does not import this module's callers
    from .interface import KernelBackend

__all__ = ["GemmOperand", "FORMATS", "dequantize_gemm_operand", "gemm_operand_of", "is_gemm_operand_source"]

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
    * ``data``: the stored bytes (``uint8``) of ``usage`` as a 2-D row-major view, laid out as
      :mod:`refops.layouts` describes: for ``"float8"`` and ``"float8_block"`` with the contracted dim
      last, the row-wise data ``(rows, last)`` or the column-wise (transposed) copy ``(last, rows)``;
      for ``"nvfp4"`` likewise, two E2M1 codes a byte along it (``(rows, last/2)`` or ``(last, rows/2)``);
      for ``"mxfp8"`` ``(rows, last)`` in both usages (its column-wise blocks run down the rows).
    * ``scale_inv``: the scale inverses of ``data`` in the tensor's stored (padded) layout: the one-element
      fp32 tensor (``"float8"``), the GEMM-ready fp32 block scales (``"float8_block"``), the E8M0 bytes
      (``"mxfp8"``), the E4M3 block-scale bytes (``"nvfp4"``).
    * ``fp8_dtype``: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` (the FP8 formats); else None.
    * ``block_scaling_dim``: ``"float8_block"`` only: 1 (1x128 blocks) or 2 (128x128 tiles).
    * ``amax``, ``e4m3_max``: ``"nvfp4"`` only: the fp32 global amax (``(1,)``, or one per data row) and
      the ``E`` of its global scale (448, or 256 under 4over6).
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
    block_scaling_dim: Optional[int] = None
    amax: Optional[torch.Tensor] = None
    e4m3_max: Optional[float] = None

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


def dequantize_gemm_operand(op: GemmOperand, backend: "KernelBackend", dtype: torch.dtype) -> torch.Tensor:
    """``op``'s values, ``op.shape`` (the nominal orientation), by ``backend``'s dequantize kernel of its format,
    rounded once to ``dtype``: bit for bit the flattened ``dequantize(dtype=dtype, usage=op.usage)`` of the tensor
    that made ``op`` (NVFP4 column-wise data with the RHT stays in the Hadamard domain)."""
    if op.data is None or op.scale_inv is None:
        raise ValueError(f"dequantize_gemm_operand: the {op.format} operand carries no data or scales")
    columnwise = op.usage == "columnwise"
    if op.format == "mxfp8":
        return backend.dequantize_mxfp8(op.data, op.scale_inv, fp8_dtype=op.fp8_dtype, columnwise=columnwise,
                                        out_dtype=dtype)
    if op.format == "nvfp4":
        return backend.dequantize_nvfp4(op.data, op.scale_inv, op.amax, shape=op.shape, columnwise=columnwise,
                                        e4m3_max=op.e4m3_max, out_dtype=dtype)
    if op.format == "float8":
        values = backend.dequantize_float8(op.data, op.scale_inv, fp8_dtype=op.fp8_dtype, out_dtype=dtype)
    else:
        values = backend.dequantize_float8_block(op.data, op.scale_inv, fp8_dtype=op.fp8_dtype,
                                                 columnwise=columnwise, block_scaling_dim=op.block_scaling_dim,
                                                 out_dtype=dtype)
    return values.t().contiguous() if columnwise else values  # the transposed copy, back to (rows, last)
