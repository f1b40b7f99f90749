"""Param-owning op cases shared by the lifecycle tests: how to build each and feed it."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

import refops as te
from refops.ops.basic.basic_linear import BasicLinear
from refops.ops.basic.bias import Bias
from refops.ops.basic.grouped_linear import GroupedLinear
from refops.ops.basic.layer_norm import LayerNorm
from refops.ops.basic.rms_norm import RMSNorm


@dataclasses.dataclass(frozen=True)
class OpCase:
    """``build(device, dtype)`` makes the op; ``inputs(device, dtype)`` makes ``(x, *extra)``."""

    name: str
    build: Callable[[torch.device | str, torch.dtype], torch.nn.Module]
    inputs: Callable[[torch.device, torch.dtype], tuple[torch.Tensor, ...]]


def _x(shape: tuple[int, ...]) -> Callable[[torch.device, torch.dtype], tuple[torch.Tensor, ...]]:
    def make(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return (torch.randn(shape, device=device, dtype=dtype),)

    return make


def _grouped_inputs(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    split_sizes = torch.tensor([3, 0, 5, 4], dtype=torch.int64)
    return torch.randn(12, 16, device=device, dtype=dtype), split_sizes


CASES: list[OpCase] = [
    OpCase("basic_linear", lambda d, t: BasicLinear(16, 8, device=d, dtype=t), _x((2, 3, 16))),
    OpCase("bias", lambda d, t: Bias(16, device=d, dtype=t), _x((4, 16))),
    OpCase("linear", lambda d, t: te.ops.Linear(16, 8, device=d, dtype=t), _x((4, 16))),
    OpCase("linear_no_bias", lambda d, t: te.ops.Linear(16, 8, bias=False, device=d, dtype=t), _x((4, 16))),
    OpCase(
        "sequential_linear_bias",
        lambda d, t: te.ops.Sequential(te.ops.Linear(16, 8, device=d, dtype=t), Bias(8, device=d, dtype=t)),
        _x((4, 16)),
    ),
    OpCase("layer_norm", lambda d, t: LayerNorm(16, device=d, dtype=t), _x((4, 16))),
    OpCase("layer_norm_zcg", lambda d, t: LayerNorm(16, device=d, dtype=t, zero_centered_gamma=True), _x((4, 16))),
    OpCase("rms_norm", lambda d, t: RMSNorm(16, device=d, dtype=t), _x((4, 16))),
    OpCase("grouped_linear", lambda d, t: GroupedLinear(4, 16, 8, device=d, dtype=t), _grouped_inputs),
    OpCase(
        "grouped_linear_single_param",
        lambda d, t: GroupedLinear(4, 16, 8, device=d, dtype=t, single_grouped_weight=True, single_grouped_bias=True),
        _grouped_inputs,
    ),
    OpCase(
        "sequential_ln_linear",
        lambda d, t: te.ops.Sequential(LayerNorm(16, device=d, dtype=t), te.ops.Linear(16, 8, device=d, dtype=t)),
        _x((4, 16)),
    ),
]

CASE_IDS = [c.name for c in CASES]


def aliases_in_sync(module: torch.nn.Module) -> bool:
    """Every ``Linear`` in ``module`` has aliases identical to its basic ops' parameters."""
    for m in module.modules():
        if isinstance(m, te.ops.Linear):
            if m.weight is not m.basic_ops[m._linear_idx].weight:
                return False
            if m._bias_idx is not None and m.bias is not m.basic_ops[m._bias_idx].bias:
                return False
    return True
