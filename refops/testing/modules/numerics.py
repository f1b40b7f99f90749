"""The ``"numerics"`` tier of the module oracle: judge a candidate like a careful reviewer would.

Two implementations of the same pipeline never agree bit for bit: they sum a GEMM's
products in another order, round once where the other rounds twice (TE's fused
dGELU+quantize), run fp32 GEMMs in TF32 (TE's rule), or accumulate FP8 products in a
tensor core's reduced-precision partial sums. Downstream of such a difference a
quantizer sees a slightly different tensor, and elements sitting on a rounding boundary
land one FP8 code apart, which the next GEMM spreads over a whole row. Element-wise
``rtol``/``atol`` judges all of that against the result's magnitude, which on zero-mean
data cancels to nearly nothing: a correct candidate fails.

This tier judges each tensor (output, input grads, parameter grads) against three runs
of the reference from the same parameters, inputs and output grad:

* **the float64 twin**: the reference pipeline in float64, no quantization (quantized
  weights dequantized: the same parameter values). Both sides' distance to it is
  reported (as SQNR, dB): a correct candidate is as close to float64 as the reference.
* **the legitimate-numerics twin** (:class:`.twins.LegitNumericsKernels`): the reference under
  kernels that differ from it only in ways a correct implementation may, all at once:
  GEMM products summed in another order, fp32 operands rounded to TF32, quantized GEMMs
  accumulated in chunks of 32 whose partial sums keep 13 mantissa bits (truncated), and
  element-wise kernels computed in float64 and rounded once. Its distance to the reference
  measures, for this pipeline, these data and this recipe, how far a correct implementation
  may rightly go; FP8 code flips downstream of a difference are in it.
* the reference itself.

A tensor passes when

1. **spread** (whole tensor): ``||cand - ref||_F <= 4 ||legit - ref||_F + eps ||float64||_F``
   (``eps``: the tensor dtype's machine epsilon, about 3.5 roundings of each element; where the
   legitimate twin computed the tensor bit for bit like the reference, the reference's own
   distance to float64 stands in for the spread), **or**, under a recipe only,
   **parity**: the candidate's SQNR against float64 is within :func:`parity_margin_db` of the
   reference's, in either direction (three standard deviations of an error energy estimated
   from the tensor's elements, at least 0.25 dB). Downstream of a rounding difference an FP8
   quantizer may re-round a whole tensor (a current-scaling amax one ulp off changes every
   code), so two correct quantized runs may be far apart element by element while being
   exactly as far from float64; a candidate much closer to float64 than the reference skipped
   a quantization, one much farther is wrong; and
2. **element-wise bound**: ``|cand - ref| <= 12 s + eps |float64|`` for every element, where
   ``s`` is the rank-one (row x column) profile of the legitimate twin's deviation from the
   reference and of the reference's own error against float64 (``s_ij^2 = R_i C_j / T`` with
   ``R``, ``C``, ``T`` the row, column and overall means of the squared deviation, summed over
   the two): a GEMM's rounding error scales with ``|x| @ |W|^T``, the product of a row
   magnitude and a column magnitude of its operands, not with the result, and this profile
   measures that product for the pipeline at hand; at an element where the reference's own error to
   float64 (or its deviation from the legitimate twin) is larger than the profile, ``s`` is that
   error: an element-wise formula that cancels there (a tanh-GELU's ``1 + tanh`` in its negative
   tail) leaves every correct float32 evaluation an error of the input's ulp on a tiny result; and
3. **no mean shift** (the output and input grads, whose rows are samples): rounding differences
   and the code flips they cause are zero-mean over the rows, a wrong bias or a lost scale is
   not. The tensor fails when ``cand - ref`` has an offset, overall or in one column, whose
   z-score exceeds 6 and whose size exceeds ``max(eps, 2^-10)`` of the tensor's rms (2^-10:
   eight times the bias a tensor core's truncated 13-bit partial sums can give a result).

The report of a failing tensor says which criterion failed and why (``why:``): a
candidate as close to float64 as an unquantized run where the reference quantized (a
skipped quantization), one much farther from float64 than the reference (a wrong
value), a few elements out of bound (a localized bug).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ...quantization.quantized_tensor import QuantizedTensor
from ..tensor_report import TensorComparison, sqnr_db

__all__ = ["SPREAD_FACTOR", "ELEMENT_FACTOR", "bit_identical_share", "judge", "parity_margin_db"]

#: Criterion 1: the candidate may be this many times as far from the reference as the legitimate twin.
SPREAD_FACTOR = 4.0
#: Criterion 2: an element may be this many times the legitimate twin's smoothed deviation there.
ELEMENT_FACTOR = 12.0


def _values(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, QuantizedTensor):
        t = t.dequantize()
    return t.detach().to("cpu", torch.float64)


def bit_identical_share(a: torch.Tensor, b: torch.Tensor) -> Optional[float]:
    """The share of elements whose bits agree (None when the shapes or dtypes differ)."""
    if isinstance(a, QuantizedTensor) or isinstance(b, QuantizedTensor):
        return None
    if a.shape != b.shape or a.dtype != b.dtype:
        return None
    if a.numel() == 0:
        return 1.0
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return float((a.view(width) == b.view(width)).double().mean().item())


def _matrix(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 0:
        return t.reshape(1, 1)
    if t.dim() == 1:
        return t.reshape(1, -1)
    return t.reshape(-1, t.shape[-1])


def _profile(d: torch.Tensor) -> torch.Tensor:
    """The rank-one (row x column) profile of the deviation ``d``: ``sqrt(R_i C_j / T)``; for one row, its rms."""
    sq = _matrix(d).square()
    total = sq.mean()
    if sq.shape[0] == 1 or sq.shape[1] == 1:
        return total.sqrt().expand_as(sq)
    if total == 0:
        return torch.zeros_like(sq)
    return (sq.mean(dim=1, keepdim=True) * sq.mean(dim=0, keepdim=True) / total).sqrt()


#: The mean-shift check: a z-score beyond this, and a shift beyond SHIFT_FLOOR of the tensor's rms.
SHIFT_Z = 6.0
#: The largest gain the mean-shift check takes out as rounding (2^-6: truncating 14-bit partial sums over K = 2^9).
GAIN_LIMIT = 2.0 ** -6
#: 2^-10: eight times the bias a tensor core's truncated 13-bit partial sums can give a result.
SHIFT_FLOOR = 2.0 ** -10


def _mean_shift(name: str, d: torch.Tensor, ref: torch.Tensor, high: torch.Tensor, eps: float) -> str:
    """A diagnosis when ``d = cand - ref`` of a batch-major tensor (the output, an input grad) has a consistent
    offset, overall or in a column, that rounding cannot explain: rounding differences and the FP8 code flips
    they cause are zero-mean over the rows (the samples); a wrong bias or a skipped scale is not. Empty if none."""
    if not (name == "output" or name.startswith("input[")) or d.dim() < 2:
        return ""
    d, h = _matrix(d), _matrix(high)
    # A small gain (cand = (1 + g) ref, |g| <= 2^-6) is rounding too: truncated partial sums shrink every result
    # toward zero. Take it out, so that a column whose reference values have a non-zero mean does not look shifted.
    r = _matrix(ref)
    energy = float(r.square().sum().item())
    if energy > 0:
        gain = max(-GAIN_LIMIT, min(GAIN_LIMIT, float((d * r).sum().item()) / energy))
        d = d - gain * r
    # Rows are samples only where they differ: an output grad with equal rows (y.sum()'s all-ones) makes every row of
    # the input grad the same, one sample repeated, whose offset says nothing about a bias. Count distinct rows.
    rows = min(d.shape[0], int(torch.unique(_matrix(ref), dim=0).shape[0]))
    if rows < 16 or not bool(d.any()):
        return ""
    floor = max(eps, SHIFT_FLOOR) * float(h.square().mean().sqrt().item())
    means, sds = d.mean(dim=0), d.std(dim=0)
    z = means.abs() / (sds / math.sqrt(rows)).clamp_min(1e-300)
    worst = int(torch.argmax(torch.where(means.abs() > floor, z, torch.zeros_like(z))).item())
    overall_mean = float(d.mean().item())
    overall_z = abs(overall_mean) / max(float(d.std().item()) / math.sqrt(d.numel()), 1e-300)
    if abs(overall_mean) > floor and overall_z > SHIFT_Z:
        return (f"why: the candidate's {name} is offset from the reference by {overall_mean:.3g} on average "
                f"(z = {overall_z:.1f} over {d.numel()} elements; rounding differences are zero-mean): a systematic "
                f"error such as a wrong bias, not rounding")
    if abs(float(means[worst].item())) > floor and float(z[worst].item()) > SHIFT_Z:
        return (f"why: column {worst} of the candidate's {name} is offset from the reference by "
                f"{float(means[worst].item()):.3g} on average over its {rows} rows (z = {float(z[worst].item()):.1f}; "
                f"rounding differences are zero-mean): a systematic error such as a wrong bias, not rounding")
    return ""


def parity_margin_db(numel: int) -> float:
    """How far (dB) two equally good quantized runs' SQNRs against float64 may fall apart on ``numel`` elements:
    three standard deviations of an error energy estimated from ``numel`` samples, at least 0.25 dB."""
    return max(0.25, 10.0 * math.log10(1.0 + 3.0 * math.sqrt(2.0 / max(numel, 1))))


def _db(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.1f}"


def _role(name: str) -> str:
    if name == "output":
        return "the forward GEMMs (input and weight)"
    if name.startswith("input"):
        return "the dgrad GEMMs (grad_output and weight)"
    if name.endswith("weight.grad"):
        return "the wgrad GEMM (input and grad_output)"
    return "the GEMMs that compute it"


def judge(
    name: str,
    candidate: torch.Tensor,
    reference: torch.Tensor,
    legit: torch.Tensor,
    high: Optional[torch.Tensor],
    *,
    quantized: bool,
    unquantized: Optional[torch.Tensor] = None,
    mean_shift: bool = True,
) -> TensorComparison:
    """One tensor under the numerics tier (criteria in the module doc); ``high``: the float64 twin's.

    ``mean_shift=False`` leaves out criterion 3: after an optimizer step the two sides' biases rightly differ by
    their updates' rounding, so a column offset no longer tells a wrong bias."""
    dtype = reference.dtype if not isinstance(reference, QuantizedTensor) else torch.float32
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    c, r, l = _values(candidate), _values(reference), _values(legit)
    share = bit_identical_share(candidate, reference)
    if c.shape != r.shape:
        return TensorComparison(
            name, "numerics", False, math.inf, math.inf, -math.inf, max(c.numel(), r.numel()),
            max(c.numel(), r.numel()), (), f"shape {tuple(c.shape)} != expected {tuple(r.shape)}",
            bit_identical_share=0.0, why=f"why: {name} has shape {tuple(c.shape)}, the reference's is {tuple(r.shape)}",
        )
    h = _values(high) if high is not None and tuple(high.shape) == tuple(r.shape) else None
    scale_ref = h if h is not None else r
    norm_h = float(scale_ref.norm().item())
    nan_c, nan_r = torch.isnan(c), torch.isnan(r)
    diff = (c - r).abs()
    diff = torch.where(nan_c & nan_r, torch.zeros_like(diff), diff)
    spread = float((l - r).nan_to_num().norm().item())
    if spread == 0.0 and h is not None:
        # The legitimate twin computed this tensor bit for bit like the reference (a kernel it does not vary, or a
        # reference that is not refops): the reference's own rounding error stands in for the spread.
        spread = float((r - h).nan_to_num().norm().item())
    distance = float(diff.nan_to_num(nan=math.inf).norm().item())
    allowed = SPREAD_FACTOR * spread + eps * norm_h
    bound = ELEMENT_FACTOR * _profile((l - r).nan_to_num()) + eps * _matrix(scale_ref).abs()
    out_of_bound = (_matrix(diff) > bound) | _matrix(nan_c != nan_r)
    to_f64_c = sqnr_db(c.nan_to_num(), h) if h is not None else math.nan
    to_f64_r = sqnr_db(r.nan_to_num(), h) if h is not None else math.nan
    to_f64_l = sqnr_db(l.nan_to_num(), h) if h is not None else math.nan
    nan_ok = not bool((nan_c != nan_r).any())
    spread_ok = distance <= allowed and nan_ok
    margin = parity_margin_db(c.numel())
    parity_ok = (quantized and h is not None and nan_ok and math.isfinite(to_f64_r)
                 and abs(to_f64_c - to_f64_r) <= margin)
    if h is not None:  # the element-wise profile also holds the reference's own error to float64
        bound = ELEMENT_FACTOR * (_profile((l - r).nan_to_num()).square()
                                  + _profile((r - h).nan_to_num()).square()).sqrt() + eps * _matrix(h).abs()
        # Where the reference itself (or the twin) lands far from float64 at one element, that element is
        # ill-conditioned for float arithmetic (1 + tanh cancelling in a tanh-GELU's tail, whose absolute
        # error is eps|x| while the result is tiny): a correct implementation may land as far, in its own way.
        local = torch.maximum((r - h).nan_to_num().abs(), (l - r).nan_to_num().abs())
        bound = torch.maximum(bound, ELEMENT_FACTOR * _matrix(local))
        out_of_bound = (_matrix(diff) > bound) | _matrix(nan_c != nan_r)
    elements_ok = not bool(out_of_bound.any())
    shift = _mean_shift(name, (c - r).nan_to_num(), r.nan_to_num(), scale_ref, eps) if mean_shift else ""
    if shift:
        elements_ok = False
    decided = "spread" if spread_ok else "parity" if parity_ok else None
    criterion = (f"numerics: ||cand-ref|| {distance:.3g} vs {SPREAD_FACTOR:g}x legit spread {spread:.3g} "
                 f"+ eps||f64|| = {allowed:.3g}")
    if h is not None:
        criterion += (f"; to float64: cand {_db(to_f64_c)} dB, ref {_db(to_f64_r)} dB (parity within "
                      f"{margin:.2f} dB{'' if quantized else ', quantized runs only'}), legit {_db(to_f64_l)} dB")
    criterion += (f"; element-wise <= {ELEMENT_FACTOR:g}x the row x column error profile (or the element's own "
                  f"error to float64) + eps|f64|")
    why = ""
    passed = bool(decided) and elements_ok
    if passed:
        criterion = f"passed by the {decided}; " + criterion
    elif shift and decided:
        criterion = "failed by the mean shift; " + criterion
        why = shift
    else:
        decided = "element-wise bound" if decided else ("spread" + (" and parity" if quantized and h is not None
                                                                      else ""))
        criterion = f"failed by the {decided}; " + criterion
        why = shift or _diagnose(name, distance, allowed, spread, out_of_bound, to_f64_c, to_f64_r, to_f64_l, quantized,
                        sqnr_db(unquantized.double().cpu(), h) if unquantized is not None and h is not None
                        else None)
    rel = diff / r.abs().clamp_min(torch.finfo(torch.float64).tiny)
    indices = torch.nonzero(out_of_bound.reshape(diff.shape) if diff.dim() > 0 else out_of_bound.reshape(()))[:5]
    return TensorComparison(
        name=name,
        tier="numerics",
        passed=passed,
        max_abs_error=float(diff.max().item()) if diff.numel() else 0.0,
        max_rel_error=float(rel.max().item()) if rel.numel() else 0.0,
        sqnr_db=sqnr_db(torch.where(nan_c & nan_r, 0, c), torch.where(nan_c & nan_r, 0, r)),
        num_mismatches=int(out_of_bound.sum().item()),
        numel=c.numel(),
        first_mismatches=tuple(tuple(int(i) for i in idx) for idx in indices.tolist()),
        criterion=criterion,
        bit_identical_share=share,
        candidate_to_float64_db=to_f64_c,
        reference_to_float64_db=to_f64_r,
        why=why,
    )


