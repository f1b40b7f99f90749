"""One run of :func:`refops.testing.check_quantizer` compared: the candidate's codes and scales (or
dequantized values) against the reference's, element by element, with the evidence of the first mismatches."""

from __future__ import annotations

from typing import Any

import torch

from ...quantization import Float8CurrentScalingQuantizer, Float8Quantizer, QuantizedTensor, Quantizer
from . import layout
from .diagnosis import diagnose_run
from .report import CaseRun, QuantizerMismatch, fails_alike

__all__ = ["candidate_fields", "quantized_run", "dequantized_run", "Comparison", "first_line", "data_not_row_major",
           "input_written"]


def first_line(error: BaseException) -> str:
    """``Type: first line of the message`` (at most 150 characters of it), for a report row."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:150]}"


def candidate_fields(result: Any, reference: QuantizedTensor, usage: str, quantizer: Quantizer) -> dict[str, Any]:
    """The candidate's data, scale_inv and amax for ``usage`` (None where it gave none)."""
    if isinstance(result, QuantizedTensor):
        if type(result) is not type(reference):
            raise ValueError(f"returned a {type(result).__name__}; the reference makes {type(reference).__name__}")
        return layout.usage_fields(result, usage)
    if isinstance(result, dict):
        data, scale_inv, amax = result.get("data"), result.get("scale_inv"), result.get("amax")
        if scale_inv is None and result.get("scale") is not None:
            if not isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)):
                raise ValueError("'scale' is accepted for per-tensor FP8 only; return 'scale_inv'")
            scale_inv = torch.reciprocal(torch.as_tensor(result["scale"]).float().reshape(-1))
    elif isinstance(result, (tuple, list)) and len(result) in (2, 3):
        data, scale_inv, amax = (*result, None)[:3]
    else:
        raise ValueError("a data_and_scale_inv result is (data, scale_inv[, amax]) or a dict with those keys")
    if not isinstance(data, torch.Tensor) or not isinstance(scale_inv, torch.Tensor):
        raise ValueError("returned no data or no scale_inv tensor")
    return {"data": data, "scale_inv": layout.valid_scale(reference, usage, scale_inv), "amax": amax}


def data_not_row_major(runs: list[str]) -> list[str]:
    """A sentence when the candidate's data was not stored row-major in some runs (``runs``, by name): its values
    were compared, not the order of its bytes, which a consumer reading them in order (a GEMM given the data
    pointer, a copy to another process) depends on."""
    if not runs:
        return []
    first = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    return [f"storage order: in {len(runs)} runs ({first}) the candidate's data was not stored row-major as the "
            "reference's (torch's elementwise ops keep the input's strides); its values were compared, not the order "
            "of its bytes: call .contiguous() before handing it to a kernel that reads them in order"]


def input_written(given: torch.Tensor, values: torch.Tensor) -> list[str]:
    """A sentence when the candidate changed the input it was given (a quantizer must leave it as it was)."""
    if given.shape != values.shape or given.dtype != values.dtype:
        return [f"the candidate changed its input to {given.dtype} of shape {tuple(given.shape)}"]
    changed = int((layout.as_bits(given) != layout.as_bits(values)).sum())
    return [f"the candidate wrote into its input: {changed} elements changed"] if changed else []


def _aligned_scales(reference: QuantizedTensor, expected: torch.Tensor, got: torch.Tensor):
    """Both scale tensors in one representation: stored bytes, or fp32 values when the candidate decoded."""
    got = got.detach().cpu()
    if expected.element_size() == 1 and got.element_size() != 1:
        return layout.decode_scale_bits(reference, expected), got.float()
    if expected.element_size() != got.element_size():
        return expected, got.to(expected.dtype)
    return expected, got


class Comparison:
    """Accumulates the runs and the first mismatches of one check."""

    def __init__(self, max_mismatches: int) -> None:
        self.runs: list[CaseRun] = []
        self.found: list[list[QuantizerMismatch]] = []
        self.max_mismatches = max_mismatches

    def record(self, run: CaseRun, found: list[QuantizerMismatch]) -> None:
        """Keep ``run``; and its mismatches, unless it fails exactly as its contiguous run (whose are kept)."""
        contiguous = next((r for r in self.runs if (r.case, r.dtype, r.usage, r.layout) ==
                           (run.case, run.dtype, run.usage, "contiguous")), None)
        self.runs.append(run)
        if found and not fails_alike(run, contiguous):
            self.found.append(found)

    @property
    def mismatches(self) -> list[QuantizerMismatch]:
        """Round robin over the failing runs (the first of each, then the second...), so every case shows."""
        out: list[QuantizerMismatch] = []
        for rank in range(max((len(f) for f in self.found), default=0)):
            out += [f[rank] for f in self.found if rank < len(f)]
        return out[: self.max_mismatches]


