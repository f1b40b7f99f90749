"""What a quantized result that differs from the reference's *is*: another format, a scale off by a power of two,
the other orientation.

A bit-for-bit comparison says that codes and scales differ; the cause is often
one of a few mix-ups that the bytes themselves reveal:

* **the other FP8 format**: TE's HYBRID recipe quantizes the forward pass to E4M3
  and the gradients to E5M2, and a kernel that casts gradients to E4M3 writes
  codes that are a fine quantization of the right values, read in the wrong format;
* **a scale off by an exact power of two**: the max of the other format
  (``448 / 57344 = 2^-7``), or MXFP8's E8M0 exponent rounded down where TE
  rounds it up (``2^-1`` in the blocks whose ``amax / max`` is not a power of two);
* **one ulp of an fp32 scale_inv**: the scale computed in another order;
* **the other orientation**: the codes are the reference's, transposed.

:func:`diagnose_mismatch` tests these on plain tensors (codes as uint8 or a
float8 dtype, scales as fp32 or as stored bytes), so it serves any comparison
of quantized operands, not only :func:`~refops.testing.check_quantizer`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Union

import torch

from ..formats import E2M1_MAX, E4M3, E5M2, Float8Format, e2m1_to_fp32, e8m0_to_fp32
from ..quantization.quantizer import DType

__all__ = ["diagnose_mismatch", "ElementFormat", "ELEMENT_FORMATS", "element_format"]


@dataclasses.dataclass(frozen=True)
class ElementFormat:
    """A quantized element format: how its codes decode and how fine its grid is."""

    name: str
    max: float
    mantissa_bits: int
    #: The exponent of the smallest normal (below it the grid is the subnormal step).
    min_exponent: int
    #: The torch dtype of its codes (None for E2M1, stored as one code a byte here).
    torch_dtype: Optional[torch.dtype]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """The values of ``codes`` (uint8 bits) in float64."""
        if self.torch_dtype is None:
            return e2m1_to_fp32(codes & 0xF).double()
        return codes.view(self.torch_dtype).double()

    def half_step(self, magnitude: torch.Tensor) -> torch.Tensor:
        """Half the distance between adjacent codes at ``magnitude`` (the largest error of round-to-nearest)."""
        exponent = torch.floor(torch.log2(magnitude.clamp_min(2.0**-1074)))
        return torch.exp2(exponent.clamp_min(self.min_exponent) - self.mantissa_bits - 1)


#: The element formats, by name.
ELEMENT_FORMATS = {
    "E4M3": ElementFormat("E4M3", E4M3.max, 3, -6, torch.float8_e4m3fn),
    "E5M2": ElementFormat("E5M2", E5M2.max, 2, -14, torch.float8_e5m2),
    "E2M1": ElementFormat("E2M1", E2M1_MAX, 1, 0, None),
}
_FP8 = ("E4M3", "E5M2")
#: A run of elements this share of which a format explains is its quantization (a few ties may flip).
_EXPLAINS = 0.99
#: A format explaining less than this share of the elements is not the one the codes are in.
_DOES_NOT_EXPLAIN = 0.9


def element_format(fmt: Any) -> ElementFormat:
    """The :class:`ElementFormat` of ``"E4M3"``/``"E5M2"``/``"E2M1"``, a :class:`~refops.formats.Float8Format`,
    a refops ``DType`` or a torch float8 dtype."""
    if isinstance(fmt, Float8Format):
        return ELEMENT_FORMATS[fmt.name]
    if isinstance(fmt, DType):
        names = {DType.kFloat8E4M3: "E4M3", DType.kFloat8E5M2: "E5M2", DType.kFloat4E2M1: "E2M1"}
        if fmt in names:
            return ELEMENT_FORMATS[names[fmt]]
    if isinstance(fmt, torch.dtype):
        for f in ELEMENT_FORMATS.values():
            if f.torch_dtype is fmt:
                return f
    if isinstance(fmt, str) and fmt.upper() in ELEMENT_FORMATS:
        return ELEMENT_FORMATS[fmt.upper()]
    raise ValueError(
        f"diagnose_mismatch: expected_format must be 'E4M3', 'E5M2' or 'E2M1' (or a Float8Format, a DType, "
        f"torch.float8_e4m3fn / torch.float8_e5m2), got {fmt!r}"
    )


def _codes(argument: str, data: Any) -> torch.Tensor:
    """``data`` as 2-D uint8 bits ``(rows, last dim)``."""
    if not isinstance(data, torch.Tensor) or data.element_size() != 1 or data.is_floating_point() and \
            data.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"diagnose_mismatch: {argument} must be a tensor of codes (uint8 or a float8 dtype), got "
                        f"{type(data).__name__}{' ' + str(data.dtype) if isinstance(data, torch.Tensor) else ''}")
    if data.dim() == 0:
        raise ValueError(f"diagnose_mismatch: {argument} must have at least one dim, got a scalar")
    bits = data.detach().cpu().contiguous().view(torch.uint8)
    return bits.reshape(-1, bits.shape[-1]) if bits.dim() != 1 else bits.reshape(1, -1)


def _scale_values(argument: str, scale: Any, fmt: ElementFormat) -> torch.Tensor:
    """The decode factors of ``scale`` in float64: fp32 values, or stored E8M0 (FP8 data) / E4M3 (E2M1 data) bytes."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"diagnose_mismatch: {argument} must be a tensor, got {type(scale).__name__}")
    s = scale.detach().cpu()
    if s.dtype == torch.float8_e8m0fnu or (s.dtype == torch.uint8 and fmt.torch_dtype is not None):
        return e8m0_to_fp32(s.view(torch.uint8)).double()
    if s.dtype == torch.float8_e4m3fn or s.dtype == torch.uint8:  # NVFP4's block scales are E4M3 bytes
        return s.view(torch.float8_e4m3fn).double()
    if not s.is_floating_point():
        raise TypeError(f"diagnose_mismatch: {argument} must hold float scales or stored scale bytes, got {s.dtype}")
    return s.double()


