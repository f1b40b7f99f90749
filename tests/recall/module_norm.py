"""Opaque plain-torch normalization kernels against refops' ``LayerNorm`` (+ ``Linear``).

Two shipped TE bugs: a LayerNorm that reads a non-contiguous input as if it were contiguous, and a
LayerNorm fused with the next FP8 cast whose amax is taken from the fp32 values before they are
rounded to the output dtype (so the scale can sit one ulp off the one the bf16 output gives).
"""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.testing import compare_modules

from .cases import RecallCase
from .module_fp8_linear import Fp8Linear

FEATURES, OUT, BATCH = 64, 32, 32


class RawPointerLayerNorm(torch.nn.LayerNorm):
    """LayerNorm over the input's storage; ``assumes_contiguous`` reads it in row-major order (the bug)."""

    def __init__(self, features: int, assumes_contiguous: bool) -> None:
        super().__init__(features)
        self.assumes_contiguous = assumes_contiguous

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.assumes_contiguous:
            x = x.as_strided(x.shape, torch.empty(x.shape).stride(), x.storage_offset())
        else:
            x = x.contiguous()
        return super().forward(x)


class NormFusedFp8Linear(torch.nn.Module):
    """LayerNorm whose kernel also yields the amax that the next FP8 cast (of its bf16 output) uses."""

    def __init__(self, amax_before_rounding: bool) -> None:
        super().__init__()
        self.add_module("0", torch.nn.LayerNorm(FEATURES, dtype=torch.bfloat16))
        self.add_module("1", Fp8Linear(FEATURES, OUT, dtype=torch.bfloat16))
        self.amax_before_rounding = amax_before_rounding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm, linear = getattr(self, "0"), getattr(self, "1")
        z = torch.nn.functional.layer_norm(x.float(), (FEATURES,), norm.weight.float(), norm.bias.float(), norm.eps)
        out = z.to(torch.bfloat16)
        amax = (z if self.amax_before_rounding else out.float()).detach().abs().amax().reshape(1)
        linear.input_scale = torch.where(amax == 0, 1.0, torch.tensor([448.0]) / amax)
        return linear(out)


def _compare_layer_norm(assumes_contiguous: bool) -> Any:
    torch.manual_seed(0)
    x = torch.randn(BATCH, FEATURES)
    return compare_modules(RawPointerLayerNorm(FEATURES, assumes_contiguous), te.ops.LayerNorm(FEATURES), (x,))


def _compare_fused_amax(amax_before_rounding: bool) -> Any:
    torch.manual_seed(0)
    candidate = NormFusedFp8Linear(amax_before_rounding)
    reference = te.ops.Sequential(te.ops.LayerNorm(FEATURES, dtype=torch.bfloat16),
                                  te.ops.Linear(FEATURES, OUT, dtype=torch.bfloat16))
    x = torch.randn(BATCH, FEATURES, dtype=torch.bfloat16)
    return compare_modules(candidate, reference, (x,), recipe=te.recipe.Float8CurrentScaling())


def _strided_outputs_differ() -> bool:
    x = torch.randn(FEATURES, BATCH).t()  # a transposed activation, as a permute upstream leaves it
    return not torch.equal(RawPointerLayerNorm(FEATURES, True)(x), RawPointerLayerNorm(FEATURES, False)(x))


def _fused_scales_differ() -> bool:
    torch.manual_seed(0)
    candidate = NormFusedFp8Linear(True)
    x = torch.randn(BATCH, FEATURES, dtype=torch.bfloat16)
    candidate(x)
    before_rounding = getattr(candidate, "1").input_scale.clone()
    candidate.amax_before_rounding = False
    candidate(x)
    return not torch.equal(before_rounding, getattr(candidate, "1").input_scale)


CASES = [
    RecallCase("layer_norm_reads_strided_input_as_contiguous",
               "https://github.com/NVIDIA/TransformerEngine/pull/1017", "module",
               "LayerNorm hands a non-contiguous input's pointer to a kernel that assumes row-major rows",
               lambda: _compare_layer_norm(True), lambda: _compare_layer_norm(False), _strided_outputs_differ),
    RecallCase("norm_fused_amax_before_output_rounding",
               "https://github.com/NVIDIA/TransformerEngine/pull/2355", "module",
               "the LayerNorm kernel's fused amax is taken from fp32 values, not the bf16 output that is "
               "then cast, so the FP8 scale can be one ulp off",
               lambda: _compare_fused_amax(True), lambda: _compare_fused_amax(False), _fused_scales_differ),
]
