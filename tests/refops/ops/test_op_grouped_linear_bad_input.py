"""GroupedLinear bad input: constructor arguments, forward inputs, and inconsistent parameters named in the error."""

from __future__ import annotations

import pytest
import torch

from refops.ops.basic.grouped_linear import GroupedLinear

from _grouped_linear_cases import G, IN, OUT, ROWS, make_op, splits


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_groups=0), "num_groups"),
        (dict(in_features=0), "in_features"),
        (dict(out_features=-1), "out_features"),
        (dict(dtype=torch.float64), "supported dtypes"),
    ],
)
def test_constructor_errors(device, kwargs, match):
    args = dict(num_groups=G, in_features=IN, out_features=OUT) | kwargs
    with pytest.raises(ValueError, match=match):
        GroupedLinear(args.pop("num_groups"), args.pop("in_features"), args.pop("out_features"), **args)


def test_forward_input_errors(device):
    op = make_op(device, scale_bias=True)
    x, scales = torch.randn(ROWS, IN), torch.rand(ROWS)
    with pytest.raises(ValueError, match="Expected 4 splits, but got 3"):
        op(x, splits([8, 12, 4]), scales)
    with pytest.raises(ValueError, match="sum to 23"):
        op(x, splits([8, 0, 11, 4]), scales)
    with pytest.raises(ValueError, match="non-negative"):
        op(x, splits([10, -2, 12, 4]), scales)
    with pytest.raises(TypeError, match="integer tensor"):
        op(x, torch.tensor([8.0, 0.0, 12.0, 4.0]), scales)
    with pytest.raises(ValueError, match="in_features=16"):
        op(torch.randn(ROWS, IN + 1), splits(), scales)
    with pytest.raises(TypeError, match="dtype"):
        op(x.half(), splits(), scales)
    with pytest.raises(ValueError, match="one entry per input row"):
        op(x, splits(), torch.rand(ROWS - 1))
    with pytest.raises(TypeError, match="floating-point"):
        op(x, splits(), torch.ones(ROWS, dtype=torch.int64))


def _replace(op, name, **kw):
    old = op.get_parameter(name)
    op.register_parameter(name, torch.nn.Parameter(torch.zeros(old.shape, **kw)))


@pytest.mark.parametrize(
    "mode,bias,corrupt,match",
    [
        ("discrete", True, lambda op: _replace(op, "weight2", dtype=torch.float16), "Weight 2 has dtype"),
        ("discrete", True, lambda op: op.weight1.requires_grad_(False), "Weight 1 has requires_grad"),
        ("discrete", True, lambda op: _replace(op, "bias3", dtype=torch.bfloat16), "Bias 3 has dtype"),
        ("discrete", True, lambda op: op.register_parameter("bias2", None), "bias 2 is uninitialized"),
        ("discrete", False, lambda op: op.register_parameter("bias1", torch.nn.Parameter(torch.zeros(OUT))),
         "Expected no biases, but bias 1"),
        ("single", True, lambda op: op.bias.requires_grad_(False), "Bias has requires_grad"),
        ("single", True, lambda op: _replace(op, "bias", dtype=torch.float16), "Bias has dtype"),
    ],
)
def test_inconsistent_parameters_are_named(device, mode, bias, corrupt, match):
    op = make_op(device, mode=mode, bias=bias)
    corrupt(op)
    with pytest.raises(RuntimeError, match=match):
        op(torch.randn(ROWS, IN), splits())
