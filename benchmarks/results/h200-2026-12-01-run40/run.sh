#!/bin/bash
# GPU run 40 (2026-12-01): the final tree (kernels of b8169e9, the same as run 36's). First call: the whole
# verification run. Second call, after the fix of the one failing test: the SiTU-GLU tests under xdist, then the fixed
# test alone.
OUT=${1:?output directory}
bash benchmarks/results/gpu_run.sh $OUT
# second call:
export PYTHONPATH=$PWD CUPY_CACHE_DIR=/tmp/cupycache
timeout 150 python3 -m pytest tests/fastpath/test_elementwise_differential.py -q -n 8 -p no:cacheprovider --tb=short \
    -k "situglu" 2>&1 | tail -n 3
timeout 60 python3 -m pytest tests/fastpath/test_elementwise_differential.py -q -p no:cacheprovider -k large_bf16 2>&1 \
    | tail -n 2
# third call, after the two recorders became one (record_launches, commit after 3486817): the whole elementwise file.
timeout 200 python3 -m pytest tests/fastpath/test_elementwise_differential.py -q -n 16 -p no:cacheprovider --tb=short \
    2>&1 | tail -n 2
