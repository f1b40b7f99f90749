"""Nothing lost, nothing silent: checkpoints, copies, recipe validation, parametrize, NaN, inference mode.

Each test names the failure it guards against: a silent type change on load, a
copy whose scales freeze, a resumed run that drifts from the uninterrupted one,
a recipe field accepted and misread later, a gradient that never arrives.
"""

from __future__ import annotations

import copy
import gc
import io

import pytest
import torch
import torch.nn.utils.parametrize as parametrize

import refops as te
from refops.ops.quantized_checkpoint import dequantize_state_dict
from refops.quantization.recipe_state import DelayedScalingRecipeState
from refops.quantization.state import get_autocast_recipe, is_quantization_enabled
from refops.recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from refops.testing import RECIPE_NAMES, make_recipe

SIZE = 128  # a multiple of every block size


def _delayed() -> DelayedScaling:
    return DelayedScaling(amax_history_len=4)


def _arrays(t: te.QuantizedTensor) -> dict[str, torch.Tensor]:
    """The tensor's own data and scales (not its quantizer's state), bytes comparable with torch.equal."""
    tensors, _ = t.to_plain_tensors()
    return {k: v.view(torch.uint8) if v.element_size() == 1 else v for k, v in tensors.items()
            if not k.startswith("quantizer.")}


def _same_quantized(p: torch.Tensor, q: torch.Tensor) -> bool:
    if type(p) is not type(q):
        return False
    a, b = _arrays(p), _arrays(q)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _qlinear(recipe, device, *, size=SIZE):
    with te.quantized_model_init(recipe=recipe):
        return te.ops.BasicLinear(size, size, device=device)


# ------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("saved, target", [("fp8_delayed_scaling", "mxfp8"), ("mxfp8", "fp8_block_scaling"),
                                           ("fp8_current_scaling", "fp8_delayed_scaling")])
def test_quantized_weights_of_another_recipe_are_a_clear_error(saved, target, device):
    source = _qlinear(make_recipe(saved), device)
    model = _qlinear(make_recipe(target), device)
    before = _arrays(model.weight)
    weight_type = type(model.weight)
    with pytest.raises(RuntimeError, match=r"BasicLinear .*parameter 'weight'.*another recipe"):
        model.load_state_dict(source.state_dict())
    assert type(model.weight) is weight_type
    assert all(torch.equal(v, _arrays(model.weight)[k]) for k, v in before.items())  # nothing loaded


def test_quantized_weights_into_a_plain_model_are_a_clear_error_or_an_explicit_conversion(device):
    source = _qlinear(_delayed(), device)
    plain = te.ops.BasicLinear(SIZE, SIZE, device=device)
    with pytest.raises(RuntimeError, match=r"'weight' is a plain parameter .*dequantize_state_dict"):
        plain.load_state_dict(source.state_dict())
    assert type(plain.weight) is torch.nn.Parameter
    plain.load_state_dict(dequantize_state_dict(source.state_dict()))  # the explicit conversion
    assert type(plain.weight) is torch.nn.Parameter
    assert torch.equal(plain.weight.detach(), source.weight.dequantize())
    meta = te.ops.BasicLinear(SIZE, SIZE, device="meta")
    with pytest.raises(RuntimeError, match="plain parameter"):
        meta.load_state_dict(source.state_dict(), assign=True)


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_plain_checkpoint_into_meta_built_quantized_model_equals_eager_built(recipe_name, device):
    torch.manual_seed(3)
    plain = te.ops.Sequential(te.ops.Linear(SIZE, SIZE, device=device, dtype=torch.bfloat16))
    state = plain.state_dict()

    def build(dev):
        with te.quantized_model_init(recipe=make_recipe(recipe_name)):
            return te.ops.Sequential(te.ops.Linear(SIZE, SIZE, device=dev, dtype=torch.bfloat16))

    eager, meta, assigned = build(device), build("meta"), build("meta")
    eager.load_state_dict(state)
    meta.load_state_dict(state)
    assigned.load_state_dict(state, assign=True)
    for model in (meta, assigned):
        assert isinstance(model[0].weight, te.QuantizedTensor) and model[0].weight is model[0].basic_ops[0].weight
        assert _same_quantized(eager[0].weight, model[0].weight)
        assert torch.equal(eager[0].bias, model[0].bias)


def _train(model, optimizer, xs):
    outputs = []
    for x in xs:
        optimizer.zero_grad()
        with te.autocast(recipe=_delayed()):
            y = model(x)
        y.square().sum().backward()
        optimizer.step()
        outputs.append(y.detach())
    return outputs


