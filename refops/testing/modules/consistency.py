"""Self-consistency of a candidate's quantized parameters: every copy a quantized tensor holds says the same value.

A quantized weight keeps a row-wise copy (the forward GEMM's operand) and often a column-wise one (the
dgrad GEMM's). Both must be quantizations of the same high-precision values: a column-wise copy left from
before an optimizer step, or from a forward that needed no backward, is stale, and a reference that took
it over would compute the same wrong dgrad. So the oracle never copies quantized arrays into the reference
(it gives the reference the candidate's values) and checks each quantized parameter on its own:

* per-tensor FP8 (delayed and current scaling): the column-wise copy is the transpose of the row-wise bytes,
  so the two dequantize to the same values, bit for bit;
* block formats (MXFP8, FP8 blocks, NVFP4 without the Hadamard transform): each copy quantizes the same
  values along another axis, so they may differ by half a code step each: ``|row - col| <= 2^-m max(|row|,
  |col|)`` (``m`` the element format's mantissa bits), plus twice the subnormal step of the tensor's largest
  scale on each side.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ...quantization.dtensor import is_dtensor
from ...formats import E2M1_MAX
from ...quantization import Float8Tensor, NVFP4Tensor, QuantizedTensor
from ...quantization.quantizer import torch_fp8_dtype
from ..tensor_report import TensorComparison, compare_tensors

__all__ = ["check_quantized_parameters"]

#: (mantissa bits, smallest normal exponent, largest finite value) of each element format.
_FORMATS = {torch.float8_e4m3fn: (3, -6, 448.0), torch.float8_e5m2: (2, -14, 57344.0), "e2m1": (1, 0, E2M1_MAX)}


def check_quantized_parameters(module: torch.nn.Module, when: str) -> list[TensorComparison]:
    """One comparison per quantized parameter of ``module`` that holds both usages (named ``"<param> usages
    agree (<when>)"``)."""
    out = []
    for name, p in module.named_parameters():
        if is_dtensor(p):  # an FSDP2 shard: this rank's quantized rows, checked where they live
            p, name = p.to_local(), f"{name} (this rank's shard)"
        if not isinstance(p, QuantizedTensor) or not (p.has_usage("rowwise") and p.has_usage("columnwise")):
            continue
        if getattr(p.quantizer, "with_rht", False):
            continue  # the column-wise copy is of the Hadamard-transformed values: no element-wise relation
        label = f"{name} usages agree ({when})"
        rows = p.dequantize(dtype=torch.float32, usage="rowwise").detach().double()
        cols = p.dequantize(dtype=torch.float32, usage="columnwise").detach().double()
        if isinstance(p, Float8Tensor):
            result = compare_tensors(label, cols, rows, tier="exact")
            why = ("why: the column-wise copy is not the transpose of the row-wise bytes: one of them is stale "
                   "(not re-quantized after the weight changed)")
        else:
            result = _within_code_steps(label, p, rows, cols)
            why = ("why: the row-wise and column-wise copies differ by more than two half code steps: they are not "
                   "quantizations of the same values (one is stale)")
        out.append(_as_consistency(result, why))
    return out


def _element_format(t: QuantizedTensor) -> Optional[tuple[int, int, float]]:
    if isinstance(t, NVFP4Tensor):
        return _FORMATS["e2m1"]
    dtype = getattr(t, "_fp8_dtype", None)
    return _FORMATS.get(torch_fp8_dtype(dtype)) if dtype is not None else None


def _within_code_steps(label: str, t: QuantizedTensor, rows: torch.Tensor, cols: torch.Tensor) -> TensorComparison:
    mantissa, emin, fmax = _element_format(t) or _FORMATS[torch.float8_e4m3fn]
    amax = float(torch.maximum(rows.abs().amax(), cols.abs().amax())) if rows.numel() else 0.0
    subnormal_step = 2.0 * amax / fmax * 2.0 ** (emin - mantissa)  # a block scale may round up to twice amax/fmax
    bound = 2.0 ** -mantissa * torch.maximum(rows.abs(), cols.abs()) + 2 * subnormal_step
    bad = (rows - cols).abs() > bound
    exact = compare_tensors(label, cols, rows, tier="exact")
    return dataclasses.replace(
        exact, passed=not bool(bad.any()), num_mismatches=int(bad.sum()),
        first_mismatches=tuple(tuple(int(i) for i in idx) for idx in torch.nonzero(bad)[:5].tolist()),
        criterion=f"|row-wise - column-wise| <= 2^-{mantissa} max(|row-wise|, |column-wise|) + two subnormal steps",
    )


def _as_consistency(result: TensorComparison, why: str) -> TensorComparison:
    return dataclasses.replace(result, tier="consistency", kind="consistency", why="" if result.passed else why)
