#!/bin/bash
# GPU run 33 (prepared 2026-12-01, not yet run): where NVFP4 pass 2 waits. Warp-stall samples per SASS line, and the
# stall reasons of the whole kernel, for the 1x16 (std) and 16x16 (2d) forms, the one kernel family still below its
# floor (28-51 % of the copy; run 29: the 2D form executes 2.4 % more instructions than std but waits 7.9 warp cycles
# per issued instruction against 6.5). About 2-3 minutes. No variant: nothing to carry.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
export PYTHONPATH=$PWD
for k in std 2d; do
    if [ $k = std ]; then c="nvfp4 1x16 row+col (x), pass 2"; else c="nvfp4 16x16 (2D) row+col (w), pass 2"; fi
    FASTPATH_LINEINFO=1 timeout 150 ncu --target-processes all -c 1 -o /tmp/prof_$k -f \
        -k "regex:^nvfp4_quantize_${k}_bf16" --section SourceCounters --section WarpStateStats --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis_Tables --section InstructionStats python3 benchmarks/profile_cases.py "$c" \
        > $OUT/ncu_$k.txt 2>&1
    echo "ncu $k: rc=$?"
    ncu -i /tmp/prof_$k.ncu-rep --page details --print-details all >> $OUT/ncu_$k.txt 2>&1
    ncu -i /tmp/prof_$k.ncu-rep --page source --csv --print-source sass > /tmp/source_$k.csv 2>>$OUT/ncu_$k.txt
    python3 benchmarks/results/h200-2026-12-01-run29/stall_lines.py /tmp/source_$k.csv > $OUT/stall_lines_$k.txt 2>&1
    head -n 16 $OUT/stall_lines_$k.txt
    grep -i -E "stall|Executed Instructions  |Bank|Pipe|Frequency|Issue Slots|Occupancy" $OUT/ncu_$k.txt | head -30
done
