#!/bin/bash
# GPU run 44 (2026-12-01): where the staged NVFP4 pass-2 kernel's instructions go today: Nsight Compute source
# counters of the 1x16 row+col form (nvfp4_quantize_std_bf16), every executed SASS line with its warp-level count
# and an opcode histogram (run 20's sass_counts.py). The tree's kernels are b8169e9's.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
export PYTHONPATH=$PWD
FASTPATH_LINEINFO=1 timeout 200 ncu --target-processes all -o /tmp/prof_std -f -k 'regex:^nvfp4_quantize_std_bf16' \
    --section SourceCounters --section InstructionStats --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis \
    python3 benchmarks/profile_cases.py "nvfp4 1x16 row+col (x), pass 2" > $OUT/ncu_std.txt 2>&1
echo "ncu: rc=$?"
ncu -i /tmp/prof_std.ncu-rep --print-summary none >> $OUT/ncu_std.txt 2>&1
ncu -i /tmp/prof_std.ncu-rep --page source --csv --print-source sass > /tmp/source_std.csv 2>>$OUT/ncu_std.txt
# (kept: the first of the 4 identical launches profile_cases.py made)
python3 benchmarks/results/h200-2026-11-30-run20/sass_counts.py /tmp/source_std.csv > $OUT/sass_counts_std.txt 2>&1
grep -E "^==|^-- total" $OUT/sass_counts_std.txt
gzip -c /tmp/source_std.csv > $OUT/source_std.csv.gz  # not kept: sass_counts_std.txt has every line
