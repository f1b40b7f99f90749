#!/bin/bash
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 150 python3 -m pytest tests/fastpath/test_quantize_differential.py -q -n 8 -p no:cacheprovider --tb=short -k "compute_scale or amax or float8" > $OUT/scale_tests.log 2>&1
tail -n 3 $OUT/scale_tests.log
CASES=("float8 e4m3 row+col (x, w)" "mxfp8 e4m3 row+col" "float8 block 1x128 row+col (x, dy)" "float8 block 128x128 row+col (w)" "nvfp4 1x16 row+col (x)" "nvfp4 row + RHT col (x, recipe default)" "nvfp4 4over6 row+col" "nvfp4 col -> bf16" "dbias" "LayerNorm forward" "LayerNorm backward" "situglu forward" "L2Normalization backward")
timeout 300 ncu --target-processes all -k 'regex:^(fp8_cast_transpose|mxfp8_quantize|fp8_block_quantize|nvfp4_|dbias|layer_norm|act_fwd_situglu|l2_norm|wgrad)' --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis python3 benchmarks/results/h200-2026-11-30-run3/profile_cases.py "${CASES[@]}" > $OUT/ncu.txt 2>&1
echo "ncu rc=$?"; grep -c "Section: GPU Speed" $OUT/ncu.txt; tail -n 5 $OUT/ncu.txt
