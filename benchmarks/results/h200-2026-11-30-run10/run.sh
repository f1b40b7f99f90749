#!/bin/bash
# GPU run 10: the final tree's verification and benchmark (bash benchmarks/results/gpu_run.sh: smoke check,
# benchmark, memcheck + racecheck over every kernel, the fast-path suite, the reference suite on CUDA), then a
# LayerNorm-backward variant (_variants/lnbwd/fastpath first on PYTHONPATH): its norm tests, memcheck and
# racecheck over its norm kernels, and its benchmark beside the tree's.
set -o pipefail
OUT=${1:?output directory}
bash benchmarks/results/gpu_run.sh $OUT
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
if [ -d _variants/lnbwd ]; then
    V=$PWD/_variants/lnbwd:$PWD
    F=tests/fastpath
    {
        PYTHONPATH=$V timeout 120 python3 -m pytest $F/test_norms_differential.py -q -n 8 -p no:cacheprovider --tb=short
        echo "variant norm tests: rc=$?"
        PYTHONPATH=$V timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $F/sanitizer_smoke.py Norm
        echo "variant memcheck: rc=$?"
        PYTHONPATH=$V timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $F/sanitizer_smoke.py Norm
        echo "variant racecheck: rc=$?"
        for v in tree variant tree variant; do
            if [ $v = tree ]; then P=$PWD; else P=$V; fi
            echo "=== $v"
            PYTHONPATH=$P python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/v --cases LayerNorm RMSNorm \
                | grep -E "copy:|GB/s"
        done
    } > $OUT/lnbwd_variant.log 2>&1
    grep -E "rc=|passed|failed|===|GB/s" $OUT/lnbwd_variant.log | tail -20
fi
