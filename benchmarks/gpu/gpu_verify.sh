#!/bin/bash
# GPU verification of a tree (on the device machine, from the repository root of a copy of the tree).
#   bash benchmarks/gpu/gpu_verify.sh OUTDIR tests   the fast-path differential suite, the reference suite on CUDA,
#                                                the sanitizer smoke script under memcheck and racecheck
#   bash benchmarks/gpu/gpu_verify.sh OUTDIR bench   python -m refops bench, NVFP4 against torch.compile, host time
#                                                per forward and step (eager and graphed; BEFORE=path adds the
#                                                same figures for another tree, e.g. the tree before a change)
# Each part fits in one 10-minute call; OUTDIR gets at most 8 files, and times.txt says what each step took.
set -o pipefail
OUT=${1:?output directory}
PART=${2:?tests or bench}
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/times.txt" 2>&1
step() { local name=$1; shift; local s=$SECONDS; "$@"; echo "$name: rc=$? $((SECONDS - s)) s" >> "$OUT/times.txt"; }
F=tests/fastpath
# The smoke script calls every kernel on three shapes against the reference and fills the compile cache.
step smoke timeout 150 python3 $F/sanitizer_smoke.py > "$OUT/sanitizers.log" 2>&1
if [ "$PART" = tests ]; then
    step memcheck timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $F/sanitizer_smoke.py \
        >> "$OUT/sanitizers.log" 2>&1
    step racecheck timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 $F/sanitizer_smoke.py \
        >> "$OUT/sanitizers.log" 2>&1
    step fastpath-tests timeout 200 python3 -m pytest $F -q -n 8 -p no:cacheprovider --tb=short -ra \
        > "$OUT/fastpath_tests.log" 2>&1
    step refops-cuda timeout 150 python3 -m pytest tests/refops tests/docs --device cuda -q -n 8 \
        -p no:cacheprovider --tb=short -ra > "$OUT/refops_cuda_tests.log" 2>&1
    grep -E "SUMMARY|checked" "$OUT/sanitizers.log"
elif [ "$PART" = bench ]; then
    step bench timeout 260 python3 -m refops bench -- --out /tmp/bench > "$OUT/bench.log" 2>&1
    tar czf "$OUT/bench.tgz" -C /tmp/bench .
    step nvfp4-vs-compile timeout 150 python3 benchmarks/nvfp4_vs_compile.py --json "$OUT/nvfp4_vs_compile.json" \
        > "$OUT/peers_and_host.txt" 2>&1
    step host-after timeout 90 python3 benchmarks/gpu_host_time.py --label after --json /tmp/host_after.json \
        >> "$OUT/peers_and_host.txt" 2>&1
    if [ -n "$BEFORE" ]; then
        step host-before env PYTHONPATH="$BEFORE" timeout 90 python3 benchmarks/gpu_host_time.py --label before \
            --json /tmp/host_before.json >> "$OUT/peers_and_host.txt" 2>&1
    fi
    python3 -c "import json,sys; json.dump([json.load(open(p)) for p in sys.argv[1:]], open('$OUT/host_time.json','w'), indent=1)" \
        /tmp/host_after.json $( [ -n "$BEFORE" ] && echo /tmp/host_before.json )
else
    echo "unknown part: $PART (tests or bench)" >&2
    exit 2
fi
cat "$OUT/times.txt"
