#!/bin/bash
# GPU run 43 (2026-12-01): NVFP4 pass 2 in register tiles staged by cp.async (stage_tiles_full.patch, against the
# tree) beside the staged kernels; the NVFP4 tests with it on; memcheck and racecheck over the smoke
# script's NVFP4 cases; ncu of both 1x16 forms.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
P=benchmarks/results/h200-2026-12-01-run41  # its probe.py and ncu_std.py
(cd benchmarks && python3 ../$P/probe.py 2>&1 | tee $OUT/probe.log)
(cd benchmarks && PROBE_MINB=5 python3 ../$P/probe.py 2>&1 | grep -E "MINB|copy|rt|ALL|BAD" | tee $OUT/probe_minb5.log)
ncu --kernel-name regex:nvfp4_quantize_.*std_bf16 --launch-count 2 --section SpeedOfLight --section SchedulerStats \
    --section InstructionStats --section Occupancy --section WarpStateStats \
    python3 $P/ncu_std.py > $OUT/ncu_std.txt 2>&1; echo "ncu: rc=$?"
check_nvfp4 $OUT
