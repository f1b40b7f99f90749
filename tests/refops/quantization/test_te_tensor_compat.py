"""Quantized tensors and recipe states that behave as TE's do (TE's ``tests/pytorch/test_quantized_tensor.py``
and ``test_recipe.py``, checked against ``transformer_engine/pytorch/tensor/*.py`` and ``quantization.py``):

* a 0-D ``Float8Tensor`` dequantizes to shape ``()`` and keeps 0-D bytes;
* ``t.data = value`` takes ``value``'s size, dtype, device *and* bytes: a plain value is quantized with
  ``t``'s quantizer, a tensor of the same class lends its arrays (TE's ``test_set_data``);
* ``chunk``/``split`` return exact pieces where TE does: per-tensor FP8 stays quantized along any dim,
  MXFP8 along dim 0, anything else is a piece of the dequantized values (TE's ``test_chunk``);
* a recipe state resolves each slot's tensor type from its role, else from its position (forward
  ``input, weight, output``; backward ``grad_output, grad_input``) and chooses options by that type,
  never by the mode alone (TE's ``_slot_tensor_type``); MXFP8's 2D weights follow the role itself;
* row-scaled NVFP4's ``is_quantizable`` answers False (its per-row amaxes cannot be all-gathered).
"""

from __future__ import annotations

import pytest
import torch

from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
    QuantizerRole,
)
from refops.quantization.recipe_state import RecipeState
from refops.recipe import Float8BlockScaling, Format, MXFP8BlockScaling, NVFP4BlockScaling

E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2


def _delayed(scale: float = 1.0) -> Float8Quantizer:
    return Float8Quantizer(torch.full((1,), scale), torch.zeros(1), E4M3)


QUANTIZERS = {
    "fp8_delayed": lambda: _delayed(),
    "fp8_current": lambda: Float8CurrentScalingQuantizer(E4M3),
    "mxfp8": lambda: MXFP8Quantizer(E4M3),
    "fp8_block_1d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
    "fp8_block_2d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True),
    "nvfp4": lambda: NVFP4Quantizer(),
}


