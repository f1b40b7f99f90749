"""DCP reshards refops models bit for bit: route x recipe x plain/quantized weights, optimizer state included (#36).

A quantized weight has one state-dict form, its row blocks (a plain uint8 matrix in one process, a DTensor of the
same matrix under FSDP2), so ``torch.distributed.checkpoint`` moves it between any numbers of ranks; an op's extra
state is bytes, which DCP replaces whole, so it loads into an op that never ran (#38, item 1). Routes:
``2 -> 2``, ``2 -> 1``, ``1 -> 2``, ``1 -> 1``, where 2 is a root-sharded FSDP2 model on 2 gloo ranks and 1 a plain
single-process model (no FSDP2); ``2 -> mesh1``, FSDP2 over a mesh of one rank; ``meta 1 -> 2`` and
``meta 2 -> 1``, a target built on meta, then ``to_empty`` and ``reset_parameters()`` (sharded first on 2 ranks);
``2->2 checked``, ``2->1 checked``, ``1->2 checked``, ``1->1 checked``: those loads through ``refops.distributed.load``,
which checks every op's recipe first (its refusals: ``test_dcp_load_checked.py``).
Recipes: none and every recipe of ``refops.testing.recipes``, each with plain weights (trained under ``autocast``)
and quantized weights (``quantized_model_init``). For every cell:

* the source trains 2 Adam steps and saves its model and optimizer state (``get_state_dict`` + ``dcp.save``);
* a freshly built target (another seed) that never ran a forward loads it (``dcp.load`` + ``set_state_dict``): its full model and optimizer
  state equal the source's, bit for bit (one process and FSDP2 store the same full state, row blocks included);
* the target's next step gives the source's outputs and full gradients bit for bit. "The next step" is one
  forward and backward on each half of a batch, gradients averaged, from the checkpointed state: 2 ranks run a
  half each (FSDP2 averages the grads), one process runs each half on its own copy of the model and averages (on a
  one-rank mesh, where FSDP2 modules cannot be deep-copied, the copy is a second load of the checkpoint).

Three spawns share the cells: one process (sources and 1 -> 1), 2 ranks (sources, 2 -> 2, 1 -> 2, meta 1 -> 2),
one process (2 -> 1, 2 -> mesh1, meta 2 -> 1); each rank returns what it saw and the comparisons run here.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

import refops as te
from refops.distributed import run_on_ranks
from refops.testing.recipes import RECIPE_NAMES, make_recipe

import _fsdp2_cases as C

CELLS = [("none", "plain")] + [(r, w) for r in RECIPE_NAMES for w in ("plain", "quantized")]
ROUTES = ("2->2", "2->1", "1->2", "1->1", "2->mesh1", "meta 1->2", "meta 2->1")
#: The same loads through refops.distributed.load, which checks every op's recipe before DCP writes anything.
CHECKED_ROUTES = ("2->2 checked", "2->1 checked", "1->2 checked", "1->1 checked")
STEPS = 2
TIMEOUT_S = 240.0


def _name(cell: tuple[str, str]) -> str:
    return f"{cell[0]}-{cell[1]}"


def _recipe(cell):
    return None if cell[0] == "none" else make_recipe(cell[0])


def _factory_and_width(cell):
    return (C.wide, 256) if cell[0] == "fp8_block_scaling" else (C.flat, 64)  # 128-row tiles: shards of 128 rows


def _build(cell, world_size: int, seed: int, *, on_meta: bool = False):
    """The cell's model (FSDP2 over ``world_size`` ranks, or a plain model for ``world_size`` 0) and an Adam;
    ``on_meta``: built on meta (and sharded), then ``to_empty`` and ``reset_parameters()`` under ``seed``."""
    factory, _ = _factory_and_width(cell)
    model = C.build(factory, "meta" if on_meta else "cpu", seed=seed,
                    recipe=_recipe(cell) if cell[1] == "quantized" else None)
    if world_size:
        model = C.shard(model, world_size, children=False)
    if on_meta:
        model.to_empty(device="cpu")
        torch.manual_seed(seed)
        C.reset_all(model)
    return model, torch.optim.Adam(model.parameters(), lr=C.LR)


def _forward_backward(model, cell, x, y):
    with te.autocast(enabled=cell[0] != "none", recipe=_recipe(cell)):
        out = model(x)
    torch.nn.functional.mse_loss(out, y).backward()
    return out.detach().clone()


def _train(model, optimizer, cell, rank: int, world_size: int) -> None:
    x, y = C.data(_factory_and_width(cell)[1])
    if world_size:
        x, y = C.local_rows(x, rank, world_size), C.local_rows(y, rank, world_size)
    for _ in range(STEPS):
        optimizer.zero_grad()
        _forward_backward(model, cell, x, y)
        optimizer.step()


def _next_step(model, cell, rank: int, world_size: int, copy_model=copy.deepcopy) -> dict[str, torch.Tensor]:
    """Outputs of each half of the next batch and the full averaged grads, from the model's current state
    (``copy_model(model)``: a copy of it in that state, for a model of one process or one rank)."""
    from torch.distributed.tensor import DTensor

    g = torch.Generator().manual_seed(5)
    width = _factory_and_width(cell)[1]
    x, y = torch.randn(C.BATCH, 64, generator=g), torch.randn(C.BATCH, width, generator=g)
    halves = [(C.local_rows(x, r, 2), C.local_rows(y, r, 2)) for r in range(2)]
    model.zero_grad()  # the last training step's grads are no part of the next step
    if world_size > 1:  # each rank its half; FSDP2 averages the grads (each divided by 2, then summed)
        outs = [None, None]
        outs[rank] = _forward_backward(model, cell, *halves[rank])
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        model.zero_grad()
        gathered = [torch.empty_like(outs[rank]) for _ in range(world_size)]
        torch.distributed.all_gather(gathered, outs[rank])
        outs = gathered
    else:  # one copy of the model per half, so that both halves see the same recipe state, as the 2 ranks do
        copies = [copy_model(model) for _ in halves]
        outs = [_forward_backward(m, cell, *h) for m, h in zip(copies, halves)]
        grads = {n: _full(copies[0].get_parameter(n).grad) / 2 + _full(copies[1].get_parameter(n).grad) / 2
                 for n, _ in model.named_parameters()}
    assert not any(isinstance(v, DTensor) for v in grads.values())
    return {"out0": outs[0], "out1": outs[1], **{f"grad/{n}": v for n, v in grads.items()}}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _full_state(model, optimizer, sharded: bool) -> dict[str, torch.Tensor]:
    """Every tensor of the model's and optimizer's full state dicts, by key (on FSDP2, a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=sharded)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    out = {f"model/{k}": v.detach().clone() for k, v in model_state.items() if isinstance(v, torch.Tensor)}
    for key, state in optim_state["state"].items():
        for field, value in state.items():
            out[f"optim/{key}/{field}"] = torch.as_tensor(value).detach().clone()
    return out


