#!/bin/bash
# GPU run 39, part 2: the shared column codes did not speed the 2D form up. Is the path taken, and where does the
# kernel wait? noshare (_variants/: the tree with the shared path switched off) timed beside the tree and base; then
# Nsight Compute on the 2D kernel of the tree and of base: instructions, stall reasons, issue activity, memory.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
time_variants $OUT/ab2.log '"nvfp4 16x16 (2D) row+col (w), pass 2"' tree noshare base tree
for v in tree base; do
    if [ $v = tree ]; then p=$PWD; else p=$PWD/_variants/$v:$PWD; fi
    PYTHONPATH=$p timeout 120 ncu --target-processes all -c 1 -o /tmp/prof_$v -f -k "regex:^nvfp4_quantize_2d_bf16" \
        --section WarpStateStats --section SpeedOfLight --section InstructionStats --section LaunchStats \
        --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats \
        python3 benchmarks/profile_cases.py "nvfp4 16x16 (2D) row+col (w), pass 2" > /tmp/ncu_$v.txt 2>&1
    echo "ncu $v: rc=$?"
    ncu -i /tmp/prof_$v.ncu-rep --page details --print-details all > $OUT/ncu_2d_$v.txt 2>&1
    grep -i -E "Stall|Executed Instructions  |Issue Slots|Duration|Eligible|Issued Warp|No Eligible|Active Warps|Memory Throughput|DRAM Throughput|threads being active" \
        $OUT/ncu_2d_$v.txt | grep -v -E " 0$|0\.0[0-9]$" | head -40
done
