"""Plain-torch peers of refops's reference quantizers, for ``bench_reference.py``.

Each function is the straightforward formulation a user would otherwise write (or call), following the
algorithms TransformerEngine publishes in its pure-torch reference quantizers (facts taken, no code
copied): per-tensor FP8 current scaling, blockwise FP8 (1x128 and 128x128 blocks, power-of-two fp32
scales) and NVFP4 (1x16 blocks, E4M3 block scales under an fp32 global scale, E2M1 round-to-nearest-even
by interval masks); plus a plain MXFP8 (1x32 blocks, E8M0 scales rounded up to a power of two) so there
is always an MXFP8 ratio, and torchao's ``to_mx`` with RCEIL when torchao is installed.

Every peer returns plain tensors (data bytes and the valid region of the scales) so the benchmark can
assert that they are byte-identical to refops's outputs before timing anything. The peers assume
finite inputs (the benchmark's tensors are): they do not skip NaNs the way TE's kernels do.

Divisions by a tensor are written ``torch.div(c, t)``: ``c / t`` is evaluated as ``t.reciprocal() * c``,
which rounds twice and is not TE's ``RN(c / t)``.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "per_tensor_fp8",
    "block_fp8",
    "mxfp8",
    "nvfp4",
    "torchao_to_mx",
    "torchao_available",
    "torchao_log2_blocks",
]

_FMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_FLT_MAX = torch.finfo(torch.float32).max


def per_tensor_fp8(x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data bytes, scale_inv)``: amax, ``scale = fmax / amax``, ``x * scale``, clamp, cast."""
    fmax = _FMAX[fp8_dtype]
    xf = x.float()
    amax = xf.abs().amax()
    scale = torch.where(amax > 0, torch.div(fmax, amax), torch.ones_like(amax))
    data = (xf * scale).clamp(-fmax, fmax).to(fp8_dtype)
    return data.view(torch.uint8), scale.reciprocal().reshape(1)


def _pow2_floor(scale: torch.Tensor) -> torch.Tensor:
    """Zero the 23 mantissa bits: ``2^floor(log2 scale)``."""
    return (scale.view(torch.int32) & -0x00800000).view(torch.float32)


