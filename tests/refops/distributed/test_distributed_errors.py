"""Clear errors for distributed misuse: a process group that is not one, and ranks whose tensors differ in shape.

Before: ``tensor_parallel_group="WORLD"`` failed with ``AttributeError: 'str' object has no attribute 'size'``
deep inside torch, and ranks whose inputs differ in rows failed with gloo's own error, naming neither refops
nor the shapes. Now the op and the argument are named where the mistake is made, and a shape mismatch is a
``ValueError`` on every rank naming the op, the tensor and each rank's shape (one small all-gather of the
shapes before the collective).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import refops as te

from _tp_reference import rank_device

GROUP_MESSAGE = r"expected a torch.distributed ProcessGroup or None \(the default group\), got str 'WORLD'"


@pytest.mark.parametrize("build, owner", [
    (lambda: te.ops.Linear(32, 32, tensor_parallel_mode="column", tensor_parallel_group="WORLD"),
     "Linear: tensor_parallel_group"),
    (lambda: te.ops.BasicLinear(32, 32, tensor_parallel_mode="row", tensor_parallel_group="WORLD"),
     "BasicLinear: tensor_parallel_group"),
    (lambda: te.ops.Linear(32, 32, tensor_parallel_group="WORLD"), "Linear: tensor_parallel_group"),
    (lambda: te.ops.Bias(32, tensor_parallel=True, tensor_parallel_group="WORLD"), "Bias: tensor_parallel_group"),
    (lambda: te.ops.AllGather(process_group="WORLD"), "AllGather: process_group"),
    (lambda: te.ops.ReduceScatter(process_group="WORLD"), "ReduceScatter: process_group"),
    (lambda: te.ops.AllReduce(process_group="WORLD"), "AllReduce: process_group"),
], ids=["Linear-column", "BasicLinear-row", "Linear-no-mode", "Bias", "AllGather", "ReduceScatter", "AllReduce"])
def test_a_process_group_that_is_not_one_is_named_at_construction(build, owner):
    """Without a process group too: the argument is wrong whether or not torch.distributed is initialized."""
    with pytest.raises(TypeError, match=rf"^{owner}: {GROUP_MESSAGE} \(pass torch.distributed.group.WORLD or None"):
        build()


def _construct_with_a_string_group(rank, world_size):
    try:
        te.ops.Linear(32, 64, tensor_parallel_mode="column", tensor_parallel_group="WORLD")
    except TypeError as error:
        message = str(error)
    else:
        message = "no error"
    linear = te.ops.Linear(32, 64, tensor_parallel_mode="column", tensor_parallel_group=dist.group.WORLD)
    return message, tuple(linear.weight.shape)


def test_a_string_group_is_refused_under_a_process_group_and_the_real_group_works(ranks):
    for message, shape in ranks(_construct_with_a_string_group):
        assert message.startswith("Linear: tensor_parallel_group: expected a torch.distributed ProcessGroup"), message
        assert shape == (32, 32)


def _rows_differ(rank, world_size, device_type, case):
    """Rank 0 passes 16 rows, rank 1 passes 8: every case must raise the same clear error on both ranks."""
    device = rank_device(rank, device_type)
    x = torch.randn(16 if rank == 0 else 8, 32, device=device)
    models = {
        "column-sp": lambda: te.ops.Linear(32, 64, tensor_parallel_mode="column", sequence_parallel=True,
                                           device=device),
        "row": lambda: te.ops.BasicLinear(64, 32, tensor_parallel_mode="row", device=device),
        # Linear's row mode is BasicLinear, Bias, then an AllReduce of the partial products: the AllReduce finds out.
        "linear-row": lambda: te.ops.Linear(64, 32, tensor_parallel_mode="row", device=device),
        "all_gather": lambda: te.ops.AllGather(),
        "reduce_scatter": lambda: te.ops.ReduceScatter(),
        "all_reduce": lambda: te.ops.AllReduce(),
    }
    torch.manual_seed(0)
    model = models[case]()
    try:
        model(x)
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.fixture
def device_type(request) -> str:
    return torch.device(request.config.getoption("--device")).type


@pytest.mark.parametrize("case, prefix", [
    ("column-sp", "BasicLinear (column tensor parallel): the input"),
    ("row", "BasicLinear (row tensor parallel): the input"),
    ("linear-row", "AllReduce: the input"),
    ("all_gather", "AllGather: the input"),
    ("reduce_scatter", "ReduceScatter: the input"),
    ("all_reduce", "AllReduce: the input"),
])
def test_ranks_whose_inputs_differ_in_rows_get_a_clear_error(ranks, device_type, case, prefix):
    for message in ranks(_rows_differ, device_type, case):
        assert message == (f"{prefix}: every rank of the group must pass the same shape, got rank 0: (16, 32), "
                           "rank 1: (8, 32)"), message
