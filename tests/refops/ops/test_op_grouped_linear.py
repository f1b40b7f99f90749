"""GroupedLinear: per-group GEMMs vs a float64 per-split ``F.linear`` reference, alone and in Sequential.

Parameters, deferred init, caller buffers, weight-grad variants and bad input are covered by the other
``test_op_grouped_linear_*.py`` files.
"""

from __future__ import annotations

import pytest
import torch

from refops.ops.sequential import Sequential
from refops.testing.tolerances import gemm_tols

from _grouped_linear_cases import (
    DTYPES,
    G,
    IN,
    OUT,
    PARAM_MODES,
    ROWS,
    bias_grad,
    close,
    make_op,
    randomize_biases,
    reference,
    splits,
    weight_grad,
)

BIAS_CASES = [(False, False), (True, False), (True, True)]  # (bias, scale_bias)


# ------------------------------------------------------------------ numerics
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias,scale_bias", BIAS_CASES)
@pytest.mark.parametrize("mode", PARAM_MODES)
def test_grouped_linear(device, mode, bias, scale_bias, dtype):
    op = make_op(device, dtype, mode, bias=bias, scale_bias=scale_bias)
    randomize_biases(op)
    x = torch.randn(ROWS, IN, dtype=dtype, requires_grad=True)
    scales = torch.rand(ROWS, dtype=dtype, requires_grad=True) if scale_bias else None
    y = op(x, splits(), *([scales] if scale_bias else []))
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = reference(op, x, dy, scales)
    tols = gemm_tols(dtype)
    assert y.dtype == dtype and y.shape == (ROWS, OUT)
    close(y, ref.y, tols)
    close(x.grad, ref.dx, tols)
    for g in range(G):
        close(weight_grad(op, g), ref.dw[g], tols)
        if bias:
            close(bias_grad(op, g), ref.db[g], tols)
    if scale_bias:
        close(scales.grad, ref.dscales, tols)
    assert torch.count_nonzero(weight_grad(op, 1)) == 0  # the empty group
    if bias:
        assert torch.count_nonzero(bias_grad(op, 1)) == 0


@pytest.mark.parametrize("scales_requires_grad", [False, True])
@pytest.mark.parametrize("weight_requires_grad", [False, True])
@pytest.mark.parametrize("input_requires_grad", [False, True])
@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_requires_grad(device, mode, input_requires_grad, weight_requires_grad, scales_requires_grad):
    op = make_op(device, torch.float32, mode, scale_bias=True)
    randomize_biases(op)
    for param in op.parameters():
        param.requires_grad_(weight_requires_grad)
    x = torch.randn(ROWS, IN, requires_grad=input_requires_grad)
    scales = torch.rand(ROWS, requires_grad=scales_requires_grad)
    y = op(x, splits(), scales)
    any_grad = input_requires_grad or weight_requires_grad or scales_requires_grad
    assert y.requires_grad == any_grad
    dy = torch.randn_like(y)
    ref = reference(op, x, dy, scales)
    close(y, ref.y, gemm_tols(torch.float32))
    if any_grad:
        y.backward(dy)
    assert (x.grad is not None) == input_requires_grad
    assert (scales.grad is not None) == scales_requires_grad
    assert all((p.grad is not None) == weight_requires_grad for p in op.parameters())
    tols = gemm_tols(torch.float32)
    if input_requires_grad:
        close(x.grad, ref.dx, tols)
    if scales_requires_grad:
        close(scales.grad, ref.dscales, tols)
    if weight_requires_grad:
        for g in range(G):
            close(weight_grad(op, g), ref.dw[g], tols)
            close(bias_grad(op, g), ref.db[g], tols)


def test_no_grad_forward_matches(device):
    op = make_op(device, scale_bias=True)
    randomize_biases(op)
    x, scales = torch.randn(ROWS, IN, requires_grad=True), torch.rand(ROWS)
    with torch.no_grad():
        y_inference = op(x, splits(), scales)
    assert not y_inference.requires_grad
    assert torch.equal(y_inference, op(x, splits(), scales).detach())


@pytest.mark.parametrize("split_dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_split_size_dtypes(device, split_dtype):
    op = make_op(device)
    x = torch.randn(ROWS, IN)
    assert torch.equal(op(x, splits(dtype=split_dtype)), op(x, splits()))


def test_leading_dims_are_flattened_to_rows(device):
    op = make_op(device)
    randomize_biases(op)
    x = torch.randn(2, ROWS // 2, IN, requires_grad=True)
    y = op(x, splits())
    assert y.shape == (2, ROWS // 2, OUT)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = reference(op, x, dy)
    close(y, ref.y, gemm_tols(torch.float32))
    close(x.grad, ref.dx, gemm_tols(torch.float32))


def test_all_rows_in_one_group(device):
    op = make_op(device, mode="single")
    x = torch.randn(ROWS, IN, requires_grad=True)
    y = op(x, splits([0, 0, ROWS, 0]))
    y.backward(torch.ones_like(y))
    assert torch.count_nonzero(op.weight.grad[[0, 1, 3]]) == 0
    assert torch.equal(op.bias.grad[2], torch.full((OUT,), float(ROWS)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_autocast(device, dtype):
    op = make_op(device, dtype)
    randomize_biases(op)
    x = torch.randn(ROWS, IN, dtype=dtype)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        y = op(x, splits())
    assert y.dtype == torch.bfloat16
    ref_op = make_op(device, torch.bfloat16)
    with torch.no_grad():
        for (_, p), (_, q) in zip(ref_op.named_parameters(), op.named_parameters()):
            p.copy_(q)
    assert torch.equal(y, ref_op(x.to(torch.bfloat16), splits()))


# ------------------------------------------------------------------ Sequential
def test_sequential_with_extra_inputs(device):
    """GroupedLinear -> GroupedLinear(scale_bias): extra inputs (splits, splits, scales) go to Sequential."""
    fc1 = make_op(device)
    fc2 = make_op(device, mode="single", scale_bias=True)
    randomize_biases(fc1)
    randomize_biases(fc2)
    seq = Sequential(fc1, fc2)
    x = torch.randn(ROWS, IN, requires_grad=True)
    scales = torch.rand(ROWS, requires_grad=True)
    y = seq(x, splits(), splits(dtype=torch.int32), scales)
    dy = torch.randn_like(y)
    y.backward(dy)

    h = reference(fc1, x, torch.zeros(ROWS, OUT))  # forward of fc1 only
    h64 = h.y.requires_grad_()
    ref2 = reference(fc2, h64, dy, scales)
    h64.backward(ref2.dx)
    x_ref = reference(fc1, x, h64.grad)
    tols = gemm_tols(torch.float32)
    close(y, ref2.y, tols)
    close(x.grad, x_ref.dx, tols)
    close(scales.grad, ref2.dscales, tols)
    for g in range(G):
        close(weight_grad(fc1, g), x_ref.dw[g], tols)
        close(weight_grad(fc2, g), ref2.dw[g], tols)
        close(bias_grad(fc2, g), ref2.db[g], tols)
    assert all(p.grad is not None for p in seq.parameters())
