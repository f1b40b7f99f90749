#!/bin/bash
# GPU run 39 (2026-12-01): NVFP4 pass 2, 16x16 (2D) standard form with the column-wise codes taken from the row pass
# (shared code tile, col_pass_shared; the tree) timed beside the kernels of b8169e9 (_variants/base), tree first and
# last; the NVFP4 tests on the tree; memcheck and racecheck over the smoke script's NVFP4 cases. _variants/: carry it.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
time_variants $OUT/ab.log '"nvfp4 16x16 (2D) row+col (w), pass 2" "nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w)"' \
    tree base tree
check_nvfp4 $OUT
