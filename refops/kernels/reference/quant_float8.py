"""Per-tensor FP8 numerics (delayed and current scaling): amax, scale from amax, cast, dequantize.

``docs/recipes/index.md#two-primitives-every-fp8-recipe-shares``, ``docs/recipes/delayed-scaling.md``,
``docs/recipes/current-scaling.md``. ``RN(.)`` is one IEEE fp32
round-to-nearest-even step. A quotient of two fp32 values computed in fp64 and
rounded once to fp32 *is* ``RN`` of the exact quotient (fp64 has more than
2*24+2 bits), so divisions below go through fp64 on every device.
"""

from __future__ import annotations

import torch

from ...formats import E4M3, E5M2, Float8Format, bits_from_fp32, fp32_from_bits
from ...layouts import columnwise_layout  # also still imported from here by the sharding modules

__all__ = [
    "float8_format",
    "abs_max",
    "amax",
    "compute_scale_from_amax",
    "reciprocal_rn",
    "quantize_float8",
    "dequantize_float8",
]

_FORMATS = {torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}
# Keeps the sign and exponent bits of an fp32: 2^floor(log2 s) for positive s.
_EXPONENT_MASK = -0x00800000  # int32 view of 0xFF800000


def float8_format(fp8_dtype: torch.dtype) -> Float8Format:
    """The :class:`Float8Format` of ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``."""
    try:
        return _FORMATS[fp8_dtype]
    except KeyError:
        raise ValueError(f"unsupported FP8 dtype {fp8_dtype}; expected torch.float8_e4m3fn or torch.float8_e5m2")


def _may_hold_nan(t: torch.Tensor) -> bool:
    """Whether ``t`` holds a NaN. Reading that on the host is refused while a CUDA graph is being
    captured, so there the answer is "maybe" (True) and the caller takes its NaN-safe path every time."""
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return True
    return bool(torch.isnan(t).any())


def abs_max(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``max |x|`` over ``dim`` (over every element when None), fp32, NaNs skipped like CUDA's ``fmaxf``.

    Exact: ``max |x| = max(|max x|, |min x|)``, the max of exactly converted
    values. The reductions read ``x`` and write nothing of its size (``aminmax``
    over everything; ``amax`` and ``amin`` along a dim, where torch's CPU kernels
    for them are faster). They propagate NaN, so a NaN result means a NaN among
    its elements: only then is the max taken again with NaNs counted as 0 (an
    all-NaN region gives 0). ``x`` must not be empty along ``dim``.
    """
    lo, hi = torch.aminmax(x) if dim is None else (x.amin(dim=dim), x.amax(dim=dim))
    result = torch.maximum(lo.abs(), hi.abs()).float()
    if _may_hold_nan(result):
        nan_free = torch.where(torch.isnan(x), torch.zeros_like(x), x.abs())
        result = (nan_free.amax() if dim is None else nan_free.amax(dim=dim)).float()
    return result


def amax(x: torch.Tensor) -> torch.Tensor:
    """``max |x|`` over every element, as an fp32 tensor of shape (1,).

    Exact (the max of exactly converted values). NaNs are skipped, like CUDA's
    ``fmaxf``; an empty tensor (or an all-NaN one) gives 0.
    """
    if x.numel() == 0:
        return torch.zeros(1, dtype=torch.float32, device=x.device)
    return abs_max(x.detach()).reshape(1)


def reciprocal_rn(scale: torch.Tensor) -> torch.Tensor:
    """``RN(1 / scale)`` in fp32 (exact for powers of two)."""
    return (1.0 / scale.double()).float()


def compute_scale_from_amax(
    amax: torch.Tensor,
    *,
    fmax: float,
    force_pow_2_scales: bool,
    amax_epsilon: float,
    value_for_inf: float,
) -> torch.Tensor:
    """TE's ``compute_scale_from_amax`` (``recipe_common.cuh``), element-wise on fp32 amaxes.

    1. ``a = max(a, eps)`` (a NaN amax fails the comparison and passes through);
    2. ``a`` inf, NaN or 0 gives scale 1;
    3. ``scale = RN(fmax / a)``;
    4. ``scale = +inf`` (tiny ``a``) becomes ``value_for_inf``;
    5. pow2: the 23 mantissa bits are zeroed, i.e. the scale rounds *down* to 2^k.
    """
    a = amax.float().clamp_min(amax_epsilon)  # clamp keeps NaN
    degenerate = ~torch.isfinite(a) | (a == 0)
    scale = (float(fmax) / a.double()).float()
    scale = torch.where(scale == float("inf"), value_for_inf, scale)
    if force_pow_2_scales:
        scale = fp32_from_bits(bits_from_fp32(scale) & _EXPONENT_MASK).reshape(scale.shape)
    return torch.where(degenerate, 1.0, scale)


def quantize_float8(
    x: torch.Tensor,
    scale: torch.Tensor,
    *,
    fp8_dtype: torch.dtype,
    rowwise: bool,
    columnwise: bool,
    amax_accumulator: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``KernelBackend.quantize_float8`` (the contract): ``q = Q_F(RN(x * scale))``; the column-wise copy is
    :func:`refops.layouts.columnwise_layout` of the same bytes, and both share the one ``scale_inv``."""
    fmt = float8_format(fp8_dtype)
    scale = scale.reshape(1).float()
    q = fmt.quantize(x.float() * scale, overwrite=True).view(torch.uint8)  # the product is a fresh fp32 tensor
    scale_inv = reciprocal_rn(scale)
    if amax_accumulator is not None:
        amax_accumulator.copy_(torch.fmax(amax_accumulator, amax(x).to(amax_accumulator.device)))
    rowwise_data = q if rowwise else None
    columnwise_data = columnwise_layout(q) if columnwise else None
    return rowwise_data, scale_inv, columnwise_data, scale_inv


def dequantize_float8(
    data: torch.Tensor, scale_inv: torch.Tensor, *, fp8_dtype: torch.dtype, out_dtype: torch.dtype
) -> torch.Tensor:
    """``KernelBackend.dequantize_float8``: ``RN(float(q) * scale_inv)`` in fp32, then one rounding."""
    return (float8_format(fp8_dtype).to_fp32(data) * scale_inv.reshape(1).float()).to(out_dtype)
