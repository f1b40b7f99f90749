#!/bin/bash
# GPU run 32 (2026-12-01): the final tree of the session: the fast-path suite, memcheck over every kernel (smoke
# script), racecheck over the LayerNorm and NVFP4 kernels that changed, the whole benchmark. About 3 minutes.
# Usage: bash benchmarks/results/h200-2026-12-01-run32/run.sh OUTDIR
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
OUT=$1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
s=$SECONDS; timeout 200 python3 -m pytest tests/fastpath -q -n 8 -p no:cacheprovider --tb=short -ra --ignore=tests/fastpath/test_compile.py > $OUT/fastpath_tests.log 2>&1; echo "fastpath-tests: rc=$? $((SECONDS-s)) s" | tee -a $OUT/times.txt
tail -n 1 $OUT/fastpath_tests.log
s=$SECONDS; timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py > $OUT/sanitizers.log 2>&1; echo "memcheck: rc=$? $((SECONDS-s)) s" | tee -a $OUT/times.txt
s=$SECONDS; timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py "LayerNorm" nvfp4 >> $OUT/sanitizers.log 2>&1; echo "racecheck (LayerNorm, nvfp4): rc=$? $((SECONDS-s)) s" | tee -a $OUT/times.txt
grep -E "checked|SUMMARY" $OUT/sanitizers.log
s=$SECONDS; timeout 60 python3 benchmarks/bench_fastpath.py --out /tmp/bench > $OUT/bench.log 2>&1; echo "bench: rc=$? $((SECONDS-s)) s" | tee -a $OUT/times.txt
cp /tmp/bench/fastpath_bench.md /tmp/bench/fastpath_bench.json /tmp/bench/fastpath_roofline.png $OUT/ 2>/dev/null
grep -E "copy:|LayerNorm|RMSNorm|nvfp4 pass 1" $OUT/bench.log
