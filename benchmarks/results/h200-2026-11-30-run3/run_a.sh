#!/bin/bash
# Device run A: perf-wip fastpath differential tests, kernel bench wip vs main side by side,
# refops CUDA suite, compute-sanitizer memcheck + racecheck on the smoke script.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
S=$SECONDS
timeout 220 python3 -m pytest tests/fastpath -q -n 8 -p no:cacheprovider --tb=short -ra --ignore=tests/fastpath/test_compile.py > $OUT/fastpath_wip.log 2>&1
echo "fastpath tests: $((SECONDS-S)) s" >> $OUT/times.txt; S=$SECONDS
timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out $OUT/bench_wip > $OUT/bench_wip.log 2>&1
echo "bench wip: $((SECONDS-S)) s" >> $OUT/times.txt; S=$SECONDS
PYTHONPATH=$PWD/_variants/main:$PWD timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out $OUT/bench_main > $OUT/bench_main.log 2>&1
echo "bench main: $((SECONDS-S)) s" >> $OUT/times.txt; S=$SECONDS
timeout 90 python3 -m pytest tests/refops --device cuda -q -n 8 -p no:cacheprovider --tb=short > $OUT/refops_cuda.log 2>&1
echo "refops cuda: $((SECONDS-S)) s" >> $OUT/times.txt; S=$SECONDS
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py > $OUT/memcheck.log 2>&1; echo "rc=$?" >> $OUT/memcheck.log
echo "memcheck: $((SECONDS-S)) s" >> $OUT/times.txt; S=$SECONDS
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py > $OUT/racecheck.log 2>&1; echo "rc=$?" >> $OUT/racecheck.log
echo "racecheck: $((SECONDS-S)) s" >> $OUT/times.txt
tail -n 4 $OUT/fastpath_wip.log $OUT/refops_cuda.log $OUT/memcheck.log $OUT/racecheck.log; cat $OUT/times.txt