def quantized_run(case, x, ref, usage, fields) -> tuple[CaseRun, list[QuantizerMismatch]]:
    """Codes and scales of one run, element by element (the amax is compared by :mod:`.amax`)."""
    expected = layout.usage_fields(ref, usage)
    shape, dtype = tuple(x.shape), str(x.dtype).removeprefix("torch.")
    base = dict(case=case.name, dtype=dtype, usage=usage, shape=shape)
    try:
        exp_codes = layout.element_codes(ref, usage, expected["data"].cpu())
        got_codes = layout.element_codes(ref, usage, fields["data"].detach().cpu())
    except RuntimeError as error:
        got = tuple(fields["data"].shape)
        return CaseRun(**base, status="differs", detail=f"data has shape {got}: {first_line(error)}"), []
    exp_scale, got_scale = _aligned_scales(ref, expected["scale_inv"].cpu(), fields["scale_inv"])
    if exp_scale.shape != got_scale.shape:
        detail = f"scale_inv has shape {tuple(got_scale.shape)}, expected {tuple(exp_scale.shape)}"
        return CaseRun(**base, status="differs", detail=detail), []
    exp_el, got_el = layout.element_scales(ref, usage, exp_scale), layout.element_scales(ref, usage, got_scale)
    bad = (exp_codes != got_codes) | (exp_el != got_el)
    scale_bad = int((layout.as_bits(exp_scale) != layout.as_bits(got_scale)).sum())
    code_bad = int((exp_codes != got_codes).sum())
    run = CaseRun(**base, status="differs" if bool(bad.any()) else "ok", elements=bad.numel(),
                  code_mismatches=code_bad, scale_mismatches=scale_bad, scales=exp_scale.numel(),
                  detail=diagnose_run(ref, usage, expected, fields, x) if bool(bad.any()) else "")
    flat = x.detach().reshape(exp_codes.shape).cpu()
    nbytes = exp_scale.element_size()
    found = []
    # Elements whose code differs first: a scale that differs alone is the lesser evidence.
    code_first = torch.cat([torch.nonzero(exp_codes != got_codes), torch.nonzero(bad & (exp_codes == got_codes))])
    for m, k in code_first[:8].tolist():
        found.append(QuantizerMismatch(
            case.name, dtype, usage, _nominal_index(shape, m, k), float(flat[m, k]),
            layout.describe_code(ref, int(exp_codes[m, k])), layout.describe_code(ref, int(got_codes[m, k])),
            layout.describe_scale(ref, int(exp_el[m, k]), nbytes), layout.describe_scale(ref, int(got_el[m, k]), nbytes),
        ))
    return run, found


def dequantized_run(case, x, ref, usage, got) -> tuple[CaseRun, list[QuantizerMismatch]]:
    """Dequantized values, bit for bit (NaN matches NaN), with the reference's code and scale as context."""
    shape, dtype = tuple(x.shape), str(x.dtype).removeprefix("torch.")
    base = dict(case=case.name, dtype=dtype, usage=usage, shape=shape)
    got = got.detach().cpu()
    expected = ref.dequantize(dtype=got.dtype, usage=usage).cpu()
    if got.shape != expected.shape:
        return CaseRun(**base, status="differs", detail=f"shape {tuple(got.shape)}, expected {shape}"), []
    bad = (layout.as_bits(got) != layout.as_bits(expected)) & ~(torch.isnan(got) & torch.isnan(expected))
    run = CaseRun(**base, status="differs" if bool(bad.any()) else "ok", elements=bad.numel(),
                  code_mismatches=int(bad.sum()))
    fields = layout.usage_fields(ref, usage)
    codes = layout.element_codes(ref, usage, fields["data"].cpu())
    scales = layout.element_scales(ref, usage, fields["scale_inv"].cpu())
    m_k = bad.reshape(codes.shape)
    flat_x, flat_e, flat_g = (t.reshape(codes.shape) for t in (x.detach().cpu(), expected, got))
    found = []
    for m, k in torch.nonzero(m_k)[:8].tolist():
        code = layout.describe_code(ref, int(codes[m, k]))
        scale = layout.describe_scale(ref, int(scales[m, k]), fields["scale_inv"].element_size())
        found.append(QuantizerMismatch(
            case.name, dtype, usage, _nominal_index(shape, m, k), float(flat_x[m, k]),
            f"{float(flat_e[m, k])!r} (code {code})", f"{float(flat_g[m, k])!r}", scale, "-",
        ))
    return run, found


def _nominal_index(shape: tuple[int, ...], m: int, k: int) -> tuple[int, ...]:
    """The index in the tensor's own shape of element ``(m, k)`` of its ``(M, K)`` view."""
    flat = m * shape[-1] + k
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))
