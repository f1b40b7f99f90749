#!/bin/bash
# GPU run 22: the db3 variant of LayerNorm backward (make_variants.py), checked in a scratch copy of the tree (the norm
# differential tests; memcheck and racecheck over the norm tests of 1000-, 4096- and 8192-wide rows), timed twice
# beside the tree, and profiled (occupancy, scheduler and warp-state figures) beside the tree's kernel.
# Build the variant first (CPU): python3 benchmarks/results/h200-2026-11-30-run22/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
. benchmarks/results/variants.sh
F=tests/fastpath/test_norms_differential.py
check_variant db3 $OUT $F -- $F -k "1000 or 4096 or 8192"
time_variants $OUT/ab.log '"LayerNorm" "RMSNorm"' tree db3 tree db3
for v in tree db3; do
    if [ $v = tree ]; then p=$PWD; else p=$PWD/_variants/$v:$PWD; fi
    PYTHONPATH=$p timeout 120 ncu --target-processes all -k 'regex:^layer_norm_bwd_bf16' --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
        --section InstructionStats python3 benchmarks/profile_cases.py "LayerNorm backward" > $OUT/ncu_$v.txt 2>&1
    echo "ncu $v: rc=$?"
    grep -E "Duration|Registers Per|Achieved Occ|Theoretical Occ|Issued Warp|Eligible Warps|Executed Ipc A|Block Limit (Reg|Shared)" $OUT/ncu_$v.txt | head -12
done
