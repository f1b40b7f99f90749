#!/bin/bash
# GPU run 39, part 4: st3 (_variants/st3: the tree with three cp.async stages in dynamic shared memory, two tiles in
# flight per block; part 3's static form exceeded the 48 KiB static limit) timed beside the tree and base; the NVFP4
# tests on st3.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
time_variants $OUT/ab4.log '"nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w), pass 2" "nvfp4 row + RHT col (x), pass 2" "nvfp4 4over6 row+col, pass 2"' \
    tree st3 base tree
check_variant st3 $OUT $F/test_quantize_nvfp4.py
