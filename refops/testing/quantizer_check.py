"""``check_quantizer``: a candidate quantizer against the reference, bit for bit, on adversarial inputs.

A kernel author's first test. ``check_quantizer(candidate, quantizer_or_recipe)``
runs the matrix of :mod:`refops.testing.quantizer_cases` (random values at many
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
import dataclasses
import inspect
from typing import Any, Callable, Optional, Sequence, Union

import torch

from ..quantization import Float8CurrentScalingQuantizer, Float8Quantizer, NVFP4Quantizer, QuantizedTensor, Quantizer
from ..quantization.quantizer import QuantizerRole
from ..quantization.recipe_state import RecipeState
from ..recipe import Recipe
from . import quantizer_layout as layout
from .quantizer_cases import CASES, QuantizerCase, multiplier_for_amax

__all__ = ["check_quantizer", "QuantizerCheckReport", "CaseRun", "QuantizerMismatch", "OUTPUTS"]

#: The output conventions a candidate may declare.
OUTPUTS = ("quantized_tensor", "data_and_scale_inv", "dequantized")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
USAGES = ("rowwise", "columnwise")
DEQUANTIZED_LIMIT = (
    "the dequantized tier compares values only: a code and a scale that disagree with the reference's "
    "but dequantize to the same value are not seen"
)


@dataclasses.dataclass(frozen=True)
class QuantizerMismatch:
    """One element where the candidate differs: where, from which input, expected and got code and scale."""

    case: str
    dtype: str
    usage: str
    index: tuple[int, ...]
    input: float
    expected_code: str
    got_code: str
    expected_scale: str
    got_scale: str

    def __str__(self) -> str:
        return (
            f"{self.case}/{self.dtype}/{self.usage} at {list(self.index)}: input {self.input!r}: "
            f"expected {self.expected_code} scale {self.expected_scale}, got {self.got_code} scale {self.got_scale}"
        )


@dataclasses.dataclass(frozen=True)
class CaseRun:
    """One case in one dtype and one orientation, and how the candidate did."""

    case: str
    dtype: str
    usage: str
    shape: tuple[int, ...]
    #: "ok", "differs", "candidate raised", "both reject", "reference rejects" or "skipped".
    status: str
    elements: int = 0
    code_mismatches: int = 0
    scale_mismatches: int = 0
    scales: int = 0
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("differs", "candidate raised")


@dataclasses.dataclass
class QuantizerCheckReport:
    """Every case run, the first mismatches and what the check could not see."""

    subject: str
    reference: str
    output: str
    runs: list[CaseRun]
    mismatches: list[QuantizerMismatch]
    notes: list[str]

    @property
    def ok(self) -> bool:
        """True when no case differs and the candidate raised nowhere the reference did not."""
        return not self.failures

    @property
    def failures(self) -> list[CaseRun]:
        return [r for r in self.runs if r.failed]

    def __getitem__(self, key: tuple[str, str, str]) -> CaseRun:
        """The run of ``(case, dtype, usage)``, e.g. ``report["ties", "float32", "rowwise"]``."""
        for r in self.runs:
            if (r.case, r.dtype, r.usage) == tuple(key):
                return r
        raise KeyError(f"no run {key!r}")

    def assert_ok(self) -> None:
        """Raise :class:`AssertionError` with the failing runs and the first mismatches."""
        if not self.ok:
            raise AssertionError(str(self))

    def __str__(self) -> str:
        compared = len([r for r in self.runs if r.status in ("ok", "differs", "candidate raised")])
        verdict = "ok" if self.ok else f"FAILED: {len(self.failures)} of {compared} compared runs differ"
        lines = [
            f"check_quantizer: {self.subject} against {self.reference}: {verdict}",
            f"output convention: {self.output}",
            f"{'case':<16}{'dtype':<10}{'usage':<11}{'shape':<14}{'result':<18}{'codes differ':>16}{'scales differ':>15}",
        ]
        for r in self.runs:
            shape = "x".join(map(str, r.shape))
            counts = (
                f"{r.code_mismatches:>9}/{r.elements:<6}{r.scale_mismatches:>8}/{r.scales:<6}"
                if r.status in ("ok", "differs")
                else ""
            )
            extra = f"  {r.detail}" if r.detail and r.status != "ok" else ""
            lines.append(f"{r.case:<16}{r.dtype:<10}{r.usage:<11}{shape:<14}{r.status:<18}{counts}{extra}")
        if self.mismatches:
            lines.append("first mismatches:")
            lines += [f"  {m}" for m in self.mismatches]
        if self.notes:
            lines.append("notes:")
            lines += [f"  - {n}" for n in self.notes]
        return "\n".join(lines)


def _reference_quantizer(quantizer_or_recipe: Union[Quantizer, Recipe], role: str) -> Quantizer:
    """The quantizer to check against: the one given, or the recipe's quantizer for ``role``."""
    if isinstance(quantizer_or_recipe, Quantizer):
        quantizer = quantizer_or_recipe
    elif isinstance(quantizer_or_recipe, Recipe):
        if role not in ("input", "weight", "grad_output"):
            raise ValueError(f"check_quantizer: role must be 'input', 'weight' or 'grad_output', got {role!r}")
        mode = "backward" if role == "grad_output" else "forward"
        state = RecipeState.create(
            quantizer_or_recipe, mode=mode, num_quantizers=1, roles=[QuantizerRole(tensor_type=role)],
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
    options = []
    for name in ("dtype", "force_pow_2_scales", "amax_epsilon", "block_scaling_dim", "with_2d_quantization",
                 "with_rht", "row_scaled_nvfp4", "nvfp4_use_4over6"):
        value = getattr(q, name, None)
        if value is None or (name != "dtype" and value in (False, 0.0) and name != "force_pow_2_scales"):
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
        amax = layout_amax(x) * case.amax_factor
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
            out[usage] = _first_line(error)
    return out


def layout_amax(x: torch.Tensor) -> float:
    """``max |x|`` skipping NaN (0 for all-NaN), as the quantizers take it."""
    a = x.detach().float().abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return float(a.max()) if a.numel() else 0.0


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:150]}"


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


