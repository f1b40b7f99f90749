"""``refops.distributed.load`` refuses another recipe's DCP checkpoint before anything is written (#38, item 1).

For each pair (the checkpoint's recipe and weight form, the target's) that differ, on the routes ``2 -> 2``,
``2 -> 1``, ``1 -> 2`` and ``1 -> 1`` (2: a root-sharded FSDP2 model on 2 gloo ranks; 1: a plain model in one
process), with the model and Adam state of ``get_state_dict``: a freshly built target's load is a
``CheckpointMismatchError`` naming the op (``model.1.basic_ops.0``), the checkpoint's recipe and the target's, and
every tensor and object of the target's full model and optimizer state (parameters, row blocks, buffers, extra
state, Adam's moments and steps) is bit-identical to what it was before. ``dcp.load(...,
planner=RecipeCheckingLoadPlanner(...))`` refuses the same way (inside DCP's ``CheckpointException``). The
same-recipe loads through ``refops.distributed.load`` are in the reshard matrix (``test_dcp_reshard.py``, the
``checked`` routes), bit-exact.

Three spawns: one process (sources, 1 -> 1), 2 ranks (sources, 2 -> 2, 1 -> 2), one process (2 -> 1).
"""

from __future__ import annotations

import os

import pytest
import torch

import refops as te
from refops.distributed import CheckpointMismatchError, RecipeCheckingLoadPlanner, run_on_ranks
from refops.testing.recipes import make_recipe

import _fsdp2_cases as C

TIMEOUT_S = 180.0
ROUTES = ("2->2", "2->1", "1->2", "1->1")
#: (checkpoint's cell, target's cell, words naming the checkpoint's recipe, words naming the target's)
PAIRS = [
    (("fp8_delayed_scaling", "quantized"), ("fp8_current_scaling", "quantized"), "DelayedScaling(",
     "Float8CurrentScaling quantized weights"),
    (("mxfp8", "quantized"), ("fp8_block_scaling", "quantized"), "MXFP8BlockScaling quantized weights",
     "Float8BlockScaling quantized weights"),
    (("nvfp4", "quantized"), ("none", "plain"), "NVFP4BlockScaling quantized weights",
     "plain weights and no recipe state"),
    (("nvfp4", "quantized"), ("nvfp4_4over6", "quantized"), "NVFP4BlockScaling quantized weights",
     "NVFP4BlockScaling quantized weights"),
    (("mxfp8", "plain"), ("mxfp8", "quantized"), "plain weights and no recipe state",
     "MXFP8BlockScaling quantized weights"),
    (("fp8_block_scaling", "quantized"), ("fp8_block_scaling", "plain"), "Float8BlockScaling quantized weights",
     "plain weights and no recipe state"),
    (("fp8_delayed_scaling", "plain"), ("fp8_delayed_scaling", "quantized"), "DelayedScaling(",
     "DelayedScaling(margin=0, fp8_format=E4M3, amax_history_len=8"),
]
#: Pairs also tried through a plain dcp.load with the planner.
PLANNER_PAIRS = (0, 1)


def _pair_name(pair) -> str:
    (saved, built) = pair[:2]
    return f"{saved[0]}-{saved[1]}->{built[0]}-{built[1]}"


def _factory_and_width(pair):
    """One model for both sides: 128-row shards for FP8 block scaling's 2-D tiles."""
    return (C.wide, 256) if "fp8_block_scaling" in (pair[0][0], pair[1][0]) else (C.flat, 64)


def _recipe(cell):
    return None if cell[0] == "none" else make_recipe(cell[0])


def _build(pair, cell, world_size: int, seed: int):
    model = C.build(_factory_and_width(pair)[0], "cpu", seed=seed,
                    recipe=_recipe(cell) if cell[1] == "quantized" else None)
    if world_size:
        model = C.shard(model, world_size, children=False)
    return model, torch.optim.Adam(model.parameters(), lr=C.LR)


def _train_and_save(pair, rank: int, world_size: int, directory: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    cell = pair[0]
    model, optimizer = _build(pair, cell, world_size, C.SEED)
    x, y = C.data(_factory_and_width(pair)[1])
    if world_size:
        x, y = C.local_rows(x, rank, world_size), C.local_rows(y, rank, world_size)
    for _ in range(2):
        optimizer.zero_grad()
        with te.autocast(enabled=cell[0] != "none", recipe=_recipe(cell)):
            out = model(x)
        torch.nn.functional.mse_loss(out, y).backward()
        optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)


