#!/bin/bash
# GPU run 36 (2026-12-01): the final tree of the session (commit 42fdf37) through the whole verification script:
# smoke, memcheck and racecheck over every kernel, the benchmark, the fast-path and reference suites. About 5 minutes.
OUT=${1:?output directory}
bash benchmarks/results/gpu_run.sh $OUT
