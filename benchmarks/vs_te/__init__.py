"""``benchmarks/bench_vs_te.py``'s parts: TransformerEngine against refops's fast path on one GPU.

One concept per module:

* :mod:`vs_te.rows`: what is measured (the rows, the step sizes, the run's plan of items);
* :mod:`vs_te.memory`: how much GPU memory a training-step row needs (both sides alive);
* :mod:`vs_te.budget`: how long a row is expected to take, and the run's time budget;
* :mod:`vs_te.timing`: eager, device and host time of a prepared call;
* :mod:`vs_te.profiling`: kernels, host syncs and host profiles of a call;
* :mod:`vs_te.sides`: loading TE and the fast path, resetting TE's global state between rows;
* :mod:`vs_te.quantizers`: the quantize rows' quantizers of both sides, their bytes, the torch.compile peers;
* :mod:`vs_te.steps`: the training step of both sides, eager and captured as CUDA graphs;
* :mod:`vs_te.runner`: measuring one item into one record;
* :mod:`vs_te.records`: ``vs_te.json`` / ``vs_te.md``, and ``--compare``;
* :mod:`vs_te.cli`: the command line.

The script's docstring (``benchmarks/bench_vs_te.py``) describes the rows and the method.
"""
