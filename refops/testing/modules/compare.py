"""The oracle: run a candidate module and the reference through the same training script, and compare.

``compare_modules(candidate, reference, inputs, recipe=...)`` gives the reference the candidate's parameter
values (by name; quantized ones as their values, never their arrays), runs both, and the reference's twins,
through the scenarios of :mod:`.scenarios` (one fresh step, realistic grad magnitudes, a row-spread input,
interleaved microbatches, optimizer steps with an eval forward between them), each step from the same random
state, and judges every recorded tensor (:mod:`.judges`) by the numerics criterion (or the tier asked). Beside
that it checks what needs no reference (:mod:`.metamorphic`), the candidate's quantized parameters for
self-consistency (:mod:`.consistency`), the quantized bytes both sides made from bit-identical tensors and
the delayed-scaling recipe state after the first step. The report (:class:`ComparisonReport`) lists every
comparison with its scenario and step, the step at which each tensor first differs, and every tier that ran
or did not, with the reason (:mod:`.tiers`).

The candidate can be any module with the reference's parameter names: TransformerEngine itself (run under
its own ``autocast`` via ``candidate_context``), a plain PyTorch model, or refops under another backend
(:func:`compare_backends`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch

from ...kernels import use_backend
from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.state import autocast
from ...recipe import NVFP4BlockScaling, Recipe
from .arguments import TIERS, validate_arguments
from .consistency import check_quantized_parameters
from .distributed_models import reduce_twin_grads_like, twin_source
from .first_step import FirstStep as _FirstStep, give_candidate_values, plain_twin as _plain_twin
from .judges import candidate_raised, judge_by_tier, judge_numerics, missing
from .metamorphic import run_metamorphic
from .report import ComparisonReport, TierRun
from .scenarios import SCENARIOS, default_grad, run_script
from .sides import Side, carry_parameter_attributes, deepcopy_module
from .tiers import describe_tiers
from .twins import float64_context, float64_twin, legit_context
from ..tensor_report import TensorComparison, compare_tensors, sqnr_db
from ..tolerances import dtype_tols, gemm_tols

__all__ = ["ComparisonReport", "SCENARIOS", "TIERS", "TierRun", "compare_modules", "compare_backends", "recipe_tols"]


def recipe_tols(recipe: Optional[Recipe], dtype: torch.dtype) -> dict[str, float]:
    """TE's tolerance for a GEMM result: E4M3 for FP8 recipes, E2M1 for NVFP4, the dtype's without one."""
    if recipe is None:
        return gemm_tols(dtype)
    if isinstance(recipe, NVFP4BlockScaling):
        return dict(rtol=0.25, atol=0.125)
    return dtype_tols(torch.float8_e4m3fn)


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
    scenarios: Sequence[str] = SCENARIOS,
    metamorphic: bool = True,
    seed: int = 0,
) -> ComparisonReport:
    """Run both modules through the training script of ``scenarios`` on ``inputs`` under ``recipe``, and compare.

    Args:
        candidate: the module under test (its parameter values are given to ``reference``).
        reference: a refops module with the same structure (same parameter names and shapes).
        inputs: forward arguments, a sequence such as ``(x,)``; floating tensors get ``requires_grad``
            and their grads are compared.
        recipe: the quantization recipe (None: high precision).
        candidate_context: a factory of the context the candidate runs in (default:
            ``refops.autocast`` with ``recipe``; pass TE's ``te.autocast`` for TransformerEngine).
        reference_context: likewise for the reference (default: ``refops.autocast`` with ``recipe``).
        grad_output: the first step's output grad (default: a zero-mean random one, seeded: the same every call);
            the "grad scales" scenario scales it.
        copy_parameters: give the reference the candidate's parameter values first (quantized parameters as
            their dequantized values, which the reference quantizes itself).
        sqnr_floor_db: floor of the first output's SQNR against the reference (default: 20 dB quantized, 40 dB
            otherwise; under "numerics", at most 12 dB below a legitimately different implementation's).
        tolerances: ``{"rtol", "atol"}`` for ``tier="tolerance"`` (default: :func:`recipe_tols`).
        tier: how outputs and grads are judged: "numerics" (the default: against a float64 twin and a
            legitimately different twin of the reference, :mod:`refops.testing.modules.twins`),
            "tolerance" (element-wise rtol/atol, TE's), "sqnr" (every output and grad against
            ``sqnr_floor_db``) or "exact" (bit for bit).
        scenarios: the scenarios of the training script, from :data:`SCENARIOS` (all by default; "one step"
            always runs first). ``("one step",)`` is the single fresh step.
        metamorphic: run the checks that need no reference (:mod:`refops.testing.modules.metamorphic`).
        seed: the random generator's seed of the script's first step (each step reseeds, the same on every
            side); the caller's generator state is restored afterwards.
    """
    validate_arguments(candidate, reference, inputs, tier, grad_output, scenarios, metamorphic)
    devices = sorted({x.device.index or 0 for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda})
    if copy_parameters:  # before the snapshot: the reference keeps the candidate's values after the call
        give_candidate_values(candidate, reference)
    with torch.random.fork_rng(devices=devices), _parameters_restored(candidate), _parameters_restored(reference):
        return _compare(candidate, reference, list(inputs), recipe=recipe, candidate_context=candidate_context,
                        reference_context=reference_context, grad_output=grad_output,
                        copy_parameters=copy_parameters, sqnr_floor_db=sqnr_floor_db, tolerances=tolerances,
                        tier=tier, scenarios=tuple(scenarios), metamorphic=metamorphic, seed=seed)


@contextlib.contextmanager
def _parameters_restored(module: torch.nn.Module):
    """The module's parameter values (in place, the same objects) and grads as they were, after the script's
    optimizer steps; recipe state (delayed scaling's amax history) has advanced, as after any run."""
    saved = {name: (p, p.detach().clone(), p.grad) for name, p in module.named_parameters()}
    try:
        yield
    finally:
        with torch.no_grad():
            for p, values, grad in saved.values():
                p.copy_(values)
                p.grad = grad


def _compare(candidate, reference, inputs, *, recipe, candidate_context, reference_context, grad_output,
             copy_parameters, sqnr_floor_db, tolerances, tier, scenarios, metamorphic, seed) -> ComparisonReport:
    def default_context():
        return autocast(enabled=recipe is not None, recipe=recipe)

    candidate_context = candidate_context or default_context
    reference_context = reference_context or default_context
    results: list[TensorComparison] = check_quantized_parameters(candidate, "before the script")
    snapshot = _deepcopy_or_none(candidate) if metamorphic else None
    sides = [Side("candidate", candidate, candidate_context), Side("reference", reference, reference_context)]
    twin_problems: list[str] = []
    if tier == "numerics":
        sides += _twin_sides(twin_source(reference), recipe, reference_context, twin_problems)  # FSDP2: unsharded
        reduce_twin_grads_like(reference, sides[2:])
    first = _FirstStep(candidate, reference, copy_parameters)
    records = run_script(sides, inputs, grad_output, scenarios=scenarios, seed=seed, observe=first.observe,
                         after_first_step=first.done)
    twin_problems += [f"the {s.name} twin failed and was left out {s.failure}" for s in sides[2:] if s.failure]
    cand, ref = records["candidate"], records["reference"]
    twins = {name: records.get(name, {}) for name in ("legit", "float64", "plain")}
    raised = [candidate_raised(sides[0].failure)] if sides[0].failure else []
    y_r = ref[("one step", "", "output")]
    y_c = cand.get(("one step", "", "output"), y_r)
    tols = tolerances if tolerances is not None else recipe_tols(recipe, y_r.dtype)
    floor = sqnr_floor_db if sqnr_floor_db is not None else (20.0 if recipe is not None else 40.0)
    if tier == "numerics" and sqnr_floor_db is None:
        legit_y = twins["legit"].get(("one step", "", "output"))
        floor = min(floor, (sqnr_db(legit_y, y_r) if legit_y is not None else math.inf) - 12.0)
    check = {"tolerance": dict(tols, tier="tolerance"), "sqnr": dict(tier="sqnr", sqnr_floor_db=floor),
             "exact": dict(tier="exact"), "numerics": dict(tols, tier="tolerance")}[tier]
    values = _judge_all(cand, ref, twins, tier, check, recipe is not None, stopped=bool(raised))
    sqnr = dataclasses.replace(compare_tensors("output (SQNR)", y_c, y_r, tier="sqnr", sqnr_floor_db=floor),
                               kind="value", scenario="one step")
    results = values[:1] + [sqnr] + values[1:] + raised + results
    results += first.comparisons(check if tier != "exact" else dict(tols, tier="tolerance"))
    results += check_quantized_parameters(candidate, "after the script")
    not_run: list[str] = []
    if metamorphic and ("one step", "", "output") in cand:
        dy = grad_output if grad_output is not None else default_grad(y_c.shape, y_c.dtype, y_c.device)
        first_step = {k: v for k, v in cand.items() if k[0] == "one step"}
        checks, not_run = run_metamorphic(snapshot, candidate_context, inputs, dy, first_step, seed, recipe)
        results += checks
    quantized_params = [n for n, p in candidate.named_parameters() if isinstance(p, QuantizedTensor)]
    tiers = describe_tiers(results, recipe=recipe, tier=tier, tols=tols, floor=floor, exposes=first.exposes,
                           quantized_params=quantized_params, copied=copy_parameters,
                           reference_operands=sorted(first.reference_operands), has_states=bool(first.states_r),
                           twin_problems=twin_problems, scenarios=("one step",) + tuple(
                               s for s in scenarios if s != "one step"),
                           metamorphic_not_run=not_run, metamorphic=metamorphic)
    if first.unequal_sources:
        bytes_tier = next(t for t in tiers if t.tier == "bytes (exact)")
        why = (f"{bytes_tier.why}; not compared byte for byte, because the two sides quantized different "
               f"high-precision tensors (downstream of an inexact op): {', '.join(first.unequal_sources)}")
        tiers[tiers.index(bytes_tier)] = TierRun(bytes_tier.tier, bytes_tier.ran, bytes_tier.count, why)
    return ComparisonReport(results, tiers)


def _judge_all(cand, ref, twins, tier, check, quantized, *, stopped: bool) -> list[TensorComparison]:
    """Every recorded tensor of the candidate against the reference's, in the script's order (``stopped``: the
    candidate raised and left the script, so the reference's later tensors have no counterpart to judge)."""
    out = []
    for key in list(cand) + [k for k in ref if k not in cand and not stopped]:
        a, b = cand.get(key), ref.get(key)
        if a is None or b is None:
            out.append(missing(key, "the candidate" if a is None else "the reference", tier))
        elif tier == "numerics":
            out.append(judge_numerics(key, a, b, twins["legit"].get(key), twins["float64"].get(key),
                                      twins["plain"].get(key), quantized=quantized))
        else:
            out.append(judge_by_tier(key, a, b, check))
    return out


def _twin_sides(reference, recipe, reference_context, problems) -> list[Side]:
    """The reference's twins, copied before the reference runs: same parameters, same recipe state."""
    def attempt(what, build):
        try:
            return build()
        except Exception as error:  # noqa: BLE001 - the report says what could not be done
            problems.append(f"{what}: {type(error).__name__}: {error}")
            return None

    sides = [Side("legit", deepcopy_module(reference), legit_context(reference_context), optional=True)]
    high = attempt("the float64 twin could not be built", lambda: float64_twin(reference))
    if high is not None:
        carry_parameter_attributes(reference, high, dtype=torch.float64)
    if high is not None:
        sides.append(Side("float64", high, float64_context, prepare=_as_double, optional=True))
    if recipe is not None:
        plain = attempt("the unquantized twin could not be built", lambda: _plain_twin(reference))
        if plain is not None:
            carry_parameter_attributes(reference, plain)
            sides.append(Side("plain", plain, lambda: autocast(enabled=False), optional=True))
    return sides


def _as_double(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def _deepcopy_or_none(module: torch.nn.Module) -> Optional[torch.nn.Module]:
    try:
        return deepcopy_module(module)
    except Exception:  # noqa: BLE001 - the metamorphic tier reports that it could not run
        return None


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
