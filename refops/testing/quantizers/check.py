"""``check_quantizer``: a candidate quantizer against the reference, bit for bit, on adversarial inputs.

A kernel author's first test. ``check_quantizer(candidate, quantizer_or_recipe)``
runs the matrix of :mod:`refops.testing.quantizers.cases` (random values at many
scales, heavy tails, zeros, all-zero blocks, subnormals, exact ties between
codes, values at and past the format's max, infinities and NaN, partial blocks,
fp32/fp16/bf16 inputs) in both orientations, and compares every code and every
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
    ``"scale"``: ``RN(1/scale)`` is compared) and optionally ``"amax"`` (NVFP4),
    in the reference's layout for the usage asked (column-wise FP8 and NVFP4
    data transposed); data as uint8 or a float8 dtype, NVFP4 packed or one code
    a byte; scales padded or cut to the valid region, as stored or decoded to fp32;
  - ``"dequantized"``: the dequantized values, compared bit for bit with the
    reference's. This tier cannot see a code and scale that disagree but
    dequantize to the same value; the report says so.

Where the reference rejects an input (an MXFP8 shape that 32 does not divide,
the RHT on a non-bf16 input), the case is recorded with the reference's error.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Callable, Optional, Sequence, Union

import torch

from ...quantization import Float8Quantizer, NVFP4Quantizer, QuantizedTensor, Quantizer
from ...quantization.quantizer import QuantizerRole
from ...quantization.recipe_state import RecipeState
from ...recipe import Recipe
from . import layout
from .cases import CASES, QuantizerCase, multiplier_for_amax
from .compare import Comparison, candidate_fields, dequantized_run, first_line, quantized_run
from .report import CaseRun, QuantizerCheckReport, QuantizerMismatch

__all__ = ["check_quantizer", "QuantizerCheckReport", "CaseRun", "QuantizerMismatch", "OUTPUTS"]

#: The output conventions a candidate may declare.
OUTPUTS = ("quantized_tensor", "data_and_scale_inv", "dequantized")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
USAGES = ("rowwise", "columnwise")
DEQUANTIZED_LIMIT = (
    "the dequantized tier compares values only: a code and a scale that disagree with the reference's "
    "but dequantize to the same value are not seen"
)


def _reference_quantizer(quantizer_or_recipe: Union[Quantizer, Recipe], role: str) -> Quantizer:
    """The quantizer to check against: the one given, or the recipe's quantizer for ``role``."""
    if isinstance(quantizer_or_recipe, Quantizer):
        quantizer = quantizer_or_recipe
    elif isinstance(quantizer_or_recipe, Recipe):
        if role not in ("input", "weight", "grad_output"):
            raise ValueError(f"check_quantizer: role must be 'input', 'weight' or 'grad_output', got {role!r}")
        mode = "backward" if role == "grad_output" else "forward"
        state = RecipeState.create(
            quantizer_or_recipe, mode=mode, num_quantizers=1, roles=[QuantizerRole(module_type="linear", tensor_type=role)],
            device=torch.device("cpu"),
        )
        quantizer = state.make_quantizer(0)
    else:
        raise TypeError(
            f"check_quantizer: expected a refops Quantizer or Recipe, got {type(quantizer_or_recipe).__name__}"
        )
    if isinstance(quantizer, NVFP4Quantizer) and quantizer.stochastic_rounding:
        raise ValueError(
            "check_quantizer: stochastic rounding draws random bits and cannot be compared bit for bit; "
            "check an NVFP4Quantizer(stochastic_rounding=False) (or another role) instead"
        )
    return quantizer


