"""Distributed checkpoints (``docs/distributed.md#distributed-checkpoints``, case F6):
``torch.distributed.checkpoint``'s ``get_model_state_dict`` / ``set_model_state_dict`` on an FSDP2-sharded
refops model, full and sharded,
with and without the ``_extra_state`` keys, round-trip bit for bit on 2 forked gloo ranks.

The model trains one step under delayed scaling first, so its extra state (amax histories and scales) is
not empty and a lost extra state would show. Loading into a model built under another seed must give
back exactly the saved entries, and one more training step must then give the same loss, bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch

import refops as te
from refops.ops.extra_state import extra_state_bytes
from refops.recipe import DelayedScaling, Format

import _fsdp2_cases as C

RECIPE = DelayedScaling(fp8_format=Format.E4M3, amax_history_len=4)
EXTRA = "_extra_state"


def _trained(rank, world_size, seed):
    model = C.shard(C.build(C.flat, seed=seed), world_size, children=False)
    x, y = C.data()
    C.train(model, C.local_rows(x, rank, world_size), C.local_rows(y, rank, world_size), steps=1, recipe=RECIPE)
    return model


def _one_step_loss(model, rank, world_size):
    x, y = C.data()
    torch.manual_seed(7)
    losses, _ = C.train(model, C.local_rows(x, rank, world_size), C.local_rows(y, rank, world_size), steps=1,
                        recipe=RECIPE)
    return C.global_loss(losses)[0]


def _local(value):
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


def _mismatches(a: dict, b: dict) -> list[str]:
    """Keys whose values differ in type, shape or any byte (DTensors: their local shards and placements)."""
    from torch.distributed.tensor import DTensor

    if a.keys() != b.keys():
        return [f"keys differ: {sorted(set(a) ^ set(b))}"]
    bad = []
    for key in a:
        x, y = a[key], b[key]
        if type(x) is not type(y) or (isinstance(x, DTensor) and x.placements != y.placements):
            bad.append(f"{key}: {type(x).__name__} vs {type(y).__name__}")
            continue
        if isinstance(x, bytes):  # an op's extra state
            if x != y:
                bad.append(key)
            continue
        lx, ly = _local(x), _local(y)
        if lx.shape != ly.shape or lx.dtype != ly.dtype or not torch.equal(lx.view(torch.uint8), ly.view(torch.uint8)):
            bad.append(key)
    return bad


def _spy(method, received: list):
    """``method``, recording the type of what it is given."""

    def spied(state):
        received.append(type(state).__name__)
        return method(state)

    return spied


def _round_trips(rank, world_size):
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    source = _trained(rank, world_size, seed=C.SEED)
    # The next step of the source, on an identically trained twin (FSDP2 modules cannot be deep-copied).
    source_next_loss = _one_step_loss(_trained(rank, world_size, seed=C.SEED), rank, world_size)
    results = {}
    for mode in ("full", "sharded"):
        options = StateDictOptions(full_state_dict=mode == "full")
        saved = get_model_state_dict(source, options=options)
        extra_keys = [k for k in saved if k.endswith(EXTRA)]
        for with_extra in (True, False):
            target = _trained(rank, world_size, seed=C.SEED + 1)
            to_load = {k: copy.deepcopy(v) for k, v in saved.items() if with_extra or not k.endswith(EXTRA)}
            # Full mode fills a missing _extra_state key with DCP's placeholder object, which refops takes as
            # "no state"; sharded mode reports it missing unless strict=False, as for any other key.
            load_options = options if with_extra or mode == "full" else StateDictOptions(strict=False)
            received = []
            for op in target.modules():
                if isinstance(op, te.ops.BasicOperation):
                    op.set_extra_state = _spy(op.set_extra_state, received)
            set_model_state_dict(target, to_load, options=load_options)  # (rewrites to_load in place)
            for op in target.modules():
                op.__dict__.pop("set_extra_state", None)
            loaded = get_model_state_dict(target, options=options)
            compared = saved if with_extra else {k: v for k, v in saved.items() if not k.endswith(EXTRA)}
            loaded = loaded if with_extra else {k: v for k, v in loaded.items() if not k.endswith(EXTRA)}
            case = f"{mode}, {'with' if with_extra else 'without'} {EXTRA}"
            results[case] = {
                "mismatches": _mismatches(compared, loaded),
                "set_extra_state_received": sorted(set(received)),
                "extra_state_bytes": sum(len(saved[k]) for k in extra_keys),
                "empty_extra_state_bytes": len(extra_keys) * len(extra_state_bytes({})),
                "values_are_dtensors": mode == "sharded" and all(
                    type(v).__name__ == "DTensor" for k, v in loaded.items() if not k.endswith(EXTRA)),
                "same_next_loss": _one_step_loss(target, rank, world_size) == source_next_loss if with_extra else None,
            }
    return results


@pytest.fixture(scope="module")
def results(cpu_ranks):
    return cpu_ranks(_round_trips, timeout=180)


@pytest.mark.parametrize("mode", ["full", "sharded"])
@pytest.mark.parametrize("with_extra", [True, False], ids=["with-extra-state", "without-extra-state"])
def test_f6_dcp_state_dict_round_trips_bit_exactly(results, mode, with_extra):
    case = f"{mode}, {'with' if with_extra else 'without'} {EXTRA}"
    for r in results:
        out = r[case]
        assert out["extra_state_bytes"] > out["empty_extra_state_bytes"]  # delayed scaling left real state to lose
        assert out["mismatches"] == [], out["mismatches"]
        if mode == "sharded":
            assert out["values_are_dtensors"]
        # Full mode hands refops DCP's placeholder object for each missing key; sharded mode nothing.
        expected = {(True, "full"): ["bytes"], (True, "sharded"): ["bytes"], (False, "full"): ["_EXTRA_STATE"],
                    (False, "sharded"): []}[(with_extra, mode)]
        assert out["set_extra_state_received"] == expected
        if with_extra:
            assert out["same_next_loss"]  # the loaded amax histories and scales drive the next step
