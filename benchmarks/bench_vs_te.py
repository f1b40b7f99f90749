"""TransformerEngine and refops's fast path side by side on one GPU: same inputs, same work, one run.

    python benchmarks/bench_vs_te.py [--out OUTDIR] [--rows KEY,...] [--sizes 8192,2048,32768,large]
                                     [--modes eager,graphed] [--budget-s 300] [--reps 20] [--size 8192]
                                     [--tokens 8192 --hidden 4096 --ffn 16384] [--no-kernels] [--profile]
                                     [--host-profile] [--te-block-graphs] [--plan]
    python benchmarks/bench_vs_te.py --compare BEFORE/vs_te.json AFTER/vs_te.json

Rows (``--rows`` takes their keys, or substrings of them):

* quantize rows: one ``size x size`` bf16 tensor quantized row-wise and column-wise by each side's quantizer
  object (``quantizer.quantize(x)``): FP8 current scaling and delayed scaling (E4M3), FP8 block scaling 1x128
  and 128x128 (E4M3, power-of-two scales). refops: ``refops.quantization``'s ``Float8CurrentScalingQuantizer``,
  ``Float8Quantizer``, ``Float8BlockQuantizer``, with ``refops.use_backend("fastpath")``; TE: the quantizer of
  the same class and options (``refops.testing.transformer_engine.te_quantizer``). Before timing, both sides'
  data and scale bytes are compared (the ``same_bytes`` key). MXFP8 and NVFP4 have no TE kernel on sm_90 (TE
  needs compute capability 10.0), so their rows compare refops with a ``torch.compile``'d plain-torch
  formulation that produces the same bytes (asserted: ``peers.mxfp8`` and ``nvfp4_vs_compile.peer``); the
  ``te_ms`` of those rows is that peer's time and their ``baseline`` key says so.
* training-step rows: ``Sequential(Linear(hidden, ffn), GELU(), Linear(ffn, hidden))`` in bf16 with biases, one
  forward (inside ``autocast(recipe=...)``; none for the bf16 row) and one backward with a fixed ``dy``, the
  input requiring grad, every grad set to None before the step, no optimizer. TE: ``te.ops.Sequential(
  te.ops.Linear, te.ops.GELU, te.ops.Linear)`` under ``te.autocast`` (``candidate_context`` of
  ``refops.testing.transformer_engine``); refops: ``refops.ops.Sequential(refops.ops.Linear, refops.ops.GELU,
  refops.ops.Linear)`` under ``refops.autocast``, fast-path backend. Both sides hold the same parameter values
  (``copy_values``) and get the same ``x`` and ``dy``; the SQNR of refops's output and input grad against TE's
  is recorded (``sqnr_y_db``, ``sqnr_dx_db``). Recipes: refops' default ``DelayedScaling()``,
  ``Float8CurrentScaling()``, ``Float8BlockScaling()``, and TE's with the same settings (``te_recipe``).

  Sizes (``--sizes``, issue #39 item 6; ``vs_te.rows.STEP_SIZES``): 8192, 2048 and 32768 tokens at hidden 4096 /
  ffn 16384, and ``large``, hidden 8192 / ffn 32768 at 8192 tokens (about 33 GiB with both sides' graphs alive by
  the upper estimate of ``vs_te.memory``: half an 80 GB H100; at 32768 tokens it would need 88 GiB). ``--tokens``
  / ``--hidden`` / ``--ffn`` give one size of one's own instead. A row whose estimate exceeds the GPU's free
  memory is recorded as skipped, not run.

  Modes (``--modes``, item 5): ``eager``, and ``graphed``: both sides captured as CUDA graphs, TE by
  ``transformer_engine.pytorch.make_graphed_callables(model, (x,), enabled=, recipe=)`` with its replays inside
  ``te.autocast`` (as TE's CUDA-graph tests call it), refops by ``refops.make_graphed_callables`` (the same
  names); the replays are timed as the eager calls are. A side that cannot be captured is recorded with the
  reason: refops refuses delayed scaling (``docs/cuda-graphs.md``); TE's te.ops under Float8BlockScaling is not
  captured, since TE's own CUDA-graph tests skip it as unsupported (``--te-block-graphs`` tries it).

Every time is the median of ``--reps`` CUDA-event intervals between consecutive calls after warm-up:

* ``te_ms`` / ``refops_ms`` (the headline, "eager"): calls enqueued back to back on an idle GPU, as a training
  loop runs them. When the host takes longer to enqueue a call than the GPU takes to run it, this is host time.
* ``*_device_ms``: the same calls (at most 5 eager training steps) enqueued behind a GPU spin
  (``torch.cuda._sleep``) long enough for the host to queue all of them, so the intervals are device time without
  host gaps. A call that synchronizes the host with the device (``cudaStreamSynchronize``, a blocking copy) drains
  the queue: its device time stays eager.
* ``*_host_ms``: host wall time per call (no synchronization inside the loop).
* with ``--host-profile`` (step rows): ``*_host_call_ms`` (median, min, max) and ``*_host_fwd_ms`` /
  ``*_host_bwd_ms``, the host time of each call started on an idle GPU, forward and backward apart; and a CPU-only
  ``torch.profiler`` table by op per side (``host_profile/<item>_<side>.txt``).

Each row also gets achieved bandwidth (quantize rows: bytes read + written, counted once for both sides, over
the time) or TFLOP/s (training rows: 6 GEMMs of ``2 tokens hidden ffn`` FLOP). With ``--kernels`` (default) one
call per side runs under ``torch.profiler``: the kernels it launched (``kernels/<item>_<side>.txt``), their
count and the host-device synchronizations (``*_kernels``, ``*_syncs``), and refops's fast-path launches
counted in Python (``refops_fastpath_launches``).

Time budget (``--budget-s``, default 300 s, 0 for none; ``vs_te.budget``): a row starts only when its expected
time fits in what is left, the others are recorded as not run; the records are rewritten after every row. The
default run (every row, every size, both modes: 6 quantize rows and 32 step rows) is expected to take about
250 s on an H100 (290 s with ``--host-profile``; ``--plan`` prints each row's estimate), and the default budget
caps it at 5 minutes. The estimate's basis is in ``vs_te.budget``: the 2026-12-05 record's step and host times,
run 47's compile times, and the 180 s in which ``perf_verify.sh`` ran the 10 rows of 2026-12-05; each row's
actual seconds are now recorded (``row_s``) to refine it.

Records: ``OUTDIR/vs_te.json`` (a list of rows: ``work``, ``te_ms``, ``refops_ms``, ``ratio`` = refops_ms /
te_ms, then ``key``, ``baseline``, ``id``, ``mode``, and the extra keys above; ``te_ms`` and ``ratio`` are null,
with ``te_skipped`` saying why, where the baseline cannot run), ``OUTDIR/vs_te_meta.json`` (the run: versions,
sizes, budget, the rows not run) and ``OUTDIR/vs_te.md`` (a markdown table of the rows, then the step rows' ratio
by size, eager / graphed). Without a GPU the script says why and exits 0; without TransformerEngine the TE
columns are skipped with the import error as the reason.

TE's objects come from the oracle's adapters (``refops.testing.transformer_engine``): the quantizer, the recipe,
the autocast, the parameter copy and the quantized arrays read the same way as in ``python -m refops
conformance``. The parts live in ``benchmarks/vs_te/`` (one concept per module); this file is the entry point
and keeps their names importable from it.
"""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # vs_te/, peers.py and nvfp4_vs_compile.py beside this script

