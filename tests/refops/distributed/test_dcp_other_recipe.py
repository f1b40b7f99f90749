"""A DCP checkpoint of another recipe's quantized weights is refused by refops, naming the op (#38, item 1).

Saved and loaded in one process (a gloo group of one) with the reshard matrix's helpers. Since an op's extra state
is bytes, DCP no longer stops at a delayed-scaling state of another size, and the load reaches refops, which refuses
weights stored by another quantizer, naming the op and the parameter. Pairs whose row blocks have the same shape are the
ones DCP lets through (per-tensor FP8 under delayed and current scaling; NVFP4 and NVFP4 4over6); for the others
torch's planner refuses on the shapes before any refops code runs
(``docs/distributed.md#extra-state-in-distributed-checkpoints``). This is plain ``dcp.load``; ``refops.distributed.load``
refuses every pair before anything is written (``test_dcp_load_checked.py``), and the error here names it.
"""

from __future__ import annotations

import os

import pytest

from refops.distributed import run_on_ranks

import test_dcp_reshard as R

PAIRS = [("fp8_delayed_scaling", "fp8_current_scaling"), ("fp8_current_scaling", "fp8_delayed_scaling"),
         ("nvfp4", "nvfp4_4over6")]


def _load_other_recipes(rank, world_size, root):
    out = {}
    for saved, built in PAIRS:
        directory = os.path.join(root, saved)
        source, optimizer = R._build((saved, "quantized"), 0, R.C.SEED)
        R._train(source, optimizer, (saved, "quantized"), rank, 0)
        R._save(source, optimizer, directory)
        target, target_optimizer = R._build((built, "quantized"), 0, R.C.SEED + 1)
        # The first get_state_dict initializes the optimizer's state with a step of lr 0: the weights' values stay,
        # but an NVFP4 weight re-derives its column-wise copy from its stored (row-wise) value, whose bytes differ
        # from the copy quantized at init from the initial values. Measure after it.
        R._full_state(target, target_optimizer, False)
        before = R._full_state(target, target_optimizer, False)
        try:
            R._load(target, target_optimizer, directory)
            error = None
        except RuntimeError as caught:
            error = str(caught)
        out[f"{saved}->{built}"] = {"error": error,
                                    "changed": R._mismatches(before, R._full_state(target, target_optimizer, False))}
    return out


@pytest.fixture(scope="module")
def loads(cpu_ranks, tmp_path_factory):
    return run_on_ranks(_load_other_recipes, 1, str(tmp_path_factory.mktemp("other")), backend="gloo",
                        timeout=R.TIMEOUT_S)[0]


@pytest.mark.parametrize("pair", PAIRS, ids="->".join)
def test_another_recipes_checkpoint_is_refops_error_naming_the_op(loads, pair):
    error = loads["->".join(pair)]["error"]
    assert error is not None, "the checkpoint of another recipe loaded"
    assert "BasicLinear (1.basic_ops.0.): parameter 'weight'" in error
    assert "another recipe" in error and "nothing of this op was loaded" in error
    assert "refops.distributed.load" in error  # the refops load that checks before DCP writes anything


@pytest.mark.parametrize("pair", PAIRS, ids="->".join)
def test_the_ops_that_refuse_keep_their_quantized_weights(loads, pair):
    """dcp.load itself copies plain tensors (norms, biases, Adam's moments) into the target in place before any
    refops code runs; the quantized weights are decoded by refops, which refuses them whole."""
    changed = loads["->".join(pair)]["changed"]
    assert not [key for key in changed if key in ("model/1.basic_ops.0.weight", "model/3.basic_ops.0.weight")]
