#!/bin/bash
# GPU run 16 (prepared 2026-11-30, not yet run): (a) the np3 form of FP8 block quantize checked in a scratch copy of
# the tree with the variant in place (FP8 block tests, memcheck and racecheck over its smoke cases) and timed beside
# the tree; (b) the LayerNorm-backward diagnostic (lnnodb, timing only) beside the tree and RMSNorm backward.
# Build the variants first (CPU): python3 benchmarks/results/h200-next-run16/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROOT=$PWD
S=/tmp/scratch_np3form
rm -rf $S && mkdir -p $S && cp -r refops tests benchmarks pyproject.toml $S/ && cp -r _variants/np3form/fastpath $S/fastpath
{
    cd $S
    export PYTHONPATH=$S
    python3 -c "import fastpath; print('fastpath from', fastpath.__file__)"
    timeout 120 python3 -m pytest tests/fastpath/test_quantize_differential.py -q -n 8 -p no:cacheprovider --tb=short \
        -k "float8_block" 2>&1 | tail -n 3
    echo "tests: rc=$?"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py "float8 block"
    echo "memcheck: rc=$?"
    timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py "float8 block"
    echo "racecheck: rc=$?"
    unset PYTHONPATH
    cd $ROOT
} > $OUT/check_np3form.log 2>&1
grep -E "fastpath from|passed|failed|rc=|SUMMARY|checked" $OUT/check_np3form.log
for v in tree np3form lnnodb tree np3form lnnodb; do
    if [ $v = tree ]; then P=$ROOT; else P=$ROOT/_variants/$v:$ROOT; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v \
        --cases "float8 block" "LayerNorm backward" "RMSNorm backward" | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
cat $OUT/ab.log
