"""The reference GEMM under ``gemm_numerics("hopper")``: what an H100 / H200 tensor core computes.

Per-tensor FP8 operands (``GemmOperand`` of format ``"float8"``) go to ``mmaemu.scaled_mm`` with the
``hopper`` profile: the FP8 bytes, the two scale inverses and ``use_fast_accum`` from the GEMM's role
(``SPLIT_ACCUMULATOR``). mmaemu models the tensor core's block-wise alignment and truncation of
products and the accumulator width of fast accumulation; its fp32 result is ``RN(acc * RN(sa * sb))``,
as cuBLASLt's epilogue. Plain fp32 operands are rounded to TF32 (10 mantissa bits, round to nearest
even), as cuBLAS's ``CUBLAS_COMPUTE_32F_FAST_TF32`` that TE selects for fp32 GEMMs, then multiplied
exactly in fp32. Anything else raises ``HopperGemmError``: the mode never falls back silently.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch

from ..gemm_numerics import SPLIT_ACCUMULATOR, HopperGemmError, current_split_k
from ..gemm_operand import GemmOperand
from .gemm import epilogue_fp32

__all__ = ["hopper_fp8_gemm", "load_mmaemu", "round_to_tf32", "MMAEMU_EXTRA"]

MMAEMU_EXTRA = "refops[hopper]"
#: mmaemu's profiles: "hopper" (torch._scaled_mm on an H100 PCIe; used with split_k=1, which needs no
#: split-K table) and "hopper-te" (TE's cuBLASLt workspace and alignment; its table decides split_k="auto").
_PROFILES = {1: "hopper", "auto": "hopper-te"}


def load_mmaemu():
    """``mmaemu``, or a ``HopperGemmError`` naming the extra that installs it."""
    try:
        module = importlib.import_module("mmaemu")
        module.scaled_mm  # noqa: B018  (resolves the lazy attribute: a broken install fails here)
    except ImportError as error:
        raise HopperGemmError(
            f"gemm_numerics('hopper') needs the optional package mmaemu (Hopper tensor-core emulation): "
            f"pip install '{MMAEMU_EXTRA}' (or pip install mmaemu>=0.1.0); importing it failed: {error}"
        ) from error
    return module


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``x`` rounded to TF32 (8 exponent bits, 10 mantissa bits), round to nearest even.

    Inf and NaN pass unchanged; a value rounding past the largest TF32 value becomes Inf, as RNE does.
    """
    x = x.float().contiguous()
    bits = x.view(torch.int32)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0x0FFF + lsb) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)


def _fp8_operands(a: GemmOperand, b: GemmOperand) -> tuple[torch.Tensor, torch.Tensor]:
    for name, op in (("a", a), ("b", b)):
        if op.format != "float8":
            raise HopperGemmError(
                f"gemm_numerics('hopper') covers per-tensor FP8 GEMMs (delayed and current scaling) and fp32 "
                f"GEMMs (TF32) only; operand {name} is {op.format} (mmaemu 0.1 models tensor-wise scales only). "
                f"Run this recipe under gemm_numerics('exact')"
            )
        if op.data is None or op.scale_inv is None or op.fp8_dtype is None:
            raise HopperGemmError(f"gemm_numerics('hopper'): operand {name} carries no FP8 bytes or scale")
        if op.hadamard:
            raise HopperGemmError("gemm_numerics('hopper'): an operand is in the Hadamard domain (NVFP4 RHT)")
    k = a.data.shape[1]
    if b.data.shape[1] != k:
        raise ValueError(f"gemm: contracted dims differ ({k} and {b.data.shape[1]})")
    if k % 16:
        raise HopperGemmError(
            f"gemm_numerics('hopper'): the contracted dim K = {k} is not a multiple of 16; Transformer Engine "
            f"refuses FP8 GEMMs with such dims on Hopper (cuBLASLt needs 16-byte aligned leading dims), so there "
            f"is nothing to model. gemm_numerics('exact') computes them"
        )
    mat1 = a.data.contiguous().view(a.fp8_dtype)
    mat2 = b.data.contiguous().view(b.fp8_dtype).t()  # (K, N) column-major, as cuBLASLt reads the second operand
    return mat1, mat2


def hopper_fp8_gemm(
    a: GemmOperand,
    b: GemmOperand,
    *,
    role: str,
    target: torch.dtype,
    alpha: float,
    out: Optional[torch.Tensor],
    accumulate: bool,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``alpha * A @ B^T (+ out) (+ bias)`` of two per-tensor FP8 operands read with the contracted dim last.

    The tensor core's fp32 result comes from mmaemu; ``alpha != 1``, ``accumulate`` and ``bias`` are then
    applied in fp32 and the sum rounded once to ``target``, as the exact mode does (cuBLASLt folds them into
    its epilogue: its bits there are not modelled, see docs/tensor-cores.md).
    """
    mat1, mat2 = _fp8_operands(a, b)
    mmaemu = load_mmaemu()
    split_k = current_split_k()
    direct = alpha == 1.0 and not accumulate and bias is None
    try:
        result = mmaemu.scaled_mm(
            mat1, mat2, a.scale_inv.reshape(()).float(), b.scale_inv.reshape(()).float(),
            out_dtype=target if direct else torch.float32, use_fast_accum=not SPLIT_ACCUMULATOR[role],
            profile=_PROFILES[split_k], splitk=split_k,
        )
    except mmaemu.MmaemuError as error:
        raise HopperGemmError(
            f"gemm_numerics('hopper'): mmaemu cannot compute this {role} GEMM "
            f"(M={mat1.shape[0]}, N={mat2.shape[1]}, K={mat1.shape[1]}, {mat1.dtype} x {mat2.dtype}, "
            f"split_k={split_k!r}): {type(error).__name__}: {error}"
        ) from error
    if not direct:
        result = epilogue_fp32(result, alpha=alpha, out=out, accumulate=accumulate, bias=bias).to(target)
    return result
