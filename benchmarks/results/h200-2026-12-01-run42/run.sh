#!/bin/bash
# GPU run 42 (2026-12-01): every NVFP4 pass-2 kernel timed beside the copy, the three forms that had no benchmark
# case (SR row+col, 16x16 SR, 4over6 16x16) among them; the tree's kernels are those of runs 36 and 40 (b8169e9).
OUT=${1:?output directory}
. benchmarks/results/variants.sh
device_setup
for i in 1 2; do
    timeout 200 python3 benchmarks/bench_fastpath.py --parts kernels --out $OUT/bench$i --cases "pass 2" 2>&1 \
        | grep -E "copy:|GB/s|rror|FAILED" | tee $OUT/pass2_$i.log
done
cp $OUT/bench1/fastpath_bench.md $OUT/fastpath_bench_1.md; cp $OUT/bench2/fastpath_bench.md $OUT/fastpath_bench_2.md
rm -rf $OUT/bench1 $OUT/bench2
