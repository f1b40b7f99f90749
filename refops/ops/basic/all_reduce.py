"""``AllReduce``: sum the ranks' inputs (backward: the identity)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..collectives import all_reduce
from .communication import CommunicationOperation

__all__ = ["AllReduce"]


class AllReduce(CommunicationOperation):
    """``y = sum over ranks of x`` over ``process_group`` (TE's ``te.ops.AllReduce``).

    A quantized input is dequantized first: the sum is in high precision.
    Backward is the identity: the output is assumed to feed computations that
    every rank repeats identically (as after a row tensor-parallel linear), so
    each rank already holds the full gradient. ``reduce_in_backward`` is stored,
    as in TE, which does not read it either.

    Args:
        process_group: the ``torch.distributed`` group (None: the default group).
        reduce_in_backward: kept for TE compatibility; it changes nothing.
    """

    def __init__(self, process_group: Optional[Any] = None, reduce_in_backward: bool = True) -> None:
        super().__init__(process_group)
        self._reduce_in_backward = reduce_in_backward

    def communicate_forward(self, input_: torch.Tensor) -> torch.Tensor:
        return all_reduce(input_, self.process_group)

    def communicate_backward(self, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output  # see the class docstring
