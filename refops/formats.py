"""Number formats: E4M3, E5M2 (FP8 data), E8M0 (MXFP8 block scales), E2M1 (NVFP4 data).

Every function here is exact and device-independent: it reproduces, bit for
bit, the conversions TransformerEngine's CUDA kernels perform
(``docs/recipes/formats.md``). Inputs are fp32 tensors.

* FP8 (E4M3, E5M2): round-to-nearest-even with *saturation* ("satfinite"):
  ``|v| > max`` and ``±inf`` give ``±max``, NaN stays NaN, ``-0`` stays ``-0``.
  torch's own casts differ on overflow across versions, so we clamp first.
* E8M0: an unsigned byte ``e`` meaning ``2^(e-127)``; no zero (``0x00`` is
  ``2^-127``), ``0xFF`` is NaN. Block scales are rounded **up** to a power of two,
  built with integer operations (torch's ``float8_e8m0fnu`` cast rounds differently).
* E2M1: 4-bit codes, bit 3 the sign, magnitudes ``0, .5, 1, 1.5, 2, 3, 4, 6``;
  round-to-nearest-even, satfinite, NaN gives ``0x7`` (+6), ``-0`` gives ``0x8``.
  Two codes share a byte, element ``2j`` in the **low** nibble.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = [
    "Float8Format",
    "E4M3",
    "E5M2",
    "FLT_MAX",
    "fp32_from_bits",
    "bits_from_fp32",
    "e8m0_from_fp32",
    "e8m0_to_fp32",
    "e8m0_encode_multiplier",
    "E2M1_MAX",
    "E2M1_VALUES",
    "e2m1_round_nearest_even",
    "e2m1_stochastic_round",
    "e2m1_to_fp32",
    "pack_e2m1",
    "unpack_e2m1",
]

FLT_MAX = torch.finfo(torch.float32).max


def fp32_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Reinterpret int32 bit patterns as fp32."""
    return bits.to(torch.int32).view(torch.float32)


def bits_from_fp32(x: torch.Tensor) -> torch.Tensor:
    """The int32 bit patterns of fp32 values."""
    return x.to(torch.float32).contiguous().view(torch.int32)


# --------------------------------------------------------------------- FP8
@dataclasses.dataclass(frozen=True)
class Float8Format:
    """An FP8 element format: its torch dtype and largest finite value."""

    name: str
    torch_dtype: torch.dtype
    max: float

    def quantize(self, v: torch.Tensor, *, overwrite: bool = False) -> torch.Tensor:
        """``Q_F(v)``: fp32 to FP8, round-to-nearest-even, saturating, NaN kept.

        ``clamp`` keeps NaN, so clamping to ``±max`` and casting is the whole rule.
        ``overwrite=True`` lets the clamp happen in ``v`` itself (an fp32 temporary
        of the caller's), which saves writing a second copy of the tensor.
        """
        if v.dtype != torch.float32:
            v, overwrite = v.to(torch.float32), True
        clamped = v.clamp_(-self.max, self.max) if overwrite else v.clamp(-self.max, self.max)
        return clamped.to(self.torch_dtype)

    def to_fp32(self, q: torch.Tensor) -> torch.Tensor:
        """Exact decode of FP8 values (given as this dtype or as raw uint8 bytes)."""
        if q.dtype == torch.uint8:
            q = q.view(self.torch_dtype)
        return q.to(torch.float32)


E4M3 = Float8Format("E4M3", torch.float8_e4m3fn, 448.0)
E5M2 = Float8Format("E5M2", torch.float8_e5m2, 57344.0)


# -------------------------------------------------------------------- E8M0
def e8m0_from_fp32(v: torch.Tensor) -> torch.Tensor:
    """Biased exponent byte of ``v`` rounded up to a power of two (saturating at ``2^127``).

    ``0 -> 0``, NaN ``-> 0xFF``, inf ``-> 0xFE``; otherwise with ``E`` the biased
    exponent and ``m`` the mantissa of ``v``: ``E + 1`` when ``m > 0``, ``E != 254``
    and not (``E == 0`` and ``m <= 0x400000``), else ``E``. ``v`` is non-negative
    (a block amax times ``1/fmax``).
    """
    v = v.to(torch.float32)
    bits = bits_from_fp32(v) & 0x7FFFFFFF
    exponent = bits >> 23
    mantissa = bits & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 254) & ((exponent != 0) | (mantissa > 0x400000))
    e = exponent + round_up  # 0 stays 0: its E and m are 0
    # E = 255 is inf (m = 0: 0xFE) or NaN (m > 0: 0xFF).
    e = torch.where(exponent == 255, 0xFE + (mantissa > 0).to(torch.int32), e)
    return e.to(torch.uint8)


