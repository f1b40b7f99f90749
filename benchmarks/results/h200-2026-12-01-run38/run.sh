#!/bin/bash
# GPU run 38 (2026-12-01), part 1: NVFP4 pass 2 with the block multiply folded into the E2M1 roundings (the tree)
# timed beside the kernels of commit b8169e9 (_variants/base: a copy of that fastpath/), tree first and last; then the
# NVFP4 and E2M1 tests on the tree. Part 2 is benchmarks/results/gpu_run.sh on the same tree. _variants/: carry it.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
time_variants $OUT/ab.log '"nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w), pass 2" "nvfp4 row + RHT col (x), pass 2" "nvfp4 SR row + RHT col (dy), pass 2" "nvfp4 4over6 row+col, pass 2"' \
    tree base tree
timeout 200 python3 -m pytest $F/test_quantize_nvfp4.py $F/test_e2m1_min3.py -q -n 8 -p no:cacheprovider --tb=short \
    > $OUT/nvfp4_tests.log 2>&1
echo "nvfp4 tests: rc=$?"; tail -n 3 $OUT/nvfp4_tests.log