from vs_te.cli import build_plan, main, parse_args, plan_text, run_plan  # noqa: E402,F401  (first: the budget's clock)
from refops.testing import sqnr_db  # noqa: E402,F401,I001  (the SQNR of the records, and of the tests)
from vs_te.budget import Budget, estimate_s, plan_seconds  # noqa: E402,F401
from vs_te.memory import step_memory_bytes  # noqa: E402,F401
from vs_te.quantizers import (  # noqa: E402,F401
    compare_bytes,
    compile_peer as _compile_peer,
    quantized_arrays,
    refops_peer_outputs,
    refops_quantizer,
    te_quantizer,
)
from vs_te.records import (  # noqa: E402,F401
    RECORD_KEYS,
    compare_table,
    make_record,
    markdown_table,
    ratio_by_size,
    throughput,
    write_records,
)
from vs_te.rows import (  # noqa: E402,F401
    ROWS,
    STEP_SIZES,
    Item,
    Row,
    Sizes,
    make_plan,
    select_modes,
    select_rows,
    select_sizes,
    step_flops,
)
from vs_te.sides import load_refops_fastpath, load_te  # noqa: E402,F401
from vs_te.steps import (  # noqa: E402,F401
    make_step,
    parameter_values as _parameter_values,
    refops_context,
    refops_recipe as _refops_recipe,
    te_context,
)

if __name__ == "__main__":
    sys.exit(main())
