#!/bin/bash
# Issue #39's GPU work in ONE device call (H100, at most 560 s with TE's setup), from the repository root with .te/
# carried (carry: [".te"]; made by shared/te-gpu/prepare.sh):
#
#   bash benchmarks/gpu/issue39_session.sh OUTDIR          # TOTAL_S=560 by default
#
# The parts, in order of value. Each runs under `timeout`, its limit the smaller of its cap and what is left of
# TOTAL_S (15 s kept for the archive); a part with less than 20 s left is skipped (times.txt says so). Each part
# writes WORK/<name>/ (WORK=/tmp/issue39: the device returns at most ~8 files, so OUTDIR gets only all.tgz, the
# archive of WORK refreshed after every part, times.txt and summary.md):
#
#   name    command                                                                    cap   expected
#   setup   bash .te/on_device.sh (TE 2.20.2 for sm_90, this tree installed)           240   ~150 s
#   probe   python3 benchmarks/gpu/te_fused_activation_probe.py WORK/probe               60   ~20 s
#   shares  python3 benchmarks/gpu/hopper_gemm_shares.py WORK/shares --parts B           150   ~30 s
#             --budget-s 120
#   hopper  GEMM_NUMERICS=hopper bash benchmarks/gpu/te_conformance.sh WORK/hopper       150   ~60-120 s
#             --tiers modules (TE_REPROS=0: the tables only, not the 11 lifecycle repros)
#   tests   python3 -m pytest tests/fastpath --device cuda -m "not compile" -n 8 -q      170   116 s (12-07)
#             (tests/failures.txt: the first 60 FAILED / ERROR lines)
#   vs_te   python3 benchmarks/bench_vs_te.py --out WORK/vs_te --rows step --host-profile  rest  >= 45 s
#             --budget-s <what is left - 10>: the step rows, 8192 tokens first (eager and graphed per recipe),
#             then 2048, 32768 and the large shape, as far as the budget goes (the quantize rows, measured on
#             12-05 and 12-07, are left out: their torch.compile peers cost ~20 s each)
#
# Expected: 150 + 20 + 30 + 90 + 120 = 410 s before vs_te, which gets the remaining ~135 s: by vs_te.budget's
# model the 16 step rows at 8192 and 2048 tokens take ~105 s, and the budget fits in what it can of the 32768-token
# rows after them (`python3 benchmarks/bench_vs_te.py --plan --rows step --host-profile` prints the estimates).
# The CuPy kernel cache (CUPY_CACHE_DIR) is shared, so the tests' compiles serve the benchmark. With less time
# (a slow setup, a long conformance), the parts after it shrink first: vs_te, then the tests.
set -u -o pipefail
OUT=${1:?usage: bash benchmarks/gpu/issue39_session.sh OUTDIR}
TOTAL_S=${TOTAL_S:-560}
WORK=${WORK:-/tmp/issue39}
ARCHIVE_S=15
MIN_PART_S=20
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupycache}
TIMES=$WORK/times.txt
: > "$TIMES"

left() { echo $((TOTAL_S - ARCHIVE_S - SECONDS)); }

archive() {
    cp "$TIMES" "$OUT/times.txt"
    tar czf "$OUT/all.tgz.tmp" -C "$WORK" . 2>/dev/null && mv "$OUT/all.tgz.tmp" "$OUT/all.tgz"
}

# part NAME CAP COMMAND...: COMMAND under timeout (its limit: CAP or what is left), its output in WORK/NAME/log.txt.
part() {
    local name=$1 cap=$2 budget limit start rc
    shift 2
    budget=$(left)
    limit=$((cap < budget ? cap : budget))
    mkdir -p "$WORK/$name"
    if [ "$limit" -lt "$MIN_PART_S" ]; then
        echo "$name: skipped, $budget s left" >> "$TIMES"
        return 0
    fi
    start=$SECONDS
    timeout -k 10 "$limit" "$@" > "$WORK/$name/log.txt" 2>&1
    rc=$?
    echo "$name: rc=$rc $((SECONDS - start)) s (limit $limit s, $(left) s left)" >> "$TIMES"
    archive
    return 0
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git') $(date -u '+%F %T UTC')"
} >> "$TIMES" 2>&1

if [ -f .te/on_device.sh ]; then
    part setup 240 bash .te/on_device.sh
else
    echo "setup: no .te/ in this copy (carry .te): TransformerEngine not installed" >> "$TIMES"
    python3 -m pip install -q --no-deps --no-build-isolation -e . > "$WORK/setup_project.log" 2>&1
fi
part probe 60 python3 benchmarks/gpu/te_fused_activation_probe.py "$WORK/probe"
part shares 150 python3 benchmarks/gpu/hopper_gemm_shares.py "$WORK/shares" --parts B --budget-s 120
part hopper 150 env GEMM_NUMERICS=hopper TE_REPROS=0 bash benchmarks/gpu/te_conformance.sh "$WORK/hopper" \
    --tiers modules
part tests 170 python3 -m pytest tests/fastpath --device cuda -m "not compile" -n 8 -q -p no:cacheprovider \
    --tb=short -ra
grep -E "^(FAILED|ERROR)" "$WORK/tests/log.txt" 2>/dev/null | head -n 60 > "$WORK/tests/failures.txt"
tail -n 1 "$WORK/tests/log.txt" 2>/dev/null | sed 's/^/tests: /' >> "$TIMES"

# The benchmark gets what is left; its own budget ends 10 s before the timeout, so it stops between rows.
bench_s=$(($(left) - 10))
if [ "$bench_s" -ge 45 ]; then
    part vs_te "$((bench_s + 10))" python3 benchmarks/bench_vs_te.py --out "$WORK/vs_te" --rows step \
        --host-profile --budget-s "$bench_s"
else
    echo "vs_te: skipped, $(left) s left" >> "$TIMES"
fi

{
    echo "# issue #39 device session"; echo; echo '```'; cat "$TIMES"; echo '```'
    for f in "$WORK/hopper/conformance.stdout" "$WORK/shares/hopper_shares.md" "$WORK/vs_te/vs_te.md"; do
        [ -f "$f" ] && { echo; echo "## ${f#"$WORK"/}"; echo; head -n 80 "$f"; }
    done
    [ -s "$WORK/tests/failures.txt" ] && { echo; echo "## tests/failures.txt"; echo; cat "$WORK/tests/failures.txt"; }
} > "$WORK/summary.md" 2>&1
cp "$WORK/summary.md" "$OUT/summary.md"
archive
cat "$TIMES"
