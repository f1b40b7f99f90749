#!/bin/bash
# GPU run 20, second call: the tree's norm.cu with row_sums' partials summed by code unrolled per warp count
# (sum_partials), checked (norm differential tests; memcheck and racecheck over the norm tests on the widths that
# use 4, 8 and 16 warps a row) and timed beside the previous norm.cu (_variants/base: the tree before the change).
# Usage: bash benchmarks/results/h200-2026-11-30-run20/run_b.sh OUT, with _variants carried.
set -o pipefail
OUT=${1:?output directory}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROOT=$PWD
F=tests/fastpath/test_norms_differential.py
timeout 110 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short > $OUT/norm_tests.log 2>&1
echo "tests: rc=$? $(tail -n 1 $OUT/norm_tests.log)"
for v in base tree base tree; do
    if [ $v = tree ]; then P=$ROOT; else P=$ROOT/_variants/$v:$ROOT; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 60 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v \
        --cases "LayerNorm" "RMSNorm" "L2Normalization" | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
cat $OUT/ab.log
for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest $F -q -p no:xdist \
        -p no:cacheprovider -k "4096 or 8192" > $OUT/$tool.log 2>&1
    echo "$tool: rc=$? $(grep -E 'SUMMARY' $OUT/$tool.log) $(grep -E 'passed|failed' $OUT/$tool.log | tail -n 1)"
done