def _arrays(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {a: getattr(t, a) for a in t._array_names() if getattr(t, a) is not None}


def _same_bytes(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    x, y = _arrays(a), _arrays(b)
    return type(a) is type(b) and x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


# ----------------------------------------------------------------- 0-D tensors
@pytest.mark.parametrize("name", ["fp8_delayed", "fp8_current"])
def test_a_0d_float8_tensor_dequantizes_to_shape_empty(name):
    x = torch.tensor(0.75)
    t = QUANTIZERS[name]()(x)
    assert t.shape == () and t._data.shape == () and t._transpose.shape == ()
    for usage in ("rowwise", "columnwise"):
        values = t.dequantize(usage=usage)
        assert values.shape == () and values.item() == 0.75
    assert (t + 1).shape == () and t.clone().dequantize().shape == ()
    empty = QUANTIZERS[name]().make_empty(())
    empty.copy_(x)
    assert empty.dequantize().shape == () and empty.dequantize().item() == 0.75


# ------------------------------------------------------------------- .data =
def test_set_data_as_te_test_set_data():
    """TE's ``test_set_data``, line for line in meaning."""
    x = _delayed()(torch.zeros(4))
    assert x.size() == x._data.size() == (4,)
    plain = torch.zeros((3, 2), dtype=torch.float16)
    x.data = plain
    assert isinstance(x, Float8Tensor)
    assert x.size() == plain.size() == x._data.size() and x.dtype == plain.dtype and x.device == plain.device
    y = x.dequantize()
    assert not isinstance(y, Float8Tensor) and y.size() == x.size() and y.dtype == x.dtype

    other = _delayed()(torch.zeros((4, 3, 1)))
    x.data = other
    assert x.size() == other.size() == x._data.size() and x.dtype == other.dtype
    assert x._data is other._data and x._scale_inv is other._scale_inv
    assert x.dequantize().size() == x.size()


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_set_data_to_a_plain_tensor_holds_its_quantized_bytes(name):
    """The bytes, scales and values after ``t.data = v`` are those of quantizing ``v``, never the old ones."""
    quantizer = QUANTIZERS[name]()
    t = quantizer(torch.randn(64, 64, dtype=torch.bfloat16))
    param = torch.nn.Parameter(t)
    value = torch.randn(128, 32, dtype=torch.bfloat16)
    param.data = value
    assert isinstance(param, torch.nn.Parameter) and isinstance(param, type(t)) and param.requires_grad
    assert param.shape == (128, 32) and param.dtype == torch.bfloat16
    expected = QUANTIZERS[name]()(value)
    assert _same_bytes(param, expected)
    assert torch.equal(param.dequantize(), expected.dequantize())


def test_set_data_refuses_another_scheme_and_names_the_way_out():
    t = MXFP8Quantizer(E4M3)(torch.randn(32, 32))
    with pytest.raises(TypeError, match=r"MXFP8Tensor.data: cannot take the arrays of a Float8Tensor .* dequantize"):
        t.data = _delayed()(torch.randn(32, 32))


# ------------------------------------------------------------------ chunk/split
@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("dim", [0, 1])
def test_chunk_gives_exact_pieces_as_te_test_chunk(name, dim):
    t = QUANTIZERS[name]()(torch.randn(128, 128, dtype=torch.bfloat16))
    values = t.dequantize()
    pieces = torch.chunk(t, 2, dim=dim)
    for piece, expected in zip(pieces, torch.chunk(values, 2, dim=dim)):
        assert piece.size() == expected.size()
        if name.startswith("fp8_delayed") or name == "fp8_current" or (name == "mxfp8" and dim == 0):
            assert isinstance(piece, QuantizedTensor)  # where TE keeps the piece quantized
        got = piece.dequantize() if isinstance(piece, QuantizedTensor) else piece
        assert torch.equal(got, expected)


@pytest.mark.parametrize("dims", [[2], [4, 4], [8, 5, 3, 3]])
def test_float8_chunk_equals_slicing_as_te_test_chunk_op(dims):
    t = _delayed()(torch.randn(dims))
    first, second = t.chunk(2, dim=0)
    half = dims[0] // 2
    assert isinstance(first, Float8Tensor) and first.shape == (half, *dims[1:]) == second.shape
    assert torch.equal(first.dequantize(), t.dequantize()[:half])
    assert torch.equal(second.dequantize(), t.dequantize()[half:])
    columns = t.split(1, dim=-1)
    assert all(isinstance(c, Float8Tensor) for c in columns)
    assert torch.equal(torch.cat([c.dequantize() for c in columns], dim=-1), t.dequantize())
    assert all(torch.equal(c.dequantize(usage="columnwise"), c.dequantize()) for c in columns)


def test_a_float8_piece_has_its_own_scale():
    """Re-quantizing one piece in place (an optimizer step) never changes another piece's scale."""
    t = Float8CurrentScalingQuantizer(E4M3)(torch.randn(8, 8))
    left, right = t.chunk(2, dim=1)
    before = right._scale_inv.clone()
    left.copy_(torch.full((8, 4), 100.0))
    assert torch.equal(right._scale_inv, before) and not torch.equal(left._scale_inv, before)


# ---------------------------------------------------------------- recipe state
def _state(recipe, mode, n, roles=None):
    return RecipeState.create(recipe, mode=mode, num_quantizers=n, roles=roles, device=torch.device("cpu"))


def test_role_less_slots_follow_tes_positional_layout():
    forward = _state(Float8BlockScaling(), "forward", 4)
    assert [forward.tensor_type(i) for i in range(4)] == ["input", "weight", "output", "input"]
    backward = _state(Float8BlockScaling(), "backward", 3)
    assert [backward.tensor_type(i) for i in range(3)] == ["grad_output", "grad_input", "grad_output"]
    # Slot 1 of a role-less forward state is a weight: 128x128 tiles, not the input's 1x128 blocks.
    assert [q.block_scaling_dim for q in forward.make_quantizers()] == [1, 2, 1, 1]
    custom = _state(Float8BlockScaling(), "forward", 2, roles=[QuantizerRole(tensor_type="qkv"), None])
    assert [custom.tensor_type(i) for i in range(2)] == ["input", "weight"]  # unknown types fall back too


def test_slots_take_their_settings_from_the_role_not_the_mode():
    recipe = Float8BlockScaling(fp8_format=Format.HYBRID)  # E4M3 forward, E5M2 backward; weights 2D
    roles = [QuantizerRole(module_type="linear", tensor_type=t) for t in ("input", "weight", "grad_output")]
    for mode in ("forward", "backward"):
        quantizers = _state(recipe, mode, 3, roles).make_quantizers()
        # Whatever the mode, an input or a weight slot takes their options and format (E4M3), a gradient E5M2.
        assert [q.block_scaling_dim for q in quantizers] == [1, 2, 1], mode
        assert [q.dtype for q in quantizers] == [E4M3, E4M3, E5M2], mode


def test_mxfp8_2d_follows_the_role_of_a_linear_weight():
    recipe = MXFP8BlockScaling(enable_2d_quantization=True)
    linear = [QuantizerRole(module_type="linear", tensor_type=t) for t in ("input", "weight")]
    assert [q.with_2d_quantization for q in _state(recipe, "forward", 2, linear).make_quantizers()] == [False, True]
    # Without a role saying so, slot 1 is not taken for a linear's weight (TE's _slot_role).
    assert [q.with_2d_quantization for q in _state(recipe, "forward", 2).make_quantizers()] == [False, False]
    other = [QuantizerRole(module_type="attention", tensor_type="weight")]
    assert not _state(recipe, "forward", 1, other).make_quantizers()[0].with_2d_quantization


@pytest.mark.parametrize("nvfp4_4over6", ["none", "weights", "activations", "all"])
def test_nvfp4_slots_as_te_test_nvfp4_row_scaled_quantizer_roles(nvfp4_4over6):
    recipe = NVFP4BlockScaling(disable_rht=True, disable_2d_quantization=True, nvfp4_4over6=nvfp4_4over6,
                               row_scaled_activation=True)

    def use_4over6(kind):
        if kind in ("grad_output", "grad_input"):
            return False
        return {"all": True, "weights": kind == "weight", "activations": kind != "weight", "none": False}[
            nvfp4_4over6]

    forward = _state(recipe, "forward", 3).make_quantizers()
    assert [q.row_scaled_nvfp4 for q in forward] == [True, False, True]
    assert [q.nvfp4_use_4over6 for q in forward] == [use_4over6(k) for k in ("input", "weight", "output")]
    assert not forward[0].is_quantizable(torch.empty(16, 16))
    assert forward[1].is_quantizable(torch.empty(16, 16))

    roles = [QuantizerRole(module_type="linear", tensor_type=t) for t in ("weight", "input", "output")] + [None]
    by_role = _state(recipe, "forward", 4, roles).make_quantizers()
    assert [q.row_scaled_nvfp4 for q in by_role] == [False, True, True, True]
    assert [q.nvfp4_use_4over6 for q in by_role] == [use_4over6(k) for k in ("weight", "input", "output", "input")]

    kinds = ("input", "weight", "grad_output", "grad_input")
    operands = _state(recipe, "backward", 4, [QuantizerRole(module_type="linear", tensor_type=k) for k in kinds])
    quantizers = operands.make_quantizers()
    assert [q.nvfp4_use_4over6 for q in quantizers] == [use_4over6(k) for k in kinds]
    assert [q.stochastic_rounding for q in quantizers] == [False, False, True, True]
    assert [q.row_scaled_nvfp4 for q in quantizers] == [False] * 4  # row scaling is for forward slots only


def test_quantizers_without_a_shape_rule_are_quantizable():
    assert Float8CurrentScalingQuantizer(E4M3).is_quantizable(torch.empty(3))
    assert not MXFP8Quantizer(E4M3).is_quantizable(torch.empty(16, 32))
    assert not NVFP4Quantizer(row_scaled_nvfp4=True).is_quantizable(torch.empty(32, 32))
    assert NVFP4Quantizer().is_quantizable(torch.empty(32, 32))
    block = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True)
    assert block.is_quantizable(torch.empty(2, 64, 128)) and not block.is_quantizable(torch.empty(64, 128))
    assert not block.is_quantizable(torch.empty(128))
