"""Identity, Reshape, ConstantScale, Dropout, AddExtraInput, MakeExtraOutput and extra-tensor channels.

Mirrors TE's TestBasicOps entries for these ops, ``TestSequentialContainer.test_extra_tensors``
and ``TestExtraTensorChannels``.
"""

from __future__ import annotations

import math

import pytest
import torch

from refops.ops.basic.add_extra_input import AddExtraInput
from refops.ops.basic.bias import Bias
from refops.ops.basic.constant_scale import ConstantScale
from refops.ops.basic.dropout import Dropout
from refops.ops.basic.identity import Identity
from refops.ops.basic.make_extra_output import MakeExtraOutput
from refops.ops.basic.reshape import Reshape
from refops.ops.fuser import OperationFuser
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


# -------------------------------------------------- Sequential extra tensors
def test_extra_tensors_in_sequential(device, size=16):
    """TE's test_extra_tensors: extra inputs consumed in order, outputs alias the caller's buffers."""
    bias = Bias(size, device=device)
    with torch.no_grad():
        bias.bias.copy_(torch.rand(size))
    model = Sequential(                          # | inputs  | outputs
        torch.nn.Identity(),                     # | x1      | x1
        MakeExtraOutput(in_place=True),          # | x1      | x1 [x1]
        bias,                                    # | x1      | h1 = x1 + b
        MakeExtraOutput(in_place=True),          # | h1      | h1 [h1]
        AddExtraInput(in_place=True),            # | h1 [x2] | x2 = x2 + h1
        MakeExtraOutput(in_place=True),          # | x2      | x2 [x2]
        torch.nn.Identity(),                     # | x2      | x2
        bias,                                    # | x2      | h2 = x2 + b
        AddExtraInput(in_place=True),            # | h2 [x3] | x3 = x3 + h2
        MakeExtraOutput(in_place=True),          # | x3      | x3 [x3]
        AddExtraInput(in_place=True),            # | x3 [x4] | x4 = x4 + x3
        torch.nn.Identity(),                     # | x4      | x4
        Identity(),                              # | x4      | x4
        MakeExtraOutput(in_place=True),          # | x4      | x4 [x4]
        Identity(),                              # | x4      | x4
    )
    x1, x2, x3, x4 = (torch.rand(size) for _ in range(4))
    x1_orig, x2_orig, x3_orig, x4_orig = (t.clone() for t in (x1, x2, x3, x4))

    ys = model(x1, x2, x3, x4)

    assert len(ys) == 6
    assert ys[0].data_ptr() == x4.data_ptr()
    assert ys[1].data_ptr() == x1.data_ptr()
    assert ys[2].data_ptr() not in [t.data_ptr() for t in (x1, x2, x3, x4)]
    assert ys[3].data_ptr() == x2.data_ptr()
    assert ys[4].data_ptr() == x3.data_ptr()
    assert ys[5].data_ptr() == x4.data_ptr()
    b, h1 = bias.bias.detach(), ys[2]
    torch.testing.assert_close(x1, x1_orig)
    torch.testing.assert_close(h1, x1_orig + b)
    torch.testing.assert_close(x2, x2_orig + h1)
    torch.testing.assert_close(x3, x3_orig + x2 + b)
    torch.testing.assert_close(x4, x4_orig + x3)


# ------------------------------------------------------ named channels
def residual_ops(size, *, output_to_caller=True, in_place=False):
    make = MakeExtraOutput(in_place=in_place)
    make.set_extra_output_channel(0, "residual", output_to_caller=output_to_caller)
    bias = Bias(size)
    with torch.no_grad():
        bias.bias.copy_(torch.rand(size))
    add = AddExtraInput()
    add.set_extra_input_channel(0, "residual")
    return make, bias, add


@pytest.mark.parametrize("in_place", (False, True))
@pytest.mark.parametrize("with_extra_grad", (False, True))
def test_internal_residual_connection(with_extra_grad, in_place, device, size=8):
    """MakeExtraOutput -> Bias -> AddExtraInput over a channel: y = 2x + b, dx = 2dy (+ dresidual)."""
    make, bias, add = residual_ops(size, in_place=in_place)
    model = Sequential(make, bias, add)
    x = torch.rand(4, size, requires_grad=True)
    dy, dres = torch.rand(4, size), torch.rand(4, size)
    dy_orig, dres_orig = dy.clone(), dres.clone()

    y, residual = model(x)
    assert model._module_groups[0].num_extra_inputs == 0
    assert model._module_groups[0]._basic_op_extra_input_sources == [[], [], [(0, 0)]]
    torch.testing.assert_close(y, (x + bias.bias) + x, **EXACT)
    torch.testing.assert_close(residual, x, **EXACT)

    if with_extra_grad:
        torch.autograd.backward([y, residual], [dy, dres])
        expected_dx = 2 * dy_orig + dres_orig
    else:
        y.backward(dy)
        expected_dx = 2 * dy_orig
    torch.testing.assert_close(x.grad, expected_dx)
    torch.testing.assert_close(bias.bias.grad, dy_orig.sum(0))
    torch.testing.assert_close(dy, dy_orig, **EXACT)  # the caller's grads are never modified


@pytest.mark.parametrize("in_place", (False, True))
def test_hidden_channel_still_propagates(in_place, device, size=8):
    make, bias, add = residual_ops(size, output_to_caller=False, in_place=in_place)
    x = torch.rand(3, size, requires_grad=True)
    dy = torch.rand(3, size)
    dy_orig = dy.clone()
    y = Sequential(make, bias, add)(x)
    assert isinstance(y, torch.Tensor)
    y.backward(dy)
    torch.testing.assert_close(y, (x + bias.bias) + x, **EXACT)
    torch.testing.assert_close(x.grad, 2 * dy_orig)
    torch.testing.assert_close(dy, dy_orig, **EXACT)


