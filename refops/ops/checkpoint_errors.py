"""The error of a checkpoint that does not fit the model it is loaded into, and where a distributed load is checked.

:class:`CheckpointMismatchError` is a ``ValueError``: an op's extra state that does not fit it
(:func:`refops.ops.extra_state.load_extra_state`) and a distributed checkpoint of another recipe or form
(:mod:`refops.distributed.checkpoint`, which checks every op before ``torch.distributed.checkpoint`` writes any
tensor) raise it. :data:`DCP_CHECK` is the sentence that names that check, for the errors raised after DCP has
already copied plain tensors into the target.
"""

from __future__ import annotations

__all__ = ["CheckpointMismatchError", "DCP_CHECK"]


class CheckpointMismatchError(ValueError):
    """A checkpoint saved by another op, under another recipe, or in another state-dict form than the target's."""


#: Names the refops load that refuses a distributed checkpoint before anything is written.
DCP_CHECK = (
    "if this is a torch.distributed.checkpoint load, dcp.load has already copied the checkpoint's plain tensors "
    "(norms, biases, optimizer state) into the model: refops.distributed.load(state_dict, checkpoint_id=...) (or "
    "dcp.load(..., planner=refops.distributed.RecipeCheckingLoadPlanner(checkpoint_id))) checks every op first and "
    "refuses before any tensor is written"
)