def test_save_load_continue_with_delayed_scaling_quantized_weights_is_bit_exact(device):
    def build(dev):
        with te.quantized_model_init(recipe=_delayed()):
            return te.ops.Sequential(te.ops.Linear(32, 32, device=dev), te.ops.Linear(32, 32, device=dev))

    torch.manual_seed(0)
    xs = [torch.randn(8, 32, device=device) * (i + 1) for i in range(6)]
    model = build(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    _train(model, optimizer, xs[:3])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, buffer)
    expected = _train(model, optimizer, xs[3:])
    final = model.state_dict()
    # Delayed-scaling updates reach every live state; the uninterrupted run must be gone first.
    del model, optimizer
    gc.collect()
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    restored = build("meta")
    restored.load_state_dict(saved["model"])
    optimizer = torch.optim.SGD(restored.parameters(), lr=0.01)
    optimizer.load_state_dict(saved["opt"])
    got = _train(restored, optimizer, xs[3:])
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    restored_state = restored.state_dict()
    assert final.keys() == restored_state.keys()
    for key, value in final.items():  # weights (bytes, scales) and recipe state (bytes), bit for bit
        same = value == restored_state[key] if isinstance(value, bytes) else torch.equal(value, restored_state[key])
        assert same, key


# ------------------------------------------------------------------ copies
def _delayed_states(model):
    return [s for op in model.modules() for s in (getattr(op, "_recipe_states", None) or {}).values()
            if isinstance(s, DelayedScalingRecipeState)]


