"""The oracle: run a candidate module and the reference on the same inputs and recipe, and compare.

``compare_modules(candidate, reference, inputs, recipe=...)`` copies the
candidate's parameters into the reference (by name), runs forward and backward
on both, and compares under the three-tier policy
(:mod:`refops.testing.tensor_report`): quantized weights and recipe state
bit-exactly, outputs and gradients within the recipe's tolerance (or the dtype's
GEMM tolerance), and the output's SQNR against a floor. The candidate can be any
module with a ``te.ops``-compatible structure (TransformerEngine itself, run
under its own ``autocast`` via ``candidate_context``) or refops under another
backend (:func:`compare_backends`).

The report lists every tier that ran and every tier that did not, with the reason
(:class:`TierRun`): a candidate that returns plain tensors has no quantized bytes to
compare unless it exposes its operands (:mod:`refops.testing.modules.quantized_operands`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch

from ...kernels import use_backend
from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.state import autocast
from ...recipe import NVFP4BlockScaling, Recipe
from . import numerics
from . import quantized_operands as operands
from .exact_state import compare_quantized, compare_state, recipe_states, slots_fed_by_unequal_sources
from .arguments import TIERS, validate_arguments
from .report import ComparisonReport, TierRun
from .twins import float64_twin, legit_context, run_float64
from ..tensor_report import TensorComparison, compare_tensors, sqnr_db
from ..tolerances import dtype_tols, gemm_tols

__all__ = ["ComparisonReport", "TIERS", "TierRun", "compare_modules", "compare_backends", "recipe_tols"]


def recipe_tols(recipe: Optional[Recipe], dtype: torch.dtype) -> dict[str, float]:
    """TE's tolerance for a GEMM result: E4M3 for FP8 recipes, E2M1 for NVFP4, the dtype's without one."""
    if recipe is None:
        return gemm_tols(dtype)
    if isinstance(recipe, NVFP4BlockScaling):
        return dict(rtol=0.25, atol=0.125)
    return dtype_tols(torch.float8_e4m3fn)


def _copy_parameters(candidate: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Give each reference parameter the candidate's values (quantized bytes copied as they are)."""
    targets = dict(reference.named_parameters())
    with torch.no_grad():
        for name, source in candidate.named_parameters():
            if name not in targets:
                raise KeyError(f"the reference has no parameter named {name!r} (it has {sorted(targets)})")
            target = targets[name]
            if target.is_meta:
                raise ValueError(f"reference parameter {name!r} is on meta; materialize it first")
            if isinstance(source, QuantizedTensor) and isinstance(target, QuantizedTensor):
                # Overwrite the bytes directly: an in-place update through the quantizer would
                # record an amax (delayed scaling) and make the recipe states differ.
                arrays, _ = source.to_plain_tensors()
                arrays = {k: v.to(target.device) for k, v in arrays.items() if not k.startswith("quantizer.")}
                target._overwrite_arrays(arrays)
            elif isinstance(source, QuantizedTensor):
                target.copy_(source.dequantize(dtype=target.dtype))
            else:
                target.copy_(source)


def _run(module, inputs, grad_output, context):
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    with context:
        out = module(*xs)
    y = out[0] if isinstance(out, tuple) else out
    dy = grad_output if grad_output is not None else _default_grad(y)
    y.backward(dy.to(device=y.device, dtype=y.dtype) if dy.dtype != y.dtype or dy.device != y.device else dy)
    return y.detach(), [x.grad for x in xs]


#: The seed of the default output grad: zero-mean standard normal, the same on every call.
DEFAULT_GRAD_SEED = 20251205


