"""Quantized weights under FSDP2 (``docs/distributed.md#quantized-weights-under-fsdp2``, case F5), every recipe,
on 2 forked gloo ranks.

A model built inside ``quantized_model_init(recipe)`` (eagerly, or on meta and then ``to_empty`` +
``reset_parameters()``) is root-sharded with ``fully_shard``. Checked per recipe:

* the local shards are ``QuantizedTensor``s of the recipe's class, before and after training (never
  silently dequantized);
* the unsharded weight FSDP2 all-gathers is, bit for bit, the weight a single process gets by quantizing
  the full high-precision value (its bytes and scales); after training, every rank holds the same shared
  scales and the unsharded weight is the concatenation of the shards;
* 3 Adam steps give the single-process quantized losses within the recipe's tolerance
  (``quantization_tols``); MXFP8 and FP8 block scaling have no whole-tensor scale and match to 1e-6;
* shards that cannot stay quantized are a clear error at ``fully_shard`` or the first forward, and shards
  whose scales disagree (delayed scaling with ``reduce_amax=False``) an error at the gather.

Delayed scaling trains with ``autocast(amax_reduction_group=WORLD)`` (the default group, None, is the same
one), which keeps every rank's recipe state equal; its first step runs with the initial scale of 1, where each rank's half-batch gradients
(twice the full-batch ones) round differently in FP8, so it matches a single process within the FP8
tolerance, not exactly.
"""

from __future__ import annotations

import pytest
import torch

from refops.quantization.quantized_tensor import QuantizedTensor
from refops.testing.recipes import make_recipe
from refops.testing.tolerances import quantization_tols

import _fsdp2_cases as C

#: recipe -> (model factory, output features, the weight class)
RECIPES = {
    "fp8_current_scaling": (C.flat, 64, "Float8Tensor"),
    "fp8_delayed_scaling": (C.flat, 64, "Float8Tensor"),
    "mxfp8": (C.flat, 64, "MXFP8Tensor"),
    "fp8_block_scaling": (C.wide, 256, "Float8BlockwiseQTensor"),
    "nvfp4": (C.flat, 64, "NVFP4Tensor"),
}
#: Recipes without a whole-tensor scale: a shard re-quantizes exactly as the full weight would.
BLOCK_LOCAL = ("mxfp8", "fp8_block_scaling")


