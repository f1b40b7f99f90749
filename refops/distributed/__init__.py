"""Distributed support at the top of the stack: launching ranks for tests and demos (:mod:`.launch`), the FSDP2
demo of ``refops trace --distributed`` (:mod:`.demo`), distributed checkpoints checked before anything loads
(:mod:`.checkpoint`: :func:`load`, :class:`RecipeCheckingLoadPlanner`), and the documented names of the collectives
and FSDP2 helpers (:mod:`.collectives`, :mod:`.fsdp`), which live below: the collectives under the ops that use them
(``refops.ops.collectives``), the quantized cuts, gather and checkpoints in the sharding layer
(``refops.sharding``). Only ``torch.distributed`` communicates."""

from .checkpoint import CheckpointMismatchError, RecipeCheckingLoadPlanner, check_checkpoint, load
from .launch import RankFailure, run_on_ranks

__all__ = ["CheckpointMismatchError", "RankFailure", "RecipeCheckingLoadPlanner", "check_checkpoint", "load",
           "run_on_ranks"]
