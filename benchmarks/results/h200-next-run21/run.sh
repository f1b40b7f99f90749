#!/bin/bash
# GPU run 21 (prepared 2026-11-30, not yet run): the rowptr variant of norm.cu (make_variants.py), checked in a
# scratch copy of the tree with the variant in place (norm differential tests; memcheck and racecheck over the norm
# tests on widths that use 2, 4, 8 and 16 warps a row) and timed twice beside the tree.
# Build the variant first (CPU): python3 benchmarks/results/h200-next-run21/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROOT=$PWD
v=rowptr; S=/tmp/scratch_$v
rm -rf $S && mkdir -p $S && cp -r refops tests benchmarks pyproject.toml $S/ && cp -r _variants/$v/fastpath $S/fastpath
F=tests/fastpath/test_norms_differential.py
(
    cd $S
    export PYTHONPATH=$S
    python3 -c "import fastpath; print('fastpath from', fastpath.__file__)"
    timeout 120 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short 2>&1 | tail -n 12
    echo "tests: rc=$?"
    for tool in memcheck racecheck; do
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest $F -q -p no:xdist \
            -p no:cacheprovider -k "1000 or 4096 or 8192" 2>&1 | tail -n 4
        echo "$tool: rc=$?"
    done
) > $OUT/check_$v.log 2>&1
grep -E "fastpath from|passed|failed|rc=|SUMMARY" $OUT/check_$v.log
for v in tree rowptr tree rowptr; do
    if [ $v = tree ]; then P=$ROOT; else P=$ROOT/_variants/$v:$ROOT; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 60 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v \
        --cases "LayerNorm" "RMSNorm" "L2Normalization" | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
cat $OUT/ab.log
