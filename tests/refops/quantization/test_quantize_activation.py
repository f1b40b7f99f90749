"""``Quantizer.quantize_activation`` and its backward twins: one pass that is, bit for bit, the composition the
fused rule is stated as (``docs/recipes/fused-activations.md``).

For every recipe's quantizer, compute dtype and activation, forward and backward (with and without the bias grad):

    quantize_activation(x, act)                 == quantize_unrounded(act_fp32(x))
    quantize_activation_backward(dy, x, act)    == quantize_unrounded(dy * act'(x) in fp32)
    quantize_activation_backward_dbias(...)[1]  == dbias of the fp32 values (delayed scaling, MXFP8) or of the values
                                                   rounded to the compute dtype (the others), rounded to it

Every array of the quantized tensors and the quantizer's state afterwards (delayed scaling's recorded amax,
current scaling's amax and scale) are compared. The inputs are bf16/fp16-rounding sensitive (wide range,
values near the maximum), so a route that rounded first would differ.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from refops.kernels import current_backend
from refops.kernels.reference import activations as ref_act
from refops.quantization import (DType, Float8BlockQuantizer, Float8CurrentScalingQuantizer, Float8Quantizer,
                                 MXFP8Quantizer, NVFP4Quantizer, QuantizedTensor)

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
UNARY = tuple(sorted(ref_act.UNARY))
GATED = ("geglu", "swiglu", "clamped_swiglu")
PARAMS = {"clamped_swiglu": {"limit": 0.75, "alpha": 1.702, "glu_linear_offset": 1.0}}
E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2


def _quantizers() -> dict[str, Any]:
    """Factories of a fresh quantizer per scheme (delayed scaling with a scale that makes codes saturate)."""
    return {
        "delayed_e4m3": lambda: Float8Quantizer(torch.tensor([24.0]), torch.tensor([0.5]), E4M3),
        "delayed_e5m2_rowwise": lambda: Float8Quantizer(torch.tensor([3.0]), torch.zeros(1), E5M2, columnwise=False),
        "current_e4m3": lambda: Float8CurrentScalingQuantizer(E4M3),
        "current_e5m2_columnwise": lambda: Float8CurrentScalingQuantizer(E5M2, rowwise=False),
        "current_pow2_eps": lambda: Float8CurrentScalingQuantizer(E4M3, force_pow_2_scales=True, amax_epsilon=1e-3),
        "mxfp8": lambda: MXFP8Quantizer(E4M3),
        "block_1d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
        "block_2d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=2),
        "nvfp4": lambda: NVFP4Quantizer(with_rht=False, with_2d_quantization=False, stochastic_rounding=False),
    }


QUANTIZERS = _quantizers()


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 4
    x.view(-1)[::7] *= 0.01  # small values: where bf16/fp16 relative rounding matters most
    return x.to(dtype)


def _skip_unfit(name: str, dtype: torch.dtype) -> None:
    if name == "nvfp4" and dtype != torch.bfloat16:
        pytest.skip("NVFP4 is tested in bf16 only (as in TE)")


def assert_same_quantized(actual: QuantizedTensor, expected: QuantizedTensor) -> None:
    """Same class, shape, nominal dtype and every array byte for byte (absent where the other is absent)."""
    assert type(actual) is type(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    for name in type(actual)._array_names():
        a, e = getattr(actual, name), getattr(expected, name)
        assert (a is None) == (e is None), name
        if a is not None:
            assert a.dtype == e.dtype and a.shape == e.shape, name
            assert torch.equal(a.view(torch.uint8), e.view(torch.uint8)), f"{name} differs"


def assert_same_state(actual: Any, expected: Any) -> None:
    """The quantizers' state tensors afterwards (what the cast recorded), bit for bit."""
    for name in ("amax", "scale"):
        if hasattr(expected, name):
            a, e = getattr(actual, name), getattr(expected, name)
            assert torch.equal(a.view(torch.int32), e.view(torch.int32)), f"quantizer {name}: {a} != {e}"


