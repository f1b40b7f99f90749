"""Distributed support at the top of the stack: launching ranks for tests and demos (:mod:`.launch`), the FSDP2
demo of ``refops trace --distributed`` (:mod:`.demo`), and the documented names of the collectives and FSDP2
helpers (:mod:`.collectives`, :mod:`.fsdp`), which live below: the collectives under the ops that use them
(``refops.ops.collectives``), the quantized cuts, gather and checkpoints in the sharding layer
(``refops.sharding``). Only ``torch.distributed`` communicates."""

from .launch import RankFailure, run_on_ranks

__all__ = ["RankFailure", "run_on_ranks"]
