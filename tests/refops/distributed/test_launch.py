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
    with pytest.raises(ValueError, match="backend must be 'gloo' or 'nccl'"):
        run_on_ranks(_sum_of_ranks, 2, backend="mpi")


def _backward_on_a_rank(rank: int, world_size: int) -> float:
    w = torch.ones(3, requires_grad=True)
    (w * 2).sum().backward()
    return w.grad.sum().item()


def test_ranks_run_backward_and_see_each_other_at_once():
    """Backward runs in a forked rank (the parent has not used CUDA), and every rank has joined before any runs."""
    if torch.cuda.is_initialized():
        pytest.skip("forked ranks cannot run backward after the parent used CUDA")
    assert run_on_ranks(_backward_on_a_rank, 2, timeout=30) == [6.0, 6.0]
