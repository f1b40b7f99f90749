"""The bit-for-bit tier of ``compare_modules``: quantized parameters' bytes and delayed-scaling recipe state,
where both sides must hold the same bits (a slot whose quantizer saw different tensors excepted)."""

from __future__ import annotations

from typing import Sequence

import torch

from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.recipe_state import DelayedScalingRecipeState
from . import quantized_operands as operands
from ..tensor_report import TensorComparison, absent, compare_tensors

__all__ = ["compare_quantized", "recipe_states", "slots_fed_by_unequal_sources", "compare_state"]


def compare_quantized(name: str, a: QuantizedTensor, b: QuantizedTensor) -> list[TensorComparison]:
    arrays_a, _ = a.to_plain_tensors()
    arrays_b, _ = b.to_plain_tensors()
    out = []
    for key in sorted(set(arrays_a) | set(arrays_b)):
        if key.startswith("quantizer."):
            continue
        x, y = arrays_a.get(key), arrays_b.get(key)
        if x is None or y is None:
            lacking = "the candidate" if x is None else "the reference"
            out.append(absent(f"{name}[{key}]", f"{lacking}'s quantized tensor has no {key} array"))
            continue
        view = (lambda t: t.view(torch.uint8)) if x.element_size() == 1 else (lambda t: t)
        out.append(compare_tensors(f"{name}[{key}]", view(x), view(y), tier="exact"))
    return out


def recipe_states(module: torch.nn.Module) -> dict[str, DelayedScalingRecipeState]:
    states = {}
    for prefix, m in module.named_modules():
        for mode, state in (getattr(m, "_recipe_states", None) or {}).items():
            if isinstance(state, DelayedScalingRecipeState):
                states[f"{prefix}.{mode}" if prefix else mode] = state
    return states


def slots_fed_by_unequal_sources(candidate, reference, seen_c, seen_r) -> dict[str, list[int]]:
    """``{state key: [quantizer slot]}``: the delayed-scaling slots whose quantizer saw different tensors on
    the two sides (downstream of an op the two sides compute in another order), by the states' keys."""
    modules_r = dict(reference.named_modules())
    slots: dict[str, list[int]] = {}
    for path, sub in candidate.named_modules():
        twin = modules_r.get(path)
        for mode, quantizers in (getattr(sub, "_quantizers", None) or {}).items():
            twins = (getattr(twin, "_quantizers", None) or {}).get(mode, [])
            for index, (q_c, q_r) in enumerate(zip(quantizers, twins)):
                if id(q_c) in seen_c and id(q_r) in seen_r and not operands.same_source(
                    seen_c.sources.get(id(q_c)), seen_r.sources.get(id(q_r))
                ):
                    slots.setdefault(f"{path}.{mode}" if path else mode, []).append(index)
    return slots


def compare_state(key: str, state_c, state_r, inexact: Sequence[int], check: dict) -> list[TensorComparison]:
    """A delayed-scaling state's scale and amax history, bit for bit; a slot whose quantizer saw different
    tensors on the two sides (``inexact``) is held to the run's outputs-and-grads criterion instead."""
    out = []
    exact = [i for i in range(state_r.scale.numel()) if i not in inexact]
    for field in ("scale", "amax_history"):
        a, b = getattr(state_c, field), getattr(state_r, field)
        if a.shape != b.shape or not inexact:
            out.append(compare_tensors(f"{key}.{field}", a, b, tier="exact"))
            continue
        if exact:
            out.append(compare_tensors(f"{key}.{field}", a[..., exact], b[..., exact], tier="exact"))
        slots = ", ".join(map(str, inexact))
        out.append(compare_tensors(f"{key}.{field}[slots {slots}, fed by unequal tensors]",
                                   a[..., list(inexact)], b[..., list(inexact)], **check))
    return out
