#!/bin/bash
# One GPU verification run (device machine, from a copy of the working tree): the fast-path differential
# suite, the reference suite on CUDA, memcheck + racecheck over every kernel, the full benchmark.
# Usage: [SUITE_MEMCHECK_S=300] bash benchmarks/results/gpu_run.sh OUTDIR   (OUTDIR gets at most 8 files)
set -o pipefail
OUT=${1:?output directory}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/times.txt 2>&1
step() { local name=$1; shift; local s=$SECONDS; "$@"; echo "$name: rc=$? $((SECONDS-s)) s" >> $OUT/times.txt; }
step fastpath-tests timeout 240 python3 -m pytest tests/fastpath -q -n 8 -p no:cacheprovider --tb=short -ra \
    --ignore=tests/fastpath/test_compile.py > $OUT/fastpath_tests.log 2>&1
step refops-cuda timeout 100 python3 -m pytest tests/refops --device cuda -q -n 8 -p no:cacheprovider --tb=short \
    > $OUT/refops_cuda_tests.log 2>&1
step memcheck timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py \
    > $OUT/sanitizers.log 2>&1
step racecheck timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py \
    >> $OUT/sanitizers.log 2>&1
if [ -n "$SUITE_MEMCHECK_S" ]; then  # memcheck over the differential suite, in one process, as far as the seconds allow
    F=tests/fastpath  # the NVFP4, norm and element-wise tests first: they cover the most kernels per second
    step memcheck-suite timeout -s INT -k 30 "$SUITE_MEMCHECK_S" compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m pytest -v -p no:cacheprovider -p no:xdist --tb=short $F/test_quantize_nvfp4.py \
        $F/test_norms_differential.py $F/test_elementwise_differential.py $F/test_quantize_differential.py \
        $F/test_gemm_differential.py $F/test_pipeline_differential.py $F/test_quantize_roundtrip.py \
        $F/test_streams.py > $OUT/memcheck_suite.log 2>&1
    echo "memcheck-suite: $(grep -c ' PASSED' $OUT/memcheck_suite.log) passed, $(grep -c ' FAILED' $OUT/memcheck_suite.log) failed, $(grep -c '^========= \(Invalid\|Program hit\|Error\)' $OUT/memcheck_suite.log) sanitizer errors" >> $OUT/times.txt
fi
step bench timeout 240 python3 benchmarks/bench_fastpath.py --out /tmp/bench > $OUT/bench.log 2>&1
tar czf $OUT/bench.tgz -C /tmp/bench .
tail -n 2 $OUT/fastpath_tests.log $OUT/refops_cuda_tests.log; grep -E "SUMMARY|checked" $OUT/sanitizers.log; tail -n 3 $OUT/memcheck_suite.log 2>/dev/null; cat $OUT/times.txt
