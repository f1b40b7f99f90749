"""Field checks that every recipe runs at construction: a wrong type or value is an error naming the field."""

from __future__ import annotations

import numbers

__all__ = ["FieldChecks"]


class FieldChecks:
    """Mixin for the recipe dataclasses: integer and flag fields, checked and normalized in ``__post_init__``."""

    def _check_int(self, name: str, minimum: int) -> None:
        """Field ``name`` must be an integer (not a bool) >= ``minimum``; stored as a plain int."""
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{type(self).__name__}: {name} must be an int, got {value!r} ({type(value).__name__})")
        if value < minimum:
            raise ValueError(f"{type(self).__name__}: {name} must be >= {minimum}, got {value}")
        setattr(self, name, int(value))

    def _check_bools(self, *names: str) -> None:
        """Flags must be real bools: a string such as ``"0"`` would otherwise read as True."""
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{type(self).__name__}: {name} must be a bool, got {value!r} ({type(value).__name__})")
