#!/bin/bash
# GPU run 39, part 3: part 2 showed the 2D kernel latency-bound once its column pass is light (5.4 warps per
# scheduler, 50 % of cycles with none eligible; short-scoreboard, barrier and long-scoreboard stalls up). Variants in
# _variants/: st3 (three cp.async stages, two tiles in flight), m4 (the 2D kernel sized for 4 resident blocks, 63
# registers), st3m4 (both); the tree (shared column codes, the stage count generic at 2) and base (b8169e9). Then the
# NVFP4 tests on st3m4 and on the tree.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
time_variants $OUT/ab3.log '"nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w), pass 2" "nvfp4 row + RHT col (x), pass 2" "nvfp4 SR row + RHT col (dy), pass 2" "nvfp4 4over6 row+col, pass 2"' \
    tree st3 m4 st3m4 base tree
check_variant st3m4 $OUT $F/test_quantize_nvfp4.py
timeout 200 python3 -m pytest $F/test_quantize_nvfp4.py -q -n 8 -p no:cacheprovider --tb=short > $OUT/nvfp4_tests_tree.log 2>&1
echo "tree nvfp4 tests: rc=$?"; tail -n 1 $OUT/nvfp4_tests_tree.log
