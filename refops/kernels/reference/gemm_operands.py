"""Quantized GEMM operands: which usage a GEMM reads, as ``GemmOperand`` plain arrays.

A quantized operand is anything with ``gemm_operand(usage)`` (``refops.quantization``'s tensors) or
a ``GemmOperand`` itself; this module never imports ``refops.quantization``.
"""

from __future__ import annotations

from typing import Union

import torch

from ..gemm_operand import GemmOperand, gemm_operand_of, is_gemm_operand_source

__all__ = ["dequantize_gemm_operands", "gemm_operands", "gemm_usages"]

Operand = Union[torch.Tensor, GemmOperand]


def gemm_usages(trans_a: bool, trans_b: bool) -> dict[str, str]:
    """The usage blocked along the contracted dim (``docs/recipes/index.md#roles-usages-and-gemms``):
    ``op(a) = a`` contracts a's last dim -> row-wise, ``trans_a`` -> column-wise; ``op(b) = b.T``
    (``trans_b``) -> row-wise, ``op(b) = b`` -> column-wise."""
    return {"a": "columnwise" if trans_a else "rowwise", "b": "rowwise" if trans_b else "columnwise"}


def gemm_operands(
    a: object, b: object, *, trans_a: bool, trans_b: bool, values: bool = True
) -> tuple[Operand, Operand]:
    """``(a, b)`` with every quantized operand replaced by its ``GemmOperand`` (plain tensors as they are).

    NVFP4 column-wise data with the random Hadamard transform is in the Hadamard domain; the transform
    cancels only when both operands carry it, so pairing it with anything else is an error.
    """
    operands = {"a": a, "b": b}
    if not any(is_gemm_operand_source(t) for t in operands.values()):
        return a, b  # type: ignore[return-value]  # plain operands: nothing to read
    usages = gemm_usages(trans_a, trans_b)
    out = {
        n: gemm_operand_of(t, usages[n], n, values=values) if is_gemm_operand_source(t) else t
        for n, t in operands.items()
    }
    hadamard = [isinstance(t, GemmOperand) and t.hadamard for t in out.values()]
    if hadamard[0] != hadamard[1]:
        raise ValueError(
            "gemm: one operand is read from NVFP4 column-wise data in the Hadamard (RHT) domain and the other is "
            "not; the transform only cancels when both operands carry it (wgrad)"
        )
    return out["a"], out["b"]


def dequantize_gemm_operands(
    a: object, b: object, *, trans_a: bool, trans_b: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, b)`` with every quantized operand replaced by its exact fp32 dequantization, flattened to
    ``(rows, last dim)`` (the nominal orientation: ``trans_*`` still apply)."""
    a2, b2 = gemm_operands(a, b, trans_a=trans_a, trans_b=trans_b)
    out = []
    for name, t in (("a", a2), ("b", b2)):
        if isinstance(t, GemmOperand):
            if t.values is None:
                raise ValueError(f"gemm: GemmOperand {name} carries no values to multiply exactly")
            t = t.values
        out.append(t)
    return out[0], out[1]
