#!/bin/bash
# GPU run 16 (2026-11-30): (a) the np3 form of FP8 block quantize and the two-FMA LayerNorm
# backward (lnfma), each checked in a scratch copy of the tree with the variant in place (its differential tests,
# memcheck and racecheck over its smoke cases); (b) both timed beside the tree, with the LayerNorm-backward
# diagnostic lnnodb (timing only: its dbias is wrong) and RMSNorm backward.
# Build the variants first (CPU): python3 benchmarks/results/h200-2026-11-30-run16/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROOT=$PWD
check() {  # check VARIANT TEST_FILE PYTEST_K ("": the whole file) SMOKE_CASE
    local v=$1 S=/tmp/scratch_$1
    rm -rf $S && mkdir -p $S && cp -r refops tests benchmarks pyproject.toml $S/ && cp -r _variants/$v/fastpath $S/fastpath
    (
        cd $S
        export PYTHONPATH=$S
        python3 -c "import fastpath; print('fastpath from', fastpath.__file__)"
        timeout 120 python3 -m pytest tests/fastpath/$2 -q -n 8 -p no:cacheprovider --tb=short ${3:+-k "$3"} 2>&1 | tail -n 3
        echo "tests: rc=$?"
        timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py "$4"
        echo "memcheck: rc=$?"
        timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py "$4"
        echo "racecheck: rc=$?"
    ) > $OUT/check_$v.log 2>&1
    grep -E "fastpath from|passed|failed|rc=|SUMMARY|checked" $OUT/check_$v.log
}
check np3form test_quantize_differential.py float8_block "float8 block"
check lnfma test_norms_differential.py "" LayerNorm
for v in tree np3form lnfma lnnodb tree np3form lnfma lnnodb; do
    if [ $v = tree ]; then P=$ROOT; else P=$ROOT/_variants/$v:$ROOT; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v \
        --cases "float8 block" "LayerNorm backward" "RMSNorm backward" | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
cat $OUT/ab.log
