#!/bin/bash
# GPU run 39 (2026-12-01): NVFP4 pass 2, 16x16 (2D) standard form with the column-wise codes taken from the row pass
# (shared code tile, col_pass_shared; the tree) timed beside the kernels of b8169e9 (_variants/base), tree first and
# last; the NVFP4 tests on the tree; memcheck and racecheck over the smoke script's NVFP4 cases. _variants/: carry it.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
time_variants $OUT/ab.log '"nvfp4 16x16 (2D) row+col (w), pass 2" "nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w)"' \
    tree base tree
timeout 200 python3 -m pytest $F/test_quantize_nvfp4.py -q -n 8 -p no:cacheprovider --tb=short > $OUT/nvfp4_tests.log 2>&1
echo "nvfp4 tests: rc=$?"; tail -n 3 $OUT/nvfp4_tests.log
for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $F/sanitizer_smoke.py nvfp4 > $OUT/$tool.log 2>&1
    echo "$tool: rc=$?"; tail -n 2 $OUT/$tool.log
done
