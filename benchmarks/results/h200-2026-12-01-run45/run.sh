#!/bin/bash
# GPU run 45 (2026-12-01): executed warp instructions of every NVFP4 pass-2 kernel (Nsight Compute, the eight
# option sets of benchmarks/_kernel_cases.py) beside the H200's SM count and highest SM clock, for the issue-rate
# bound of benchmarks/nvfp4_issue_bound.py; then the final tree's verification (gpu_run.sh).
# (gpu_run.sh and variants.sh were under benchmarks/results/ then; they moved to benchmarks/gpu/ since.)
OUT=${1:?output directory}
. benchmarks/gpu/variants.sh
device_setup
export PYTHONPATH=$PWD
R=$OUT/ncu_pass2.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.memory --format=csv > $R 2>&1
python3 -c "import torch; p = torch.cuda.get_device_properties(0); print('sm_count', p.multi_processor_count)" >> $R 2>&1
timeout 200 ncu --target-processes all --csv -k 'regex:^nvfp4_quantize_' \
    --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
    python3 benchmarks/profile_cases.py "pass 2" >> $R 2>&1
echo "ncu: rc=$?"
grep -c nvfp4_quantize_ $R
bash benchmarks/gpu/gpu_run.sh $OUT
