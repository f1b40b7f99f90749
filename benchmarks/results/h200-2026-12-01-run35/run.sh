#!/bin/bash
# GPU run 35 (2026-12-01): the occ variant (occupancy.patch on top of the tree, which carries run 34's lean tiles):
# NVFP4 pass 2 sized for 4 resident blocks per SM (64 registers; 3 for the RHT form, 80), its grid one wave from the
# occupancy query. Checks: the whole fast-path suite in a scratch copy with the variant, memcheck and racecheck over
# the smoke script's NVFP4 cases there; pass 2 timed for the tree, occ and orig (run 33's nvfp4.cu), twice each; the
# full benchmark of the variant. About 6 minutes. _variants/{occ,orig}/fastpath: carry _variants.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
check_variant occ $OUT $F --ignore=$F/test_compile.py
( cd /tmp/scratch_occ && export PYTHONPATH=/tmp/scratch_occ CUPY_CACHE_DIR=/tmp/cupycache_occ
  for tool in memcheck racecheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $F/sanitizer_smoke.py nvfp4 2>&1 | tail -n 3
      echo "$tool: rc=$?"
  done ) >> $OUT/check_occ.log 2>&1
grep -E "checked|SUMMARY|rc=" $OUT/check_occ.log
time_variants $OUT/ab.log '"nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w), pass 2" "nvfp4 row + RHT col (x), pass 2" "nvfp4 SR row + RHT col (dy), pass 2" "nvfp4 4over6 row+col, pass 2"' \
    tree occ orig tree occ orig
( cd /tmp/scratch_occ && PYTHONPATH=/tmp/scratch_occ CUPY_CACHE_DIR=/tmp/cupycache_occ timeout 200 \
      python3 benchmarks/bench_fastpath.py --out /tmp/bench_occ ) > $OUT/bench_occ.log 2>&1
echo "bench: rc=$?"; tar czf $OUT/bench_occ.tgz -C /tmp/bench_occ .
grep -E "nvfp4|copy:" $OUT/bench_occ.log | head -30