def _candidate_fields(result: Any, reference: QuantizedTensor, usage: str, quantizer: Quantizer) -> dict[str, Any]:
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


def _aligned_scales(reference: QuantizedTensor, expected: torch.Tensor, got: torch.Tensor):
    """Both scale tensors in one representation: stored bytes, or fp32 values when the candidate decoded."""
    got = got.detach().cpu()
    if expected.element_size() == 1 and got.element_size() != 1:
        return layout.decode_scale_bits(reference, expected), got.float()
    if expected.element_size() != got.element_size():
        return expected, got.to(expected.dtype)
    return expected, got


class _Comparison:
    """Accumulates the runs and the first mismatches of one check."""

    def __init__(self, max_mismatches: int) -> None:
        self.runs: list[CaseRun] = []
        self.found: list[list[QuantizerMismatch]] = []
        self.max_mismatches = max_mismatches

    def record(self, run: CaseRun, found: list[QuantizerMismatch]) -> None:
        self.runs.append(run)
        if found:
            self.found.append(found)

    @property
    def mismatches(self) -> list[QuantizerMismatch]:
        """Round robin over the failing runs (the first of each, then the second...), so every case shows."""
        out: list[QuantizerMismatch] = []
        for rank in range(max((len(f) for f in self.found), default=0)):
            out += [f[rank] for f in self.found if rank < len(f)]
        return out[: self.max_mismatches]


def _quantized_run(case, x, ref, usage, fields) -> tuple[CaseRun, list[QuantizerMismatch]]:
    """Codes and scales of one run, element by element; NVFP4's amax as a whole."""
    expected = layout.usage_fields(ref, usage)
    shape, dtype = tuple(x.shape), str(x.dtype).removeprefix("torch.")
    base = dict(case=case.name, dtype=dtype, usage=usage, shape=shape)
    try:
        exp_codes = layout.element_codes(ref, usage, expected["data"].cpu())
        got_codes = layout.element_codes(ref, usage, fields["data"].detach().cpu())
    except RuntimeError as error:
        got = tuple(fields["data"].shape)
        return CaseRun(**base, status="differs", detail=f"data has shape {got}: {_first_line(error)}"), []
    exp_scale, got_scale = _aligned_scales(ref, expected["scale_inv"].cpu(), fields["scale_inv"])
    if exp_scale.shape != got_scale.shape:
        detail = f"scale_inv has shape {tuple(got_scale.shape)}, expected {tuple(exp_scale.shape)}"
        return CaseRun(**base, status="differs", detail=detail), []
    exp_el, got_el = layout.element_scales(ref, usage, exp_scale), layout.element_scales(ref, usage, got_scale)
    bad = (exp_codes != got_codes) | (exp_el != got_el)
    scale_bad = int((layout.as_bits(exp_scale) != layout.as_bits(got_scale)).sum())
    details = []
    if fields.get("amax") is not None and expected.get("amax") is not None:
        if not torch.equal(layout.as_bits(fields["amax"].float().cpu()), layout.as_bits(expected["amax"].cpu())):
            details.append(f"amax {fields['amax'].tolist()} != expected {expected['amax'].tolist()}")
    code_bad = int((exp_codes != got_codes).sum())
    status = "differs" if (bool(bad.any()) or details) else "ok"
    run = CaseRun(**base, status=status, elements=bad.numel(), code_mismatches=code_bad,
                  scale_mismatches=scale_bad, scales=exp_scale.numel(), detail="; ".join(details))
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


def _dequantized_run(case, x, ref, usage, got) -> tuple[CaseRun, list[QuantizerMismatch]]:
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
        cases: only these case names (default: every case of :data:`~refops.testing.quantizer_cases.CASES`).
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
    result = _Comparison(max_mismatches)
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


def _run_one(candidate, reference, case, x, usage, ref, takes_quantizer, state, result: _Comparison) -> None:
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
        got, got_error = None, _first_line(error)
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
            run, found = _dequantized_run(case, x, ref, usage, got)
        else:
            fields = _candidate_fields(got, ref, usage, q_cand)
            if fields.get("data") is None or fields.get("scale_inv") is None:
                raise ValueError(f"the result holds no {usage} data or scale_inv")
            if fields.get("amax") is None and "amax" in layout.usage_fields(ref, usage):
                state["amax_missing"] = True
            run, found = _quantized_run(case, x, ref, usage, fields)
    except (ValueError, TypeError) as error:
        run, found = CaseRun(**base, status="differs", detail=_first_line(error)), []
    result.record(run, found)

