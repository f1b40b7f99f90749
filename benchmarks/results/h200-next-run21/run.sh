#!/bin/bash
# GPU run 21 (prepared 2026-11-30, not yet run): the rowptr and rowptrc2 variants of norm.cu (make_variants.py),
# each checked in a scratch copy of the tree with the variant in place (norm differential tests; for rowptr also
# memcheck and racecheck over the norm tests on widths that use 2, 4, 8 and 16 warps a row), and timed twice
# beside the tree.
# Build the variant first (CPU): python3 benchmarks/results/h200-next-run21/make_variants.py; carry _variants.
set -o pipefail
OUT=${1:?output directory}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
. benchmarks/results/variants.sh
F=tests/fastpath/test_norms_differential.py
check_variant rowptr $OUT $F -- $F -k "1000 or 4096 or 8192"
check_variant rowptrc2 $OUT $F  # the same addresses as rowptr; only LayerNorm backward's dx formula differs
time_variants $OUT/ab.log '"LayerNorm" "RMSNorm" "L2Normalization"' tree rowptr rowptrc2 tree rowptr rowptrc2