def _describe_quantizer(q: Quantizer) -> str:
    """``Float8BlockQuantizer(dtype=kFloat8E4M3, force_pow_2_scales=True, block_scaling_dim=1)``: the class
    and the options that change the numerics (off-by-default flags only when set)."""
    options = []
    for name in ("dtype", "force_pow_2_scales", "amax_epsilon", "block_scaling_dim", "with_2d_quantization",
                 "with_rht", "row_scaled_nvfp4", "nvfp4_use_4over6"):
        value = getattr(q, name, None)
        always_shown = name in ("dtype", "force_pow_2_scales", "block_scaling_dim")
        if value is None or (not always_shown and not value):
            continue
        options.append(f"{name}={value.name if name == 'dtype' else value}")
    return f"{type(q).__name__}({', '.join(options)})"


def _takes_quantizer(candidate: Callable[..., Any]) -> bool:
    """Whether ``candidate`` accepts a second positional argument (the case's quantizer)."""
    try:
        params = inspect.signature(candidate).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _case_quantizer(reference: Quantizer, x: torch.Tensor, case: QuantizerCase, *usages: str) -> Quantizer:
    """A fresh quantizer for one run: these usages; for delayed scaling, the scale this case casts with."""
    if isinstance(reference, Float8Quantizer):
        amax = _amax_skipping_nan(x) * case.amax_factor
        scale = torch.tensor([multiplier_for_amax(reference, amax, x.dtype)], dtype=torch.float32, device=x.device)
        q = Float8Quantizer(scale, torch.zeros(1, device=x.device), reference.dtype)
    else:
        q = copy.deepcopy(reference)
    q.set_usage(rowwise="rowwise" in usages, columnwise="columnwise" in usages)
    return q


def _reference_outputs(reference: Quantizer, case: QuantizerCase, x: torch.Tensor, usages: Sequence[str]):
    """``{usage: QuantizedTensor or the reference's error}``: both usages at once, or one by one if that fails."""
    try:
        both = _case_quantizer(reference, x, case, *usages)(x.clone())
        return dict.fromkeys(usages, both)
    except Exception:  # noqa: BLE001  (one usage may be what the reference rejects: try each alone)
        pass
    out: dict[str, Any] = {}
    for usage in usages:
        try:
            out[usage] = _case_quantizer(reference, x, case, usage)(x.clone())
        except Exception as error:  # noqa: BLE001  (recorded: the reference rejects this input)
            out[usage] = first_line(error)
    return out


