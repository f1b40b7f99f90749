"""GroupedLinear caller buffers: output and grad-input written into tensors the caller provides."""

from __future__ import annotations

import pytest
import torch

from refops.ops.basic.grouped_linear import GRAD_INPUT_BUFFER_KEY, OUTPUT_BUFFER_KEY
from refops.ops.sequential import Sequential

from _grouped_linear_cases import IN, OUT, ROWS, make_op, splits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_linear_caller_buffers(device, dtype):
    """TE's test: fc1 writes its dgrad, fc2 its output into caller buffers (through Sequential)."""
    fc1, fc2 = make_op(device, dtype), make_op(device, dtype)
    seq = Sequential(fc1, fc2)
    out_buf = torch.empty(ROWS, OUT, dtype=dtype)
    dgrad_buf = torch.empty(ROWS, IN, dtype=dtype)
    x = torch.randn(ROWS, IN, dtype=dtype)
    dy = torch.randn(ROWS, OUT, dtype=dtype)
    x_ref = x.clone().requires_grad_()
    y_ref = seq(x_ref, splits(), splits())
    y_ref.backward(dy)
    for _ in range(2):  # beyond TE: the same buffers can be reused every iteration
        xi = x.clone().requires_grad_()
        op_kwargs = {fc1: {GRAD_INPUT_BUFFER_KEY: dgrad_buf}, fc2: {OUTPUT_BUFFER_KEY: out_buf}}
        y = seq(xi, splits(), splits(), op_kwargs=op_kwargs)
        assert y.data_ptr() == out_buf.data_ptr() and not out_buf.requires_grad
        assert torch.equal(y, y_ref) and torch.equal(out_buf, y_ref)
        y.backward(dy)
        assert torch.equal(dgrad_buf, xi.grad) and torch.equal(xi.grad, x_ref.grad)


@pytest.mark.parametrize("key", [OUTPUT_BUFFER_KEY, GRAD_INPUT_BUFFER_KEY])
@pytest.mark.parametrize("problem", ["shape", "dtype", "device", "non_contiguous", "requires_grad"])
def test_caller_buffer_errors(device, key, problem):
    op = make_op(device)
    shape = (ROWS, OUT) if key == OUTPUT_BUFFER_KEY else (ROWS, IN)
    buffer = {
        "shape": lambda: torch.empty(ROWS + 1, shape[1]),
        "dtype": lambda: torch.empty(shape, dtype=torch.float16),
        "device": lambda: torch.empty(shape, device="meta"),  # a real second device needs no GPU this way
        "non_contiguous": lambda: torch.empty(shape[1], ROWS).t(),
        "requires_grad": lambda: torch.empty(shape, requires_grad=True),
    }[problem]()
    with pytest.raises(ValueError, match=key):
        op(torch.randn(ROWS, IN, requires_grad=True), splits(), **{key: buffer})


def test_caller_buffer_direct_call_and_bad_kwargs(device):
    op = make_op(device)
    x = torch.randn(ROWS, IN)
    buffer = torch.empty(ROWS, OUT)
    y = op(x, splits(), output=buffer)
    assert y.data_ptr() == buffer.data_ptr() and torch.equal(y, op(x, splits()))
    with pytest.raises(TypeError, match="torch.Tensor"):
        op(x, splits(), output=[0.0] * ROWS)
    with pytest.raises(TypeError, match="unexpected forward kwargs"):
        op(x, splits(), outputs=buffer)
