"""Identity, Reshape, ConstantScale, Dropout, AddExtraInput and MakeExtraOutput.

Mirrors TE's TestBasicOps entries for these ops. How Sequential routes their extra
tensors (``test_extra_tensors``, ``TestExtraTensorChannels``) is in ``test_extra_tensors``.
"""

from __future__ import annotations

import math

import pytest
import torch

from refops.ops.basic.add_extra_input import AddExtraInput
from refops.ops.basic.constant_scale import ConstantScale
from refops.ops.basic.dropout import Dropout
from refops.ops.basic.identity import Identity
from refops.ops.basic.make_extra_output import MakeExtraOutput
from refops.ops.basic.reshape import Reshape
from refops.ops.op import OperationContext
from refops.ops.sequential import Sequential
from refops.testing import dtype_tols

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
EXACT = dict(rtol=0, atol=0)


def make_pair(shape, dtype, device, *, requires_grad=True, low=0.0, high=1.0):
    """``(ref, test)``: float64 CPU and ``dtype`` on ``device`` holding the same (representable) values."""
    ref = torch.empty(shape, dtype=torch.float64, device="cpu").uniform_(low, high)
    test = ref.to(device=device, dtype=dtype).clone()
    ref.copy_(test.to(device="cpu", dtype=torch.float64))
    return ref.requires_grad_(requires_grad), test.requires_grad_(requires_grad)


def to64(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(device="cpu", dtype=torch.float64)


# ----------------------------------------------------------------- Identity
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity(dtype, device, shape=(7, 5)):
    x_ref, x = make_pair(shape, dtype, device)
    dy_ref, dy = make_pair(shape, dtype, device, requires_grad=False)
    # Guard against a trivially passing comparison: the data differ.
    assert not torch.equal(x_ref, dy_ref)

    y = Identity()(x)
    y.backward(dy)

    assert y.data_ptr() == x.data_ptr() and y.dtype == dtype
    torch.testing.assert_close(to64(y), x_ref, **EXACT)
    torch.testing.assert_close(to64(x.grad), dy_ref, **EXACT)
    with torch.no_grad():
        assert Identity()(x) is x


# ------------------------------------------------------------------ Reshape
@pytest.mark.parametrize("shapes", (
    ((1, 2, 3), (3, 2, 1)),
    ((5, 4, 3), (-1, 3)),
    ((30,), (2, 5, 3)),
    ((6, 5), (3, -1, 5)),
    ((2, 3, 4), (-1,)),
    ((4,), 4),
))
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape(shapes, dtype, device):
    in_shape, out_shape = shapes
    x_ref, x = make_pair(in_shape, dtype, device)
    y_ref = x_ref.reshape(out_shape)
    dy_ref, dy = make_pair(y_ref.shape, dtype, device, requires_grad=False)
    y_ref.backward(dy_ref)

    y = Sequential(Reshape(out_shape))(x)
    y.backward(dy)

    assert y.shape == y_ref.shape and x.grad.shape == x.shape
    torch.testing.assert_close(to64(y), y_ref.detach(), **EXACT)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **EXACT)


def test_reshape_rejects_bad_shapes(device):
    with pytest.raises(ValueError, match="at most one dim may be -1"):
        Reshape((-1, -1))
    with pytest.raises(ValueError, match="ints >= -1"):
        Reshape((2, -3))
    with pytest.raises(ValueError, match="cannot reshape"):
        Reshape((4, 4))(torch.zeros(3, 5))


