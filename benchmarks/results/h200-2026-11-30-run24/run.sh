#!/bin/bash
# GPU run 24: the bnoa and bcarve variants (make_variants.py), each checked by the norm differential tests in a
# scratch copy of the tree, then timed twice beside the tree; Nsight Compute's L1 hit rate and carve-out of
# layer_norm_bwd_bf16 in the tree and both variants.
# Build the variants first (CPU): python3 benchmarks/results/h200-2026-11-30-run24/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
. benchmarks/results/variants.sh
F=tests/fastpath/test_norms_differential.py
check_variant bnoa $OUT $F
check_variant bcarve $OUT $F
time_variants $OUT/ab.log '"LayerNorm backward" "RMSNorm backward"' tree bnoa bcarve tree bnoa bcarve
for v in tree bnoa bcarve; do
    if [ $v = tree ]; then p=$PWD; else p=$PWD/_variants/$v:$PWD; fi
    PYTHONPATH=$p timeout 90 ncu --target-processes all -k 'regex:^layer_norm_bwd_bf16' --section MemoryWorkloadAnalysis \
        --section LaunchStats --section SpeedOfLight python3 benchmarks/profile_cases.py "LayerNorm backward" \
        > $OUT/ncu_$v.txt 2>&1
    echo "ncu $v: rc=$?"
    grep -E "Duration|L1/TEX Hit Rate|L2 Hit Rate|Shared Memory Configuration Size" $OUT/ncu_$v.txt | head -6
done
