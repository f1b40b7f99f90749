"""Checkpoints in the single-process form refops wrote before row blocks still load, bit for bit (#36).

Until the sharding layer, ``state_dict()`` stored a quantized weight as one 1-D uint8 tensor (its plain tensors
and metadata, :mod:`refops.ops.legacy_checkpoint_form`). A checkpoint of that form is built here with the
encoder kept for the purpose, saved with ``torch.save`` and read back with ``torch.load(weights_only=True)``; it
loads, for every recipe, into a materialized model, into a model on ``meta``, and (``set_model_state_dict`` with
the full state dict) into an FSDP2 model on 2 ranks: the weights hold the saved bytes and scales, and the
next step gives the saved model's outputs. A truncated legacy entry is still an error naming the op.
"""

from __future__ import annotations

import io

import pytest
import torch

import refops as te
from refops.ops.legacy_checkpoint_form import encode_legacy_quantized_parameter
from refops.quantization.quantized_tensor import QuantizedTensor
from refops.testing.recipes import make_recipe

import _fsdp2_cases as C

RECIPES = ("fp8_delayed_scaling", "fp8_current_scaling", "mxfp8", "fp8_block_scaling", "nvfp4")


def _factory(name: str):
    return C.wide if name == "fp8_block_scaling" else C.flat


def _trained(name: str, device: str = "cpu"):
    model = C.build(_factory(name), device, recipe=make_recipe(name))
    if device != "meta":
        x, y = C.data(256 if name == "fp8_block_scaling" else 64)
        C.train(model, x, y, steps=1, recipe=make_recipe(name))
    return model


def _legacy_state_dict(model) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` as refops wrote it before row blocks, through ``torch.save`` / ``torch.load``."""
    state = model.state_dict()
    for key in state:
        if key.endswith("weight") and isinstance(model.get_parameter(key), QuantizedTensor):
            state[key] = encode_legacy_quantized_parameter(model.get_parameter(key))
        if key.endswith("_extra_state"):  # then a uint8 tensor, now bytes
            state[key] = torch.frombuffer(bytearray(state[key]), dtype=torch.uint8).clone()
    assert any(v.dim() == 1 and v.dtype == torch.uint8 and v.numel() > 100 for v in state.values())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _arrays(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {a: getattr(t, a) for a in t._array_names() if getattr(t, a) is not None}


def _same_weights(a, b) -> bool:
    pairs = [(p, q) for p, q in zip(a.parameters(), b.parameters()) if isinstance(p, QuantizedTensor)]
    return bool(pairs) and all(
        type(p) is type(q) and _arrays(p).keys() == _arrays(q).keys()
        and all(torch.equal(x, _arrays(q)[k]) for k, x in _arrays(p).items()) for p, q in pairs)


def _output(model, name: str) -> torch.Tensor:
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), te.autocast(recipe=make_recipe(name)):
        return model(x)


@pytest.mark.parametrize("name", RECIPES)
def test_a_legacy_single_process_checkpoint_loads_bit_exactly(name):
    source = _trained(name)
    legacy = _legacy_state_dict(source)
    for target in (C.build(_factory(name), recipe=make_recipe(name), seed=C.SEED + 1), _trained(name, "meta")):
        target.load_state_dict(legacy)
        assert _same_weights(source, target)
        assert torch.equal(_output(source, name), _output(target, name))
    assert isinstance(target.state_dict()["1.basic_ops.0.weight"], torch.Tensor)
    assert target.state_dict()["1.basic_ops.0.weight"].dim() == 2  # saved again: row blocks


def test_a_truncated_legacy_entry_names_the_op():
    source = _trained("fp8_current_scaling")
    legacy = _legacy_state_dict(source)
    legacy["1.basic_ops.0.weight"] = legacy["1.basic_ops.0.weight"][:-40]
    target = C.build(C.flat, recipe=make_recipe("fp8_current_scaling"), seed=C.SEED + 1)
    with pytest.raises(RuntimeError, match=r"BasicLinear \(1\.basic_ops\.0\.\): parameter 'weight': .*truncated or "
                                           r"corrupt.*nothing of this op was loaded"):
        target.load_state_dict(legacy)


def _legacy_into_fsdp2(rank, world_size, legacy_by_recipe):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    out = {}
    for name, legacy in legacy_by_recipe.items():
        model = C.shard(C.build(_factory(name), recipe=make_recipe(name), seed=C.SEED + 2), world_size,
                        children=False)
        set_model_state_dict(model, dict(legacy), options=StateDictOptions(full_state_dict=True))
        model.unshard()
        out[name] = {n: _arrays(p) for n, p in model.named_parameters() if isinstance(p, QuantizedTensor)}
        out[name] = {n: {k: v.clone() for k, v in arrays.items()} for n, arrays in out[name].items()}
        model.reshard()
    return out


def test_a_legacy_single_process_checkpoint_loads_into_fsdp2(cpu_ranks):
    sources = {name: _trained(name) for name in RECIPES}
    results = cpu_ranks(_legacy_into_fsdp2, {name: _legacy_state_dict(m) for name, m in sources.items()}, timeout=180)
    for rank_result in results:
        for name, source in sources.items():
            expected = {n: _arrays(p) for n, p in source.named_parameters() if isinstance(p, QuantizedTensor)}
            assert rank_result[name].keys() == expected.keys() and expected, name
            for weight, arrays in expected.items():
                got = rank_result[name][weight]
                assert got.keys() == arrays.keys() and all(torch.equal(v, got[k]) for k, v in arrays.items()), \
                    (name, weight)