def _diagnose(name, distance, allowed, spread, out_of_bound, c64, r64, l64, quantized, unquantized64) -> str:
    """One line saying what the numbers suggest went wrong."""
    finite = not any(math.isnan(v) for v in (c64, r64))
    near_unquantized = unquantized64 is not None and (
        c64 == unquantized64 or abs(c64 - unquantized64) < abs(c64 - r64))
    if finite and quantized and near_unquantized and c64 > r64 + 3.0:
        return (f"why: the candidate's {name} is as close to float64 ({_db(c64)} dB) as an unquantized run would "
                f"be ({_db(unquantized64)} dB), the reference's is {_db(r64)} dB: the reference quantized the "
                f"operands of {_role(name)}, the candidate evidently did not")
    if finite and quantized and c64 > r64 + parity_margin_db(out_of_bound.numel()):
        return (f"why: the candidate's {name} is closer to float64 ({_db(c64)} dB) than the reference's "
                f"({_db(r64)} dB) by more than two equally good quantized runs can be: it evidently skipped a "
                f"quantization the reference makes, or quantized more finely (E4M3 where the recipe asks for E5M2, "
                f"smaller blocks), in {_role(name)} or upstream")
    if finite and c64 < r64 - 3.0:
        return (f"why: the candidate's {name} is farther from float64 ({_db(c64)} dB) than the reference's "
                f"({_db(r64)} dB) and than a legitimately different implementation's ({_db(l64)} dB): a wrong "
                f"value, or a coarser quantization than the recipe's (another FP8 format, scaling or block), "
                f"not a rounding difference")
    count = int(out_of_bound.sum().item())
    if distance <= allowed:
        return (f"why: {count} of {out_of_bound.numel()} elements of {name} differ from the reference by more than "
                f"any rounding of the GEMMs that produce them can explain, while the whole tensor is as close as "
                f"rounding allows: a localized bug (one element, one row or one column)")
    return (f"why: the candidate's {name} is {distance / max(spread, 1e-300):.3g}x as far from the reference as a "
            f"legitimately different implementation ({_db(c64)} dB to float64 against the reference's "
            f"{_db(r64)} dB): more than rounding order, TF32 or fast accumulation can explain")
