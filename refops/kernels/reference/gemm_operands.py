"""Quantized GEMM operands: which usage a GEMM reads, dequantized exactly to fp32."""

from __future__ import annotations

import functools

import torch

__all__ = ["dequantize_gemm_operands"]


@functools.cache
def _quantized_tensor_type() -> type:
    """``QuantizedTensor``, imported on first use: refops.quantization is built on top of the kernels."""
    from ...quantization.quantized_tensor import QuantizedTensor

    return QuantizedTensor


def _reads_hadamard_domain(t: torch.Tensor, usage: str) -> bool:
    return usage == "columnwise" and bool(getattr(t, "_columnwise_rht", False))


def _dequantize(t: torch.Tensor, usage: str, name: str) -> torch.Tensor:
    if not t.has_usage(usage):  # type: ignore[attr-defined]
        dim = "last" if usage == "rowwise" else "first"
        raise ValueError(
            f"gemm: operand {name} is a {type(t).__name__} without {usage} data, which this GEMM reads "
            f"(it contracts {name}'s {dim} dim); quantize it with that usage enabled"
        )
    values = t.dequantize(dtype=torch.float32, usage=usage)  # type: ignore[attr-defined]
    return values.reshape(-1, values.shape[-1])  # leading dims flatten into rows


def dequantize_gemm_operands(
    a: torch.Tensor, b: torch.Tensor, *, trans_a: bool, trans_b: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, b)`` with every quantized operand replaced by its fp32 dequantization.

    The usage read is the one blocked along the contracted dim (recipes-numerics
    §3.1): ``op(a) = a`` contracts a's last dim -> row-wise, ``trans_a`` -> column-wise;
    ``op(b) = b.T`` (``trans_b``) -> row-wise, ``op(b) = b`` -> column-wise. NVFP4
    column-wise data with the random Hadamard transform is in the Hadamard domain;
    the transform cancels only when both operands carry it, so pairing it with
    anything else is an error. A quantized operand with more than two dims is
    flattened to ``(rows, last dim)`` after dequantizing.
    """
    QuantizedTensor = _quantized_tensor_type()
    if not isinstance(a, QuantizedTensor) and not isinstance(b, QuantizedTensor):
        return a, b  # plain operands: nothing to read or dequantize

    usages = {"a": "columnwise" if trans_a else "rowwise", "b": "rowwise" if trans_b else "columnwise"}
    operands = {"a": a, "b": b}
    hadamard = {n: isinstance(t, QuantizedTensor) and _reads_hadamard_domain(t, usages[n]) for n, t in operands.items()}
    if hadamard["a"] != hadamard["b"]:
        raise ValueError(
            "gemm: one operand is read from NVFP4 column-wise data in the Hadamard (RHT) domain and the other is "
            "not; the transform only cancels when both operands carry it (wgrad)"
        )
    out = [
        _dequantize(t, usages[n], n) if isinstance(t, QuantizedTensor) else t for n, t in operands.items()
    ]
    return out[0], out[1]