def test_internal_and_external_extra_inputs(device, size=8):
    """An unbound slot stays a public argument: y = 2x + e, de = dy."""
    make = MakeExtraOutput()
    make.set_extra_output_channel(0, "r", output_to_caller=False)
    bound, public = AddExtraInput(), AddExtraInput()
    bound.set_extra_input_channel(0, "r")
    fuser = OperationFuser([make, bound, public])
    assert fuser.num_extra_inputs == 1
    x, e = torch.rand(2, size, requires_grad=True), torch.rand(2, size, requires_grad=True)
    dy = torch.rand(2, size)
    y = fuser(x, e)
    y.backward(dy)
    torch.testing.assert_close(y, 2 * x + e, **EXACT)
    torch.testing.assert_close(x.grad, 2 * dy)
    torch.testing.assert_close(e.grad, dy, **EXACT)


def test_in_place_channel_grad_does_not_alias_public_grad(device, size=4):
    """make(in_place, hidden "r") -> x2 -> add("r") -> add(public e): y = 3x + e, so de must be dy."""
    make = MakeExtraOutput(in_place=True)
    make.set_extra_output_channel(0, "r", output_to_caller=False)
    bound, public = AddExtraInput(), AddExtraInput()
    bound.set_extra_input_channel(0, "r")
    fuser = OperationFuser([make, ConstantScale(2.0), bound, public])
    x, e = torch.rand(size, requires_grad=True), torch.rand(size, requires_grad=True)
    dy = torch.rand(size)
    fuser(x, e).backward(dy)
    torch.testing.assert_close(x.grad, 3 * dy)
    torch.testing.assert_close(e.grad, dy)


def test_channel_fanout(device, size=8):
    """One producer, two consumers: y = 3x; dx = 3dy + dr."""
    make = MakeExtraOutput()
    make.set_extra_output_channel(0, "r")
    first, second = AddExtraInput(), AddExtraInput()
    first.set_extra_input_channel(0, "r")
    second.set_extra_input_channel(0, "r")
    x = torch.rand(2, size, requires_grad=True)
    dy, dr = torch.rand(2, size), torch.rand(2, size)
    y, r = OperationFuser([make, first, second])(x)
    torch.autograd.backward([y, r], [dy, dr])
    torch.testing.assert_close(y, 3 * x, **EXACT)
    torch.testing.assert_close(x.grad, 3 * dy + dr)


def test_channel_needs_a_producer():
    add = AddExtraInput()
    add.set_extra_input_channel(0, "missing")
    with pytest.raises(ValueError, match="has no producer"):
        OperationFuser([add])


def test_channel_consumer_before_producer():
    add, make = AddExtraInput(), MakeExtraOutput()
    add.set_extra_input_channel(0, "r")
    make.set_extra_output_channel(0, "r")
    with pytest.raises(ValueError, match="has no earlier producer"):
        OperationFuser([add, make])


@pytest.mark.parametrize("index", (-1, 1))
def test_channel_index_out_of_range(index):
    with pytest.raises(IndexError, match="out of range"):
        MakeExtraOutput().set_extra_output_channel(index, "r")
    with pytest.raises(IndexError, match="out of range"):
        AddExtraInput().set_extra_input_channel(index, "r")


@pytest.mark.parametrize("name", ("", 123))
def test_channel_name_must_be_a_non_empty_string(name):
    with pytest.raises(ValueError, match="non-empty string"):
        MakeExtraOutput().set_extra_output_channel(0, name)
    with pytest.raises(ValueError, match="non-empty string"):
        AddExtraInput().set_extra_input_channel(0, name)


def test_channel_output_to_caller_must_be_a_bool():
    with pytest.raises(TypeError, match="output_to_caller must be a bool"):
        MakeExtraOutput().set_extra_output_channel(0, "r", output_to_caller=1)


def test_channel_with_multiple_producers():
    first, second, add = MakeExtraOutput(), MakeExtraOutput(), AddExtraInput()
    first.set_extra_output_channel(0, "r")
    second.set_extra_output_channel(0, "r")
    add.set_extra_input_channel(0, "r")
    with pytest.raises(ValueError, match="multiple producers"):
        OperationFuser([first, second, add])


def test_channels_lock_after_capture(device, size=4):
    make, add = MakeExtraOutput(), AddExtraInput()
    OperationFuser([make, add])
    with pytest.raises(RuntimeError, match="already captured its channel routing"):
        make.set_extra_output_channel(0, "r")
    with pytest.raises(RuntimeError, match="already captured its channel routing"):
        add.set_extra_input_channel(0, "r")

    make, bias, add = residual_ops(size)
    model = Sequential(make, bias, add)
    make.set_extra_output_channel(0, "residual", output_to_caller=False)  # still allowed: no forward yet
    y = model(torch.rand(2, size))
    assert isinstance(y, torch.Tensor)
    with pytest.raises(RuntimeError, match="already captured its channel routing"):
        make.set_extra_output_channel(0, None)


def test_rebinding_keeps_the_last_channel(device, size=4):
    first, second, add = MakeExtraOutput(), MakeExtraOutput(), AddExtraInput()
    first.set_extra_output_channel(0, "a")
    second.set_extra_output_channel(0, "b")
    add.set_extra_input_channel(0, "a")
    add.set_extra_input_channel(0, "b")
    fuser = OperationFuser([first, second, add])
    assert fuser._basic_op_extra_input_sources[2] == [(1, 0)]
    assert fuser.num_extra_inputs == 0
    x = torch.rand(size)
    y, a, b = fuser(x)
    torch.testing.assert_close(y, 2 * x, **EXACT)
    assert a.data_ptr() == b.data_ptr() == x.data_ptr()
