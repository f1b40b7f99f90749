#!/bin/bash
# GPU run 12: the one-tile-per-block FP8 cast + transpose and FP8 block quantize variants (make_variants.py:
# _variants/np2, np3, np3h2 first on PYTHONPATH): their FP8 differential tests, then their kernels timed beside
# the tree's, twice in alternation.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
F=tests/fastpath/test_quantize_differential.py
K="quantize_float8 or float8_block or amax"
for v in np2 np3 np3h2; do
    PYTHONPATH=$PWD/_variants/$v:$PWD timeout 120 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short \
        -k "$K" > $OUT/tests_$v.log 2>&1
    echo "$v tests: rc=$? $(tail -n 1 $OUT/tests_$v.log)" | tee -a $OUT/times.txt
done
CASES=("e4m3 row+col" "e5m2 row+col" "float8 block 1x128" "float8 block 128x128")
for v in tree np2 np3 np3h2 tree np2 np3 np3h2; do
    if [ $v = tree ]; then P=$PWD; else P=$PWD/_variants/$v:$PWD; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v --cases "${CASES[@]}" \
        | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
echo "ab: rc=$?" >> $OUT/times.txt
cat $OUT/ab.log
