#!/bin/bash
# GPU run 23: the stg and stgp variants of norm.cu (make_variants.py), each checked in a scratch copy of the tree
# (norm differential tests; for stg also memcheck and racecheck over the norm tests of 1000-, 4096- and 8192-wide
# rows), then timed twice beside the tree.
# Build the variants first (CPU): python3 benchmarks/results/h200-2026-11-30-run23/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
. benchmarks/results/variants.sh
F=tests/fastpath/test_norms_differential.py
check_variant stg $OUT $F -- $F -k "1000 or 4096 or 8192"
check_variant stgp $OUT $F
time_variants $OUT/ab.log '"LayerNorm" "RMSNorm" "L2Normalization"' tree stg stgp tree stg stgp
