"""The adversarial input matrix of :func:`refops.testing.check_quantizer`.

Random inputs almost never reach the inputs where quantizers disagree: a value
whose scaled product lands exactly between two codes, a block that is all
zero, an amax that is infinite or tiny. Each case here builds one such input,
deterministically (a generator seeded from the case's position), for a given
input dtype and quantizer. The ``ties`` case is built against the quantizer's
own multiplier, so that ``x * s`` lands on (and one or two ulps around) every
rounding midpoint of the format: the place where computing the scale in
another order (``x / (amax / 448)`` for ``x * (448 / amax)``) changes a byte.
The ``amax_near_power_of_two`` case puts block amaxes at and one ulp around
``fmax * 2^k``, where a power-of-two scale steps an octave: the place where taking
that scale with float ``log2`` instead of from exponent bits changes a scale.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import torch

from ...formats import E2M1_VALUES, FLT_MAX, e8m0_encode_multiplier, e8m0_from_fp32
from ...kernels import current_backend
from ...layouts import rows_cols
from ...quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
)
from ...quantization.quantizer import torch_fp8_dtype

__all__ = ["QuantizerCase", "CASES", "STRIDED", "block_length", "format_max", "multiplier_for_amax", "TIE_AMAX",
           "power_of_two_boundary"]

#: The amax the ``ties`` case gives every block: its scale 448 / A is not a power of two,
#: and one of its products lands on an E4M3 tie (``docs/recipes/current-scaling.md``).
TIE_AMAX = 8.076315879821777
MAIN_SHAPE = (64, 128)


@dataclasses.dataclass(frozen=True)
class QuantizerCase:
    """One input of the matrix: ``build(dtype, quantizer, generator)`` returns the tensor."""

    name: str
    description: str
    build: Callable[[torch.dtype, Quantizer, torch.Generator], torch.Tensor]
    #: Delayed scaling only: the scale comes from ``amax(x) * amax_factor`` (< 1: values past the max).
    amax_factor: float = 1.0
    #: The input dtypes this case runs in (None: all of them).
    dtypes: Optional[tuple[torch.dtype, ...]] = None
    #: The layouts besides contiguous its values are also given in (:mod:`.input_layouts`): a
    #: representative few cases run in them, to keep the default check fast.
    layouts: tuple[str, ...] = ()


def block_length(quantizer: Quantizer) -> int:
    """Elements per scaling block along one dim (per-tensor FP8: 32, an arbitrary period)."""
    if isinstance(quantizer, NVFP4Quantizer):
        return 16
    if isinstance(quantizer, Float8BlockQuantizer):
        return 128
    return 32


def format_max(quantizer: Quantizer) -> float:
    """The largest finite code value of the quantizer's element format."""
    if isinstance(quantizer, NVFP4Quantizer):
        return 6.0
    return torch.finfo(torch_fp8_dtype(quantizer.dtype)).max


def _midpoints(quantizer: Quantizer) -> torch.Tensor:
    """Every point exactly between two adjacent non-negative codes below the format's max (fp64)."""
    if isinstance(quantizer, NVFP4Quantizer):
        values = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    else:
        codes = torch.arange(0, 128, dtype=torch.uint8).view(torch_fp8_dtype(quantizer.dtype)).double()
        values = codes[torch.isfinite(codes)].unique()
    return (values[1:] + values[:-1]) / 2


def multiplier_for_amax(quantizer: Quantizer, amax: float, dtype: torch.dtype) -> float:
    """The factor ``m`` the quantizer multiplies by (``q = Q(RN(x * m))``) in a block whose amax is ``amax``.

    For delayed scaling this is the scale :func:`check_quantizer` gives it for that amax.
    Under NVFP4's 4over6 the map-to-4 choice may use another factor; the ties are then approximate.
    """
    a = torch.tensor([amax], dtype=torch.float32)
    fmax = format_max(quantizer)
    if isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer, Float8BlockQuantizer)):
        block = isinstance(quantizer, Float8BlockQuantizer)
        scale = current_backend().compute_scale_from_amax(
            a,
            fmax=fmax,
            force_pow_2_scales=getattr(quantizer, "force_pow_2_scales", False),
            amax_epsilon=getattr(quantizer, "amax_epsilon", 0.0),
            value_for_inf=torch.finfo(dtype).max if block else FLT_MAX,
        )
        return float(scale.reshape(-1)[0])
    if isinstance(quantizer, MXFP8Quantizer):
        inv = torch.tensor([1.0 / fmax], dtype=torch.float32)
        return float(e8m0_encode_multiplier(e8m0_from_fp32(a * inv))[0])
    e = float(quantizer.e4m3_max)
    s_enc = torch.tensor([e * 6.0], dtype=torch.float32) / a
    s_b = (a * (s_enc * torch.tensor([1.0 / 6.0], dtype=torch.float32))).clamp(max=448.0)
    s_b = s_b.to(torch.float8_e4m3fn).float()
    s_dec = torch.tensor([1.0], dtype=torch.float32) / s_enc
    return float(torch.tensor([1.0], dtype=torch.float32) / (s_b * s_dec))


