#!/bin/bash
# GPU run 41 (2026-12-01): NVFP4 pass 2 in register tiles (rt_quantize) beside the staged kernels; the NVFP4 tests
# with register tiles on; memcheck and racecheck over the smoke script's NVFP4 cases; ncu of both 1x16 forms.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
R=benchmarks/results/h200-2026-12-01-run41
cd benchmarks && python3 ../$R/probe.py 2>&1 | tee $OUT/probe.log; cd ..
(cd benchmarks && PROBE_MINB=3 python3 ../$R/probe.py 2>&1 | grep -E "MINB|copy|rt|ALL|BAD" | tee $OUT/probe_minb3.log)
(cd benchmarks && PROBE_PREFETCH=1 python3 ../$R/probe.py 2>&1 | grep -E "MINB|copy|rt|ALL|BAD" | tee $OUT/probe_prefetch.log)
ncu --kernel-name regex:nvfp4_quantize_.*std_bf16 --launch-skip 0 --launch-count 2 --section SpeedOfLight \
    --section SchedulerStats --section InstructionStats --section Occupancy --section WarpStateStats \
    python3 $R/ncu_std.py > $OUT/ncu_std.txt 2>&1; echo "ncu: rc=$?"
check_nvfp4 $OUT
