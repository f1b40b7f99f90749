"""The fast path's benchmark: its kernels against a device-to-device copy, a pipeline, host overhead.

Run it with ``python -m fastpath.benchmark`` (``--help`` for the options), ``python -m refops bench`` (which
starts that module in a subprocess: ``refops`` never imports this package) or, in a source checkout,
``python benchmarks/bench_fastpath.py``. The methodology is ``docs/benchmarks.md``'s.

Unlike the kernels of ``fastpath``, which use only ``refops.kernels`` (and the layouts and formats), the
benchmark is a program on top of both packages: its pipeline part runs refops' ops on this backend.

* :mod:`.runner`: the command line and the run;
* :mod:`.kernel_cases`: part (a), every kernel on one large tensor;
* :mod:`.pipeline`: parts (b) and (c), a pipeline's device time per step and host time per forward;
* :mod:`.timing`: CUDA-event timing and the bytes a call moves; :mod:`.report`: JSON, Markdown, roofline.
"""

from .runner import main

__all__ = ["main"]
