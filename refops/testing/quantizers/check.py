"""``check_quantizer``: a candidate quantizer against the reference, bit for bit, on adversarial inputs.

A kernel author's first test. ``check_quantizer(candidate, quantizer_or_recipe)``
runs the matrix of :mod:`refops.testing.quantizers.cases` (random values at many
scales, heavy tails, zeros, all-zero blocks, subnormals, exact ties between
codes, values at and past the format's max, infinities and NaN, partial blocks,
block amaxes one ulp around a power-of-two scale boundary, fp32/fp16/bf16 inputs) in both orientations, and compares every code and every
scale with the reference's exactly.

The candidate protocol:

* it is called as ``candidate(x)``, or ``candidate(x, quantizer)`` when it takes
  two positional arguments. ``quantizer`` is a fresh reference quantizer
  configured for the case: its options (``dtype``, ``force_pow_2_scales``,
  ``block_scaling_dim``, ...), the usage asked for (``rowwise_usage`` or
  ``columnwise_usage``), and for delayed scaling the ``scale`` to cast with.
  A one-argument candidate is checked row-wise only (it cannot be asked for the
  other orientation), and cannot be checked for delayed scaling;
* ``output=`` says what it returns (inferred from the first result when omitted):

  - ``"quantized_tensor"``: a refops :class:`~refops.quantization.QuantizedTensor`;
  - ``"data_and_scale_inv"``: ``(data, scale_inv)`` or ``(data, scale_inv, amax)``,
    or a dict with ``"data"``, ``"scale_inv"`` (per-tensor FP8 may give
    ``"scale"``: ``RN(1/scale)`` is compared) and optionally ``"amax"``,
    in the reference's layout for the usage asked (column-wise FP8 and NVFP4
    data transposed); data as uint8 or a float8 dtype, NVFP4 packed or one code
    a byte; scales padded or cut to the valid region, as stored or decoded to fp32;
  - ``"dequantized"``: the dequantized values, compared bit for bit with the
    reference's. This tier cannot see a code and scale that disagree but
    dequantize to the same value; the report says so.

A few representative cases also give the candidate the same values in other
input layouts (:mod:`.input_layouts`: non-contiguous, behind a storage offset,
expanded with stride 0), each compared with the reference's result on the
contiguous tensor; ``report[case, dtype, usage, layout]`` is such a run. Every run
gets a fresh copy of its input, and one that the candidate writes into fails. A
failing run names the mix-up its bytes reveal where there is one (the other FP8
format, a scale a power of two off, the transposed layout:
:mod:`refops.testing.format_diagnosis`).

The amax (per-tensor FP8's, which delayed scaling records for the next scale,
and NVFP4's global one) is compared bit for bit wherever the candidate returns it
or records it in ``quantizer.amax`` (:mod:`.amax`). Where the reference rejects an
input (an MXFP8 shape that 32 does not divide, the RHT on a non-bf16 input), the
case is recorded with the reference's error.

The report (:class:`~refops.testing.quantizers.report.QuantizerCheckReport`) leads
with the failing runs, summarizes the passing ones, and lists what could not be
compared: the codes behind a dequantized result, an amax never provided, the
column-wise orientation of a one-argument candidate, and a missing clamp before
an FP8 cast that torch's own cast hides by saturating (:mod:`.saturation`). A
check that compared nothing fails; arguments that would select nothing are a
``ValueError`` before anything runs (:mod:`.arguments`).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Optional, Sequence, Union

import torch

from ...quantization import Float8Quantizer, QuantizedTensor, Quantizer
from ...recipe import Recipe
from . import amax as amax_check
from . import input_layouts, layout, saturation
from .cases import CASES
from .arguments import (DTYPES, LAYOUTS, OUTPUTS, USAGES, check_candidate, check_dtypes, check_layouts, check_usages,
                        planned_runs, select_cases)
from .compare import (Comparison, candidate_fields, data_not_row_major, dequantized_run, first_line, input_written,
                      quantized_run)
from .reference import case_quantizer, describe_quantizer, reference_outputs, reference_quantizer
from .report import COMPARED, CaseRun, QuantizerCheckReport, QuantizerMismatch

__all__ = ["check_quantizer", "QuantizerCheckReport", "CaseRun", "QuantizerMismatch", "OUTPUTS", "DTYPES", "USAGES",
           "LAYOUTS"]

DEQUANTIZED_LIMIT = (
    "the dequantized tier compares values only: a code and a scale that disagree with the reference's "
    "but dequantize to the same value are not seen"
)


def _takes_quantizer(candidate: Callable[..., Any]) -> bool:
    """Whether ``candidate`` accepts a second positional argument (the case's quantizer)."""
    try:
        params = inspect.signature(candidate).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _infer_output(result: Any) -> str:
    if isinstance(result, QuantizedTensor):
        return "quantized_tensor"
    if isinstance(result, (tuple, list, dict)):
        return "data_and_scale_inv"
    if isinstance(result, torch.Tensor) and result.is_floating_point() and result.element_size() > 1:
        return "dequantized"
    raise TypeError(
        f"check_quantizer: cannot tell what the candidate returned ({type(result).__name__}"
        f"{'' if not isinstance(result, torch.Tensor) else ' ' + str(result.dtype)}); return a QuantizedTensor, "
        "(data, scale_inv) or dequantized values, and pass output= to say which"
    )


def check_quantizer(
    candidate: Callable[..., Any],
    quantizer_or_recipe: Union[Quantizer, Recipe],
    *,
    output: Optional[str] = None,
    role: str = "input",
    dtypes: Sequence[torch.dtype] = DTYPES,
    usages: Sequence[str] = USAGES,
    cases: Optional[Sequence[str]] = None,
    layouts: Sequence[str] = LAYOUTS,
    device: Optional[torch.device | str] = None,
    seed: int = 0,
    max_mismatches: int = 24,
) -> QuantizerCheckReport:
    """Run the adversarial matrix through ``candidate`` and the reference; compare bit for bit.

    Args:
        candidate: ``candidate(x)`` or ``candidate(x, quantizer)`` (see the module docstring).
        quantizer_or_recipe: a refops quantizer, or a recipe (its quantizer for ``role``).
        output: "quantized_tensor", "data_and_scale_inv" or "dequantized" (None: inferred).
        role: for a recipe, which tensor's quantizer: "input", "weight" or "grad_output".
        dtypes: the input dtypes, some of fp32, fp16, bf16 (default: all three).
        usages: the orientations, some of "rowwise" and "columnwise" (default: both).
        cases: only these case names (default: every case of :data:`~refops.testing.quantizers.cases.CASES`).
        layouts: the input layouts besides contiguous, some of "non-contiguous", "storage offset" and
            "expanded" (default: all three; ``[]``: contiguous inputs only), and "unaligned storage offset",
            which runs only when named (a slice whose address is not 16-byte aligned). They run on the cases that
            declare them (:attr:`~refops.testing.quantizers.cases.QuantizerCase.layouts`: normal, ties,
            partial_blocks, three_dims and broadcast_row; expanded on broadcast_row only), compared
            with the reference's result on the contiguous input; ``report[case, dtype, usage, layout]``.
        device: where the inputs are made (default: torch's default device).
        seed: seeds each case's generator (``seed + position``); the matrix is deterministic.
        max_mismatches: how many mismatching elements the report lists (the first of every failing run
            first, at most 8 per run).

    Returns:
        A :class:`QuantizerCheckReport`; ``assert_ok()`` raises with the evidence. A report in which no
        run could be compared (every one skipped or rejected by the reference) is not ok.

    Raises:
        TypeError: ``candidate`` is not callable; ``usages``, ``dtypes``, ``cases`` or ``layouts`` is not a list
            (a single string or dtype); a one-argument candidate for delayed scaling.
        ValueError: an empty ``usages``, ``dtypes`` or ``cases``, or a selection that runs nothing
            (a check that runs nothing must not pass); an unknown usage, case or output; a dtype
            other than fp32, fp16 and bf16; an unknown layout; ``role`` with a quantizer.
    """
    check_candidate(candidate)
    if output is not None and output not in OUTPUTS:
        raise ValueError(f"check_quantizer: output must be one of {OUTPUTS}, got {output!r}")
    usages = check_usages(usages)
    dtypes = check_dtypes(dtypes)
    layouts = check_layouts(layouts)
    if not isinstance(max_mismatches, int) or max_mismatches < 0:
        raise ValueError(f"check_quantizer: max_mismatches must be an int >= 0, got {max_mismatches!r}")
    selected = select_cases(cases)
    plan = planned_runs(selected, dtypes)
    reference = reference_quantizer(quantizer_or_recipe, role)
    device = torch.device(device) if device is not None else torch.get_default_device()
    takes_quantizer = _takes_quantizer(candidate)
    if isinstance(reference, Float8Quantizer) and not takes_quantizer:
        raise TypeError(
            "check_quantizer: Float8Quantizer (delayed scaling) casts with a scale the candidate must be given; "
            "write candidate(x, quantizer) and cast with quantizer.scale"
        )
    state = {"output": output, "inferred": output is None, "strided": []}
    evidence = amax_check.AmaxEvidence()
    past_max: dict[str, int] = {}
    result = Comparison(max_mismatches)
    positions = {case.name: position for position, case in enumerate(selected)}
    for case, dtype in plan:
        g = torch.Generator().manual_seed(seed + positions[case.name])
        x = case.build(dtype, reference, g).to(device)
        references = reference_outputs(reference, case, x, usages)
        # The contiguous input first, then the same values in each other layout the case declares.
        for input_layout in [input_layouts.CONTIGUOUS] + [lay for lay in case.layouts if lay in layouts]:
            for usage in usages:
                run = _run_one(candidate, reference, case, x, input_layout, usage, references[usage],
                               takes_quantizer, state, result, evidence)
                if run.status in COMPARED and run.past_max:
                    past_max[case.name] = past_max.get(case.name, 0) + 1
    _hold_to_recording(result, evidence)
    return _report(candidate, reference, role if isinstance(quantizer_or_recipe, Recipe) else "", usages,
                   takes_quantizer, state, result, evidence, past_max, device, selected, layouts)


def _describe_layouts(runs: Sequence[CaseRun], selected, layouts: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(compared, not_compared)`` sentences: which layouts ran on which cases, and what ran contiguous only."""
    other = [r for r in runs if r.layout != input_layouts.CONTIGUOUS and r.status in COMPARED]
    ran = list(dict.fromkeys(r.layout for r in other))
    compared, not_compared = [], []
    if ran:
        on = {lay: sorted({r.case for r in other if r.layout == lay}, key=[c.name for c in selected].index)
              for lay in ran}
        where = "; ".join(f"{input_layouts.describe_layouts((lay,))} on {', '.join(on[lay])}" for lay in ran)
        compared.append(f"the same values in other layouts, against the reference's result on the contiguous input, "
                        f"bit for bit ({len(other)} runs): {where}")
    compared.append("every input the candidate was given (a fresh copy each run) holds its values after the call")
    unused = [c.name for c in selected if not any(lay in layouts for lay in c.layouts)]
    if not layouts:
        not_compared.append("other layouts: every input was contiguous (layouts=[])")
    elif not ran:
        not_compared.append(f"other layouts: none ran: they run on {', '.join(c.name for c in CASES if c.layouts)}, "
                            "and none of these was selected or compared")
    elif unused:
        cases = f"the {len(unused)} other cases" if len(unused) > 1 else f"the other case ({unused[0]})"
        not_compared.append(f"other layouts: {cases} ran on contiguous inputs only (a representative few run in "
                            "every layout, to keep the check fast)")
    return compared, not_compared


def _hold_to_recording(result: Comparison, evidence: amax_check.AmaxEvidence) -> None:
    """A candidate that records its amax in some runs must in every run: where ``quantizer.amax`` stayed
    zero while the input's amax is not zero, the run differs."""
    if not evidence.recorded_runs:
        return
    for index, expected in evidence.unrecorded:
        run = result.runs[index]
        if expected == 0.0 or run.status not in ("ok", "differs"):
            continue
        note = f"amax not recorded in quantizer.amax (still 0), expected {expected!r}"
        detail = f"{run.detail}; {note}" if run.detail else note
        result.runs[index] = dataclasses.replace(run, status="differs", detail=detail)


def _report(candidate, reference, role, usages, takes_quantizer, state, result, evidence, past_max,
            device, selected, layouts) -> QuantizerCheckReport:
    output = state["output"] or "unknown (the candidate never returned a result)"
    if state["inferred"]:
        output += " (inferred from the first result)"
    compared, not_compared = [], []
    if state["output"] == "dequantized":
        compared.append("dequantized values of every element, bit for bit (NaN matches NaN)")
        not_compared.append(DEQUANTIZED_LIMIT)
    elif state["output"] is not None:
        compared.append("the code of every element and every scale_inv (valid region, padding excluded), bit for bit")
    if not takes_quantizer and "columnwise" in usages and state["output"] != "quantized_tensor":
        not_compared.append("column-wise not checked: the candidate takes no quantizer argument, so it cannot be "
                            "asked for the column-wise orientation (write candidate(x, quantizer))")
    layouts_said, layouts_unsaid = _describe_layouts(result.runs, selected, layouts)
    compared += layouts_said
    not_compared += layouts_unsaid + data_not_row_major(state["strided"])
    amax_compared, amax_not_compared = amax_check.describe(
        reference, evidence, can_return=state["output"] != "dequantized", can_record=takes_quantizer)
    compared += amax_compared
    not_compared += amax_not_compared
    dtype = saturation.cast_dtype(reference)
    said, unsaid = saturation.describe(reference, saturation.native_saturation(dtype, device), past_max)
    compared += [said] if said else []
    not_compared += [unsaid] if unsaid else []
    rejected = sorted({r.case for r in result.runs if r.status in ("both reject", "reference rejects")})
    if rejected:
        not_compared.append(f"the reference rejects some inputs of {', '.join(rejected)}; those runs were not "
                            "compared")
    name = getattr(candidate, "__qualname__", None) or type(candidate).__name__
    return QuantizerCheckReport(name, describe_quantizer(reference), output, result.runs, result.mismatches,
                                not_compared, compared, role)


def _run_one(candidate, reference, case, x, input_layout, usage, ref_and_amax, takes_quantizer, state,
             result: Comparison, evidence: amax_check.AmaxEvidence) -> CaseRun:
    """One case, one dtype, one input layout, one orientation: the candidate on a fresh copy of ``x`` in
    ``input_layout``, compared with the reference's result on the contiguous ``x``."""
    ref, ref_amax = ref_and_amax
    shape, dtype = tuple(x.shape), str(x.dtype).removeprefix("torch.")
    base = dict(case=case.name, dtype=dtype, usage=usage, shape=shape, layout=input_layout)
    if usage == "columnwise" and not takes_quantizer and state["output"] not in (None, "quantized_tensor"):
        return _record(result, CaseRun(**base, status="skipped", detail="the candidate cannot be asked for column-wise"))
    q_cand = case_quantizer(reference, x, case, usage)
    amax_buffer = q_cand.amax if amax_check.records_amax(q_cand) else None
    ref_error = ref if isinstance(ref, str) else None
    given = input_layouts.present(x, input_layout)  # a fresh tensor: what the candidate does to it stays there
    try:
        got = candidate(given, q_cand) if takes_quantizer else candidate(given)
        got_error = None
    except Exception as error:  # noqa: BLE001  (recorded as evidence)
        got, got_error = None, first_line(error)
    if ref_error is not None:
        status = "both reject" if got_error is not None else "reference rejects"
        detail = f"reference: {ref_error}" + (f"; candidate: {got_error}" if got_error else "; the candidate returned a result")
        return _record(result, CaseRun(**base, status=status, detail=detail))
    if got_error is not None:
        return _record(result, CaseRun(**base, status="candidate raised", detail=got_error))
    if state["output"] is None:
        state["output"] = _infer_output(got)
    if usage == "columnwise" and not takes_quantizer and state["output"] != "quantized_tensor":
        return _record(result, CaseRun(**base, status="skipped", detail="the candidate cannot be asked for column-wise"))
    returned_amax = None
    problems = []
    try:
        if state["output"] == "dequantized":
            if not isinstance(got, torch.Tensor) or isinstance(got, QuantizedTensor):
                raise ValueError(f"returned {type(got).__name__}, not a tensor of dequantized values")
            run, found = dequantized_run(case, x, ref, usage, got)
        else:
            fields = candidate_fields(got, ref, usage, q_cand)
            if fields.get("data") is None or fields.get("scale_inv") is None:
                raise ValueError(f"the result holds no {usage} data or scale_inv")
            returned_amax = fields.get("amax")
            run, found = quantized_run(case, x, ref, usage, fields)
            if not fields["data"].is_contiguous():  # its values are compared; its storage order is reported
                state["strided"].append(dataclasses.replace(run, layout=input_layout).name)
    except (ValueError, TypeError) as error:
        run, found = CaseRun(**base, status="differs", detail=first_line(error)), []
    problems += input_written(given, x)
    expected_amax = layout.usage_fields(ref, usage).get("amax") if ref_amax is None else ref_amax
    problems += amax_check.compare(expected_amax, returned_amax, amax_check.recorded(q_cand, amax_buffer), evidence,
                                   len(result.runs))
    if problems:
        detail = "; ".join([run.detail] * bool(run.detail) + problems)
        run = dataclasses.replace(run, status="differs", detail=detail)
    run = dataclasses.replace(run, layout=input_layout, past_max=saturation.elements_past_max(ref, usage, x))
    return _record(result, run, [dataclasses.replace(m, layout=input_layout) for m in found])


def _record(result: Comparison, run: CaseRun, found: Sequence[QuantizerMismatch] = ()) -> CaseRun:
    result.record(run, list(found))
    return run