def _default_grad(y: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(DEFAULT_GRAD_SEED)
    return torch.randn(tuple(y.shape), generator=generator, dtype=torch.float32).to(device=y.device, dtype=y.dtype)


def compare_modules(
    candidate: torch.nn.Module,
    reference: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    *,
    recipe: Optional[Recipe] = None,
    candidate_context: Optional[Callable[[], ContextManager[Any]]] = None,
    reference_context: Optional[Callable[[], ContextManager[Any]]] = None,
    grad_output: Optional[torch.Tensor] = None,
    copy_parameters: bool = True,
    sqnr_floor_db: Optional[float] = None,
    tolerances: Optional[dict[str, float]] = None,
    tier: str = "numerics",
) -> ComparisonReport:
    """Run both modules forward and backward on ``inputs`` under ``recipe`` and compare everything.

    Args:
        candidate: the module under test (its parameters are copied into ``reference``).
        reference: a refops module with the same structure (same parameter names and shapes).
        inputs: forward arguments, a sequence such as ``(x,)``; floating tensors get ``requires_grad``
            and their grads are compared.
        recipe: the quantization recipe (None: high precision).
        candidate_context: a factory of the context the candidate runs in (default:
            ``refops.autocast`` with ``recipe``; pass TE's ``te.autocast`` for TransformerEngine).
        reference_context: likewise for the reference (default: ``refops.autocast`` with ``recipe``).
        grad_output: the output grad (default: a zero-mean random one, seeded: the same every call).
        copy_parameters: copy the candidate's parameter values into the reference first.
        sqnr_floor_db: floor of the output's SQNR against the reference (default: 20 dB quantized, 40 dB
            otherwise; under "numerics", at most 12 dB below a legitimately different implementation's).
        tolerances: ``{"rtol", "atol"}`` for ``tier="tolerance"`` (default: :func:`recipe_tols`).
        tier: how outputs and grads are judged: "numerics" (the default: against a float64 twin and a
            legitimately different twin of the reference, :mod:`refops.testing.modules.twins`),
            "tolerance" (element-wise rtol/atol, TE's), "sqnr" (every output and grad against
            ``sqnr_floor_db``) or "exact" (bit for bit).
    """
    validate_arguments(candidate, reference, inputs, tier, grad_output)
    inputs = list(inputs)

    def default_context():
        return autocast(enabled=recipe is not None, recipe=recipe)

    reference_context = reference_context or default_context
    if copy_parameters:
        _copy_parameters(candidate, reference)
    twins = _Twins(reference, recipe) if tier == "numerics" else None
    with operands.recording() as seen_c:
        y_c, grads_c = _run(candidate, inputs, grad_output, (candidate_context or default_context)())
    if grad_output is None:
        grad_output = _default_grad(y_c)
    exposes = exposes_hook = callable(getattr(candidate, operands.HOOK, None))
    with operands.recording() as seen:
        y_r, grads_r = _run(reference, inputs, grad_output, reference_context())
    tols = tolerances if tolerances is not None else recipe_tols(recipe, y_r.dtype)
    floor = sqnr_floor_db if sqnr_floor_db is not None else (20.0 if recipe is not None else 40.0)

    reference_params = dict(reference.named_parameters())
    candidate_params = dict(candidate.named_parameters())
    tensors = [("output", y_c, y_r)]
    tensors += [(f"input[{i}].grad", a, b) for i, (a, b) in enumerate(zip(grads_c, grads_r))
                if a is not None or b is not None]
    tensors += [(f"{name}.grad", p.grad, reference_params[name].grad) for name, p in candidate_params.items()]
    if twins is not None:
        twins.run(inputs, grad_output, reference_context)
        output_floor = floor if sqnr_floor_db is not None else min(floor, twins.legit_sqnr(y_r) - 12.0)
        results = [_judge_optional(name, a, b, twins, recipe is not None) for name, a, b in tensors]
        results.insert(1, compare_tensors("output (SQNR)", y_c, y_r, tier="sqnr", sqnr_floor_db=output_floor))
        check = dict(tols, tier="tolerance")  # recipe state fed by unequal tensors
    else:
        check = {"tolerance": dict(tols, tier="tolerance"), "sqnr": dict(tier="sqnr", sqnr_floor_db=floor),
                 "exact": dict(tier="exact")}[tier]
        results = [_compare_optional(name, a, b, check) for name, a, b in tensors]
        results.insert(1, compare_tensors("output (SQNR)", y_c, y_r, tier="sqnr", sqnr_floor_db=floor))
        output_floor = floor
    for name, p in candidate_params.items():
        q = reference_params[name]
        if isinstance(p, QuantizedTensor) and isinstance(q, QuantizedTensor):
            results.extend(compare_quantized(name, p, q))
    quantized_operands = operands.reference_operands(reference, seen)
    unequal_sources: list[str] = []
    if exposes:
        results.extend(operands.compare_operands(getattr(candidate, operands.HOOK)(), quantized_operands))
    else:  # a refops candidate (another backend, another build) exposes its operands by being refops
        # Bytes must agree only where both sides quantized bit-identical tensors: the model's input,
        # the weights, the output grad. Downstream of a GEMM the sources differ within its tolerance.
        own = operands.reference_operands(candidate, seen_c, deterministic_only=True)
        sources_c, sources_r = operands.operand_sources(candidate, seen_c), operands.operand_sources(reference, seen)
        own = {name: t for name, t in own.items() if name in quantized_operands}
        unequal_sources = sorted(n for n in own if not operands.same_source(sources_c.get(n), sources_r.get(n)))
        own = {name: t for name, t in own.items() if name not in unequal_sources}
        exposes = bool(own)
        results.extend(operands.compare_operands(own, quantized_operands))
    states_c, states_r = recipe_states(candidate), recipe_states(reference)
    inexact_slots = slots_fed_by_unequal_sources(candidate, reference, seen_c, seen) if not exposes_hook else {}
    state_check = check if check["tier"] != "exact" else dict(tols, tier="tolerance")
    for key in sorted(set(states_c) & set(states_r)):
        results.extend(compare_state(key, states_c[key], states_r[key], inexact_slots.get(key, ()), state_check))
    tiers = _tiers(results, candidate, recipe, tier, tols, output_floor, exposes, sorted(quantized_operands),
                   states_c, states_r, twins)
    if unequal_sources:
        bytes_tier = tiers[0]
        why = (f"{bytes_tier.why}; not compared byte for byte, because the two sides quantized different "
               f"high-precision tensors (downstream of an inexact op): {', '.join(unequal_sources)}")
        tiers[0] = TierRun(bytes_tier.tier, bytes_tier.ran, bytes_tier.count, why)
    return ComparisonReport(results, tiers)


class _Twins:
    """The reference's float64 twin, its legitimately different twin and (under a recipe) its unquantized twin,
    copied before the reference runs (same parameters, same recipe state) and run on the same inputs and grad."""

    def __init__(self, reference: torch.nn.Module, recipe: Optional[Recipe]) -> None:
        self.problems: list[str] = []
        self.legit_module = copy.deepcopy(reference)
        self.high_module = self._try("the float64 twin could not be built", lambda: float64_twin(reference))
        self.plain_module = None
        if recipe is not None:
            self.plain_module = self._try("the unquantized twin could not be built", lambda: _plain_twin(reference))
        self.legit: dict[str, torch.Tensor] = {}
        self.high: dict[str, torch.Tensor] = {}
        self.plain: dict[str, torch.Tensor] = {}

    def _try(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 - the report says what could not be done
            self.problems.append(f"{what}: {type(error).__name__}: {error}")
            return None

    def run(self, inputs, grad_output, reference_context) -> None:
        self.legit = self._try("the legitimately different twin failed", lambda: _run_named(
            self.legit_module, inputs, grad_output, legit_context(reference_context)())) or {}
        if self.high_module is not None:
            xs = [x.double() if x.is_floating_point() else x for x in inputs]
            self.high = self._try("the float64 twin failed", lambda: run_float64(
                self.high_module, lambda ctx: _run_named(self.high_module, xs, grad_output.double(), ctx))) or {}
        if self.plain_module is not None:
            self.plain = self._try("the unquantized twin failed", lambda: _run_named(
                self.plain_module, inputs, grad_output, autocast(enabled=False))) or {}

    def legit_sqnr(self, y_r: torch.Tensor) -> float:
        legit = self.legit.get("output")
        return sqnr_db(legit, y_r) if legit is not None else math.inf


def _plain_twin(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` with every quantized parameter dequantized (run without a recipe)."""
    twin = copy.deepcopy(module)
    for sub in twin.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            if isinstance(p, QuantizedTensor):
                values = p.dequantize(dtype=p.dtype if p.dtype.is_floating_point else torch.float32)
                setattr(sub, name, torch.nn.Parameter(values.detach().clone(), requires_grad=p.requires_grad))
    return twin


def _run_named(module, inputs, grad_output, context) -> dict[str, torch.Tensor]:
    """``{"output", "input[i].grad", "<param>.grad"}`` of one forward and backward."""
    y, grads = _run(module, inputs, grad_output, context)
    named = {"output": y}
    named.update({f"input[{i}].grad": g for i, g in enumerate(grads) if g is not None})
    named.update({f"{n}.grad": p.grad for n, p in module.named_parameters() if p.grad is not None})
    return named


def _judge_optional(name, a, b, twins: "_Twins", quantized: bool) -> TensorComparison:
    if a is None or b is None:
        present = torch.zeros(1)
        return compare_tensors(f"{name} (None on one side)", present, present + 1, tier="exact")
    legit = twins.legit.get(name)
    high = twins.high.get(name)
    if legit is None or tuple(legit.shape) != tuple(b.shape):
        # No legitimately different run: the reference's own distance to float64 stands in for its spread.
        legit = 2 * _as_f64(b) - high.double().cpu() if high is not None else b
    return numerics.judge(name, a, b, legit, high, quantized=quantized, unquantized=twins.plain.get(name))


def _as_f64(t: torch.Tensor) -> torch.Tensor:
    return (t.dequantize() if isinstance(t, QuantizedTensor) else t).detach().double()


def _tiers(results, candidate, recipe, tier, tols, floor, exposes, reference_operands, states_c, states_r,
           twins) -> list[TierRun]:
    """What each tier compared, or why it did not run: the limits of a passing report, stated."""
    exact = [c for c in results if c.tier == "exact"]
    state = [c for c in exact if c.name.endswith((".scale", ".amax_history"))]
    byte_checks = [c for c in exact if c not in state and "(None on one side)" not in c.name
                   and (c.name.startswith("operand ") or "[" in c.name)]
    quantized_params = [n for n, p in candidate.named_parameters() if isinstance(p, QuantizedTensor)]
    if byte_checks:
        sources = (["quantized parameters"] if quantized_params else []) + (["the quantized operands"] if exposes else [])
        bytes_why = f"bit-exact data and scales of {' and '.join(sources) or 'quantized tensors'}"
    elif recipe is None:
        bytes_why = "no recipe: nothing is quantized"
    else:
        made = ", ".join(reference_operands) or "none"
        bytes_why = (
            "the candidate holds no QuantizedTensor parameters and exposes no quantized operands "
            f"(define {operands.HOOK}(); the reference quantized: {made}), so no quantized byte was compared "
            "and a quantization bug within the tolerance passes: check the candidate's quantizer with "
            "refops.testing.check_quantizer"
        )
    if state:
        state_why = "delayed-scaling scale and amax history of both sides"
        if any("fed by unequal tensors" in c.name for c in results):
            state_why += ("; the slots of quantizers that saw different tensors on the two sides are held to the "
                          "outputs' criterion instead (named '[slots ..., fed by unequal tensors]')")
    elif not states_r:
        state_why = "the recipe keeps no delayed-scaling state" if recipe is not None else "no recipe"
    else:
        state_why = "the candidate has no refops delayed-scaling state to compare"
    judged = [c for c in results if c.tier == "numerics"]
    if tier == "numerics":
        num_why = ("outputs and grads against the reference, each within 4x the distance of a legitimately different "
                   "implementation of it (another summation order, TF32 for fp32 GEMMs, FP8 fast accumulation, one "
                   "rounding instead of two) and element-wise within 12x that deviation's row x column profile; "
                   "each side's distance to a float64 twin reported")
        if twins is not None and twins.problems:
            num_why += "; " + "; ".join(twins.problems)
    else:
        num_why = f"tier={tier!r} was asked"
    tolerance = [c for c in results if c.tier == "tolerance"]
    if tier == "tolerance":
        tol_why = f"outputs and grads element-wise, rtol={tols['rtol']:g}, atol={tols['atol']:g}"
    elif tolerance:
        tol_why = f"recipe state fed by unequal tensors, rtol={tols['rtol']:g}, atol={tols['atol']:g}"
    else:
        tol_why = f"tier={tier!r} was asked: outputs and grads are judged by it instead"
    sqnr = [c for c in results if c.tier == "sqnr"]
    values = [c for c in exact if c not in state and c not in byte_checks]
    return [
        TierRun("bytes (exact)", bool(byte_checks), len(byte_checks), bytes_why),
        TierRun("recipe state (exact)", bool(state), len(state), state_why),
        TierRun("numerics", bool(judged), len(judged), num_why),
        TierRun("tolerance", bool(tolerance), len(tolerance), tol_why),
        TierRun("SQNR", bool(sqnr), len(sqnr), f"whole-tensor floor {floor:g} dB"
                + (" (outputs and grads)" if tier == "sqnr" else " (the output)")),
        TierRun("values (exact)", tier == "exact", len(values) if tier == "exact" else 0,
                "outputs and grads bit for bit" if tier == "exact" else f"tier={tier!r} was asked"),
    ]


def _compare_optional(name, a, b, check) -> TensorComparison:
    if a is None or b is None:
        present = torch.zeros(1)
        return compare_tensors(f"{name} (None on one side)", present, present + 1, tier="exact")
    result = compare_tensors(name, a, b, **check)
    return dataclasses.replace(result, bit_identical_share=numerics.bit_identical_share(a, b))


def compare_backends(
    factory: Callable[[torch.device], torch.nn.Module],
    inputs: Sequence[torch.Tensor],
    *,
    recipe: Optional[Recipe] = None,
    candidate_backend: str = "fastpath",
    reference_backend: str = "reference",
    seed: int = 0,
    **kwargs: Any,
) -> ComparisonReport:
    """The same refops model under two kernel backends: ``factory(device)`` is built twice under ``seed``."""
    device = inputs[0].device
    torch.manual_seed(seed)
    candidate = factory(device)
    torch.manual_seed(seed)
    reference = factory(device)

    def in_backend(name: str) -> Callable[[], ContextManager[Any]]:
        @contextlib.contextmanager
        def context():
            with use_backend(name), autocast(enabled=recipe is not None, recipe=recipe):
                yield

        return context

    return compare_modules(
        candidate,
        reference,
        inputs,
        recipe=recipe,
        candidate_context=in_backend(candidate_backend),
        reference_context=in_backend(reference_backend),
        copy_parameters=False,
        **kwargs,
    )
