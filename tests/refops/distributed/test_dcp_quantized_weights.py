"""Distributed checkpoints of FSDP2 models with quantized weights, every recipe, bit for bit
(``docs/distributed.md#distributed-checkpoints``).

A model built under ``quantized_model_init(recipe)`` and root-sharded over 2 gloo ranks trains 2 Adam steps,
then ``torch.distributed.checkpoint`` saves its model and optimizer state (``get_state_dict``). Before the
fix the save failed on both ranks ("Float8Tensor / MXFP8Tensor is not picklable"). Checked per recipe:

* **2 -> 2**: a fresh model (another seed) and optimizer load the checkpoint (``dcp.load`` +
  ``set_state_dict``): the full model state (quantized weights as row blocks: bytes and scales; extra
  state; biases and norms) and the full optimizer state equal the saved ones bit for bit, and one more
  step gives the uninterrupted run's loss and state, bit for bit;
* **2 -> 1 -> 2**: one rank (FSDP2 over a mesh of one) loads the same checkpoint: the same full state,
  bit for bit; the unsharded weights are byte-identical to what the 2 ranks all-gather; it saves again,
  and 2 ranks load that checkpoint back into the original state, bit for bit;
* **full state dicts**: ``get_model_state_dict(full_state_dict=True)`` loads into a single-process model
  (no FSDP2) with the weights the 2 ranks all-gather, byte for byte; ``set_model_state_dict`` with the
  full state dict restores a sharded model bit for bit.

Only bytes move, so every comparison is exact. Expected values come from the saving run itself.
"""

from __future__ import annotations

import os

import pytest
import torch

import refops as te
from refops.quantization.quantized_tensor import QuantizedTensor
from refops.testing.recipes import make_recipe

import _fsdp2_cases as C

#: recipe -> (model factory, output features)
RECIPES = {
    "fp8_delayed_scaling": (C.flat, 64),
    "fp8_current_scaling": (C.flat, 64),
    "mxfp8": (C.flat, 64),
    "fp8_block_scaling": (C.wide, 256),  # 128-row tiles: shards of 128 rows
    "nvfp4": (C.flat, 64),
}
STEPS = 2


def _build(name: str, world_size: int, seed: int):
    factory, _ = RECIPES[name]
    model = C.shard(C.build(factory, recipe=make_recipe(name), seed=seed), world_size, children=False)
    return model, torch.optim.Adam(model.parameters(), lr=C.LR)


def _step(model, optimizer, name: str, rank: int, world_size: int) -> torch.Tensor:
    x, y = C.data(RECIPES[name][1])
    optimizer.zero_grad()
    with te.autocast(recipe=make_recipe(name)):
        loss = torch.nn.functional.mse_loss(model(C.local_rows(x, rank, world_size)), C.local_rows(y, rank, world_size))
    loss.backward()
    optimizer.step()
    total = loss.detach().clone()
    torch.distributed.all_reduce(total)
    return total


def _full_state(model, optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the model's and optimizer's full state dicts, flattened, on every rank (collectives)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    out = {f"model/{k}": v.detach().clone() for k, v in model_state.items() if isinstance(v, torch.Tensor)}
    for key, state in optim_state["state"].items():
        for field, value in state.items():
            out[f"optim/{key}/{field}"] = torch.as_tensor(value).detach().clone()
    return out


def _mismatches(a: dict, b: dict) -> list[str]:
    if a.keys() != b.keys():
        return [f"keys differ: {sorted(set(a) ^ set(b))}"]
    return [k for k in a if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
            or not torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))]


