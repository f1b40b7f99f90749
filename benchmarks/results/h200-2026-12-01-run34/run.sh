#!/bin/bash
# GPU run 34 (2026-12-01): the tree carries lean_tiles.patch (NVFP4 pass 2: interior tiles staged without a bounds
# check per chunk, output addresses from per-tile bases) and the fix of run 33's failure (LayerNorm backward fp32:
# every kernel with dynamic shared memory opts in). Checks: the NVFP4, norm and pipeline tests of the tree; NVFP4
# under memcheck and racecheck; the redux variant (lean + REDUX for the 16x16 tile amax of the row pass) in a scratch
# copy; pass 2 timed for the tree (lean), orig (run 33's nvfp4.cu) and redux, twice each. About 5-6 minutes.
# _variants/{orig,redux}/fastpath: copies of fastpath/ with those nvfp4.cu files; carry _variants.
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
export PYTHONPATH=$PWD
F=tests/fastpath
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short $F/test_quantize_nvfp4.py \
    $F/test_quantize_roundtrip.py $F/test_norms_differential.py $F/test_pipeline_differential.py \
    $F/test_quantize_differential.py -k "nvfp4 or NVFP4 or norm or layernorm or pipeline" > $OUT/tree_tests.log 2>&1
echo "tree tests: rc=$? $(tail -n 1 $OUT/tree_tests.log)"
for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 $F/sanitizer_smoke.py nvfp4 LayerNorm 2>&1 \
        | tail -n 3
    echo "$tool: rc=$?"
done > $OUT/sanitizers.log 2>&1
cat $OUT/sanitizers.log
check_variant redux $OUT $F/test_quantize_nvfp4.py $F/test_quantize_roundtrip.py -k "nvfp4 or NVFP4"
time_variants $OUT/ab.log '"nvfp4 1x16 row+col (x), pass 2" "nvfp4 16x16 (2D) row+col (w), pass 2" "nvfp4 row + RHT col (x), pass 2" "nvfp4 SR row + RHT col (dy), pass 2" "nvfp4 4over6 row+col, pass 2"' \
    tree orig redux tree orig redux
