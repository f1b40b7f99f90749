"""``run_on_ranks``: results in rank order, failures and hangs reported with each rank's traceback, in bounded time."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from refops.distributed import RankFailure, run_on_ranks


def _sum_of_ranks(rank: int, world_size: int, offset: float) -> tuple[int, float]:
    t = torch.tensor([rank + offset])
    dist.all_reduce(t)
    return dist.get_rank(), t.item()


def _rank_one_raises(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    return rank


def _rank_zero_waits_alone(rank: int, world_size: int) -> int:
    if rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins
    return rank


def test_results_come_back_in_rank_order(ranks):
    assert ranks(_sum_of_ranks, 0.5) == [(0, 2.0), (1, 2.0)]


def test_a_failing_rank_is_reported_with_its_traceback():
    with pytest.raises(RankFailure, match=r"(?s)rank 1 ---.*rank one fails on purpose"):
        run_on_ranks(_rank_one_raises, 2, timeout=30)


def test_a_rank_left_waiting_fails_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(RankFailure, match="rank 0"):
        run_on_ranks(_rank_zero_waits_alone, 2, timeout=10)
    assert time.monotonic() - start < 20


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        run_on_ranks(_sum_of_ranks, 0)
    with pytest.raises(ValueError, match="backend must be 'gloo', 'nccl' or None"):
        run_on_ranks(_sum_of_ranks, 2, backend="mpi")


@pytest.mark.parametrize("kwargs, error, message", [
    ({"world_size": "2"}, TypeError, r"^run_on_ranks: world_size must be an int \(the number of ranks, >= 1\), got str '2'"),
    ({"world_size": 2.0}, TypeError, r"^run_on_ranks: world_size must be an int .* got float 2\.0"),
    ({"world_size": True}, TypeError, r"^run_on_ranks: world_size must be an int .* got bool True"),
    ({"world_size": -1}, ValueError, r"^run_on_ranks: world_size must be >= 1 .* got -1"),
    ({"world_size": 2, "backend": "NCCL"}, ValueError, r"^run_on_ranks: backend must be 'gloo', 'nccl' or None"),
    ({"world_size": 2, "timeout": "60"}, TypeError, r"^run_on_ranks: timeout must be a number of seconds, got str"),
    ({"world_size": 2, "timeout": 0}, ValueError, r"^run_on_ranks: timeout must be a finite number of seconds > 0"),
    ({"world_size": 2, "timeout": float("inf")}, ValueError, r"^run_on_ranks: timeout must be a finite number"),
], ids=["str-world-size", "float-world-size", "bool-world-size", "negative-world-size", "backend-case", "str-timeout",
        "zero-timeout", "infinite-timeout"])
def test_every_argument_is_checked_before_a_process_starts(kwargs, error, message):
    """``world_size="2"`` used to fail inside torch's TCPStore; now each argument is named with what was expected."""
    with pytest.raises(error, match=message):
        run_on_ranks(_sum_of_ranks, *(kwargs.pop("world_size"),), 0.5, **kwargs)


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match=r"^run_on_ranks: fn must be a callable fn\(rank, world_size, \*args\), got str"):
        run_on_ranks("_sum_of_ranks", 2)


def _backward_on_a_rank(rank: int, world_size: int) -> float:
    w = torch.ones(3, requires_grad=True)
    (w * 2).sum().backward()
    return w.grad.sum().item()


def test_ranks_run_backward_and_see_each_other_at_once():
    """Backward runs in a forked rank (the parent has not used CUDA), and every rank has joined before any runs."""
    if torch.cuda.is_initialized():
        pytest.skip("forked ranks cannot run backward after the parent used CUDA")
    assert run_on_ranks(_backward_on_a_rank, 2, timeout=30) == [6.0, 6.0]