def _amax_skipping_nan(x: torch.Tensor) -> float:
    """``max |x|`` skipping NaN (0 for all-NaN), as the quantizers take it."""
    a = x.detach().float().abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return float(a.max()) if a.numel() else 0.0


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
        dtypes: the input dtypes (default fp32, fp16, bf16).
        usages: the orientations, "rowwise" and "columnwise".
        cases: only these case names (default: every case of :data:`~refops.testing.quantizers.cases.CASES`).
        device: where the inputs are made (default: torch's default device).
        seed: seeds each case's generator (``seed + position``); the matrix is deterministic.
        max_mismatches: how many mismatching elements the report lists (the first of every failing run
            first, at most 8 per run).

    Returns:
        A :class:`QuantizerCheckReport`; ``assert_ok()`` raises with the evidence.
    """
    if output is not None and output not in OUTPUTS:
        raise ValueError(f"check_quantizer: output must be one of {OUTPUTS}, got {output!r}")
    unknown = sorted(set(usages) - set(USAGES))
    if unknown:
        raise ValueError(f"check_quantizer: unknown usages {unknown}; usages are {USAGES}")
    reference = _reference_quantizer(quantizer_or_recipe, role)
    device = torch.device(device) if device is not None else torch.get_default_device()
    selected = [c for c in CASES if cases is None or c.name in cases]
    if cases is not None and len(selected) != len(set(cases)):
        raise ValueError(f"check_quantizer: unknown cases {sorted(set(cases) - {c.name for c in CASES})}")
    takes_quantizer = _takes_quantizer(candidate)
    notes: list[str] = []
    if isinstance(reference, Float8Quantizer) and not takes_quantizer:
        raise TypeError(
            "check_quantizer: Float8Quantizer (delayed scaling) casts with a scale the candidate must be given; "
            "write candidate(x, quantizer) and cast with quantizer.scale"
        )
    state = {"output": output, "inferred": output is None}
    result = Comparison(max_mismatches)
    for position, case in enumerate(selected):
        for dtype in case.dtypes or dtypes:
            if dtype not in dtypes:
                continue
            g = torch.Generator().manual_seed(seed + position)
            x = case.build(dtype, reference, g).to(device)
            references = _reference_outputs(reference, case, x, usages)
            for usage in usages:
                _run_one(candidate, reference, case, x, usage, references[usage], takes_quantizer, state, result)
    output = state["output"] or "unknown (the candidate never returned a result)"
    if state["inferred"]:
        output += " (inferred from the first result)"
    if state["output"] == "dequantized":
        notes.append(DEQUANTIZED_LIMIT)
    if not takes_quantizer and "columnwise" in usages and state["output"] != "quantized_tensor":
        notes.append("column-wise not checked: the candidate takes no quantizer argument, so it cannot be asked "
                     "for the column-wise orientation (write candidate(x, quantizer))")
    if state.get("amax_missing"):
        notes.append("the candidate returned no amax: NVFP4's global amax was not compared")
    rejected = sorted({r.case for r in result.runs if r.status in ("both reject", "reference rejects")})
    if rejected:
        notes.append(f"the reference rejects some inputs of {', '.join(rejected)}; those runs were not compared")
    name = getattr(candidate, "__qualname__", None) or type(candidate).__name__
    return QuantizerCheckReport(name, _describe_quantizer(reference), output, result.runs, result.mismatches, notes)


def _run_one(candidate, reference, case, x, usage, ref, takes_quantizer, state, result: Comparison) -> None:
    """One case, one dtype, one orientation: reference first, then the candidate, then the comparison."""
    shape, dtype = tuple(x.shape), str(x.dtype).removeprefix("torch.")
    base = dict(case=case.name, dtype=dtype, usage=usage, shape=shape)
    if usage == "columnwise" and not takes_quantizer and state["output"] not in (None, "quantized_tensor"):
        result.record(CaseRun(**base, status="skipped", detail="the candidate cannot be asked for column-wise"), [])
        return
    q_cand = _case_quantizer(reference, x, case, usage)
    ref_error = ref if isinstance(ref, str) else None
    try:
        got = candidate(x.clone(), q_cand) if takes_quantizer else candidate(x.clone())
        got_error = None
    except Exception as error:  # noqa: BLE001  (recorded as evidence)
        got, got_error = None, first_line(error)
    if ref_error is not None:
        status = "both reject" if got_error is not None else "reference rejects"
        detail = f"reference: {ref_error}" + (f"; candidate: {got_error}" if got_error else "; the candidate returned a result")
        result.record(CaseRun(**base, status=status, detail=detail), [])
        return
    if got_error is not None:
        result.record(CaseRun(**base, status="candidate raised", detail=got_error), [])
        return
    if state["output"] is None:
        state["output"] = _infer_output(got)
    if usage == "columnwise" and not takes_quantizer and state["output"] != "quantized_tensor":
        result.record(CaseRun(**base, status="skipped", detail="the candidate cannot be asked for column-wise"), [])
        return
    try:
        if state["output"] == "dequantized":
            if not isinstance(got, torch.Tensor) or isinstance(got, QuantizedTensor):
                raise ValueError(f"returned {type(got).__name__}, not a tensor of dequantized values")
            run, found = dequantized_run(case, x, ref, usage, got)
        else:
            fields = candidate_fields(got, ref, usage, q_cand)
            if fields.get("data") is None or fields.get("scale_inv") is None:
                raise ValueError(f"the result holds no {usage} data or scale_inv")
            if fields.get("amax") is None and "amax" in layout.usage_fields(ref, usage):
                state["amax_missing"] = True
            run, found = quantized_run(case, x, ref, usage, fields)
    except (ValueError, TypeError) as error:
        run, found = CaseRun(**base, status="differs", detail=first_line(error)), []
    result.record(run, found)

