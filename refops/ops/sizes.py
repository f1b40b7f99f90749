"""Sizes given to op constructors: positive ints, or an error naming the op and the argument.

``Linear(8.5, 4)`` must not reach ``torch.empty`` (whose message names neither),
and ``Linear(True, 4)`` must not pass as a size of one: ``bool`` is an ``int``
subclass in Python, so it is refused explicitly. Integer-like values (NumPy
ints) are accepted and returned as ``int``.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["check_size"]


def check_size(op_name: str, name: str, value: Any) -> int:
    """``value`` as a positive ``int``; ``TypeError`` (not an integer) or ``ValueError`` (not positive)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op_name}: {name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{op_name}: {name} must be positive (got {value})")
    return int(value)
