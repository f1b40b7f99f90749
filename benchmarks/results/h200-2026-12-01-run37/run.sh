#!/bin/bash
# GPU run 37 (2026-12-01): the session's last 6 minutes of device time. Variants of NVFP4 pass 2 on top of the tree
# (commit of run 36's kernels): perpass (perpass.patch: each pass forms its own output bases, which removes the 8-byte
# spill that TileOut brought to the sr and 2d_sr kernels) and perpass_unroll (row_unroll.patch on top: the row pass's
# two blocks per thread interleaved, except with stochastic rounding). Timed beside the tree first, then each checked
# in a scratch copy (NVFP4 tests; memcheck over the smoke script's NVFP4 cases). _variants/: carry it.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
time_variants $OUT/ab.log '"nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w), pass 2" "nvfp4 row + RHT col (x), pass 2" "nvfp4 SR row + RHT col (dy), pass 2" "nvfp4 4over6 row+col, pass 2"' \
    tree perpass perpass_unroll tree
for v in perpass_unroll perpass; do
    check_variant $v $OUT $F/test_quantize_nvfp4.py $F/test_quantize_roundtrip.py -k "nvfp4 or NVFP4"
    ( cd /tmp/scratch_$v && export PYTHONPATH=/tmp/scratch_$v CUPY_CACHE_DIR=/tmp/cupycache_$v
      timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $F/sanitizer_smoke.py nvfp4 2>&1 | tail -n 2
      echo "memcheck: rc=$?" ) >> $OUT/check_$v.log 2>&1
    tail -n 3 $OUT/check_$v.log
done
