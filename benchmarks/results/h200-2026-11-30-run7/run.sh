#!/bin/bash
# GPU run 7: the CPU-only refactors checked (fast-path suite), memcheck over the whole fast-path suite in
# 6 parallel shards (REFOPS_TEST_SHARD, one compute-sanitizer process each), and Nsight Compute on the
# kernels below their bandwidth floors. Usage: bash benchmarks/results/h200-2026-11-30-run7/run.sh OUTDIR
set -o pipefail
OUT=${1:?output directory}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/times.txt 2>&1
ncu --version | tail -1 >> $OUT/times.txt
F=tests/fastpath
s=$SECONDS
# Warm the compile cache once, so the shards do not all compile every kernel under the sanitizer.
python3 tests/fastpath/sanitizer_smoke.py > /tmp/warm.log 2>&1; echo "warm: rc=$? $((SECONDS-s)) s" >> $OUT/times.txt
s=$SECONDS
timeout 240 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short -ra --ignore=$F/test_compile.py \
    > $OUT/fastpath_tests.log 2>&1 &
TESTS=$!
for i in 0 1 2 3 4 5; do
    REFOPS_TEST_SHARD=$i/6 timeout -s INT -k 30 330 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m pytest $F -q -p no:xdist -p no:cacheprovider --tb=short --ignore=$F/test_compile.py \
        > /tmp/memcheck_$i.log 2>&1 &
    PIDS="$PIDS $!"
done
wait $TESTS; echo "fastpath-tests: rc=$? $((SECONDS-s)) s" >> $OUT/times.txt
for i in 0 1 2 3 4 5; do
    wait $(echo $PIDS | cut -d' ' -f$((i+1))); rc=$?
    { echo "=== shard $i/6: rc=$rc"; cat /tmp/memcheck_$i.log; } >> $OUT/memcheck_suite.log
    echo "memcheck shard $i/6: rc=$rc $(tail -n 1 /tmp/memcheck_$i.log)" >> $OUT/times.txt
done
echo "memcheck: $((SECONDS-s)) s, $(grep -c '^========= \(Invalid\|Program hit\|Error\)' $OUT/memcheck_suite.log) sanitizer error lines" >> $OUT/times.txt
s=$SECONDS
CASES=("float8 e4m3 row+col (x, w)" "float8 block 1x128" "float8 block 128x128" "nvfp4 1x16 row+col (x)"
       "nvfp4 16x16" "nvfp4 col -> bf16" "situglu forward" "LayerNorm backward")
FASTPATH_LINEINFO=1 timeout 200 ncu --target-processes all -o /tmp/prof -f \
    -k 'regex:^(fp8_cast_transpose|fp8_block_quantize|nvfp4_quantize_std|nvfp4_quantize_2d_bf|nvfp4_dequantize_cols|act_fwd_situglu|layer_norm_bwd)' \
    --import-source yes --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats \
    --section SchedulerStats --section SourceCounters \
    python3 benchmarks/profile_cases.py "${CASES[@]}" > /tmp/ncu_run.log 2>&1
echo "ncu: rc=$? $((SECONDS-s)) s" >> $OUT/times.txt
ncu -i /tmp/prof.ncu-rep --print-summary none > $OUT/ncu.txt 2>&1
cat /tmp/ncu_run.log >> $OUT/ncu.txt
# Per-kernel SASS lines with the most stall samples (the source page as CSV, cut to the top lines).
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > /tmp/source.csv 2>/tmp/source.err
echo "source page: rc=$? $(wc -c < /tmp/source.csv) bytes; $(head -c 300 /tmp/source.err)" >> $OUT/times.txt
python3 benchmarks/results/h200-2026-11-30-run7/top_stalls.py /tmp/source.csv > $OUT/ncu_top_stalls.txt 2>&1
gzip -c /tmp/prof.ncu-rep > $OUT/prof.ncu-rep.gz
cat $OUT/times.txt; tail -n 3 $OUT/fastpath_tests.log
