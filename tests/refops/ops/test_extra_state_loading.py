"""Extra state on load: "no state" placeholders accepted, corrupted or misplaced state a clear error naming the op,
and a failed load leaves the op's recipe state (and the model) as it was."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.ops.extra_state import decode_extra_state, encode_extra_state
from refops.recipe import DelayedScaling, Format


def _delayed_model(history: int = 4) -> te.ops.Sequential:
    model = te.ops.Sequential(te.ops.Linear(32, 32))
    with te.autocast(recipe=DelayedScaling(fp8_format=Format.E4M3, amax_history_len=history)):
        model(torch.randn(32, 32)).sum().backward()
    return model


def _recipe_state_bytes(op) -> bytes:
    return op.get_extra_state()


@pytest.mark.parametrize("no_state", [None, b"", torch.empty(0, dtype=torch.uint8)], ids=["None", "empty-bytes",
                                                                                       "empty-tensor"])
def test_none_or_an_empty_extra_state_means_no_state(no_state):
    model = _delayed_model()
    op = model[0].basic_ops[0]
    before = _recipe_state_bytes(op)
    op.set_extra_state(no_state)
    assert op.get_extra_state() == before  # nothing changed
    assert decode_extra_state(no_state) == {}


def test_the_uint8_tensor_of_an_older_checkpoint_still_loads():
    """refops stored extra state as a uint8 tensor before it stored bytes: those checkpoints load unchanged."""
    source = _delayed_model(history=3)[0].basic_ops[0]
    target = te.ops.Sequential(te.ops.Linear(32, 32))[0].basic_ops[0]  # never ran: no recipe state
    older_form = torch.frombuffer(bytearray(source.get_extra_state()), dtype=torch.uint8)
    target.set_extra_state(older_form)
    assert target.get_extra_state() == source.get_extra_state()
    assert torch.equal(target._recipe_states["forward"].amax_history, source._recipe_states["forward"].amax_history)


def test_dcp_placeholder_class_itself_is_accepted():
    from torch.distributed.checkpoint.state_dict import _EXTRA_STATE

    op = _delayed_model()[0].basic_ops[0]
    before = _recipe_state_bytes(op)
    op.set_extra_state(_EXTRA_STATE())
    assert op.get_extra_state() == before


def test_corrupted_extra_state_names_the_op_and_changes_nothing():
    model = _delayed_model()
    op = model[0].basic_ops[0]
    before = _recipe_state_bytes(op)
    truncated = before[: len(before) // 2]
    with pytest.raises(ValueError, match=r"^BasicLinear: the extra state is corrupted or truncated"):
        op.set_extra_state(truncated)
    with pytest.raises(TypeError, match=r"^BasicLinear: extra state must be bytes or a uint8 tensor"):
        op.set_extra_state(torch.frombuffer(bytearray(before), dtype=torch.uint8).float())
    with pytest.raises(ValueError, match=r"^BasicLinear: extra state was not written by refops"):
        op.set_extra_state(torch.zeros(32, dtype=torch.uint8))
    assert op.get_extra_state() == before
    model(torch.randn(4, 32)).sum().backward()  # still usable


def test_misplaced_extra_state_names_the_op_and_restores_its_recipe_state():
    """State whose forward part fits and whose backward part does not (another op's quantizer count):
    the forward part, loaded first, is rolled back, so nothing is half-loaded."""
    target = _delayed_model()
    op = target[0].basic_ops[0]
    before = _recipe_state_bytes(op)
    foreign = op._extra_state_dict()
    foreign["states"]["forward"]["scale"] = foreign["states"]["forward"]["scale"] * 2 + 1  # fits, differs
    backward = foreign["states"]["backward"]
    backward["scale"] = torch.ones(backward["scale"].numel() + 2)  # does not fit
    with pytest.raises(ValueError, match=r"^BasicLinear: the extra state does not fit this op"):
        op.set_extra_state(encode_extra_state(foreign))
    assert op.get_extra_state() == before
    with te.autocast(recipe=DelayedScaling(fp8_format=Format.E4M3, amax_history_len=4)):
        target(torch.randn(32, 32)).sum().backward()  # still usable
