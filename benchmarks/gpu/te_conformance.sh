#!/usr/bin/env bash
# The conformance of the installed TransformerEngine on this GPU, and the lifecycle repros; installs nothing.
#   bash benchmarks/gpu/te_conformance.sh OUTDIR [options of python -m refops conformance]
# From the repository root, on a machine with a CUDA GPU, torch and TransformerEngine. Writes
# OUTDIR/conformance.{md,json} (+ the console output) and OUTDIR/te_lifecycle_repros.{md,json}.
# GEMM_NUMERICS=hopper adds --gemm-numerics hopper (needs refops.gemm_numerics and mmaemu).
# TE_REPROS=0 skips the lifecycle repros (11 fresh interpreters importing TE) when only the tables are wanted.
# Exit status: the larger of the two commands' (0 all pass, 1 a row failed or a repro crashed, 2 cannot run).
set -u
out=${1:?usage: bash benchmarks/gpu/te_conformance.sh OUTDIR [options of python -m refops conformance]}; shift
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
python3 -m refops conformance --out "$out" ${GEMM_NUMERICS:+--gemm-numerics "$GEMM_NUMERICS"} "$@" \
  > "$out/conformance.stdout" 2> "$out/conformance.stderr"; c=$?
tail -n 5 "$out/conformance.stderr"; grep -m1 '^\*\*' "$out/conformance.stdout"
if [ "${TE_REPROS:-1}" = 0 ]; then
  r=0; echo "te_conformance.sh: TE_REPROS=0, lifecycle repros not run"
else
  python3 benchmarks/gpu/te_lifecycle_repros.py "$out"; r=$?
fi
echo "te_conformance.sh: conformance exit $c, repros exit $r; records in $out"
exit $(( c > r ? c : r ))
