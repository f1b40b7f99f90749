#!/bin/bash
# GPU run 20: Nsight Compute source counters (executed instructions per SASS line) of LayerNorm and RMSNorm
# backward on the 16384 x 8192 bf16 benchmark rows. Usage: bash benchmarks/results/h200-2026-11-30-run20/run.sh OUT
set -o pipefail
OUT=${1:?output directory}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
HERE=benchmarks/results/h200-2026-11-30-run20
FASTPATH_LINEINFO=1 timeout 150 ncu --target-processes all -o /tmp/prof -f \
    -k 'regex:^(layer_norm_bwd_bf16|rms_norm_bwd_bf16)' --section SourceCounters --section InstructionStats \
    python3 benchmarks/profile_cases.py "LayerNorm backward" "RMSNorm backward" > $OUT/ncu_run.log 2>&1
echo "ncu: rc=$?"
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > /tmp/source.csv 2>>$OUT/ncu_run.log
python3 $HERE/sass_counts.py /tmp/source.csv > $OUT/sass_counts.txt 2>&1
grep -E "^==|^-- total" $OUT/sass_counts.txt
