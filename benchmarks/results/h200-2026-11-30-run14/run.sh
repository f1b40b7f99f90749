#!/bin/bash
# GPU run 14: (a) two one-tile-per-block variants of the NVFP4 column-wise dequantize (_variants/nvcols1: the same
# 64 x 128 tile, grid = tiles, 8 blocks per SM; nvcols2: 64 x 256 tiles, 512 threads, 128-byte input rows), each
# checked in a scratch copy of the tree with the variant's fastpath/ in place (its NVFP4 dequantize tests, memcheck
# and racecheck over its smoke cases); (b) the kernels timed beside the tree's, with run 12's np3 and a tree copy
# whose FP8 block kernels declare run 12's shared-memory size (smem2), for the FP8 block 1x128 difference between
# runs 12 and 13.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROOT=$PWD
for v in nvcols1 nvcols2; do
    S=/tmp/scratch_$v
    rm -rf $S && mkdir -p $S && cp -r refops tests benchmarks pyproject.toml $S/ && cp -r _variants/$v/fastpath $S/fastpath
    {
        cd $S
        export PYTHONPATH=$S
        python3 -c "import fastpath; print('fastpath from', fastpath.__file__)"
        timeout 120 python3 -m pytest tests/fastpath/test_quantize_nvfp4.py -q -n 8 -p no:cacheprovider --tb=short \
            -k "dequantize" 2>&1 | tail -n 3
        echo "tests: rc=$?"
        timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py "nvfp4 col"
        echo "memcheck: rc=$?"
        timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py "nvfp4 col"
        echo "racecheck: rc=$?"
        unset PYTHONPATH
        cd $ROOT
    } > $OUT/check_$v.log 2>&1
    grep -E "fastpath from|passed|failed|rc=|SUMMARY|checked" $OUT/check_$v.log
done
for v in tree nvcols1 nvcols2 np3 smem2 tree nvcols1 nvcols2 np3 smem2; do
    if [ $v = tree ]; then P=$ROOT; else P=$ROOT/_variants/$v:$ROOT; fi
    echo "=== $v"
    PYTHONPATH=$P timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/ab_$v \
        --cases "nvfp4 col -> bf16" "float8 block 1x128" | grep -E "copy:|GB/s|rror"
done > $OUT/ab.log 2>&1
echo "ab: rc=$?"
cat $OUT/ab.log