def _arrays(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {kw: getattr(t, attr) for kw, attr in t._CTOR_TENSORS.items() if getattr(t, attr) is not None}


def _same_bytes(a: QuantizedTensor, b: QuantizedTensor) -> list[str]:
    """Array names whose shapes or bytes differ (empty: bit-identical)."""
    x, y = _arrays(a), _arrays(b)
    if x.keys() != y.keys():
        return [f"usages differ: {sorted(x)} vs {sorted(y)}"]
    return [k for k in x if x[k].shape != y[k].shape
            or not torch.equal(x[k].contiguous().view(torch.uint8), y[k].contiguous().view(torch.uint8))]


def _weights(model) -> list:
    return [m.weight for m in model if hasattr(m, "weight") and m.weight is not None and m.weight.dim() == 2]


def _unsharded_weights(model) -> list[QuantizedTensor]:
    """The weights as FSDP2 all-gathers them for a forward (unshard, copy, reshard: resharding frees them)."""
    model.unshard()
    weights = [w.detach().clone() for w in _weights(model)]
    model.reshard()
    return weights


def _case(rank, world_size, name, route):
    import warnings

    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    factory, out_features, weight_class = RECIPES[name]
    recipe = make_recipe(name)
    single = C.build(factory, recipe=recipe)  # the full weights, quantized by one process
    ref_losses, _, _ = C.reference(factory, recipe=recipe, out_features=out_features)
    if route == "eager":
        model = C.shard(C.build(factory, recipe=recipe), world_size, children=False)
    else:
        model = C.shard(C.build(factory, "meta", recipe=recipe), world_size, children=False)
        model.to_empty(device="cpu")
        C.reset_all(model)
    out = {"local_types": [type(w._local_tensor).__name__ for w in _weights(model)]}
    out["unsharded_vs_single"] = [_same_bytes(u, s) for u, s in zip(_unsharded_weights(model), _weights(single))]
    x, y = C.data(out_features)
    group = torch.distributed.group.WORLD if name == "fp8_delayed_scaling" else None
    losses, _ = C.train(model, C.local_rows(x, rank, world_size), C.local_rows(y, rank, world_size), recipe=recipe,
                        amax_reduction_group=group)
    out["losses"], out["ref_losses"] = C.global_loss(losses), ref_losses
    out["local_types_after"] = [type(w._local_tensor).__name__ for w in _weights(model)]
    unsharded = _unsharded_weights(model)
    shards = [w._local_tensor.dequantize() for w in _weights(model)]
    gathered = []
    for shard in shards:
        parts = [torch.empty_like(shard) for _ in range(world_size)]
        torch.distributed.all_gather(parts, shard)
        gathered.append(torch.cat(parts))
    out["unsharded_is_the_shards"] = all(torch.equal(u.dequantize(), g) for u, g in zip(unsharded, gathered))
    out["unsharded_types"] = [type(u).__name__ for u in unsharded]
    shared = [torch.cat([a.reshape(-1).float() for k, a in sorted(_arrays(w._local_tensor).items())
                         if k in ("fp8_scale_inv", "amax_rowwise", "amax_columnwise")] or [torch.zeros(1)])
              for w in _weights(model)]
    everyone = [[torch.empty_like(s) for _ in range(world_size)] for s in shared]
    for s, parts in zip(shared, everyone):
        torch.distributed.all_gather(parts, s)
    out["shared_scales_agree"] = all(all(torch.equal(p, parts[0]) for p in parts) for parts in everyone)
    out["weight_class"] = weight_class
    return out


def _all_cases(rank, world_size, names):
    results = {}
    for name in names:
        for route in ("eager", "meta"):
            try:
                results[(name, route)] = _case(rank, world_size, name, route)
            except Exception as error:  # noqa: BLE001 - an expected refusal is a result
                results[(name, route)] = {"error": f"{type(error).__name__}: {error}"}
    return results


@pytest.fixture(scope="module")
def results(cpu_ranks):
    return cpu_ranks(_all_cases, list(RECIPES), timeout=300)


@pytest.mark.parametrize("route", ["eager", "meta"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_f5_quantized_weights_stay_quantized_and_train_like_a_single_process(results, name, route):
    for r in results:
        out = r[(name, route)]
        assert "error" not in out, out.get("error")
        weight_class = out["weight_class"]
        assert out["local_types"] == [weight_class] * 2 and out["local_types_after"] == [weight_class] * 2
        assert out["unsharded_types"] == [weight_class] * 2
        assert out["unsharded_vs_single"] == [[], []]  # bytes and scales of quantizing the full weight
        assert out["unsharded_is_the_shards"] and out["shared_scales_agree"]
        tols = {"rtol": 0.0, "atol": 1e-6} if name in BLOCK_LOCAL else quantization_tols(name)
        torch.testing.assert_close(torch.tensor(out["losses"]), torch.tensor(out["ref_losses"]), **tols)


def _delayed_without_amax_reduction(rank, world_size):
    """Delayed scaling with ``reduce_amax=False``: each rank's scales follow its own amaxes ("most_recent", so
    that the first step's own shard amax decides the next scale). (Without a group, autocast reduces over
    the world group, as in TE, and the scales agree.)"""
    from refops.recipe import DelayedScaling, Format

    recipe = DelayedScaling(fp8_format=Format.E4M3, amax_compute_algo="most_recent", reduce_amax=False)
    model = C.shard(C.build(C.flat, recipe=recipe), world_size, children=False)
    x, y = C.data()
    try:
        C.train(model, C.local_rows(x, rank, world_size), C.local_rows(y, rank, world_size), recipe=recipe,
                steps=5)  # the shards' scales part on the third step; the next gather finds out
    except RuntimeError as error:
        return str(error)
    return "no error"


def test_f5_delayed_scaling_shards_with_different_scales_are_an_error_not_a_wrong_weight(cpu_ranks):
    for message in cpu_ranks(_delayed_without_amax_reduction, timeout=60):
        assert message.startswith("Linear (Float8Tensor weight of shape (128, 64)): the shards carry different "
                                  "fp8_scale_inv"), message
        assert "amax_reduction_group" in message


def _misaligned(rank, world_size):
    """FP8 block scaling on the 64-wide model: its shards of 64 rows split 128-row tiles."""
    try:
        C.shard(C.build(C.flat, recipe=make_recipe("fp8_block_scaling")), world_size, children=False)
    except NotImplementedError as error:
        return str(error)
    return "no error"


def test_f5_a_shard_that_would_split_scaling_blocks_is_an_error_at_fully_shard(cpu_ranks):
    for message in cpu_ranks(_misaligned, timeout=60):
        assert "can only be cut at multiples of 128 rows" in message, message