def _save(model, optimizer, directory: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)


def _load(model, optimizer, directory: str, *, checked: bool = False) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import refops.distributed

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    (refops.distributed.load if checked else dcp.load)(state, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _source(cell, world_size: int, rank: int, directory: str) -> dict:
    model, optimizer = _build(cell, world_size, C.SEED)
    _train(model, optimizer, cell, rank, world_size)
    _save(model, optimizer, directory)
    return {"state": _full_state(model, optimizer, bool(world_size)), "next": _next_step(model, cell, rank, world_size)}


def _loaded_target(cell, world_size: int, directory: str, *, on_meta: bool = False, checked: bool = False):
    """A freshly built model and optimizer (another seed, never ran a forward) that loaded ``directory``
    (``checked``: through ``refops.distributed.load``)."""
    model, optimizer = _build(cell, world_size, C.SEED + 1, on_meta=on_meta)
    _load(model, optimizer, directory, checked=checked)
    return model, optimizer


def _target(cell, world_size: int, rank: int, directory: str, *, on_meta: bool = False,
            checked: bool = False) -> dict:
    model, optimizer = _loaded_target(cell, world_size, directory, on_meta=on_meta, checked=checked)
    copy_model = copy.deepcopy if world_size == 0 else lambda _: _loaded_target(cell, world_size, directory)[0]
    return {"state": _full_state(model, optimizer, bool(world_size)),
            "next": _next_step(model, cell, rank, world_size, copy_model)}


def _one_process_sources_and_1_to_1(rank, world_size, root):
    out = {}
    for cell in CELLS:
        directory = os.path.join(root, "one", _name(cell))
        out[_name(cell)] = {"source": _source(cell, 0, rank, directory), "1->1": _target(cell, 0, rank, directory),
                            "1->1 checked": _target(cell, 0, rank, directory, checked=True)}
    return out


def _two_ranks_sources_2_to_2_and_1_to_2(rank, world_size, root):
    out = {}
    for cell in CELLS:
        directory = os.path.join(root, "two", _name(cell))
        out[_name(cell)] = {
            "source": _source(cell, world_size, rank, directory),
            "2->2": _target(cell, world_size, rank, directory),
            "1->2": _target(cell, world_size, rank, os.path.join(root, "one", _name(cell))),
            "meta 1->2": _target(cell, world_size, rank, os.path.join(root, "one", _name(cell)), on_meta=True),
            "2->2 checked": _target(cell, world_size, rank, directory, checked=True),
            "1->2 checked": _target(cell, world_size, rank, os.path.join(root, "one", _name(cell)), checked=True),
        }
    return out


def _one_process_2_to_1_and_2_to_mesh1(rank, world_size, root):
    out = {}
    for cell in CELLS:
        directory = os.path.join(root, "two", _name(cell))
        out[_name(cell)] = {"2->1": _target(cell, 0, rank, directory), "2->mesh1": _target(cell, 1, rank, directory),
                            "meta 2->1": _target(cell, 0, rank, directory, on_meta=True),
                            "2->1 checked": _target(cell, 0, rank, directory, checked=True)}
    return out


@pytest.fixture(scope="module")
def runs(cpu_ranks, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("reshard"))
    one = run_on_ranks(_one_process_sources_and_1_to_1, 1, root, backend="gloo", timeout=TIMEOUT_S)[0]
    two = cpu_ranks(_two_ranks_sources_2_to_2_and_1_to_2, root, timeout=TIMEOUT_S)
    back = run_on_ranks(_one_process_2_to_1_and_2_to_mesh1, 1, root, backend="gloo", timeout=TIMEOUT_S)[0]
    return {"one": one, "two": two, "back": back}


def _mismatches(a: dict, b: dict) -> list[str]:
    if a.keys() != b.keys():
        return [f"keys differ: {sorted(set(a) ^ set(b))}"]
    return [k for k in a if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
            or not torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))]


