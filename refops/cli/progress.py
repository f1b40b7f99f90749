"""A progress bar for the long commands (``check``, ``conformance``), drawn only on a terminal.

The bar goes to stderr and is drawn only when stderr is a TTY: redirected output
(``python -m refops check > log``) holds the results, not a line rewritten with ``\\r``
per case.
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO

__all__ = ["Progress"]


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # a closed stream
        return False


class Progress:
    """``[#####     ] 3/10 label``, rewritten in place on ``stream`` (default: stderr) when it is a TTY.

    Args:
        total: how many steps the bar counts.
        stream: where to draw (looked up when the bar is made, so a replaced ``sys.stderr`` is honoured).
        width: the bar's width in characters.
    """

    def __init__(self, total: int, *, stream: Optional[TextIO] = None, width: int = 20) -> None:
        self.total = max(int(total), 0)
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.done = 0
        self.enabled = self.total > 0 and _is_tty(self.stream)
        self._drawn = False

    def step(self, label: str = "") -> None:
        """Count one step and redraw (nothing when the stream is not a TTY)."""
        self.done = min(self.done + 1, self.total)
        if not self.enabled:
            return
        bar = "#" * (self.width * self.done // self.total)
        line = f"[{bar:<{self.width}}] {self.done}/{self.total} {label}"
        print(f"\r{line[:110]:<110}", end="", file=self.stream, flush=True)
        self._drawn = True

    def close(self) -> None:
        """End the bar's line (so the next output starts on a fresh one)."""
        if self._drawn:
            print(file=self.stream, flush=True)
            self._drawn = False
