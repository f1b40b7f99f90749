"""What the module oracle takes from the first step of the script: the quantized bytes and the recipe state.

Quantized bytes must agree bit for bit only where both sides quantized bit-identical tensors: the first
step's model input, weights quantized from the same values, the output grad. After the first step the
two sides' weights differ by the rounding of their updates, so bytes and delayed-scaling state are taken
from the first step alone (:class:`FirstStep`). Also here: how the reference gets the candidate's parameter
values (:func:`give_candidate_values`), never its quantized arrays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Iterator, Optional

import torch

from ...layouts import columnwise_layout
from ...quantization.dtensor import is_dtensor
from ...quantization import Float8Tensor
from ...quantization.quantized_tensor import QuantizedTensor
from . import quantized_operands as operands
from .distributed_models import assign_full_value, deepcopy_sharing_groups
from .exact_state import compare_quantized, compare_state, recipe_states, slots_fed_by_unequal_sources
from .sides import Side, values_of
from ..tensor_report import TensorComparison

__all__ = ["FirstStep", "give_candidate_values", "plain_twin"]


def give_candidate_values(candidate: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Each reference parameter takes the candidate's values (by name). A quantized one is re-quantized from
    the candidate's values by the reference's own quantizer, so that no derived copy (a transpose, a column-wise
    copy) of the candidate, stale or not, reaches the reference; the amax it records is put back, so the
    recipe state stays as it was."""
    targets = dict(reference.named_parameters())
    with torch.no_grad():
        for name, source in candidate.named_parameters():
            target = targets[name]
            if target.is_meta:
                raise ValueError(f"compare_modules: reference parameter {name!r} is on meta; materialize it first")
            values = values_of(source)  # a DTensor's full value
            if is_dtensor(target):
                assign_full_value(target, values, what=f"reference parameter {name!r}")
            elif isinstance(target, QuantizedTensor):
                if torch.equal(target.dequantize(), values.to(device=target.device, dtype=target.dtype)):
                    continue  # the reference already holds these values, quantized by itself
                _quantize_keeping_amax(target, values.to(target.device), source)
            else:
                target.copy_(values.to(dtype=target.dtype, device=target.device))


def _quantize_keeping_amax(target: QuantizedTensor, values: torch.Tensor, source: torch.Tensor) -> None:
    quantizer = target.quantizer
    amax = getattr(quantizer, "amax", None)
    saved = amax.clone() if isinstance(amax, torch.Tensor) else None
    target.quantize_(values)
    if saved is not None:
        quantizer.amax.copy_(saved)
    if isinstance(target, Float8Tensor) and isinstance(source, Float8Tensor) and not torch.equal(
            target.dequantize(), values.to(target.dtype)):
        # Re-quantized with another scale than the candidate's (delayed scaling's scale moved since the weight was
        # cast), the values are not the candidate's: take its codes and scale_inv (what its values are), and let
        # the reference derive the transpose from them, so that a stale transpose is still not taken over.
        arrays, _ = source.to_plain_tensors()
        data = arrays["data"].to(target.device)
        fresh = {"data": data, "fp8_scale_inv": arrays["fp8_scale_inv"].to(target.device)}
        if target.has_usage("columnwise"):
            fresh["data_transpose"] = columnwise_layout(data).reshape(target._transpose.shape)
        target._overwrite_arrays(fresh)