def _source_and_targets(runs, name: str, route: str) -> tuple[dict, list[dict]]:
    """The source run of ``route`` and what each of the target's ranks saw."""
    saved_on_two_ranks = route.split("->")[0].endswith("2")
    source = runs["two"][0][name]["source"] if saved_on_two_ranks else runs["one"][name]["source"]
    if route in ("2->1", "2->mesh1", "meta 2->1", "2->1 checked"):
        return source, [runs["back"][name][route]]
    if route in ("1->1", "1->1 checked"):
        return source, [runs["one"][name][route]]
    return source, [rank[name][route] for rank in runs["two"]]


@pytest.mark.parametrize("route", ROUTES + CHECKED_ROUTES)
@pytest.mark.parametrize("cell", CELLS, ids=_name)
def test_dcp_reshards_bit_exactly_with_optimizer_state(runs, route, cell):
    name = _name(cell)
    source, targets = _source_and_targets(runs, name, route)
    assert any(k.startswith("optim/") for k in source["state"])  # Adam's state travels too
    if cell[1] == "quantized":  # the quantized weights travel as row blocks
        assert any(v.dtype == torch.uint8 and v.dim() == 2 for k, v in source["state"].items() if k.endswith("weight"))
    for seen in targets:
        assert _mismatches(source["state"], seen["state"]) == [], route
        assert _mismatches(source["next"], seen["next"]) == [], route


def test_one_process_and_two_ranks_store_one_form():
    """Unit-level twin of the matrix: a quantized weight's single-process entry is its row blocks."""
    from refops.sharding import is_row_blocks

    with te.quantized_model_init(recipe=make_recipe("mxfp8")):
        model = te.ops.Sequential(te.ops.Linear(64, 64))
    entry = model.state_dict()["0.basic_ops.0.weight"]
    assert is_row_blocks(entry) and entry.shape[0] == 64 // 32