def block_fp8(
    x: torch.Tensor, block_rows: int, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data bytes (M, K), scale_inv (M/block_rows, K/128))`` with power-of-two scales.

    Tiles of ``block_rows`` x 128 (1 or 128 rows); M and K must be multiples of the tile.
    ``scale = 2^floor(log2(fmax / amax))`` (1 for an all-zero tile), ``q = clamp(x * scale)``.
    """
    fmax = _FMAX[fp8_dtype]
    m, k = x.shape
    tiles = x.float().reshape(m // block_rows, block_rows, k // 128, 128)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True)
    scale = torch.where(amax > 0, torch.div(fmax, amax), torch.ones_like(amax))
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, torch.finfo(x.dtype).max), scale)
    scale = _pow2_floor(scale)
    data = (tiles * scale).clamp(-fmax, fmax).to(fp8_dtype).reshape(m, k)
    return data.view(torch.uint8), scale.reciprocal().reshape(m // block_rows, k // 128)


def mxfp8(x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data bytes (M, K), E8M0 bytes (M, K/32))``: ``e = ceil(log2(amax / fmax))`` by exponent bits.

    The exponent of ``amax / fmax`` plus one when its mantissa is nonzero; an all-zero block gets 0.
    """
    fmax = _FMAX[fp8_dtype]
    m, k = x.shape
    blocks = x.float().reshape(m, k // 32, 32)
    amax = blocks.abs().amax(dim=2, keepdim=True)
    bits = (amax / fmax).view(torch.int32)
    e = (bits >> 23) + ((bits & 0x7FFFFF) > 0).to(torch.int32)
    multiplier = ((254 - e).clamp_min(1) << 23).view(torch.float32)  # 2^(127 - e)
    data = (blocks * multiplier).clamp(-fmax, fmax).to(fp8_dtype).reshape(m, k)
    return data.view(torch.uint8), e.reshape(m, k // 32).to(torch.uint8)


# E2M1 by interval masks: values on a closed end belong to the even code (round half to even).
_E2M1_INTERVALS = (
    (0.0, 0.25, True, True, 0),
    (0.25, 0.75, False, False, 1),
    (0.75, 1.25, True, True, 2),
    (1.25, 1.75, False, False, 3),
    (1.75, 2.5, True, True, 4),
    (2.5, 3.5, False, False, 5),
    (3.5, 5.0, True, True, 6),
)


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of ``v`` (RNE, values above 5 give 6): one mask per rounding interval, sign in bit 3."""
    a = v.abs()
    codes = torch.full(v.shape, 7, dtype=torch.uint8)  # above 5: 6
    for lo, hi, lo_closed, hi_closed, code in _E2M1_INTERVALS:
        above = a >= lo if lo_closed else a > lo
        below = a <= hi if hi_closed else a < hi
        codes[above & below] = code
    codes[torch.signbit(v)] += 8
    return codes


def nvfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed data (M, K/2), E4M3 scale bytes (M, K/16), global amax)``, rowwise, no RHT or SR.

    ``S_enc = 2688 / A`` (1 when A is 0), ``s_b = E4M3(b * (S_enc * fl(1/6)))``,
    ``enc_b = 1 / (s_b * (1 / S_enc))`` (FLT_MAX for a zero scale), ``q = E2M1(x * enc_b)``;
    element ``2j`` in the low nibble.
    """
    m, k = x.shape
    xf = x.float()
    amax = xf.abs().amax().reshape(1)
    s_enc = torch.where(amax > 0, torch.div(448.0 * 6.0, amax), torch.ones_like(amax)).clamp_max(_FLT_MAX)
    s_dec = 1.0 / s_enc
    blocks = xf.reshape(m, k // 16, 16)
    block_amax = blocks.abs().amax(dim=2, keepdim=True)
    one_sixth = torch.tensor(1.0 / 6.0, dtype=torch.float32)
    s_b = (block_amax * (s_enc * one_sixth)).clamp(max=448.0).to(torch.float8_e4m3fn)
    enc = (1.0 / (s_b.float() * s_dec)).clamp_max(_FLT_MAX)
    codes = _e2m1_codes(blocks * enc).reshape(m, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, s_b.reshape(m, k // 16).view(torch.uint8), amax


# ------------------------------------------------------------------ torchao
def torchao_available() -> Optional[str]:
    """None when ``torchao.prototype.mx_formats`` imports, else the reason it does not."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.prototype.mx_formats.mx_tensor import to_mx  # noqa: F401
    except Exception as exc:  # ImportError, or a torchao built for another torch
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def torchao_to_mx(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data bytes (M, K), E8M0 bytes (M, K/32))`` from ``to_mx(x, e4m3, 32, RCEIL)``."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scale, data = to_mx(x, torch.float8_e4m3fn, 32, scaling_mode=ScaleCalculationMode.RCEIL)
    m, k = x.shape
    return data.view(torch.uint8).reshape(m, k), scale.view(torch.uint8).reshape(m, k // 32)


def torchao_log2_blocks(x: torch.Tensor) -> torch.Tensor:
    """Blocks (M, K/32) where torchao's RCEIL scale is known to differ from TE's: bool mask.

    torchao's eager RCEIL takes ``ceil(log2(amax / 448))`` with an fp32 ``log2``, which rounds onto the
    integer ``k`` when ``amax / 448`` is a hair above ``2^k``; TE rounds that block's scale up to
    ``2^(k+1)`` (``cvt.rp``). Everywhere else the two agree byte for byte.
    """
    m, k = x.shape
    descale = x.float().reshape(m, k // 32, 32).abs().amax(dim=2) / 448.0
    log2 = torch.log2(descale)
    not_pow2 = (descale.view(torch.int32) & 0x7FFFFF) != 0
    return not_pow2 & (log2 == torch.round(log2))
