#!/bin/bash
# GPU run 27: the tree with nvfp4.cu's e2m1_sr_min3 (stochastic rounding as a floor of the concave code map). In the
# tree: the NVFP4 test files; memcheck over the smoke script's NVFP4 cases; the SR cases timed beside _variants/base
# (the fastpath/ of the commit before, `git archive HEAD fastpath`; carry _variants); racecheck last. Steps are
# ordered by importance: the device time left for this session was under 300 s.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=$PWD
F=tests/fastpath
s=$SECONDS
timeout 100 python3 -m pytest $F/test_quantize_nvfp4.py $F/test_quantize_roundtrip.py $F/test_e2m1_min3.py -q -n 8 \
    -p no:cacheprovider --tb=short > $OUT/nvfp4_tests.log 2>&1
echo "nvfp4-tests: rc=$? $((SECONDS-s)) s; $(tail -n 1 $OUT/nvfp4_tests.log)"
s=$SECONDS
timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $F/sanitizer_smoke.py "nvfp4 SR" "nvfp4 1x16" \
    > $OUT/sanitizers.log 2>&1
echo "memcheck: rc=$? $((SECONDS-s)) s"
. benchmarks/results/variants.sh
time_variants $OUT/ab.log '"nvfp4 SR" "nvfp4 1x16"' tree base
s=$SECONDS
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $F/sanitizer_smoke.py "nvfp4 SR" \
    >> $OUT/sanitizers.log 2>&1
echo "racecheck: rc=$? $((SECONDS-s)) s"
grep -E "SUMMARY|checked" $OUT/sanitizers.log