def _pattern(shape: tuple[int, ...], period: int) -> torch.Tensor:
    """True where ``(m + k) % period == 0``: one element in every 1xB and Bx1 block, B in every BxB tile."""
    m, k = rows_cols(shape)
    rows = torch.arange(m).reshape(-1, 1)
    cols = torch.arange(k).reshape(1, -1)
    return ((rows + cols) % period == 0).reshape(shape)


def _randn(shape, g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32)


def _with_block_amax(x: torch.Tensor, q: Quantizer, amax: float) -> torch.Tensor:
    """``x`` with ``amax`` in one element of every block, so every block (and the tensor) has amax ``amax``."""
    return torch.where(_pattern(tuple(x.shape), block_length(q)), torch.full_like(x, amax), x)


def _step_ulps(x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """``x`` moved ``steps`` ulps away from (positive) or toward (negative) zero, in ``x``'s dtype."""
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[x.dtype]
    moved = (x.view(bits).to(torch.int64) + steps).to(bits).view(x.dtype)
    return torch.where(x == 0, x, moved)


def _ties(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    mids = _midpoints(q)
    m = multiplier_for_amax(q, float(torch.tensor(TIE_AMAX).to(dtype).float()), dtype)
    n = math.prod(MAIN_SHAPE)
    i = torch.arange(n)
    offsets = torch.tensor([0, 1, -1, 2, -2])
    target = mids[i % len(mids)]
    step = offsets[(i // len(mids)) % len(offsets)]
    sign = torch.where((i // (len(mids) * len(offsets))) % 2 == 0, 1.0, -1.0).double()
    x = (sign * target / m).to(dtype)
    x = _step_ulps(x, step).reshape(MAIN_SHAPE)
    return _with_block_amax(x.float(), q, float(torch.tensor(TIE_AMAX).to(dtype).float())).to(dtype)


def _wide_scales(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    low, high = (-20, 12) if dtype == torch.float16 else (-60, 60)
    exponents = torch.linspace(low, high, MAIN_SHAPE[0]).round().reshape(-1, 1)
    return (_randn(MAIN_SHAPE, g) * torch.exp2(exponents)).to(dtype)


def _heavy_tails(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    x = _randn(MAIN_SHAPE, g) * torch.exp(2.5 * _randn(MAIN_SHAPE, g))
    return x.clamp(-6e4, 6e4).to(dtype)


def _zeros(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    x = torch.zeros(MAIN_SHAPE)
    x[::2] = -0.0
    return x.to(dtype)


def _zero_blocks(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    x = _randn(MAIN_SHAPE, g)
    x[:32] = 0.0  # whole rows: every 1xB block and the 32x1 / 16x16 blocks there
    x[32:48, ::32] = -0.0
    for start in range(0, MAIN_SHAPE[1], 32):
        x[32:48, start : start + 16] = 0.0  # every other 16-element block of these rows
    return x.to(dtype)


def _subnormals(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    """Block amax 1, the rest scaled into (and below) the format's subnormals; row 1 the dtype's subnormals."""
    u = torch.rand(MAIN_SHAPE, generator=g)
    sign = torch.where(torch.rand(MAIN_SHAPE, generator=g) < 0.5, -1.0, 1.0)
    x = sign * torch.exp2(-22 + 10 * u) * (1 if not isinstance(q, NVFP4Quantizer) else 2**6)
    tiny = torch.finfo(dtype).smallest_normal
    x[1] = sign[1] * tiny * torch.exp2(-torch.arange(MAIN_SHAPE[1]) % 8 - 1.0)
    return _with_block_amax(x, q, 1.0).to(dtype)


def _near_max(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    """Values from half the amax up to it: the top codes (and, for delayed scaling, past the max)."""
    x = TIE_AMAX * (0.5 + 0.5 * torch.rand(MAIN_SHAPE, generator=g))
    x = torch.where(torch.rand(MAIN_SHAPE, generator=g) < 0.5, -x, x)
    return _with_block_amax(x, q, TIE_AMAX).to(dtype)


def _dtype_max(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    x = _randn(MAIN_SHAPE, g).to(dtype)
    big = torch.finfo(dtype).max
    x[0, 0], x[5, 17], x[40, 100], x[63, 127] = big, -big, big, -big
    return x


def _tiny_amax(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    """Every value at or below the dtype's smallest normal: ``fmax / amax`` overflows the scale."""
    return (_randn(MAIN_SHAPE, g).clamp(-1, 1) * torch.finfo(dtype).smallest_normal).to(dtype)


#: The octaves k of the ``amax_near_power_of_two`` boundaries ``base * 2^k``: past |k| = 3 a float
#: ``log2`` of ``2^k * (1 + 2^-23)`` rounds onto k; the spread stays inside NVFP4's E4M3 block scales.
NEAR_POWER_OF_TWO_OCTAVES = (-8, -5, -3, -2, -1, 0, 1, 2, 3, 5, 8)


def power_of_two_boundary(quantizer: Quantizer) -> float:
    """The amax at which the quantizer's scale is exactly 1: MXFP8's E8M0 exponent, a pow2 FP8 scale and
    NVFP4's global scale ``6 * 448 / amax`` jump an octave where the amax passes ``boundary * 2^k``."""
    if isinstance(quantizer, NVFP4Quantizer):
        return 6.0 * 448.0
    return format_max(quantizer)


def _boundary_amaxes(dtype: torch.dtype, base: float) -> torch.Tensor:
    """``base * 2^k`` and the dtype's values one ulp above and below it, for every octave k whose values
    are finite and normal in the dtype; the largest ends the list, one ulp above its boundary."""
    finfo = torch.finfo(dtype)
    octaves = [k for k in NEAR_POWER_OF_TWO_OCTAVES
               if base * 2.0**k * (1 + finfo.eps) <= finfo.max and base * 2.0**k * (1 - finfo.eps) >= finfo.tiny]
    at = torch.tensor([base * 2.0**k for k in octaves for _ in range(3)], dtype=dtype)
    return _step_ulps(at, torch.tensor([0, -1, 1] * len(octaves))).float()


def _blockwise_max(peaks: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """Each element's block maximum of ``peaks`` (2-D) over blocks of ``length`` along ``dim``; partial
    blocks at the end count as blocks."""
    out = torch.empty_like(peaks)
    for start in range(0, peaks.shape[dim], length):
        block = peaks.narrow(dim, start, min(length, peaks.shape[dim] - start))
        out.narrow(dim, start, block.shape[dim]).copy_(block.amax(dim, keepdim=True).expand_as(block))
    return out


def _amax_near_power_of_two(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    """Block amaxes at, one ulp below and one ulp above ``boundary * 2^k`` for several k, each block's
    from the list in turn; the tensor's amax one ulp above the largest, where a pow2 scale must drop
    an octave. A float ``log2`` of ``amax / fmax`` loses E8M0's round-up there (sglang #31210)."""
    targets = _boundary_amaxes(dtype, power_of_two_boundary(q))
    where = _pattern(MAIN_SHAPE, block_length(q))
    count = int(where.sum())
    order = torch.arange(count) % len(targets)
    order[torch.randperm(count, generator=g)[0]] = len(targets) - 1  # the tensor's amax, however few blocks
    peaks = torch.zeros(MAIN_SHAPE)
    peaks[where] = targets[order]
    # The other values stay below both of their blocks' amaxes (the row's and the column's), and spread
    # over that block's codes. A block without a peak (a column of a 1x128 tile past 64 rows) takes its row's.
    length = block_length(q)
    along_rows, along_cols = _blockwise_max(peaks, length, 1), _blockwise_max(peaks, length, 0)
    below = torch.minimum(along_rows, torch.where(along_cols > 0, along_cols, along_rows))
    rest = below * 0.95 * (2 * torch.rand(MAIN_SHAPE, generator=g) - 1)
    sign = torch.where(torch.rand(MAIN_SHAPE, generator=g) < 0.5, -1.0, 1.0)
    return torch.where(where, sign * peaks, rest).to(dtype)


def _with_specials(values: dict[tuple[int, int], float]):
    def build(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
        x = _randn(MAIN_SHAPE, g)
        for index, value in values.items():
            x[index] = value
        if any(math.isnan(v) for v in values.values()):
            x[5] = math.nan  # a whole row: blocks that are all NaN
        return x.to(dtype)

    return build


def _broadcast_row(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
    """One row of normal values with a larger one in every block, repeated in every row: a bias or a
    broadcast scale, the input a caller may hand over expanded (stride 0)."""
    row = _with_block_amax(_randn((1, MAIN_SHAPE[1]), g), q, TIE_AMAX)
    return row.expand(MAIN_SHAPE).contiguous().to(dtype)


def _shaped(shape: tuple[int, ...], scale: float = 1.0):
    def build(dtype: torch.dtype, q: Quantizer, g: torch.Generator) -> torch.Tensor:
        return (scale * _randn(shape, g)).to(dtype)

    return build


INF, NAN = math.inf, math.nan

#: Given in the non-contiguous and storage-offset layouts too (the unaligned one when asked for).
STRIDED = ("non-contiguous", "storage offset", "unaligned storage offset")

#: Every case, in report order.
CASES: tuple[QuantizerCase, ...] = (
    QuantizerCase("normal", "standard normal values", _shaped(MAIN_SHAPE), layouts=STRIDED),
    QuantizerCase("tiny", "normal values times 2^-14", _shaped(MAIN_SHAPE, 2.0**-14)),
    QuantizerCase("large", "normal values times 2^12", _shaped(MAIN_SHAPE, 2.0**12)),
    QuantizerCase("wide_scales", "each row at its own power of two, 2^-60..2^60", _wide_scales),
    QuantizerCase("heavy_tails", "log-normal magnitudes (outliers)", _heavy_tails),
    QuantizerCase("zeros", "all zero, every other row -0.0", _zeros),
    QuantizerCase("zero_blocks", "all-zero rows and all-zero 16-element blocks", _zero_blocks),
    QuantizerCase("subnormals", "scaled into the format's subnormals; the dtype's subnormals", _subnormals),
    QuantizerCase("ties", "x * scale on and 1-2 ulps around every midpoint between codes", _ties, layouts=STRIDED),
    QuantizerCase("at_and_past_max", "values up to the amax; delayed: scale for amax/4", _near_max, 0.25),
    QuantizerCase("dtype_max", "the input dtype's largest finite values", _dtype_max),
    QuantizerCase("tiny_amax", "amax below the smallest normal (the scale overflows)", _tiny_amax),
    QuantizerCase("inf", "+inf and -inf among normal values", _with_specials({(3, 5): INF, (10, 70): -INF})),
    QuantizerCase("nan", "NaN among normal values; one all-NaN row", _with_specials({(3, 5): NAN, (10, 70): NAN})),
    QuantizerCase(
        "inf_and_nan", "inf, -inf and NaN together", _with_specials({(3, 5): INF, (9, 9): -INF, (10, 70): NAN})
    ),
    QuantizerCase("constant", "every element -3.0", lambda d, q, g: torch.full(MAIN_SHAPE, -3.0, dtype=d)),
    QuantizerCase("partial_blocks", "shape (96, 160): partial 128-blocks", _shaped((96, 160)), layouts=STRIDED),
    QuantizerCase("ragged", "shape (40, 72): no block size divides it", _shaped((40, 72))),
    QuantizerCase("three_dims", "shape (2, 32, 128): leading dims flatten", _shaped((2, 32, 128)), layouts=STRIDED),
    QuantizerCase("full_tiles", "shape (128, 256), whole 128x128 tiles", _shaped((128, 256)), dtypes=(torch.bfloat16,)),
    QuantizerCase("broadcast_row", "one row repeated in every row; also given expanded (stride 0)", _broadcast_row,
                  layouts=STRIDED + ("expanded",)),
    # Last: a case's generator is seeded from its position, so the cases before it keep their inputs.
    QuantizerCase("amax_near_power_of_two", "block amaxes at and 1 ulp around fmax * 2^k (NVFP4: 6 * 448 * 2^k)",
                  _amax_near_power_of_two),
)