# ------------------------------------------------------------ ConstantScale
@pytest.mark.parametrize("scale", (1, 0, -2.5, 3.5))
@pytest.mark.parametrize("shape", ((), (1, 13), (4, 4, 2)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_scale(scale, shape, dtype, device):
    x_ref, x = make_pair(shape, dtype, device)
    dy_ref, dy = make_pair(shape, dtype, device, requires_grad=False)
    y_ref = scale * x_ref
    y_ref.backward(dy_ref)

    op = ConstantScale(scale)
    assert op.scale == scale and isinstance(op.scale, (int, float))
    y = op(x)
    y.backward(dy)

    tols = dtype_tols(dtype)
    assert y.shape == x.shape and y.dtype == dtype
    torch.testing.assert_close(to64(y), y_ref.detach(), **tols)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **tols)


def test_constant_scale_rejects_non_numbers():
    with pytest.raises(TypeError, match="Python number"):
        ConstantScale(torch.tensor(2.0))
    with pytest.raises(TypeError, match="Python number"):
        ConstantScale("2")


# ------------------------------------------------------------------ Dropout
@pytest.mark.parametrize("prob", (0.0625, 0.5, 0.75))
@pytest.mark.parametrize("is_training", (True, False))
@pytest.mark.parametrize("shape", ((101,), (2, 4, 16), (128, 128)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout(prob, is_training, shape, dtype, device):
    x_ref, x = make_pair(shape, dtype, device)
    with torch.no_grad():  # shift so that no input is zero: a zero output means "dropped"
        x += 1
        x_ref.copy_(to64(x))
    dy_ref, dy = make_pair(shape, dtype, device, requires_grad=False)

    op = Dropout(prob)
    op.train(is_training)
    y = op(x)
    y.backward(dy)

    y64, dx64 = to64(y), to64(x.grad)
    if not is_training:
        assert y.data_ptr() == x.data_ptr()
        torch.testing.assert_close(y64, x_ref.detach(), **EXACT)
        torch.testing.assert_close(dx64, dy_ref, **EXACT)
        return
    tols = dtype_tols(dtype)
    mask = ((y64 != 0) / (1 - prob)).to(dtype=dtype)
    torch.testing.assert_close(y64, x_ref.detach() * mask, **tols)
    torch.testing.assert_close(dx64, dy_ref * mask, **tols)

    # z-test on the fraction of zeros: the mean of n Bernoulli(p) draws is about
    # normal with std sqrt(p(1-p)/n); outside the 99% interval fails.
    observed = 1 - torch.count_nonzero(y64).item() / y64.numel()
    z_score = (observed - prob) / math.sqrt(prob * (1 - prob) / y64.numel())
    assert abs(z_score) < 2.5758, f"zero fraction {observed} is outside the 99% interval for p={prob}"


def test_dropout_zero_probability_is_identity(device):
    x = torch.rand(8, 8, requires_grad=True)
    dy = torch.rand(8, 8)
    op = Dropout(0.0)
    assert op.training
    y = op(x)
    y.backward(dy)
    assert y.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x.grad, dy, **EXACT)


def test_dropout_mask_follows_torch_seed(device):
    x = torch.ones(64, 64)
    torch.manual_seed(3)
    first = Dropout(0.5)(x)
    torch.manual_seed(3)
    second = Dropout(0.5)(x)
    third = Dropout(0.5)(x)
    torch.testing.assert_close(first, second, **EXACT)
    assert not torch.equal(second, third)


@pytest.mark.parametrize("p", (-0.1, 1.0, 1.5))
def test_dropout_rejects_bad_probability(p):
    with pytest.raises(ValueError, match="0 <= p < 1"):
        Dropout(p)


# ------------------------------------------------------------ AddExtraInput
@pytest.mark.parametrize("in_place", (True, False))
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_extra_input(in_place, dtype, device, shape=(32, 32)):
    x1_ref, x1 = make_pair(shape, dtype, device)
    x2_ref, x2 = make_pair(shape, dtype, device)
    dy_ref, dy = make_pair(shape, dtype, device, requires_grad=False)
    x2_before = x2.detach().clone()
    y_ref = x1_ref.detach() + x2_ref.detach()

    y = AddExtraInput(in_place=in_place)(x1, x2)
    y.backward(dy)

    if in_place:  # the output is the caller's buffer, updated
        assert y.data_ptr() == x2.data_ptr()
        torch.testing.assert_close(x2.detach(), y.detach(), **EXACT)
    else:
        assert y.data_ptr() not in (x1.data_ptr(), x2.data_ptr())
        torch.testing.assert_close(x2.detach(), x2_before, **EXACT)
    torch.testing.assert_close(to64(y), y_ref, **dtype_tols(dtype))
    torch.testing.assert_close(to64(x1.grad), dy_ref, **EXACT)
    torch.testing.assert_close(to64(x2.grad), dy_ref, **EXACT)


def test_add_extra_input_rejects_mismatched_extra_input(device):
    op = AddExtraInput()
    with pytest.raises(ValueError, match="shape"):
        op(torch.zeros(4, 3), torch.zeros(3))
    with pytest.raises(TypeError, match="dtype"):
        op(torch.zeros(4, 3), torch.zeros(4, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="Expected 1 extra inputs but got 0"):
        op(torch.zeros(4, 3))


# ---------------------------------------------------------- MakeExtraOutput
@pytest.mark.parametrize("in_place", (True, False))
@pytest.mark.parametrize("dtype", DTYPES)
def test_make_extra_output(in_place, dtype, device, shape=(32, 32)):
    x_ref, x = make_pair(shape, dtype, device)
    dy1_ref, dy1 = make_pair(shape, dtype, device, requires_grad=False)
    dy2_ref, dy2 = make_pair(shape, dtype, device, requires_grad=False)
    (x_ref * dy1_ref + x_ref * dy2_ref).sum().backward()

    y1, y2 = MakeExtraOutput(in_place=in_place)(x)
    (y1 * dy1 + y2 * dy2).sum().backward()

    assert y1.data_ptr() == y2.data_ptr() == x.data_ptr()
    torch.testing.assert_close(to64(y1), x_ref.detach(), **EXACT)
    torch.testing.assert_close(to64(y2), x_ref.detach(), **EXACT)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **dtype_tols(dtype))


def test_make_extra_output_forward_returns_one_tensor_twice():
    x = torch.rand(3)
    y, extra = MakeExtraOutput().fuser_forward(
        [OperationContext()], x, basic_op_extra_inputs=[()], prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None, basic_op_kwargs=[{}],
    )
    assert y is x and extra[0][0] is x


@pytest.mark.parametrize("in_place", (True, False))
def test_make_extra_output_backward_rules(in_place):
    """g None: dx = dy; in_place: g += dy and dx is g; else dx = g + dy (g untouched)."""
    op = MakeExtraOutput(in_place=in_place)
    dy, g = torch.rand(5), torch.rand(5)
    g_before = g.clone()

    dx, param_grads, extra_grads = op.fuser_backward([OperationContext()], dy, basic_op_grad_extra_outputs=[(None,)])
    assert dx is dy and list(param_grads) == [()] and list(extra_grads) == [()]

    dx, _, _ = op.fuser_backward([OperationContext()], dy, basic_op_grad_extra_outputs=[(g,)])
    torch.testing.assert_close(dx, g_before + dy, **EXACT)
    if in_place:
        assert dx is g
    else:
        assert dx is not g
        torch.testing.assert_close(g, g_before, **EXACT)


def test_make_extra_output_in_place_does_not_clobber_an_aliased_grad():
    """When the extra-output grad *is* dy, the in-place sum would also change dy; it is done out of place."""
    dy = torch.rand(5)
    dy_before = dy.clone()
    dx, _, _ = MakeExtraOutput(in_place=True).fuser_backward(
        [OperationContext()], dy, basic_op_grad_extra_outputs=[(dy,)]
    )
    torch.testing.assert_close(dx, 2 * dy_before, **EXACT)
    torch.testing.assert_close(dy, dy_before, **EXACT)
