"""Shared helpers for the quantized-compute tests of the basic ops (``docs/te-ops.md#how-the-tests-check-an-op``).

TE's method: inputs (and grads) are made exactly representable by quantizing and
dequantizing them with a fixed, test-chosen quantizer; the reference runs in
float64 on CPU from those values; results are compared with TE's quantization
tolerances (E4M3 tols for every FP8 recipe, E2M1 tols for NVFP4). Where the
semantics make a result exact (Quantize values, a neighbour's quantizer applied
once to the high-precision result), the comparison is exact.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import pytest
import torch

import refops as te
import refops.quantization as rq
from refops.quantization import DType, QuantizedTensor
from refops.quantization.recipe_state import RecipeState
from refops.recipe import NVFP4BlockScaling
from refops.testing import make_recipe, quantization_tols

FP8_RECIPES = ("fp8_delayed_scaling", "fp8_current_scaling", "mxfp8", "fp8_block_scaling")
RECIPES = FP8_RECIPES + ("nvfp4", "nvfp4_2d")
ROWS, HIDDEN = 128, 128  # multiples of every block size (1x16, 1x32, 1x128, 128x128)


# ------------------------------------------------------------------ recipes
def make_test_recipe(name: str) -> Any:
    """TE's test recipes; NVFP4 without RHT and stochastic rounding, 2D weights on or off."""
    if name.startswith("nvfp4"):
        return NVFP4BlockScaling(
            disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=name != "nvfp4_2d"
        )
    return make_recipe(name)


def _nvfp4_missing() -> Optional[str]:
    if not hasattr(rq, "NVFP4Quantizer"):
        return "refops.quantization exports no NVFP4Quantizer yet"
    try:
        RecipeState.create(make_test_recipe("nvfp4"), mode="forward", num_quantizers=1)
    except TypeError as error:
        return f"refops has NVFP4Quantizer but no recipe state for NVFP4BlockScaling yet ({error})"
    return None


def skip_unsupported(recipe_name: str, dtype: torch.dtype) -> None:
    """NVFP4 runs only when refops provides its recipe state, and in bf16 only (as TE's tests)."""
    if recipe_name.startswith("nvfp4"):
        missing = _nvfp4_missing()
        if missing:
            pytest.skip(missing)
        if dtype != torch.bfloat16:
            pytest.skip("NVFP4 is tested in bf16 only (as in TE)")


def tols(recipe_name: str) -> dict[str, float]:
    return quantization_tols("nvfp4" if recipe_name.startswith("nvfp4") else recipe_name)


def fresh_quantizer(recipe_name: str, mode: str = "forward", role: Optional[str] = None) -> Any:
    """A quantizer of the recipe for slot 0, in its initial state (delayed scaling: scale 1)."""
    roles = None if role is None else [rq.QuantizerRole(module_type="linear", tensor_type=role)]
    state = RecipeState.create(make_test_recipe(recipe_name), mode=mode, num_quantizers=1, roles=roles)
    return state.make_quantizer(0)


# ------------------------------------------------------------------ tensors
def representable_quantizer(recipe_name: str, role: str, device: torch.device) -> Any:
    """TE's fixed test quantizers (``docs/te-ops.md#how-the-tests-check-an-op``): the values they round-trip
    are representable in the recipe."""
    e4m3 = DType.kFloat8E4M3
    if recipe_name == "fp8_delayed_scaling":
        return rq.Float8Quantizer(torch.ones(1, device=device), torch.zeros(1, device=device), e4m3)
    if recipe_name == "fp8_current_scaling":
        return rq.Float8CurrentScalingQuantizer(e4m3, device)
    if recipe_name == "mxfp8":
        return rq.MXFP8Quantizer(e4m3)
    if recipe_name == "fp8_block_scaling":
        dim = 2 if role == "weight" else 1
        return rq.Float8BlockQuantizer(e4m3, rowwise=True, columnwise=True, block_scaling_dim=dim)
    return rq.NVFP4Quantizer(with_rht=False, with_2d_quantization=False, stochastic_rounding=False)


def make_tensors(shape, recipe_name, dtype, device, *, role="input", low=0.0, high=1.0, requires_grad=True,
                 quantized=False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ref, test)``: float64 CPU values and the same values in ``dtype`` (quantized if asked)."""
    ref = torch.empty(shape, dtype=torch.float64).uniform_(low, high)
    test = representable_quantizer(recipe_name, role, device)(ref.to(device=device, dtype=dtype))
    ref = test.dequantize().to(device="cpu", dtype=torch.float64)
    if not quantized:
        test = test.dequantize()
    return ref.requires_grad_(requires_grad), test.requires_grad_(requires_grad)


def to64(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, QuantizedTensor):
        t = t.dequantize()
    return t.detach().to(device="cpu", dtype=torch.float64)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, **tolerances: float) -> None:
    torch.testing.assert_close(to64(actual), to64(expected), **tolerances)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64."""
    expected = to64(expected)
    return float((to64(actual) - expected).norm() / expected.norm())


def assert_exact(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert_close(actual, expected, rtol=0, atol=0)


# ------------------------------------------------------------------ references (float64)
def gelu_reference(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def glu_reference(gate: Callable) -> Callable:
    return lambda x: gate(x.chunk(2, dim=-1)[0]) * x.chunk(2, dim=-1)[1]


# ------------------------------------------------------------------ running
def quantized_run(model, x, dy, recipe_name, *extra):
    with te.autocast(recipe=make_test_recipe(recipe_name)):
        y = model(x, *extra)
    y.backward(dy)
    return y


def record_calls(op: Any, method: str, seen: list) -> None:
    """Record the tensor argument of ``op.<method>`` (an instance attribute shadows the method)."""
    original = getattr(op, method)

    def wrapper(ctx, tensor, *args, **kwargs):
        seen.append(tensor)
        return original(ctx, tensor, *args, **kwargs)

    setattr(op, method, wrapper)
