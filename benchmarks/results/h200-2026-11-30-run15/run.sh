#!/bin/bash
# GPU run 15: the final tree (run 14's NVFP4 column-wise dequantize and FP8 block footprint taken): smoke check of
# every kernel, the benchmark, memcheck + racecheck over every kernel, the fast-path suite. (The reference suite
# on CUDA is unchanged since run 13, where it passed: refops/ has not changed.)
set -o pipefail
OUT=${1:?output directory}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/times.txt 2>&1
step() { local name=$1; shift; local s=$SECONDS; "$@"; echo "$name: rc=$? $((SECONDS-s)) s" >> $OUT/times.txt; }
F=tests/fastpath
step smoke timeout 100 python3 $F/sanitizer_smoke.py > $OUT/sanitizers.log 2>&1
step bench timeout 100 python3 benchmarks/bench_fastpath.py --out /tmp/bench > $OUT/bench.log 2>&1
tar czf $OUT/bench.tgz -C /tmp/bench .
step memcheck timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $F/sanitizer_smoke.py \
    >> $OUT/sanitizers.log 2>&1
step racecheck timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $F/sanitizer_smoke.py \
    >> $OUT/sanitizers.log 2>&1
step fastpath-tests timeout 110 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short -ra \
    --ignore=$F/test_compile.py > $OUT/fastpath_tests.log 2>&1
grep -E "SUMMARY|checked" $OUT/sanitizers.log; tail -n 1 $OUT/fastpath_tests.log; cat $OUT/times.txt
