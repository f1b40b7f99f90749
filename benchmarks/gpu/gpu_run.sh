#!/bin/bash
# One GPU verification run (device machine, from a copy of the working tree): the fast-path differential
# suite, the reference suite on CUDA, memcheck + racecheck over every kernel, the full benchmark.
# Usage: [MEMCHECK_SHARDS=6 [MEMCHECK_S=360]] [BENCH_ARGS="--parts kernels"] bash benchmarks/gpu/gpu_run.sh OUTDIR
#   MEMCHECK_SHARDS=n: the fast-path suite runs as n shards (REFOPS_TEST_SHARD), each under its own
#   compute-sanitizer memcheck (xdist workers crash the sanitizer), beside the reference suite; without it the
#   fast-path suite runs plainly under xdist. OUTDIR gets at most 8 files.
set -o pipefail
OUT=${1:?output directory}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/times.txt 2>&1
step() { local name=$1; shift; local s=$SECONDS; "$@"; echo "$name: rc=$? $((SECONDS-s)) s" >> $OUT/times.txt; }
F=tests/fastpath
# The smoke script calls every kernel once on three shapes and checks it against the reference: it also
# fills the compile cache, so the sanitizer runs below do not compile.
step smoke timeout 120 python3 $F/sanitizer_smoke.py > $OUT/sanitizers.log 2>&1
# The benchmark next, on an otherwise idle GPU.
step bench timeout 240 python3 benchmarks/bench_fastpath.py --out /tmp/bench $BENCH_ARGS > $OUT/bench.log 2>&1
tar czf $OUT/bench.tgz -C /tmp/bench .
step memcheck timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $F/sanitizer_smoke.py \
    >> $OUT/sanitizers.log 2>&1
step racecheck timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $F/sanitizer_smoke.py \
    >> $OUT/sanitizers.log 2>&1
if [ -n "$MEMCHECK_SHARDS" ]; then
    s=$SECONDS
    timeout 200 python3 -m pytest tests/refops --device cuda -q -n 4 -p no:cacheprovider --tb=short \
        > $OUT/refops_cuda_tests.log 2>&1 &
    REF=$!
    PIDS=()
    for ((i = 0; i < MEMCHECK_SHARDS; i++)); do
        REFOPS_TEST_SHARD=$i/$MEMCHECK_SHARDS timeout -s INT -k 30 ${MEMCHECK_S:-360} compute-sanitizer --tool memcheck \
            --error-exitcode 9 python3 -m pytest $F -q -p no:xdist -p no:cacheprovider --tb=short \
            --ignore=$F/test_compile.py > /tmp/memcheck_$i.log 2>&1 &
        PIDS+=($!)
    done
    wait $REF; echo "refops-cuda: rc=$? $((SECONDS-s)) s" >> $OUT/times.txt
    for ((i = 0; i < MEMCHECK_SHARDS; i++)); do
        wait ${PIDS[$i]}; rc=$?
        { echo "=== shard $i/$MEMCHECK_SHARDS: rc=$rc"; cat /tmp/memcheck_$i.log; } >> $OUT/fastpath_memcheck.log
        echo "fastpath-tests under memcheck, shard $i/$MEMCHECK_SHARDS: rc=$rc $(tail -n 1 /tmp/memcheck_$i.log)" \
            >> $OUT/times.txt
    done
    echo "fastpath-tests under memcheck: $((SECONDS-s)) s, $(grep -c '^========= \(Invalid\|Program hit\|Error\)' \
        $OUT/fastpath_memcheck.log) sanitizer error lines" >> $OUT/times.txt
else
    step fastpath-tests timeout 240 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short -ra \
        --ignore=$F/test_compile.py > $OUT/fastpath_tests.log 2>&1
    step refops-cuda timeout 100 python3 -m pytest tests/refops --device cuda -q -n 8 -p no:cacheprovider \
        --tb=short > $OUT/refops_cuda_tests.log 2>&1
fi
grep -E "SUMMARY|checked" $OUT/sanitizers.log; cat $OUT/times.txt