def _per_element(argument: str, scale: torch.Tensor, shape: tuple[int, int],
                 block: Optional[tuple[int, int]]) -> torch.Tensor:
    """The scale of every element of an ``(M, K)`` tensor: one for all, one each, or a grid of blocks."""
    m, k = shape
    grid = scale.reshape(1, 1) if scale.numel() == 1 else scale.reshape(-1, 1) if scale.dim() == 1 else scale
    if grid.dim() != 2:
        raise ValueError(f"diagnose_mismatch: {argument} must be one value or a 2-D grid of blocks, "
                         f"got shape {tuple(scale.shape)}")
    rows, cols = grid.shape
    bm, bk = block if block is not None else (math.ceil(m / rows), math.ceil(k / cols))
    if math.ceil(m / bm) != rows or math.ceil(k / bk) != cols:
        raise ValueError(f"diagnose_mismatch: {argument} of shape {tuple(scale.shape)} does not tile the data's "
                         f"{(m, k)} in {bm}x{bk} blocks; cut the padding off, or transpose a GEMM-ready layout")
    return grid.repeat_interleave(bm, dim=0)[:m].repeat_interleave(bk, dim=1)[:, :k]


def _explained_share(fmt: ElementFormat, codes: torch.Tensor, scale: torch.Tensor, target: torch.Tensor,
                     target_error: torch.Tensor) -> Optional[float]:
    """The share of elements whose code, read in ``fmt`` and times ``scale``, is ``target`` rounded to ``fmt``
    (within half a step, ``target_error`` more when the target is itself quantized); None: nothing to judge."""
    usable = torch.isfinite(target) & torch.isfinite(scale) & (scale > 0)
    if not bool(usable.any()):
        return None
    decoded = fmt.decode(codes)
    magnitude = target.abs() / scale
    saturated = magnitude >= fmt.max
    tolerance = fmt.half_step(magnitude) * scale * (1 + 1e-9) + target_error
    near = (decoded * scale - target).abs() <= tolerance
    clamped = (decoded.abs() == fmt.max) & (torch.signbit(decoded) == torch.signbit(target))
    explained = torch.where(saturated, clamped, near) & ~torch.isnan(decoded)
    return float(explained[usable].double().mean())


def _power_of_two(ratio: torch.Tensor) -> torch.Tensor:
    """The integer ``k`` where ``ratio == 2^k`` exactly, NaN elsewhere."""
    mantissa, exponent = torch.frexp(ratio)
    return torch.where(mantissa == 0.5, (exponent - 1).double(), torch.full_like(ratio, math.nan))


def _power(k: int) -> str:
    return f"2^{k}"