@pytest.mark.parametrize("how", ["deepcopy", "torch.load"])
def test_a_copy_of_a_delayed_scaling_model_keeps_updating(how, device):
    torch.manual_seed(1)
    model = te.ops.Sequential(te.ops.Linear(16, 16, device=device), te.ops.GELU(), te.ops.Linear(16, 8, device=device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(4, 16, device=device) * (i + 1) for i in range(4)]
    _train(model, optimizer, xs[:1])
    if how == "deepcopy":
        twin = copy.deepcopy(model)
    else:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        twin = torch.load(buffer, weights_only=False)
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    twin_optimizer.load_state_dict(optimizer.state_dict())
    for x in xs[1:]:  # in lockstep: the copy must behave exactly as the original
        before = [s.scale.clone() for s in _delayed_states(twin)]
        assert torch.equal(_train(model, optimizer, [x])[0], _train(twin, twin_optimizer, [x])[0])
        for mine, theirs in zip(_delayed_states(model), _delayed_states(twin)):
            assert mine is not theirs and mine.scale.data_ptr() != theirs.scale.data_ptr()
            assert torch.equal(mine.scale, theirs.scale) and torch.equal(mine.amax_history, theirs.amax_history)
        assert any(not torch.equal(b, s.scale) for b, s in zip(before, _delayed_states(twin)))


# -------------------------------------------------------- recipe validation
@pytest.mark.parametrize(
    "cls, kwargs, error, match",
    [
        (DelayedScaling, {"margin": -1}, ValueError, "DelayedScaling: margin must be >= 0"),
        (DelayedScaling, {"margin": 1.5}, TypeError, "DelayedScaling: margin must be an int"),
        (DelayedScaling, {"margin": True}, TypeError, "margin must be an int"),
        (DelayedScaling, {"amax_history_len": 0}, ValueError, "amax_history_len must be >= 1"),
        (DelayedScaling, {"amax_history_len": 2.5}, TypeError, "amax_history_len must be an int"),
        (DelayedScaling, {"fp8_format": "E4M3"}, TypeError, "fp8_format must be a Format"),
        (DelayedScaling, {"reduce_amax": "no"}, TypeError, "reduce_amax must be a bool"),
        (DelayedScaling, {"scaling_factor_compute_algo": 2.0}, TypeError, "scaling_factor_compute_algo"),
        (Float8CurrentScaling, {"use_power_2_scales": "0"}, TypeError, "use_power_2_scales must be a bool"),
        (Float8CurrentScaling, {"fp8_format": Format.E2M1}, ValueError, "E2M1 is not supported"),
        (MXFP8BlockScaling, {"margin": -2}, ValueError, "MXFP8BlockScaling: margin"),
        (MXFP8BlockScaling, {"enable_2d_quantization": 1}, TypeError, "enable_2d_quantization must be a bool"),
        (Float8BlockScaling, {"x_block_scaling_dim": True}, ValueError, "x_block_scaling_dim must be 1 or 2"),
        (NVFP4BlockScaling, {"disable_rht": "1"}, TypeError, "NVFP4BlockScaling: disable_rht must be a bool"),
        (CustomRecipe, {"qfactory": lambda role: None, "quantization_alignment": 0}, ValueError,
         "quantization_alignment must be >= 1"),
    ],
)
def test_recipe_fields_are_validated_at_construction(cls, kwargs, error, match):
    with pytest.raises(error, match=match):
        cls(**kwargs)


def test_integer_fields_accept_integer_like_values():
    import numpy as np

    recipe = DelayedScaling(margin=np.int64(2), amax_history_len=np.int32(8))
    assert recipe.margin == 2 and type(recipe.margin) is int
    assert recipe.amax_history_len == 8 and type(recipe.amax_history_len) is int


class _FailOnce(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.failed = False

    def forward(self, x):
        if not self.failed:
            self.failed = True
            raise RuntimeError("user code failed")
        return x


def test_a_failed_forward_never_poisons_later_autocasts(device):
    model = te.ops.Sequential(te.ops.Linear(16, 16, device=device), _FailOnce(), te.ops.Linear(16, 16, device=device))
    x = torch.randn(4, 16, device=device, requires_grad=True)
    outer = te.autocast(recipe=_delayed())
    with pytest.raises(RuntimeError, match="user code failed"):
        with outer, te.autocast(recipe=_delayed()):
            model(x)
    with pytest.raises(ValueError, match="in_features"):  # bad input: the op names what it expected
        with te.autocast(recipe=_delayed()):
            model(torch.randn(4, 15, device=device))
    assert not is_quantization_enabled() and get_autocast_recipe() is None
    with outer:  # the instance itself is reusable
        assert is_quantization_enabled()
    states = _delayed_states(model)
    forward = [s for s in states if s.mode == "forward"]
    backward = [s for s in states if s.mode == "backward"]
    before = [s.scale.clone() for s in states]
    with te.autocast(recipe=_delayed()):
        y = model(x * 100)
    assert all(not torch.equal(s.scale, b) for s, b in zip(states, before) if s in forward)  # forward update ran
    y.backward(torch.full_like(y, 1000.0))
    assert all(not torch.equal(s.scale, b) for s, b in zip(states, before) if s in backward)  # backward update ran


# --------------------------------------------------------------- parametrize
class _Double(torch.nn.Module):
    def forward(self, w):
        return 2 * w


def test_parametrize_on_a_weight_is_a_clear_error_and_the_op_stays_usable(device):
    op = te.ops.Linear(8, 8, device=device)
    x = torch.randn(3, 8, device=device)
    expected = op(x)
    parametrize.register_parametrization(op.basic_ops[0], "weight", _Double())
    with pytest.raises(TypeError, match=r"BasicLinear: torch.nn.utils.parametrize on \['weight'\].*original parameter"):
        op(x)
    parametrize.remove_parametrizations(op.basic_ops[0], "weight", leave_parametrized=False)
    op._sync_parameters()
    assert torch.equal(op(x), expected)


# ----------------------------------------------------------------------- NaN
def test_max_algorithm_skips_nan_in_the_history_as_te_kernel():
    state = DelayedScalingRecipeState(DelayedScaling(fp8_format=Format.E4M3, margin=0, amax_history_len=2),
                                      mode="forward", num_quantizers=1, device=torch.device("cpu"))
    state.amax_history.copy_(torch.tensor([[float("nan")], [1.0]]))
    state.scale.fill_(3.0)
    state.update_scales()
    assert state.scale.item() == 448.0  # fmax(1, NaN) = 1, not the old scale
    state.amax_history.copy_(torch.tensor([[2.0], [float("nan")]]))
    state.update_scales()
    assert state.scale.item() == 224.0  # a NaN already in the window is skipped too
    state.amax_history.fill_(float("nan"))
    state.update_scales()
    assert state.scale.item() == 224.0  # nothing finite: the scale stays


# ------------------------------------------------------------ inference mode
@pytest.mark.parametrize("quantized_weight", [False, True], ids=["hp_weight", "qweight"])
@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
def test_inference_mode_first_then_training(recipe_name, quantized_weight, device):
    recipe = make_recipe(recipe_name)
    with te.quantized_model_init(enabled=quantized_weight, recipe=recipe):
        model = te.ops.Sequential(te.ops.Linear(SIZE, SIZE, device="meta", dtype=torch.bfloat16))
    x = torch.randn(SIZE, SIZE, device=device, dtype=torch.bfloat16)
    with torch.inference_mode():
        with te.autocast(recipe=make_recipe(recipe_name)):
            model(x)
        detached = [p.detach() for p in model.parameters()]  # quantized weights too
    weight = model[0].weight
    assert isinstance(detached[0], te.QuantizedTensor) == quantized_weight == isinstance(weight, te.QuantizedTensor)
    assert not any(p.is_inference() for p in model.parameters())
    states = _delayed_states(model)
    before = [s.scale.clone() for s in states]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        with te.autocast(recipe=make_recipe(recipe_name)):
            y = model(x.clone().requires_grad_(True))
        y.float().square().mean().backward()
        optimizer.step()
    assert all(p.grad is not None for p in model.parameters())
    assert not any(s.scale.is_inference() or s.amax_history.is_inference() for s in states)
    assert all(not torch.equal(b, s.scale) for b, s in zip(before, states))  # state first touched there updates


# ------------------------------------------------------ recipe options change
def test_new_options_of_the_same_recipe_type_are_not_ignored(device):
    model = te.ops.Sequential(te.ops.Linear(64, 64, device=device, dtype=torch.bfloat16))
    x = torch.randn(32, 64, device=device, dtype=torch.bfloat16)
    with te.autocast(recipe=NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)):
        model(x)
    assert not model[0].basic_ops[0].get_quantizer("forward", 0).with_rht
    with te.autocast(recipe=NVFP4BlockScaling(disable_stochastic_rounding=True)):  # RHT on now
        model(x)
    assert model[0].basic_ops[0].get_quantizer("forward", 0).with_rht


def test_a_format_change_of_delayed_scaling_keeps_the_history_and_follows_the_format(device):
    model = te.ops.Sequential(te.ops.Linear(16, 16, device=device))
    x = torch.randn(4, 16, device=device, requires_grad=True)
    for fmt in (Format.HYBRID, Format.E4M3):
        recipe = DelayedScaling(fp8_format=fmt, amax_history_len=4)
        with te.autocast(recipe=recipe):
            y = model(x)
        y.backward(torch.full_like(y, 1000.0))
    op = model[0].basic_ops[0]
    backward = op._recipe_states["backward"]
    assert op.get_quantizer("backward", 0).dtype == te.DType.kFloat8E4M3  # was E5M2 under HYBRID
    assert torch.count_nonzero(backward.amax_history).item() == 2  # both steps' amaxes kept
    assert torch.equal(backward.scale, torch.tensor([448.0]) / 1000.0)  # E4M3's max, not E5M2's


# ------------------------------------------------ extra state that is not a tensor
@pytest.mark.parametrize("foreign", [io.BytesIO(b"\x80\x04N."), {"scale": torch.ones(3)}, "state"],
                         ids=["BytesIO", "dict", "str"])
def test_extra_state_that_is_not_a_tensor_is_an_error_naming_the_op_and_the_key(foreign):
    """TE's older checkpoints hold an io.BytesIO (pickle) as extra state: refops cannot read it and must say so,
    naming the op and the key, and load nothing of that op; it was silently dropped before."""
    source = te.ops.Sequential(te.ops.Linear(32, 32))
    with te.autocast(recipe=_delayed()):
        source(torch.randn(32, 32)).sum().backward()
    target = te.ops.Sequential(te.ops.Linear(32, 32))
    with te.autocast(recipe=_delayed()):
        target(torch.randn(32, 32)).sum().backward()
    op = target[0].basic_ops[0]
    before = {"weight": op.weight.detach().clone(), "extra": op.get_extra_state()}
    state = source.state_dict()
    state["0.basic_ops.0._extra_state"] = foreign
    with pytest.raises(RuntimeError, match=r"BasicLinear \(0\.basic_ops\.0\.\): '0\.basic_ops\.0\._extra_state': extra "
                                           r"state must be bytes written by refops .*nothing of this op was "
                                           r"loaded"):
        target.load_state_dict(state)
    assert torch.equal(op.weight, before["weight"]) and op.get_extra_state() == before["extra"]
    with pytest.raises(TypeError, match=r"^BasicLinear: extra state must be bytes written by refops"):
        op.set_extra_state(foreign)
    assert op.get_extra_state() == before["extra"]


def test_dcp_placeholder_for_a_missing_extra_state_key_still_means_no_state():
    from torch.distributed.checkpoint.state_dict import _EXTRA_STATE

    model = te.ops.Sequential(te.ops.Linear(32, 32))
    with te.autocast(recipe=_delayed()):
        model(torch.randn(32, 32)).sum().backward()
    op = model[0].basic_ops[0]
    before = op.get_extra_state()
    state = model.state_dict()
    state["0.basic_ops.0._extra_state"] = _EXTRA_STATE()
    model.load_state_dict(state)
    assert op.get_extra_state() == before
