"""``python -m fastpath.benchmark [--out DIR] [--quick] [--parts ...] [--cases ...]``: see :mod:`.runner`."""

import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m fastpath.benchmark"))