def _shapes(activation: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(x shape, y shape)``: 128-multiples for the block schemes, a leading dim of 2 for the flattening."""
    if activation in ref_act.GATED:
        return (2, 64, 256), (2, 64, 128)
    return (2, 64, 128), (2, 64, 128)


@pytest.mark.parametrize("activation", UNARY + GATED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_forward_is_quantize_unrounded_of_the_fp32_activation(name, dtype, activation):
    _skip_unfit(name, dtype)
    params = PARAMS.get(activation, {})
    x = _inputs(_shapes(activation)[0], dtype, seed=1)
    fused_q, composed_q = QUANTIZERS[name](), QUANTIZERS[name]()
    fused = fused_q.quantize_activation(x, activation, dtype=dtype, **params)
    v = current_backend().activation_forward(x.float(), activation, **params)
    composed = composed_q.quantize_unrounded(v, dtype=dtype)
    assert_same_quantized(fused, composed)
    assert_same_state(fused_q, composed_q)


@pytest.mark.parametrize("activation", UNARY + GATED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_backward_is_quantize_unrounded_of_the_fp32_grad(name, dtype, activation):
    _skip_unfit(name, dtype)
    params = PARAMS.get(activation, {})
    x_shape, y_shape = _shapes(activation)
    x, dy = _inputs(x_shape, dtype, seed=2), _inputs(y_shape, dtype, seed=3)
    fused_q, composed_q = QUANTIZERS[name](), QUANTIZERS[name]()
    fused = fused_q.quantize_activation_backward(dy, x, activation, dtype=dtype, **params)
    v = current_backend().activation_backward(dy.float(), x.float(), activation, **params)
    composed = composed_q.quantize_unrounded(v, dtype=dtype)
    assert_same_quantized(fused, composed)
    assert_same_state(fused_q, composed_q)


@pytest.mark.parametrize("activation", UNARY)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_backward_dbias_sums_the_values_the_scheme_names(name, dtype, activation):
    _skip_unfit(name, dtype)
    x_shape, y_shape = _shapes(activation)
    x, dy = _inputs(x_shape, dtype, seed=4), _inputs(y_shape, dtype, seed=5)
    fused_q, composed_q = QUANTIZERS[name](), QUANTIZERS[name]()
    fused, dbias = fused_q.quantize_activation_backward_dbias(dy, x, activation, dtype=dtype)
    v = current_backend().activation_backward(dy.float(), x.float(), activation)
    composed = composed_q.quantize_unrounded(v, dtype=dtype)
    summed = v if composed_q.dbias_from_unrounded else v.to(dtype)
    expected = summed.reshape(-1, summed.shape[-1]).sum(dim=0).to(dtype)  # fp32 sum, one rounding
    assert_same_quantized(fused, composed)
    assert_same_state(fused_q, composed_q)
    assert dbias.dtype == dtype and dbias.shape == (x.shape[-1],)
    assert torch.equal(dbias.view(torch.uint8), expected.view(torch.uint8))


def test_the_rules_differ_where_they_should():
    """The comparisons above can fail: in bf16 the delayed-scaling codes of the one-rounding pass differ from
    those of rounding first, and the two dbias rules give different sums."""
    x, dy = _inputs((64, 128), torch.bfloat16, seed=6), _inputs((64, 128), torch.bfloat16, seed=7)
    fused = QUANTIZERS["delayed_e4m3"]().quantize_activation(x, "gelu", dtype=torch.bfloat16)
    rounded_first = QUANTIZERS["delayed_e4m3"]()(current_backend().activation_forward(x, "gelu"))
    assert not torch.equal(fused._data, rounded_first._data)
    _, from_fp32 = QUANTIZERS["delayed_e4m3"]().quantize_activation_backward_dbias(dy, x, "gelu", dtype=torch.bfloat16)
    _, from_bf16 = QUANTIZERS["current_e4m3"]().quantize_activation_backward_dbias(dy, x, "gelu", dtype=torch.bfloat16)
    assert not torch.equal(from_fp32, from_bf16)


def test_a_quantizer_without_usages_refuses_the_fused_pass():
    q = Float8Quantizer(torch.ones(1), torch.zeros(1), E4M3, rowwise=False, columnwise=False)
    with pytest.raises(ValueError, match="neither row-wise nor column-wise"):
        q.quantize_activation(torch.ones(4, 8), "gelu", dtype=torch.float32)
