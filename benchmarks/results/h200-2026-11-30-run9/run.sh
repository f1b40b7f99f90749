#!/bin/bash
# GPU run 9: the tile-group sweep of the cast + transpose and FP8 block kernels (the same kernels, the launcher's
# _TILE_GROUP_M set to 1 / 4 / 8 / 16 / 32 by copies of fastpath in _variants/gN put first on PYTHONPATH; 16 is
# the tree's), then the tree's full verification: MEMCHECK_SHARDS=8 MEMCHECK_S=280 bash benchmarks/results/gpu_run.sh
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
CASES=("float8 e4m3 row+col" "float8 e5m2 row+col" "float8 block 1x128" "float8 block 128x128")
for g in 16 1 4 8 32 16 1; do
    if [ $g = 16 ]; then P=$PWD; else P=$PWD/_variants/g$g:$PWD; fi
    echo "=== _TILE_GROUP_M = $g" >> $OUT/tile_groups.log
    PYTHONPATH=$P python3 benchmarks/bench_fastpath.py --parts kernels --out /tmp/g$g --cases "${CASES[@]}" \
        2>&1 | grep -E "copy:|GB/s" >> $OUT/tile_groups.log
done
echo "sweep: $SECONDS s" > $OUT/sweep_time.txt
MEMCHECK_SHARDS=8 MEMCHECK_S=280 bash benchmarks/results/gpu_run.sh $OUT
cat $OUT/tile_groups.log
