"""``run_on_ranks``: run one function on W local processes joined in a ``torch.distributed`` group.

Tests and the CLI demo use it. On the CPU the ranks are forked (about 0.3 s a start against about
25 s for spawn on 2 cores, since a spawned child imports torch again) and join a gloo group on
127.0.0.1 through a TCP store that the parent holds, so no port is guessed. With
``backend="nccl"`` the ranks are spawned (CUDA cannot be forked) and rank r uses ``cuda:r``.
Every rank reports back through a pipe; the parent waits at most ``timeout`` seconds in all and
then kills what is left, so a hung collective fails the caller instead of hanging it.
"""

from __future__ import annotations

import datetime
import math
import multiprocessing
import numbers
import os
import pickle
import time
import traceback
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

__all__ = ["RankFailure", "run_on_ranks"]

START_METHOD_ENV = "REFOPS_DIST_START"


class RankFailure(RuntimeError):
    """One or more ranks raised, died or timed out; the message holds each rank's traceback."""


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, backend: str, port: int,
               args: tuple, conn: Any, timeout_s: float) -> None:
    """A child: join the group, run ``fn(rank, world_size, *args)``, send ``("ok", result)`` or ``("error", tb)``."""
    status: tuple[str, Any]
    try:
        torch.set_num_threads(1)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        # Every rank is connected before any runs: a rank that finished early could otherwise tear the
        # group down while a slower one is still joining it (gloo's "connectFullMesh" failures).
        dist.barrier()
        try:
            status = ("ok", fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent
        status = ("error", traceback.format_exc())
    try:
        # Plain pickle: torch's multiprocessing pickler would share tensor storage through
        # the child's file descriptors, which are gone once the child exits.
        conn.send_bytes(pickle.dumps(status))
    except Exception:  # an unpicklable result is a failure of the caller's function
        conn.send_bytes(pickle.dumps(
            ("error", f"rank {rank}: the result could not be sent back:\n{traceback.format_exc()}")
        ))
    conn.close()


def _check_arguments(fn: Any, world_size: Any, backend: Any, timeout: Any) -> None:
    """Every argument of :func:`run_on_ranks` checked before a process or a store exists, each error naming
    the argument and what was expected (a wrong type would otherwise fail inside torch's TCPStore)."""
    if not callable(fn):
        raise TypeError(f"run_on_ranks: fn must be a callable fn(rank, world_size, *args), got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise TypeError(f"run_on_ranks: world_size must be an int (the number of ranks, >= 1), got "
                        f"{type(world_size).__name__} {world_size!r}")
    if world_size < 1:
        raise ValueError(f"run_on_ranks: world_size must be >= 1 (the number of ranks), got {world_size}")
    if backend is not None and backend not in ("gloo", "nccl"):
        raise ValueError(f"run_on_ranks: backend must be 'gloo', 'nccl' or None (gloo), got {backend!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"run_on_ranks: timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"run_on_ranks: timeout must be a finite number of seconds > 0, got {timeout!r}")


def run_on_ranks(fn: Callable[..., Any], world_size: int = 2, *args: Any, backend: Optional[str] = None,
                 timeout: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return each rank's result, in rank order.

    ``backend``: ``"gloo"`` (default without CUDA) or ``"nccl"``. The start method is fork for gloo and
    spawn for NCCL; ``REFOPS_DIST_START=spawn`` forces spawn (``fn`` and ``args`` must then be picklable).
    Raises :class:`RankFailure` naming every rank that failed, with its traceback, or that did not finish
    within ``timeout`` seconds; a bad argument (``world_size="2"``, a backend name, a timeout that is
    not a positive number) is a ``TypeError``/``ValueError`` naming it before any process starts.
    """
    _check_arguments(fn, world_size, backend, timeout)
    world_size, timeout, backend = int(world_size), float(timeout), backend or "gloo"
    if dist.is_initialized():
        raise RuntimeError("run_on_ranks: call it from a process without a default process group")
    method = os.environ.get(START_METHOD_ENV) or ("spawn" if backend == "nccl" else "fork")
    hint = ""
    if method == "fork" and torch.cuda.is_initialized():
        hint = ("\n(this process had initialized CUDA before forking the ranks: a forked rank can neither use CUDA "
                "nor run autograd's backward. Start the ranks from a process that has not used CUDA, use "
                f"backend='nccl' (spawned ranks), or set {START_METHOD_ENV}=spawn with importable functions)")
    ctx = multiprocessing.get_context(method)
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True,
                          timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    procs, conns = [], []
    for rank in range(world_size):
        parent_end, child_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_rank_main, args=(fn, rank, world_size, backend, store.port, args, child_end,
                                                     timeout), daemon=True)
        proc.start()
        child_end.close()
        procs.append(proc)
        conns.append(parent_end)
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * world_size
    failures: list[str] = []
    for rank, (proc, conn) in enumerate(zip(procs, conns)):
        remaining = max(0.0, deadline - time.monotonic())
        if conn.poll(remaining):
            try:
                kind, payload = pickle.loads(conn.recv_bytes())
            except EOFError:
                kind, payload = "error", "the process exited without reporting"
        else:
            kind, payload = "error", f"no result within {timeout:.0f} s (a hung collective, or a rank that died)"
        if kind == "ok":
            results[rank] = payload
        else:
            failures.append(f"--- rank {rank} ---\n{payload}")
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()) + 5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    del store
    if failures:
        raise RankFailure(f"{len(failures)} of {world_size} ranks failed:\n" + "\n".join(failures) + hint)
    return results