def plain_twin(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` with every quantized parameter dequantized (run without a recipe)."""
    twin = deepcopy_sharing_groups(module)
    for sub in twin.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            if isinstance(p, QuantizedTensor):
                values = p.dequantize(dtype=p.dtype if p.dtype.is_floating_point else torch.float32)
                setattr(sub, name, torch.nn.Parameter(values.detach().clone(), requires_grad=p.requires_grad))
    return twin


def _snapshot(state: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(scale=state.scale.detach().clone(), amax_history=state.amax_history.detach().clone())


class FirstStep:
    """Watches the candidate's and the reference's first step; compares their bytes and recipe state after it."""

    def __init__(self, candidate: torch.nn.Module, reference: torch.nn.Module, copied: bool) -> None:
        self.candidate, self.reference, self.copied = candidate, reference, copied
        self.seen: dict[str, operands.Recorded] = {}
        self.exposed: Optional[dict[str, Any]] = None
        self.states_c: dict[str, Any] = {}
        self.states_r: dict[str, Any] = {}
        self.inexact: dict[str, list[int]] = {}
        self.weight_bytes: list[TensorComparison] = []
        self.reference_operands: dict[str, QuantizedTensor] = {}
        self.reference_sources: dict[str, Optional[torch.Tensor]] = {}
        self.unequal_sources: list[str] = []
        self.exposes = False

    @contextlib.contextmanager
    def observe(self, side: Side) -> Iterator[None]:
        if side.name not in ("candidate", "reference"):
            yield
            return
        with operands.recording() as seen:
            yield
        self.seen[side.name] = seen

    def done(self) -> None:
        """After every side's first step: take the operands, bytes and states to compare."""
        seen_c, seen_r = self.seen.get("candidate", operands.Recorded()), self.seen.get("reference", operands.Recorded())
        hook = getattr(self.candidate, operands.HOOK, None)
        self.exposed = hook() if callable(hook) else None
        self.reference_operands = operands.reference_operands(self.reference, seen_r)
        self.reference_sources = operands.operand_sources(self.reference, seen_r)
        self.states_c = {k: _snapshot(v) for k, v in recipe_states(self.candidate).items()}
        self.states_r = {k: _snapshot(v) for k, v in recipe_states(self.reference).items()}
        if self.exposed is None:
            self.inexact = slots_fed_by_unequal_sources(self.candidate, self.reference, seen_c, seen_r)
        if not self.copied:  # both sides quantized their own weights from the same values
            params_r = dict(self.reference.named_parameters())
            for name, p in self.candidate.named_parameters():
                q = params_r.get(name)
                if isinstance(p, QuantizedTensor) and isinstance(q, QuantizedTensor):
                    self.weight_bytes.extend(compare_quantized(name, p, q))
        self._own_operands(seen_c, seen_r)

    def _own_operands(self, seen_c: operands.Recorded, seen_r: operands.Recorded) -> None:
        """A refops candidate exposes its operands by being refops: those both sides quantized from bit-identical
        tensors (the model's input, the weights, the output grad; downstream of a GEMM the sources differ)."""
        if self.exposed is not None:
            self.exposes = True
            return
        own = operands.reference_operands(self.candidate, seen_c, deterministic_only=True)
        sources_c = operands.operand_sources(self.candidate, seen_c)
        sources_r = operands.operand_sources(self.reference, seen_r)
        own = {name: t for name, t in own.items() if name in self.reference_operands}
        self.unequal_sources = sorted(n for n in own if not operands.same_source(sources_c.get(n), sources_r.get(n)))
        self.exposed = {name: t for name, t in own.items() if name not in self.unequal_sources}
        self.exposes = bool(self.exposed)

    def comparisons(self, state_check: dict) -> list[TensorComparison]:
        """The bytes (weights, operands) and the delayed-scaling state, each marked with its kind."""
        out = [dataclasses.replace(c, kind="bytes", scenario="one step") for c in self.weight_bytes]
        if self.exposed:
            out += [dataclasses.replace(c, kind="bytes", scenario="one step")
                    for c in operands.compare_operands(self.exposed, self.reference_operands,
                                                        self.reference_sources)]
        for key in sorted(set(self.states_c) & set(self.states_r)):
            out += [dataclasses.replace(c, kind="state", scenario="one step") for c in compare_state(
                key, self.states_c[key], self.states_r[key], self.inexact.get(key, ()), state_check)]
        return out