def _everything(model, optimizer, sharded: bool) -> dict[str, object]:
    """Every value of the full model and optimizer state dicts by key: tensors as their bytes, objects (the ops'
    extra-state bytes, param groups) as they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=sharded))

    def as_value(v):
        if isinstance(v, torch.Tensor):
            v = v.detach().clone()
            return (str(v.dtype), tuple(v.shape), v.reshape(-1).view(torch.uint8).tolist())
        return v

    out = {f"model/{k}": as_value(v) for k, v in model_state.items()}
    for key, state in optim_state["state"].items():
        out.update({f"optim/{key}/{field}": as_value(value) for field, value in state.items()})
    out["optim/param_groups"] = optim_state["param_groups"]
    return out


def _attempt(pair, world_size: int, directory: str, *, planner: bool) -> dict:
    """A freshly built target's refused load: the error (type and text) and the keys whose values changed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import refops.distributed

    model, optimizer = _build(pair, pair[1], world_size, C.SEED + 1)
    # The first get_state_dict initializes Adam's state (a step of lr 0: an NVFP4 weight re-derives its
    # column-wise copy from its stored value); measure after it, as a resumed run would.
    get_state_dict(model, optimizer)
    before = _everything(model, optimizer, bool(world_size))
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    error = kind = None
    try:
        if planner:
            dcp.load(state, checkpoint_id=directory, planner=RecipeCheckingLoadPlanner(directory))
        else:
            refops.distributed.load(state, checkpoint_id=directory)
    except CheckpointMismatchError as caught:
        error, kind = str(caught), "CheckpointMismatchError"
    except CheckpointException as caught:  # the planner's error, as DCP hands it to every rank
        inner = [exc for exc, _ in caught.failures.values()]
        kind = "CheckpointException of " + ",".join(sorted({type(e).__name__ for e in inner}))
        error = "\n".join(str(e) for e in inner)
    after = _everything(model, optimizer, bool(world_size))
    changed = sorted(k for k in before if k not in after or before[k] != after[k])
    # The state dict handed to the load is the model's: a refused load leaves its values too.
    return {"error": error, "kind": kind, "changed": changed + sorted(set(after) - set(before))}


def _attempts(world_size: int, directory: str) -> dict:
    return {_pair_name(pair): {"load": _attempt(pair, world_size, os.path.join(directory, _pair_name(pair)),
                                                planner=False),
                               **({"planner": _attempt(pair, world_size, os.path.join(directory, _pair_name(pair)),
                                                       planner=True)} if i in PLANNER_PAIRS else {})}
            for i, pair in enumerate(PAIRS)}


def _one_process_sources_and_1_to_1(rank, world_size, root):
    for pair in PAIRS:
        _train_and_save(pair, rank, 0, os.path.join(root, "one", _pair_name(pair)))
    return {"1->1": _attempts(0, os.path.join(root, "one"))}


def _two_ranks_sources_2_to_2_and_1_to_2(rank, world_size, root):
    for pair in PAIRS:
        _train_and_save(pair, rank, world_size, os.path.join(root, "two", _pair_name(pair)))
    return {"2->2": _attempts(world_size, os.path.join(root, "two")),
            "1->2": _attempts(world_size, os.path.join(root, "one"))}


def _one_process_2_to_1(rank, world_size, root):
    return {"2->1": _attempts(0, os.path.join(root, "two"))}


@pytest.fixture(scope="module")
def attempts(cpu_ranks, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("checked"))
    one = run_on_ranks(_one_process_sources_and_1_to_1, 1, root, backend="gloo", timeout=TIMEOUT_S)
    two = cpu_ranks(_two_ranks_sources_2_to_2_and_1_to_2, root, timeout=TIMEOUT_S)
    back = run_on_ranks(_one_process_2_to_1, 1, root, backend="gloo", timeout=TIMEOUT_S)
    return {"1->1": [one[0]["1->1"]], "2->1": [back[0]["2->1"]], "2->2": [r["2->2"] for r in two],
            "1->2": [r["1->2"] for r in two]}


def _check_refusal(seen: dict, pair, *, kind: str) -> None:
    saved_words, target_words = pair[2:]
    assert seen["kind"] == kind, seen["error"]
    error = seen["error"]
    assert "model.1.basic_ops.0: the checkpoint holds " in error, error  # the op, by its path
    assert "model.1.basic_ops.0.weight" in error, error  # the tensor
    head = error.split("model.1.basic_ops.0: the checkpoint holds ", 1)[1].split("\n", 1)[0]
    saved_part, target_part = head.split(", this model's op ", 1)
    assert saved_part.startswith(saved_words), head  # the checkpoint's recipe, then the target's
    assert target_part.startswith(target_words), head
    assert "nothing was loaded" in error
    assert seen["changed"] == [], f"the refused load changed {seen['changed']}"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("pair", PAIRS, ids=_pair_name)
def test_another_recipes_checkpoint_is_refused_before_anything_is_written(attempts, route, pair):
    for rank in attempts[route]:
        _check_refusal(rank[_pair_name(pair)]["load"], pair, kind="CheckpointMismatchError")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("pair", [PAIRS[i] for i in PLANNER_PAIRS], ids=_pair_name)
def test_the_planner_refuses_inside_a_plain_dcp_load(attempts, route, pair):
    for rank in attempts[route]:
        _check_refusal(rank[_pair_name(pair)]["planner"], pair,
                       kind="CheckpointException of CheckpointMismatchError")


def test_every_quantizer_names_its_recipe():
    """The recipe the error names for a quantized weight is the recipe whose quantizer stored it."""
    from refops.distributed.checkpoint import RECIPE_OF_QUANTIZER
    from refops.testing.recipes import RECIPE_NAMES

    for name in RECIPE_NAMES:
        recipe = make_recipe(name)
        with te.quantized_model_init(recipe=recipe):
            linear = te.ops.Linear(64, 64)
        quantizer = linear.basic_ops[0].weight.quantizer
        assert RECIPE_OF_QUANTIZER[type(quantizer).__name__] == type(recipe).__name__


def test_load_needs_a_checkpoint_to_read():
    import refops.distributed

    with pytest.raises(TypeError, match="checkpoint_id"):
        refops.distributed.load({})
    with pytest.raises(TypeError, match="checkpoint_id"):
        RecipeCheckingLoadPlanner()