def _scale_finding(expected: torch.Tensor, got: torch.Tensor, fmt: ElementFormat, stored_as: str) -> Optional[str]:
    """How ``got`` scale_inv relates to ``expected`` entry by entry (equal shapes), when it is a pattern."""
    usable = torch.isfinite(expected) & torch.isfinite(got) & (expected > 0) & (got > 0)
    if not bool(usable.any()):
        return None
    e, g = expected[usable], got[usable]
    unequal = e != g
    if not bool(unequal.any()):
        return None
    powers = _power_of_two(g / e)
    if bool(torch.isnan(powers[unequal]).any()):
        return _ulp_finding(e, g, stored_as)
    ks = sorted({int(k) for k in powers[unequal].tolist()})
    if len(ks) != 1:
        return None
    k = ks[0]
    everywhere = bool(unequal.all())
    where = "everywhere" if everywhere else f"in {int(unequal.sum())} of {e.numel()} blocks and equal in the rest"
    sentence = f"scale_inv is {_power(k)} x the reference's {where}"
    for other in _FP8 if everywhere else ():
        of = ELEMENT_FORMATS[other]
        if fmt.name in _FP8 and other != fmt.name and round(math.log2(fmt.max / of.max)) == k:
            return f"{sentence}: the scale for {other}'s max ({of.max:g}) where {fmt.name} (max {fmt.max:g}) was expected"
    if abs(k) == 1:  # where amax / max is a power of two both roundings agree: a partial pattern is typical
        if stored_as == "E8M0":
            way = "down where the reference rounds it up" if k < 0 else "up where the reference keeps it"
            return f"{sentence}: the E8M0 exponent rounded {way} (TE takes the power of two at or above amax / max)"
        return f"{sentence}: a power of two rounded the other way in those blocks"
    return sentence


def _ulp_finding(expected: torch.Tensor, got: torch.Tensor, stored_as: str) -> Optional[str]:
    """fp32 scale_inv entries one ulp apart: the same scale, computed in another order."""
    if stored_as != "fp32":
        return None
    e32, g32 = expected.float(), got.float()
    if not torch.equal(e32.double(), expected) or not torch.equal(g32.double(), got):
        return None
    steps = (e32.view(torch.int32).long() - g32.view(torch.int32).long()).abs()
    unequal = steps != 0
    if not bool((steps[unequal] == 1).all()):
        return None
    return (f"scale_inv is one fp32 ulp off the reference's in {int(unequal.sum())} of {steps.numel()} entries: "
            "the scale computed in another order (TE stores RN(1 / RN(max / amax)), not amax / max)")


def _transposed_finding(expected: torch.Tensor, got: torch.Tensor) -> Optional[str]:
    """The codes are the reference's transposed (the other orientation's layout)."""
    if got.shape != expected.shape[::-1] or expected.shape[0] == 1 or expected.shape[1] == 1:
        return None
    same_as_transpose = float((got.t() == expected).double().mean())
    same_in_place = float((got == expected).double().mean()) if got.shape == expected.shape else 0.0
    if same_as_transpose < _DOES_NOT_EXPLAIN or same_in_place >= same_as_transpose:
        return None
    how = "are" if same_as_transpose == 1.0 else f"match, in {same_as_transpose:.0%} of elements,"
    return (f"the candidate's codes {how} the reference's transposed: shape {tuple(got.shape)} where "
            f"{tuple(expected.shape)} was expected (the other orientation's layout)")


def _stored_as(scale: torch.Tensor, fmt: ElementFormat) -> str:
    if scale.dtype == torch.float8_e8m0fnu or (scale.dtype == torch.uint8 and fmt.torch_dtype is not None):
        return "E8M0"
    return "E4M3" if scale.element_size() == 1 else "fp32"


