"""Each thread's quantization state: the ``autocast`` and ``quantized_model_init`` contexts it has open.

The settings in force are those of the innermost open context (the last one entered and not yet left);
with none open, quantization is off. Each context is a *frame* on its thread's stack, and leaving a
context removes its own frame wherever it is (``docs/api/refops.md#threads-and-nesting``):

* in order (the ``with`` statement's way), the frame is the top one and the settings of the one below
  come back, as TE's snapshot-and-restore gives;
* out of order (``ExitStack`` misuse, generators, ``__exit__`` called by hand, or a context left on
  another thread than the one that entered it), the frame is taken out of the middle of its stack,
  the innermost frame's settings stay in force, and the frame above inherits what the removed one
  would have restored. Once every context is closed the thread is as it was before any of them:
  nothing can stay switched on, which a restored snapshot cannot promise (an interleaved exit
  restores a snapshot taken while another context was open).

The state is per thread, as ``torch.autocast``'s is, so two threads never see each other's recipe. A
lock guards the stacks (a context may be left on another thread than its own); it is never held while
scales update, since with amax reduction an update is a collective.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Optional

__all__ = ["AutocastFrame", "InitFrame", "ThreadState", "LOCK", "current", "push", "remove"]

#: Guards every stack and frame change: a context left on another thread changes its owner's stack.
LOCK = threading.Lock()


@dataclasses.dataclass(eq=False)
class AutocastFrame:
    """One open ``autocast``: its settings, and whether a module had claimed the backward update before it."""

    enabled: bool
    calibrating: bool
    recipe: Any
    amax_reduction_group: Any
    graph: bool
    claimed_before: bool = False


@dataclasses.dataclass(eq=False)
class InitFrame:
    """One open ``quantized_model_init``."""

    enabled: bool
    recipe: Any
    preserve_high_precision_init_val: bool


@dataclasses.dataclass(eq=False)
class ThreadState:
    """One thread's open contexts, and the delayed-scaling states its autocasts ran."""

    autocasts: list = dataclasses.field(default_factory=list)
    inits: list = dataclasses.field(default_factory=list)
    #: The frame that opened the current outermost span: its settings decide the forward update when the
    #: last frame of the span leaves, whichever leaves last (``docs/api/refops.md#threads-and-nesting``).
    opener: Optional[AutocastFrame] = None
    first_module_claimed: bool = False
    # Delayed-scaling states of the ops that ran under autocast, in first-use order: the forward ones since
    # the last forward update; the backward ones of the current outermost autocast (each autocast gets its
    # own set, which its first module's backward updates: interleaved microbatches F1 F2 B1 B2 update at B1
    # and at B2, one history row each). Only these are updated: the set is what the program ran, the same on
    # every rank, whatever the garbage collector has freed (with amax reduction each state's update is a
    # collective, so two ranks must visit the same states in the same order). Held strongly until their
    # update, so no collection can change the set in between.
    forward_states: dict = dataclasses.field(default_factory=dict)
    backward_states: dict = dataclasses.field(default_factory=dict)

    # The settings in force: the innermost frame's, or off.
    @property
    def depth(self) -> int:
        return len(self.autocasts)

    @property
    def enabled(self) -> bool:
        return bool(self.autocasts) and self.autocasts[-1].enabled

    @property
    def calibrating(self) -> bool:
        return bool(self.autocasts) and self.autocasts[-1].calibrating

    @property
    def recipe(self) -> Any:
        return self.autocasts[-1].recipe if self.enabled else None

    @property
    def amax_reduction_group(self) -> Any:
        return self.autocasts[-1].amax_reduction_group if self.autocasts else None

    @property
    def parameters_enabled(self) -> bool:
        return bool(self.inits) and self.inits[-1].enabled

    @property
    def parameters_recipe(self) -> Any:
        return self.inits[-1].recipe if self.parameters_enabled else None

    @property
    def high_precision_init_val(self) -> bool:
        return bool(self.inits) and self.inits[-1].preserve_high_precision_init_val


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.state = ThreadState()


_THREADS = _PerThread()


def current() -> ThreadState:
    """The calling thread's state."""
    return _THREADS.state


def push(stack: list, frame: Any) -> None:
    """Open ``frame`` on ``stack`` (call under ``LOCK``)."""
    stack.append(frame)


def remove(stack: list, frame: Any) -> Optional[Any]:
    """Take ``frame`` out of ``stack`` wherever it is (call under ``LOCK``); return the frame that was above it
    (None when it was the innermost), which inherits what the removed frame would have restored."""
    index = next(i for i, f in enumerate(stack) if f is frame)
    del stack[index]
    return stack[index] if index < len(stack) else None
