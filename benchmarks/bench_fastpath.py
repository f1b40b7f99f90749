"""The fast-path benchmark from a source checkout: ``fastpath.benchmark`` with its records in ``benchmarks/results``.

    python benchmarks/bench_fastpath.py [--out benchmarks/results] [--quick] [--parts kernels,pipeline,host]
                                        [--cases SUBSTRING ...]

The benchmark is ``fastpath/benchmark/`` (``python -m fastpath.benchmark``, ``python -m refops bench``): this
script is the name the GPU run scripts and the records use, and writes beside itself by default.
"""

import pathlib
import sys

from fastpath.benchmark import main

if __name__ == "__main__":
    sys.exit(main(prog="bench_fastpath.py", default_out=pathlib.Path(__file__).resolve().parent / "results"))
