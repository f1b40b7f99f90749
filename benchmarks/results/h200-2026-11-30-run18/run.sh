#!/bin/bash
# GPU run 18: the LayerNorm-backward variants of make_variants.py, each checked in a scratch copy of the tree
# with the variant in place (norm differential tests; memcheck (and for p2s racecheck) over its LayerNorm tests on 8x4096 and 64x8192, the rows
# the new kernel takes; the
# three checked side by side), timed beside the tree twice, and Nsight Compute on the tree's and p2s's kernels.
# Build the variants first (CPU): python3 benchmarks/results/h200-2026-11-30-run18/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROOT=$PWD
check() {
    local v=$1 S=/tmp/scratch_$1
    rm -rf $S && mkdir -p $S && cp -r refops tests benchmarks pyproject.toml $S/ && cp -r _variants/$v/fastpath $S/fastpath
    (
        cd $S
        export PYTHONPATH=$S CUPY_CACHE_DIR=/tmp/cupycache_$v
        python3 -c "import fastpath; print('fastpath from', fastpath.__file__)"
        timeout 150 python3 -m pytest tests/fastpath/test_norms_differential.py -q -n 5 -p no:cacheprovider --tb=line 2>&1 | tail -n 12
        echo "tests: rc=$?"
        timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:xdist -p no:cacheprovider tests/fastpath/test_norms_differential.py -k "layer_norm and (8192 or 4096)" 2>&1 | tail -n 4
        echo "memcheck: rc=$?"
        [ $v = p2s ] && timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -p no:xdist -p no:cacheprovider tests/fastpath/test_norms_differential.py -k "layer_norm and (8192 or 4096)" 2>&1 | tail -n 4
        echo "racecheck: rc=$?"
    ) > $OUT/check_$v.log 2>&1
}
check p2r & check p2s & check p2sc2 & wait
for v in p2r p2s p2sc2; do echo "== $v"; grep -E "fastpath from|passed|failed|rc=|SUMMARY|checked" $OUT/check_$v.log; done
for v in tree p2r p2s p2sc2 tree p2r p2s p2sc2; do
    if [ $v = tree ]; then P=$ROOT; else P=$ROOT/_variants/$v:$ROOT; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v \
        --cases "LayerNorm backward" "RMSNorm backward" | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
cat $OUT/ab.log
s=$SECONDS
for v in tree p2s; do
    if [ $v = tree ]; then P=$ROOT; else P=$ROOT/_variants/$v:$ROOT; fi
    PYTHONPATH=$P FASTPATH_LINEINFO=1 timeout 120 ncu --target-processes all -o /tmp/prof_$v -f \
        -k 'regex:^(layer_norm_bwd|rms_norm_bwd_bf16|wgrad_finalize_bf16)' \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section InstructionStats --section SchedulerStats \
        python3 benchmarks/profile_cases.py "LayerNorm backward" "RMSNorm backward" > /tmp/ncu_$v.log 2>&1
    echo "ncu $v: rc=$? $((SECONDS-s)) s"
    { ncu -i /tmp/prof_$v.ncu-rep --print-summary none; cat /tmp/ncu_$v.log; } > $OUT/ncu_$v.txt 2>&1
done
grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Executed Instructions  |No Eligible" $OUT/ncu_tree.txt $OUT/ncu_p2s.txt
