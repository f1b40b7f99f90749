#!/bin/bash
# GPU run 21 (prepared 2026-11-30, not yet run): the rowptr and rowptrc2 variants of norm.cu (make_variants.py),
# each checked in a scratch copy of the tree with the variant in place (norm differential tests; for rowptr also
# memcheck and racecheck over the norm tests on widths that use 2, 4, 8 and 16 warps a row), and timed twice
# beside the tree.
# Build the variant first (CPU): python3 benchmarks/results/h200-next-run21/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
. benchmarks/results/variants.sh
F=tests/fastpath/test_norms_differential.py
check_variant rowptr $OUT $F -- $F -k "1000 or 4096 or 8192"
check_variant rowptrc2 $OUT $F  # the same addresses as rowptr; only LayerNorm backward's dx formula differs
time_variants $OUT/ab.log '"LayerNorm" "RMSNorm" "L2Normalization"' tree rowptr rowptrc2 tree rowptr rowptrc2
# Where NVFP4's instructions go (for the next NVFP4 work): source counters of pass 2 (1x16 row+col) and of the
# RHT amax pass 1, cut by run 20's sass_counts.py (every executed SASS line with its count; opcode histogram).
export PYTHONPATH=$PWD
FASTPATH_LINEINFO=1 timeout 150 ncu --target-processes all -o /tmp/prof_nvfp4 -f \
    -k 'regex:^(nvfp4_quantize_std_bf16|nvfp4_rht_amax_bf16)' --section SourceCounters --section InstructionStats \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    python3 benchmarks/profile_cases.py "nvfp4 1x16 row+col (x), pass 2" "nvfp4 pass 1: amax + RHT amax" \
    > $OUT/ncu_nvfp4.txt 2>&1
echo "ncu: rc=$?"
ncu -i /tmp/prof_nvfp4.ncu-rep --print-summary none >> $OUT/ncu_nvfp4.txt 2>&1
ncu -i /tmp/prof_nvfp4.ncu-rep --page source --csv --print-source sass > /tmp/source_nvfp4.csv 2>>$OUT/ncu_nvfp4.txt
python3 benchmarks/results/h200-2026-11-30-run20/sass_counts.py /tmp/source_nvfp4.csv > $OUT/sass_counts_nvfp4.txt 2>&1
grep -E "^==|^-- total" $OUT/sass_counts_nvfp4.txt
