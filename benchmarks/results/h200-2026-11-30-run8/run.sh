#!/bin/bash
# GPU run 8: the perf-round kernels (cast_fp8.cu cast-transpose, fp8_block.cu, nvfp4.cu dequantize, situglu
# forward, LayerNorm backward) checked (smoke check vs the reference, the fast-path suite, memcheck and
# racecheck over every kernel) and benchmarked side by side with the previous kernels (copied to
# _variants/base/fastpath and put first on PYTHONPATH). Usage: bash .../run.sh OUTDIR
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
step() { local name=$1; shift; local s=$SECONDS; "$@"; echo "$name: rc=$? $((SECONDS-s)) s" >> $OUT/times.txt; }
F=tests/fastpath
CASES=("float8 e4m3 row+col" "float8 e5m2 row+col" "float8 e4m3 row only" "float8 block" "nvfp4 col -> bf16" "nvfp4 row -> bf16"
       "situglu" "LayerNorm" "RMSNorm backward" "swiglu forward" "gelu forward")
bench() { python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/$1 --cases "${CASES[@]}"; }
export PYTHONPATH=$PWD
step smoke timeout 150 python3 $F/sanitizer_smoke.py > $OUT/sanitizers.log 2>&1
step bench-new-1 bench new1 > $OUT/bench_ab.log 2>&1
PYTHONPATH=$PWD/_variants/base:$PWD step bench-base bench base >> $OUT/bench_ab.log 2>&1
step bench-new-2 bench new2 >> $OUT/bench_ab.log 2>&1
# The column-wise NVFP4 dequantize with the previous (k-major) tile order, otherwise the new kernel.
PYTHONPATH=$PWD/_variants/kmajor:$PWD step bench-kmajor python3 benchmarks/bench_fastpath.py --parts kernels \
    --out /tmp/kmajor --cases "nvfp4 col -> bf16" >> $OUT/bench_ab.log 2>&1
# The cast-transpose with 2 cp.async stages instead of 3.
PYTHONPATH=$PWD/_variants/ct2:$PWD step bench-ct2 python3 benchmarks/bench_fastpath.py --parts kernels \
    --out /tmp/ct2 --cases "float8 e4m3 row+col" "float8 e5m2 row+col" >> $OUT/bench_ab.log 2>&1
PYTHONPATH=$PWD/_variants/kmajor:$PWD step kmajor-tests timeout 120 python3 -m pytest $F/test_quantize_nvfp4.py \
    -q -n 8 -p no:cacheprovider --tb=short -k dequant > $OUT/kmajor_tests.log 2>&1
step fastpath-tests timeout 240 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short -ra \
    --ignore=$F/test_compile.py > $OUT/fastpath_tests.log 2>&1
step memcheck timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $F/sanitizer_smoke.py \
    >> $OUT/sanitizers.log 2>&1
step racecheck timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $F/sanitizer_smoke.py \
    >> $OUT/sanitizers.log 2>&1
grep -E "SUMMARY|checked|MISMATCH" $OUT/sanitizers.log | head -20; tail -n 3 $OUT/fastpath_tests.log $OUT/kmajor_tests.log
grep -E "copy:|GB/s" $OUT/bench_ab.log; cat $OUT/times.txt
