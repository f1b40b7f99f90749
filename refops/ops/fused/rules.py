"""Fusion rules as data: a pattern of basic-op classes, named conditions, and how to build the fused op.

A fusion function (``f(ops, *, recipe) -> ops``, the fuser's registry format) is
made from a rule by :meth:`FusionRule.fuse`: it slides over the op list in
forward order and replaces every window that matches a pattern and satisfies
every condition. Ops that are already fused never match a basic-op class, so
rules compose in registration order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from ..op import FusedOperation, FusibleOperation

__all__ = ["Condition", "FusionRule"]

Window = Sequence[FusibleOperation]


@dataclasses.dataclass(frozen=True)
class Condition:
    """A named predicate on a matched window.

    ``holds(window, recipe, previous)`` gets the matched ops (forward order), the
    recipe (None without quantization) and the op just before the window (None
    at the start).
    """

    description: str
    holds: Callable[[Window, Any, Optional[FusibleOperation]], bool]


@dataclasses.dataclass(frozen=True)
class FusionRule:
    """Which windows of basic ops become ``fused_op``, and when.

    ``patterns`` lists alternative class sequences (longest first); an entry may
    be a tuple of classes meaning "any of these".
    """

    fused_op: type[FusedOperation]
    patterns: tuple[tuple[Any, ...], ...]
    conditions: tuple[Condition, ...]
    build: Callable[[Window], FusedOperation]

    def _matching_pattern(
        self, ops: Sequence[FusibleOperation], start: int, recipe: Any, previous: Optional[FusibleOperation]
    ) -> Optional[int]:
        for pattern in self.patterns:
            window = ops[start : start + len(pattern)]
            if len(window) != len(pattern):
                continue
            if not all(isinstance(op, cls) for op, cls in zip(window, pattern)):
                continue
            if all(c.holds(window, recipe, previous) for c in self.conditions):
                return len(pattern)
        return None

    def fuse(self, ops: Sequence[FusibleOperation], *, recipe: Any = None, **unused: Any) -> list[FusibleOperation]:
        """The fusion function: replace every matching window, scanning in forward order."""
        out: list[FusibleOperation] = []
        i = 0
        while i < len(ops):
            length = self._matching_pattern(ops, i, recipe, out[-1] if out else None)
            if length is None:
                out.append(ops[i])
                i += 1
            else:
                out.append(self.build(ops[i : i + length]))
                i += length
        return out

    def describe(self) -> str:
        """One line per pattern and condition (used by the docs)."""
        names = [" + ".join(_class_names(c) for c in pattern) for pattern in self.patterns]
        conditions = "; ".join(c.description for c in self.conditions) or "always"
        return f"{self.fused_op.__name__}: {' | '.join(names)} when {conditions}"


def _class_names(entry: Any) -> str:
    if isinstance(entry, tuple):
        return "(" + "|".join(c.__name__ for c in entry) + ")"
    return entry.__name__
