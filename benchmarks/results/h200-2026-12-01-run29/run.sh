#!/bin/bash
# GPU run 29 (prepared 2026-11-30 as "run 28", run 2026-12-01): the rhtneg variant (make_variants.py), checked in a scratch copy of
# the tree (the NVFP4 test files; memcheck and racecheck over the smoke script's NVFP4 cases) and timed twice beside
# the tree; the colsum variant the same way; then two Nsight Compute profiles (see below). About 6-7 minutes.
# Build the variant first (CPU): python3 benchmarks/results/h200-2026-12-01-run29/make_variants.py; carry _variants.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
check_variant rhtneg $OUT $F/test_quantize_nvfp4.py $F/test_quantize_roundtrip.py
( cd /tmp/scratch_rhtneg && export PYTHONPATH=/tmp/scratch_rhtneg CUPY_CACHE_DIR=/tmp/cupycache_rhtneg
  for tool in memcheck racecheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $F/sanitizer_smoke.py nvfp4 2>&1 | tail -n 3
      echo "$tool: rc=$?"
  done ) > $OUT/sanitizers_rhtneg.log 2>&1
grep -E "checked|SUMMARY|rc=" $OUT/sanitizers_rhtneg.log
time_variants $OUT/ab.log '"nvfp4"' tree rhtneg tree rhtneg
# colsum: the norm and activation differential tests (every weight and bias gradient goes through the column sums),
# memcheck and racecheck over the norm tests of 1000-, 4096- and 8192-wide rows; timed beside the tree.
check_variant colsum $OUT $F/test_norms_differential.py $F/test_elementwise_differential.py -k "norm or dbias" -- \
    $F/test_norms_differential.py -k "1000 or 4096 or 8192"
time_variants $OUT/ab_colsum.log '"LayerNorm backward" "RMSNorm backward" "dbias"' tree colsum tree colsum
# Where LayerNorm backward's warps wait (the floor it misses by 4 %): warp-stall samples per SASS line of the tree's
# kernel, cut by stall_lines.py. Runs 22-24 changed occupancy, staging and L1 without finding it.
export PYTHONPATH=$PWD
FASTPATH_LINEINFO=1 timeout 120 ncu --target-processes all -o /tmp/prof_lnb -f -k 'regex:^layer_norm_bwd_bf16' \
    --section SourceCounters --section WarpStateStats python3 benchmarks/profile_cases.py "LayerNorm backward" \
    > $OUT/ncu_lnb.txt 2>&1
echo "ncu: rc=$?"
ncu -i /tmp/prof_lnb.ncu-rep --page source --csv --print-source sass > /tmp/source_lnb.csv 2>>$OUT/ncu_lnb.txt
ncu -i /tmp/prof_lnb.ncu-rep --page details >> $OUT/ncu_lnb.txt 2>&1
python3 benchmarks/results/h200-2026-12-01-run29/stall_lines.py /tmp/source_lnb.csv > $OUT/stall_lines_lnb.txt 2>&1
head -n 12 $OUT/stall_lines_lnb.txt
# Why the 2D (16x16) pass 2 takes 0.261 ms against the 1x16 pass's 0.200 ms: instruction counts and shared-memory
# bank conflicts of both kernels.
timeout 90 ncu --target-processes all -k 'regex:^nvfp4_quantize_(std|2d)_bf16' --section InstructionStats \
    --section MemoryWorkloadAnalysis_Tables --section SpeedOfLight --section WarpStateStats \
    python3 benchmarks/profile_cases.py "nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w), pass 2" \
    > $OUT/ncu_nvfp4_2d.txt 2>&1
echo "ncu 2d: rc=$?"
grep -E "nvfp4_quantize|Duration|Executed Instructions  |Bank Conflicts|Warp Cycles Per Issued" $OUT/ncu_nvfp4_2d.txt | head -20
