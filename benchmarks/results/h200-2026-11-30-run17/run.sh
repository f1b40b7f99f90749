#!/bin/bash
# GPU run 17: the norm variants of make_variants.py (checked: lnc2's norm tests and memcheck in a scratch copy;
# l1 only changes prefetch hints), timed beside the tree twice; then Nsight Compute on the tree's LayerNorm and
# RMSNorm backward and NVFP4 pass 2 (1x16 row+col), with the SASS lines that stall most.
# Build the variants first (CPU): python3 benchmarks/results/h200-2026-11-30-run17/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROOT=$PWD
HERE=benchmarks/results/h200-2026-11-30-run17
v=lnc2; S=/tmp/scratch_$v
rm -rf $S && mkdir -p $S && cp -r refops tests benchmarks pyproject.toml $S/ && cp -r _variants/$v/fastpath $S/fastpath
(
    cd $S
    export PYTHONPATH=$S
    python3 -c "import fastpath; print('fastpath from', fastpath.__file__)"
    timeout 120 python3 -m pytest tests/fastpath/test_norms_differential.py -q -n 8 -p no:cacheprovider --tb=line 2>&1 | tail -n 12
    echo "tests: rc=$?"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py LayerNorm
    echo "memcheck: rc=$?"
) > $OUT/check_$v.log 2>&1
grep -E "fastpath from|passed|failed|rc=|SUMMARY|checked" $OUT/check_$v.log
for v in tree l1 lnc2 l1c2 tree l1 lnc2 l1c2; do
    if [ $v = tree ]; then P=$ROOT; else P=$ROOT/_variants/$v:$ROOT; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v \
        --cases "LayerNorm" "RMSNorm" "L2Normalization" | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
cat $OUT/ab.log
export PYTHONPATH=$ROOT
s=$SECONDS
FASTPATH_LINEINFO=1 timeout 150 ncu --target-processes all -o /tmp/prof -f \
    -k 'regex:^(layer_norm_bwd_bf16|rms_norm_bwd_bf16|nvfp4_quantize_std_bf16)' \
    --import-source yes --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section InstructionStats --section SchedulerStats --section SourceCounters \
    python3 benchmarks/profile_cases.py "LayerNorm backward" "RMSNorm backward" "nvfp4 1x16 row+col (x), pass 2" \
    > /tmp/ncu_run.log 2>&1
echo "ncu: rc=$? $((SECONDS-s)) s"
ncu -i /tmp/prof.ncu-rep --print-summary none > $OUT/ncu.txt 2>&1
cat /tmp/ncu_run.log >> $OUT/ncu.txt
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > /tmp/source.csv 2>/tmp/source.err
python3 benchmarks/results/h200-2026-11-30-run7/top_stalls.py /tmp/source.csv > $OUT/ncu_top_stalls.txt 2>&1
grep -E "^  [a-z_]+_bf16|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Executed Instructions  |Stall|No Eligible" $OUT/ncu.txt | head -60
