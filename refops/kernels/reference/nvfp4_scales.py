"""NVFP4's two-level scale factors: the per-tensor (or per-row) encode / decode scales from a global
amax, the E4M3 block scales (standard and 4over6's two candidates) and the per-block encode multiplier.

Part of the byte-exact NVFP4 specification (:mod:`.quant_nvfp4`, ``docs/recipes/nvfp4.md#the-arithmetic``): every
step is one fp32 torch operation, rounding once; ``fl(c)`` is the constant ``c`` rounded to fp32 and
``fminf`` the C function (a NaN operand yields the other operand).
"""

from __future__ import annotations

import torch

from ...formats import E4M3, FLT_MAX, fp32_from_bits

__all__ = [
    "fl",
    "fminf",
    "nvfp4_global_scale",
    "nvfp4_block_scale",
    "nvfp4_4over6_block_scales",
    "nvfp4_block_encode_multiplier",
]

_FL_ONE_SIXTH_BITS = 0x3E2AAAAB  # fl(1/6)


def fl(value: float, like: torch.Tensor) -> torch.Tensor:
    """``fl(value)`` as a 0-dim fp32 tensor on ``like``'s device (the double rounded once)."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def fminf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C ``fminf``: the smaller operand; a NaN ``a`` yields ``b``."""
    return torch.where(torch.isnan(a), b, torch.minimum(a, b))


def nvfp4_global_scale(amax: torch.Tensor, *, e4m3_max: float = 448.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor (or per-row) encode and decode scales ``(S_enc, S_dec)`` from the global amax.

    ``S_enc = fminf(RN(fl(6*E) / A), FLT_MAX)`` (``6*E`` = 2688 or 1536 is exact);
    then ``S_enc = 1`` where ``A == 0`` or ``S_enc == 0`` (``A = inf``). A NaN
    ``A`` gives ``FLT_MAX`` (``fminf``). ``S_dec = RN(1 / S_enc)``.
    ``E = e4m3_max`` is 448 (standard) or 256 (4over6 tensors that reserve
    headroom for the 1.5x map-to-4 scale).
    """
    if e4m3_max not in (256.0, 448.0):
        raise ValueError(f"nvfp4_global_scale: e4m3_max must be 256 or 448, got {e4m3_max}")
    a = amax.to(torch.float32)
    s_enc = fminf(torch.div(fl(6.0 * e4m3_max, a), a), fl(FLT_MAX, a))
    s_enc = torch.where((a == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    s_dec = torch.div(fl(1.0, a), s_enc)
    return s_enc, s_dec


def nvfp4_block_scale(block_amax: torch.Tensor, s_enc: torch.Tensor) -> torch.Tensor:
    """Standard block scale ``s_b = Q_E4M3(fminf(RN(b * RN(S_enc * fl(1/6))), FLT_MAX))``.

    Association matters: ``S_enc * fl(1/6)`` first (``fl(1/6)`` = ``0x3E2AAAAB``),
    then times the block amax ``b``. Returns ``float8_e4m3fn`` values
    (``.view(torch.uint8)`` gives the stored bytes). ``b = inf`` gives 448.
    """
    multiplier = s_enc * fp32_from_bits(torch.tensor(_FL_ONE_SIXTH_BITS, device=s_enc.device))
    return E4M3.quantize(fminf(block_amax * multiplier, fl(FLT_MAX, s_enc)))


def nvfp4_4over6_block_scales(block_amax: torch.Tensor, s_enc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """4over6 candidate scales ``(s4, s6)`` as ``float8_e4m3fn``.

    ``base = RN(RN(b / 6) * S_enc)`` (a true division, unlike the standard
    path); ``s4 = Q_E4M3(fminf(RN(base * 1.5), 448))``; ``s6 = Q_E4M3(fminf(base, 448))``.
    """
    base = torch.div(block_amax, fl(6.0, block_amax)) * s_enc
    e4m3_max = fl(E4M3.max, block_amax)
    s4 = E4M3.quantize(fminf(base * fl(1.5, block_amax), e4m3_max))
    s6 = E4M3.quantize(fminf(base, e4m3_max))
    return s4, s6


def nvfp4_block_encode_multiplier(s_b: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    """``enc_b = fminf(RN(1 / RN(float(s_b) * S_dec)), FLT_MAX)``; ``s_b = 0`` gives ``FLT_MAX``."""
    decode = s_b.to(torch.float32) * s_dec
    return fminf(torch.div(fl(1.0, decode), decode), fl(FLT_MAX, decode))
