#!/bin/bash
# GPU run 11: the verification of the tree with the shared kernel headers (gpu_run.sh), then the access-pattern
# ceilings (benchmarks/diag_access_patterns.py) and the cache-hint variants (make_variants.py: _variants/hint1,
# _variants/hint2 first on PYTHONPATH) timed beside the tree on the kernels below their floors.
set -o pipefail
OUT=${1:?output directory}
bash benchmarks/results/gpu_run.sh $OUT
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
timeout 90 python3 benchmarks/diag_access_patterns.py > $OUT/diag.log 2>&1; echo "diag: rc=$?" >> $OUT/times.txt
CASES=("e4m3 row+col" "e5m2 row+col" "float8 block 1x128" "float8 block 128x128" "nvfp4 col -> bf16" "LayerNorm" "gelu forward")
for v in tree hint1 hint2 tree hint1 hint2; do
    if [ $v = tree ]; then P=$PWD; else P=$PWD/_variants/$v:$PWD; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v --cases "${CASES[@]}" \
        | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
echo "ab: rc=$?" >> $OUT/times.txt
cat $OUT/diag.log; grep -E "===|GB/s" $OUT/ab.log | head -80
