#!/bin/bash
# GPU run 38, part 2: why the folded multiply was slower in part 1. Variants (in _variants/): base (commit b8169e9),
# noprologue (the tree with every multiplier marked unfoldable: the table's prologue and the code size, without the
# fold), foldonly (the tree without the unfolded min3 path: unfoldable blocks take the generic encoding); then Nsight
# Compute on the RHT form (the clearest slowdown), tree against base: instructions, stall reasons, issue activity.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
time_variants $OUT/ab2.log '"nvfp4 1x16 row+col (x), pass 2" "nvfp4 row + RHT col (x), pass 2" "nvfp4 4over6 row+col, pass 2"' \
    tree base noprologue foldonly tree
for v in tree base; do
    if [ $v = tree ]; then p=$PWD; else p=$PWD/_variants/$v:$PWD; fi
    PYTHONPATH=$p timeout 120 ncu --target-processes all -c 1 -o /tmp/prof_$v -f -k "regex:^nvfp4_quantize_rht_bf16" \
        --section WarpStateStats --section SpeedOfLight --section InstructionStats --section LaunchStats \
        --section Occupancy python3 benchmarks/profile_cases.py "nvfp4 row + RHT col (x), pass 2" > /tmp/ncu_$v.txt 2>&1
    echo "ncu $v: rc=$?"
    ncu -i /tmp/prof_$v.ncu-rep --page details --print-details all > $OUT/ncu_rht_$v.txt 2>&1
    grep -i -E "Stall|Executed Instructions  |Issue Slots|Duration|Registers|Achieved Occupancy|No Instruction" \
        $OUT/ncu_rht_$v.txt | head -40
done
