#!/bin/bash
# GPU run 31 (prepared 2026-12-01): the whole verification of the tree (gpu_run.sh: smoke, benchmark, memcheck and
# racecheck over every kernel, the fast-path and reference suites), then the rhtraw variant (make_variants.py; it
# contains rhtwave) checked in a scratch copy of the tree (the NVFP4 RHT tests; memcheck and racecheck over the smoke
# script's NVFP4 cases), and both variants timed twice beside the tree. About 6-7 minutes.
# Build the variants first (CPU): python3 benchmarks/results/h200-2026-12-01-run31/make_variants.py; carry _variants.
OUT=${1:?output directory}
bash benchmarks/results/gpu_run.sh $OUT
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
check_variant rhtraw $OUT $F/test_quantize_nvfp4.py $F/test_quantize_roundtrip.py -k "rht or RHT"
( cd /tmp/scratch_rhtraw && export PYTHONPATH=/tmp/scratch_rhtraw CUPY_CACHE_DIR=/tmp/cupycache_rhtraw
  for tool in memcheck racecheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $F/sanitizer_smoke.py nvfp4 2>&1 | tail -n 3
      echo "$tool: rc=$?"
  done ) >> $OUT/check_rhtraw.log 2>&1
grep -E "checked|SUMMARY|rc=" $OUT/check_rhtraw.log
time_variants $OUT/ab.log '"nvfp4 pass 1: amax + RHT amax" "nvfp4 row + RHT col (x, recipe default)"' \
    tree rhtwave rhtraw tree rhtwave rhtraw
