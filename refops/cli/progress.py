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

    The object is the ``progress(done, total, label)`` callback that the library's runners take
    (``run_check_matrix``, ``run_conformance``): they know the total, the command does not.

    Args:
        stream: where to draw (looked up when the bar is made, so a replaced ``sys.stderr`` is honoured).
        width: the bar's width in characters.
    """

    def __init__(self, *, stream: Optional[TextIO] = None, width: int = 20) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.enabled = _is_tty(self.stream)
        self._drawn = False

    def __call__(self, done: int, total: int, label: str = "") -> None:
        """Redraw at ``done`` of ``total`` steps (nothing when the stream is not a TTY)."""
        if not self.enabled or total <= 0:
            return
        done = min(max(done, 0), total)
        bar = "#" * (self.width * done // total)
        line = f"[{bar:<{self.width}}] {done}/{total} {label}"
        print(f"\r{line[:110]:<110}", end="", file=self.stream, flush=True)
        self._drawn = True

    def close(self) -> None:
        """End the bar's line (so the next output starts on a fresh one)."""
        if self._drawn:
            print(file=self.stream, flush=True)
            self._drawn = False