def e8m0_to_fp32(e: torch.Tensor) -> torch.Tensor:
    """``2^(e-127)``: ``e = 0`` gives ``2^-127`` (a subnormal), ``e = 255`` gives NaN."""
    e = e.to(torch.int32)
    bits = torch.where(e == 0, 0x00400000, e << 23)
    bits = torch.where(e == 255, 0x7FC00000, bits)
    return fp32_from_bits(bits)


def e8m0_encode_multiplier(e: torch.Tensor) -> torch.Tensor:
    """``2^(127-e)``, the exact multiplier that encodes a block with scale byte ``e``.

    ``e = 254`` gives ``2^-127``, ``e = 0`` gives ``2^127``, ``e = 255`` gives NaN.
    """
    e = e.to(torch.int32)
    biased = 254 - e  # exponent field of 2^(127-e)
    bits = torch.where(biased >= 1, biased << 23, 0x00400000)
    bits = torch.where(e == 255, 0x7FC00000, bits)
    return fp32_from_bits(bits)


# -------------------------------------------------------------------- E2M1
E2M1_MAX = 6.0
#: Magnitude of each 3-bit code.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Upper bounds of each code's rounding interval; a value equal to a bound is a
# tie and goes to the even code (listed separately).
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_TIE_CODES = (0, 2, 2, 4, 4, 6, 6)


def _magnitude_code_rne(a: torch.Tensor) -> torch.Tensor:
    """The 3-bit code of ``|v|`` (``a``, non-negative or NaN): the number of interval bounds it passes.

    Bound ``i`` separates codes ``i`` and ``i + 1``. A value above it passes it; a
    value equal to it is a tie and passes it only when ``i + 1`` is the even code.
    Values above 5 pass every bound (code 7 = 6, satfinite); NaN passes none.
    """
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    passed = torch.empty(a.shape, dtype=torch.bool, device=a.device)
    for i, bound in enumerate(_E2M1_BOUNDS):
        tie_goes_up = _E2M1_TIE_CODES[i] == i + 1
        (torch.ge if tie_goes_up else torch.gt)(a, bound, out=passed)
        code += passed
    return code


def _with_sign(code: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Bit 3 from ``v``'s sign (so ``-0`` gives 8); NaN gives 7 (+6). Updates ``code`` (uint8) in place."""
    code.add_(torch.signbit(v), alpha=8)
    return code.masked_fill_(torch.isnan(v), 7)


def e2m1_round_nearest_even(v: torch.Tensor) -> torch.Tensor:
    """Codes (0..15, one per element, unpacked) of ``v`` rounded to E2M1, RNE satfinite."""
    v = v.to(torch.float32)
    return _with_sign(_magnitude_code_rne(v.abs()), v)


def _sr_step(a: torch.Tensor) -> torch.Tensor:
    return torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, torch.full_like(a, 2.0)))  # a's dtype


def e2m1_stochastic_round(v: torch.Tensor, random_bytes: torch.Tensor) -> torch.Tensor:
    """Codes of ``v`` rounded stochastically to E2M1 with one random byte per element.

    TE's software model: ``u = byte / 256``; ``t = |v| + u * step(|v|)`` (one
    rounding: ``u * step`` is exact); ``q = min(floor(t / step(t)) * step(t), 6)``
    where ``step`` is 0.5 below 2, 1 below 4, else 2. Sign restored; NaN gives +6.
    """
    v = v.to(torch.float32)
    if random_bytes.shape != v.shape or random_bytes.dtype != torch.uint8:
        raise ValueError(
            f"e2m1_stochastic_round: need one uint8 random byte per element (shape {tuple(v.shape)}), "
            f"got {random_bytes.dtype} of shape {tuple(random_bytes.shape)}"
        )
    a = v.abs()
    u = random_bytes.to(torch.float32) / 256.0
    t = a + u * _sr_step(a)
    step_t = _sr_step(t)
    q = torch.clamp_max(torch.floor(t / step_t) * step_t, E2M1_MAX)
    q = torch.where(torch.isnan(t), torch.full_like(q, E2M1_MAX), q)
    # q is on the E2M1 grid, so rounding it to nearest gives its own code.
    return _with_sign(_magnitude_code_rne(q), v)


def e2m1_to_fp32(codes: torch.Tensor) -> torch.Tensor:
    """Exact decode of unpacked E2M1 codes."""
    table = torch.tensor(E2M1_VALUES + tuple(-x for x in E2M1_VALUES), dtype=torch.float32, device=codes.device)
    table[8] = -0.0
    return table[codes.to(torch.int64)]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes two per byte along the last dim: element ``2j`` low nibble, ``2j+1`` high."""
    if codes.shape[-1] % 2 != 0:
        raise ValueError(f"pack_e2m1: the last dim must be even, got shape {tuple(codes.shape)}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`."""
    low = packed & 0xF
    high = (packed >> 4) & 0xF
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
