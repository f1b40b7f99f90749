#!/bin/bash
# GPU run 13: the whole verification of the tree with the one-tile-per-block FP8 kernels: smoke check, benchmark,
# memcheck + racecheck over every kernel, the whole fast-path suite under memcheck in 8 shards beside the
# reference suite on CUDA.
OUT=${1:?output directory}
MEMCHECK_SHARDS=8 MEMCHECK_S=280 bash benchmarks/results/gpu_run.sh $OUT
