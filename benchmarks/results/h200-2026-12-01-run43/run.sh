#!/bin/bash
# GPU run 43 (2026-12-01): NVFP4 pass 2 in register tiles staged by cp.async (stage_tiles_full.patch, against the
# tree) beside the staged kernels; the NVFP4 tests with it on; memcheck and racecheck over the smoke
# script's NVFP4 cases; ncu of both 1x16 forms.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
R=benchmarks/results/h200-2026-12-01-run43
F=tests/fastpath
(cd benchmarks && python3 ../$R/probe.py 2>&1 | tee $OUT/probe.log)
(cd benchmarks && PROBE_MINB=5 python3 ../$R/probe.py 2>&1 | grep -E "MINB|copy|rt|ALL|BAD" | tee $OUT/probe_minb5.log)
ncu --kernel-name regex:nvfp4_quantize_.*std_bf16 --launch-count 2 --section SpeedOfLight --section SchedulerStats \
    --section InstructionStats --section Occupancy --section WarpStateStats \
    python3 $R/ncu_std.py > $OUT/ncu_std.txt 2>&1; echo "ncu: rc=$?"
timeout 200 python3 -m pytest $F/test_quantize_nvfp4.py -q -n 8 -p no:cacheprovider --tb=short > $OUT/nvfp4_tests.log 2>&1
echo "nvfp4 tests: rc=$?"; tail -n 3 $OUT/nvfp4_tests.log
for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $F/sanitizer_smoke.py nvfp4 > $OUT/$tool.log 2>&1
    echo "$tool: rc=$?"; tail -n 2 $OUT/$tool.log
done
