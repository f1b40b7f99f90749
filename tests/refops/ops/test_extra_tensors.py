"""Extra inputs and outputs routed through Sequential and OperationFuser: in order and over named channels.

Mirrors TE's ``TestSequentialContainer.test_extra_tensors`` and ``TestExtraTensorChannels``:
AddExtraInput and MakeExtraOutput wired positionally (outputs alias the caller's buffers)
or bound to named channels (producers, consumers, fan-out, validation, locking).
"""

from __future__ import annotations

import pytest
import torch

from refops.ops.basic.add_extra_input import AddExtraInput
from refops.ops.basic.bias import Bias
from refops.ops.basic.constant_scale import ConstantScale
from refops.ops.basic.grouped_linear import GroupedLinear
from refops.ops.basic.identity import Identity
from refops.ops.basic.make_extra_output import MakeExtraOutput
from refops.ops.fuser import OperationFuser
from refops.ops.op import FuserOnlyOperation
from refops.ops.sequential import Sequential

EXACT = dict(rtol=0, atol=0)


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


# -------------------------------------------------- ops that run only through the fuser
@pytest.mark.parametrize("make_op", [AddExtraInput, MakeExtraOutput, lambda: GroupedLinear(2, 8, 8, device="meta")],
                         ids=["AddExtraInput", "MakeExtraOutput", "GroupedLinear"])
def test_ops_with_extra_tensors_refuse_the_per_op_hooks(make_op):
    """Their extra tensors travel only through fuser_forward / fuser_backward: op_forward / op_backward say so."""
    op = make_op()
    assert isinstance(op, FuserOnlyOperation)
    name = type(op).__name__
    with pytest.raises(RuntimeError, match=f"^{name} has .* so it implements fuser_forward instead of op_forward"):
        op.op_forward(None, torch.zeros(2, 8), prev_op_grad_output_quantizer=None, next_op_input_quantizer=None)
    with pytest.raises(RuntimeError, match=f"^{name} has .* so it implements fuser_backward instead of op_backward"):
        op.op_backward(None, torch.zeros(2, 8))
