#!/bin/bash
# GPU run 30 (prepared 2026-12-01): the vst and stage variants of LayerNorm backward (make_variants.py), each checked
# in a scratch copy of the tree (the norm differential tests; memcheck and racecheck over the LayerNorm tests of
# 1000-, 4096- and 8192-wide rows) and timed twice beside the tree; then Nsight Compute's duration, instruction count
# and warp state of layer_norm_bwd in the tree and in stage. About 5 minutes.
# Build the variants first (CPU): python3 benchmarks/results/h200-2026-12-01-run30/make_variants.py; carry _variants.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
F=tests/fastpath
for v in vst stage; do
    check_variant $v $OUT $F/test_norms_differential.py -- $F/test_norms_differential.py -k "layer and (1000 or 4096 or 8192)"
done
time_variants $OUT/ab.log '"LayerNorm backward" "RMSNorm backward"' tree vst stage tree vst stage
for v in tree stage; do
    if [ $v = tree ]; then p=$PWD; else p=$PWD/_variants/$v:$PWD; fi
    PYTHONPATH=$p timeout 60 ncu --target-processes all -k 'regex:^(layer_norm_bwd_bf16|wgrad_finalize)' \
        --section SpeedOfLight --section InstructionStats --section WarpStateStats --section Occupancy \
        python3 benchmarks/profile_cases.py "LayerNorm backward" > $OUT/ncu_$v.txt 2>&1
    echo "ncu $v: rc=$?"
    grep -E "^  [a-z_]+bf16|Duration|Executed Instructions  |Warp Cycles Per Issued|Achieved Occupancy|Registers Per" \
        $OUT/ncu_$v.txt
done