def diagnose_mismatch(
    expected_data: torch.Tensor,
    got_data: torch.Tensor,
    expected_scale_inv: torch.Tensor,
    got_scale_inv: torch.Tensor,
    *,
    expected_format: Union[str, Float8Format, DType, torch.dtype],
    values: Optional[torch.Tensor] = None,
    scale_block: Optional[tuple[int, int]] = None,
) -> Optional[str]:
    """One sentence naming what the candidate's quantized tensor is, when it is a known mix-up; else None.

    It decides, in this order:

    1. the codes are the reference's **transposed** (``got_data`` has the reversed shape);
    2. the codes are the quantization of the same values in **another FP8 format** (read in
       ``expected_format`` with the candidate's own scale they are not the values; read in the other
       format they are, to within half a step in 99% of the elements), with the scale of that
       format's max when the scale says so too;
    3. ``scale_inv`` is an **exact power of two** times the reference's: everywhere (naming the
       other format whose max gives that ratio, ``2^7`` for E4M3's 448 where E5M2's 57344 was
       expected), or in some blocks and equal in the rest (MXFP8's E8M0 exponent rounded the
       other way); or, for fp32 scales, **one ulp** off the reference's.

    None when the shapes do not line up element for element, or the difference is none of these
    (a rounding bug inside the right format, say: check the mismatching elements instead).

    Args:
        expected_data, got_data: codes in the same (row-wise) layout, as uint8 bits or a float8 dtype;
            E2M1 one code a byte (unpack packed NVFP4 data with :func:`refops.formats.unpack_e2m1`).
            Leading dims are flattened: the blocks run along the last dim.
        expected_scale_inv, got_scale_inv: the decode scales, one value, one per element, or a grid of
            blocks tiling the data in row-major order (padding cut off; FP8 block scaling's GEMM-ready
            1-D scales transposed to ``(M, K / 128)``); fp32 values or stored bytes (``uint8`` is E8M0
            for FP8 data, E4M3 for E2M1 data; or ``torch.float8_e8m0fnu`` / ``torch.float8_e4m3fn``).
        expected_format: the element format asked for: ``"E4M3"``, ``"E5M2"``, ``"E2M1"``, a
            :class:`~refops.formats.Float8Format`, a ``DType`` or a torch float8 dtype.
        values: the high-precision input, one per element (default: the reference's dequantized values
            stand in for it, with their own rounding error allowed for).
        scale_block: the ``(rows, cols)`` of the data each scale entry covers (default: inferred from
            the shapes, which a grid with padding left on can fool).

    Raises:
        TypeError: data that are not code tensors, scales or values that are not tensors.
        ValueError: an unknown format; values or scales whose shapes do not fit the data.
    """
    fmt = element_format(expected_format)
    expected, got = _codes("expected_data", expected_data), _codes("got_data", got_data)
    exp_scale = _scale_values("expected_scale_inv", expected_scale_inv, fmt)
    got_scale = _scale_values("got_scale_inv", got_scale_inv, fmt)
    if values is not None:
        if not isinstance(values, torch.Tensor) or not values.is_floating_point():
            raise TypeError(f"diagnose_mismatch: values must be a float tensor, got {type(values).__name__}")
        if values.numel() != expected.numel():
            raise ValueError(f"diagnose_mismatch: values has {values.numel()} elements, expected_data "
                             f"{expected.numel()}: give one value per code")
    transposed = _transposed_finding(expected, got)
    if transposed is not None or got.shape != expected.shape:
        return transposed
    shape = tuple(expected.shape)
    exp_el = _per_element("expected_scale_inv", exp_scale, shape, scale_block)
    got_el = _per_element("got_scale_inv", got_scale, shape, scale_block)
    scale_note = None
    if exp_scale.shape == got_scale.shape:
        scale_note = _scale_finding(exp_scale.reshape(-1), got_scale.reshape(-1), fmt, _stored_as(expected_scale_inv, fmt))
    if values is not None:
        target, error = values.detach().cpu().double().reshape(shape), torch.zeros(shape, dtype=torch.float64)
    else:
        reference = fmt.decode(expected)
        target = reference * exp_el
        error = fmt.half_step(target.abs() / exp_el) * exp_el
        target = torch.where(reference.abs() == fmt.max, math.nan, target)  # saturated: the value is unknown
    if fmt.name in _FP8:
        own = _explained_share(fmt, got, got_el, target, error)
        for other in _FP8:
            if other == fmt.name or own is None or own >= _DOES_NOT_EXPLAIN:
                continue
            theirs = _explained_share(ELEMENT_FORMATS[other], got, got_el, target, error)
            if theirs is not None and theirs >= _EXPLAINS:
                dtype = f" (its data is {got_data.dtype})" if got_data.dtype == ELEMENT_FORMATS[other].torch_dtype else ""
                sentence = (f"the candidate's codes are the {other} quantization of the same values{dtype}, where "
                            f"{fmt.name} was expected")
                return sentence + (f"; {scale_note}" if scale_note else "")
    return scale_note
