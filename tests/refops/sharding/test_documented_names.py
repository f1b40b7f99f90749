"""The names the docs documented under ``refops.distributed`` before the sharding layer still import, and are the
objects of their new homes."""

from __future__ import annotations


def test_documented_distributed_names_are_the_new_homes():
    from refops import ops, sharding
    from refops.distributed import collectives, fsdp
    from refops.ops import tensor_parallel_gather

    assert fsdp.reset_parameter_owners is sharding.reset_parameter_owners
    assert fsdp.PER_OP_SHARDING_FIX is sharding.PER_OP_SHARDING_FIX
    assert collectives.gather_along_first_dim is tensor_parallel_gather.gather_along_first_dim
    for name in ("all_reduce", "check_process_group", "check_same_shape_across_ranks", "get_group_size",
                 "reduce_scatter_along_first_dim"):
        assert getattr(collectives, name) is getattr(ops.collectives, name), name
