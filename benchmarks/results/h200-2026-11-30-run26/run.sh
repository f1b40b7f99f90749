#!/bin/bash
# GPU run 26: the tree with nvfp4.cu's e2m1_rne_min3 encoding (the E2M1 code as the minimum of three roundings,
# where a block's scaled values stay below 7). In the tree itself: the whole fast-path suite, memcheck and racecheck
# over the smoke script's NVFP4 cases; then the NVFP4 cases timed twice beside _variants/base (the fastpath/ of the
# commit before, built on the CPU machine with `git archive HEAD fastpath`; carry _variants).
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=$PWD
F=tests/fastpath
s=$SECONDS
timeout 150 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short --ignore=$F/test_compile.py \
    > $OUT/fastpath_tests.log 2>&1
echo "fastpath-tests: rc=$? $((SECONDS-s)) s; $(tail -n 1 $OUT/fastpath_tests.log)"
for tool in memcheck racecheck; do
    s=$SECONDS
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $F/sanitizer_smoke.py nvfp4 \
        >> $OUT/sanitizers.log 2>&1
    echo "$tool: rc=$? $((SECONDS-s)) s"
done
grep -E "SUMMARY|checked" $OUT/sanitizers.log
. benchmarks/results/variants.sh
time_variants $OUT/ab.log '"nvfp4"' tree base tree base
