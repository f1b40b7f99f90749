"""Distributed support: launching ranks for tests and demos, and the communication helpers the
tensor-parallel ops and FSDP2 integration use. Only ``torch.distributed`` communicates."""

from .launch import RankFailure, run_on_ranks

__all__ = ["RankFailure", "run_on_ranks"]
