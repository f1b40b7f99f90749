"""Checkpoints round-trip bit-exactly, also into meta-built models, and never use pickle."""

from __future__ import annotations

import io

import pytest
import torch

import refops as te
from refops.ops.extra_state import decode_extra_state, encode_extra_state

from _cases import CASE_IDS, CASES, aliases_in_sync


def _train(model, xs, lr=0.25):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    outs = []
    for x in xs:
        opt.zero_grad()
        y = model(x)
        y.square().sum().backward()
        opt.step()
        outs.append(y.detach())
    return opt, outs


def _mlp(device):
    return te.ops.Sequential(te.ops.Linear(8, 16, device=device), te.ops.Linear(16, 4, device=device))


def test_save_load_continue_training_is_bit_exact(device):
    xs = [torch.randn(5, 8, device=device) for _ in range(4)]
    model = _mlp(device)
    opt, _ = _train(model, xs[:2])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # no pickle of arbitrary objects needed
    restored = _mlp("meta")
    restored.load_state_dict(loaded["model"])
    assert aliases_in_sync(restored)
    opt2 = torch.optim.SGD(restored.parameters(), lr=0.25)
    opt2.load_state_dict(loaded["opt"])
    _, outs_a = _train(model, xs[2:])
    _, outs_b = _train(restored, xs[2:])
    for a, b in zip(outs_a, outs_b):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), restored.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_state_dict_round_trip_into_meta_model(case, device):
    torch.manual_seed(2)
    source = case.build(device, torch.float32)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p))  # values no initializer would produce
    target = case.build("meta", torch.float32)
    target.load_state_dict(source.state_dict())
    for (name, p), q in zip(target.named_parameters(), source.parameters()):
        assert p.device == device, name
        assert torch.equal(p, q), name
    inputs = case.inputs(device, torch.float32)
    assert torch.equal(target(*inputs), source(*inputs))


def test_state_dict_layout_matches_te(device):
    keys = list(te.ops.Linear(4, 3, device=device).state_dict())
    assert keys == ["basic_ops.0.weight", "basic_ops.0._extra_state", "basic_ops.1.bias", "basic_ops.1._extra_state"]
    state = te.ops.Linear(4, 3, device=device).state_dict()["basic_ops.0._extra_state"]
    # Bytes where TE has a uint8 tensor (docs/distributed.md#extra-state-in-distributed-checkpoints); no state yet.
    assert isinstance(state, bytes) and decode_extra_state(state) == {}


def test_linear_loads_nn_linear_style_keys(device):
    plain = torch.nn.Linear(4, 3, device=device)
    op = te.ops.Linear(4, 3, device="meta")
    op.load_state_dict({"weight": plain.weight.detach(), "bias": plain.bias.detach()}, strict=False)
    x = torch.randn(2, 4, device=device)
    assert torch.equal(op.weight, plain.weight) and torch.equal(op.bias, plain.bias)
    assert torch.allclose(op(x), plain(x))


def test_strict_load_of_linear_without_bias(device):
    source = te.ops.Linear(4, 3, bias=False, device=device)
    target = te.ops.Linear(4, 3, bias=False, device="meta")
    result = target.load_state_dict(source.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys


def test_wrong_shape_checkpoint_is_a_clear_error_and_loads_nothing(device):
    model = _mlp(device)
    before = [p.detach().clone() for p in model.parameters()]
    bad = model.state_dict()
    bad["0.basic_ops.0.weight"] = torch.zeros(16, 9, device=device)
    bad["0.basic_ops.1.bias"] = torch.ones(16, device=device)
    with pytest.raises(RuntimeError, match=r"BasicLinear .*'weight' expects shape \(16, 8\)"):
        model.load_state_dict(bad)
    assert torch.equal(model[0].weight, before[0])  # the failing op loaded nothing
    model(torch.randn(2, 8, device=device)).sum().backward()  # still usable


def test_extra_state_codec_round_trips_without_pickle():
    state = {
        "recipe": {"name": "DelayedScaling", "margin": 0, "amax_history_len": 3, "flag": True, "none": None},
        "scale": torch.tensor([1.0, 0.5, float("inf")]),
        "amax_history": torch.tensor([[0.0, float("nan")], [3.5, -0.0]]),
        "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "fp8": torch.tensor([448.0, -0.5]).to(torch.float8_e4m3fn),
        "empty": torch.empty(0, 4),
        "nested": [1, 2.5, "x", [torch.tensor(7, dtype=torch.int64)]],
    }
    encoded = encode_extra_state(state)
    assert encoded.dtype == torch.uint8 and encoded.dim() == 1
    assert b"pickle" not in bytes(encoded.numpy()[:8].tobytes())
    decoded = decode_extra_state(encoded)
    assert decoded["recipe"] == state["recipe"]
    for key in ("scale", "amax_history", "bf16", "fp8", "empty"):
        assert decoded[key].dtype == state[key].dtype and decoded[key].shape == state[key].shape
        assert torch.equal(decoded[key].view(torch.uint8), state[key].view(torch.uint8)), key
    assert decoded["nested"][:3] == [1, 2.5, "x"] and decoded["nested"][3][0].item() == 7
    assert decode_extra_state(torch.empty(0, dtype=torch.uint8)) == {}


def test_extra_state_rejects_foreign_payloads():
    import pickle

    payload = torch.frombuffer(bytearray(pickle.dumps({"a": 1})), dtype=torch.uint8)
    with pytest.raises(ValueError, match="not written by refops"):
        decode_extra_state(payload)
    with pytest.raises(TypeError, match="cannot serialize"):
        encode_extra_state({"f": object()})