def _weight_arrays(weight: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {kw: getattr(weight, attr).clone() for kw, attr in weight._CTOR_TENSORS.items()
            if getattr(weight, attr) is not None}


def _unsharded_weights(model) -> dict[str, dict[str, torch.Tensor]]:
    """The quantized weights as FSDP2 all-gathers them for a forward: name -> arrays."""
    model.unshard()
    out = {n: _weight_arrays(p) for n, p in model.named_parameters() if isinstance(p, QuantizedTensor)}
    model.reshard()
    return out


def _save(model, optimizer, directory: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)


def _load(model, optimizer, directory: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _two_ranks_save(rank, world_size, root):
    """Train, save, continue one step; then load into a fresh model and continue it the same way."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    out = {}
    for name in RECIPES:
        directory = os.path.join(root, name)
        model, optimizer = _build(name, world_size, C.SEED)
        for _ in range(STEPS):
            _step(model, optimizer, name, rank, world_size)
        _save(model, optimizer, directory)
        saved = _full_state(model, optimizer)
        full_model = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        unsharded = _unsharded_weights(model)
        next_loss = _step(model, optimizer, name, rank, world_size)
        continued = _full_state(model, optimizer)

        target, target_optimizer = _build(name, world_size, C.SEED + 1)
        _load(target, target_optimizer, directory)
        loaded = _full_state(target, target_optimizer)
        loaded_next_loss = _step(target, target_optimizer, name, rank, world_size)

        third, third_optimizer = _build(name, world_size, C.SEED + 2)  # a full model state dict, set directly
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(third, dict(full_model), options=StateDictOptions(full_state_dict=True))  # (rewrites it)
        out[name] = {
            "saved": saved, "unsharded": unsharded, "full_model": full_model,
            "loaded_mismatches": _mismatches(saved, loaded),
            "same_next_loss": torch.equal(next_loss, loaded_next_loss),
            "continued_mismatches": _mismatches(continued, _full_state(target, target_optimizer)),
            "full_set_mismatches": _mismatches(
                {k: v for k, v in saved.items() if k.startswith("model/")},
                {k: v for k, v in _full_state(third, third_optimizer).items() if k.startswith("model/")}),
        }
    return out


def _one_rank_reshard(rank, world_size, root, saved_by_recipe):
    """Load the 2-rank checkpoint on one rank, compare, save it again from here."""
    out = {}
    for name in RECIPES:
        model, optimizer = _build(name, world_size, C.SEED + 3)
        _load(model, optimizer, os.path.join(root, name))
        out[name] = {"mismatches": _mismatches(saved_by_recipe[name], _full_state(model, optimizer)),
                     "unsharded": _unsharded_weights(model)}
        _save(model, optimizer, os.path.join(root, f"{name}-one-rank"))
    return out


def _two_ranks_load_one_rank_checkpoint(rank, world_size, root, saved_by_recipe):
    out = {}
    for name in RECIPES:
        model, optimizer = _build(name, world_size, C.SEED + 4)
        _load(model, optimizer, os.path.join(root, f"{name}-one-rank"))
        out[name] = _mismatches(saved_by_recipe[name], _full_state(model, optimizer))
    return out


@pytest.fixture(scope="module")
def results(cpu_ranks, tmp_path_factory):
    from refops.distributed import run_on_ranks

    root = str(tmp_path_factory.mktemp("dcp"))
    two = cpu_ranks(_two_ranks_save, root, timeout=300)
    saved = {name: two[0][name]["saved"] for name in RECIPES}
    one = run_on_ranks(_one_rank_reshard, 1, root, saved, backend="gloo", timeout=300)[0]
    back = cpu_ranks(_two_ranks_load_one_rank_checkpoint, root, saved, timeout=300)
    return {"two": two, "one": one, "back": back}


@pytest.mark.parametrize("name", list(RECIPES))
def test_dcp_save_load_of_quantized_weights_is_bit_exact_with_optimizer_state(results, name):
    for rank_result in results["two"]:
        out = rank_result[name]
        assert any(k.startswith("optim/") for k in out["saved"])  # Adam's state travels too
        assert out["loaded_mismatches"] == [], out["loaded_mismatches"]
        assert out["same_next_loss"]
        assert out["continued_mismatches"] == [], out["continued_mismatches"]
    ranks = results["two"]
    assert _mismatches(ranks[0][name]["saved"], ranks[1][name]["saved"]) == []  # one full state on both ranks


@pytest.mark.parametrize("name", list(RECIPES))
def test_a_two_rank_checkpoint_loads_on_one_rank_and_back_bit_exactly(results, name):
    one = results["one"][name]
    assert one["mismatches"] == [], one["mismatches"]
    two_unsharded = results["two"][0][name]["unsharded"]
    assert one["unsharded"].keys() == two_unsharded.keys() and len(two_unsharded) == 2
    for weight, arrays in two_unsharded.items():
        assert _mismatches(arrays, one["unsharded"][weight]) == [], weight
    for rank_result in results["back"]:
        assert rank_result[name] == [], rank_result[name]


@pytest.mark.parametrize("name", list(RECIPES))
def test_full_state_dicts_of_quantized_weights_round_trip(results, name):
    for rank_result in results["two"]:
        assert rank_result[name]["full_set_mismatches"] == [], rank_result[name]["full_set_mismatches"]
    # The full state dict loads into a single-process model, with the bytes the ranks all-gather.
    out = results["two"][0][name]
    factory, _ = RECIPES[name]
    single = C.build(factory, recipe=make_recipe(name), seed=C.SEED + 5)
    single.load_state_dict(out["full_model"])
    weights = {n: _weight_arrays(p) for n, p in single.named_parameters() if isinstance(p, QuantizedTensor)}
    assert weights.keys() == out["unsharded"].keys()
    for weight, arrays in out["unsharded"].items():
        assert _mismatches(arrays, weights[weight]) == [], weight


def _load_another_recipe(rank, world_size):
    """An MXFP8 model's sharded state dict into an FP8 current-scaling model: refused, nothing of the op loaded."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    source, _ = _build("mxfp8", world_size, C.SEED)
    target, _ = _build("fp8_current_scaling", world_size, C.SEED + 1)
    before = target[1].basic_ops[0].weight.to_local().dequantize().clone()
    try:
        set_model_state_dict(target, get_model_state_dict(source))
    except RuntimeError as error:
        message = str(error)
    else:
        message = "no error"
    return message, torch.equal(target[1].basic_ops[0].weight.to_local().dequantize(), before)


def test_a_sharded_checkpoint_of_another_recipe_is_refused_naming_the_op(cpu_ranks):
    for message, unchanged in cpu_ranks(_load_another_recipe, timeout=120):
        assert "BasicLinear (1.basic_ops.0.): parameter 'weight': the checkpoint's row blocks have shape" in message, \
            message
        assert "nothing of this op was loaded" in message and unchanged
