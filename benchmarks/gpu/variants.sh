#!/bin/bash
# Shell functions for GPU runs that try kernel variants (source it from a run's script, on the device machine, from
# the repository root). A variant is a copy of fastpath/ under _variants/NAME/fastpath, built on the CPU machine by
# the run's make_variants.py and carried to the device.
#
#   check_variant NAME OUTDIR PYTEST_ARGS... [-- SANITIZER_PYTEST_ARGS...]
#       In a scratch copy of the tree with the variant's fastpath in place (so that `python -m pytest`, which puts
#       the working directory first on sys.path, imports the variant): the given tests under xdist, then, when
#       arguments follow `--`, those tests under compute-sanitizer memcheck and racecheck. Writes
#       OUTDIR/check_NAME.log and prints its summary lines.
#   time_variants OUTDIR/ab.log "CASE..." NAME... : bench_fastpath.py's kernel table for the given cases, once per
#       NAME in order ("tree": the tree itself), so that each variant is timed beside the tree in one run.
#   device_setup : the usual start of a run script on the device machine (pipefail, unbuffered Python, the CuPy
#       compile cache, this checkout installed in place).
#   check_nvfp4 OUTDIR : the NVFP4 tests of the tree under xdist (OUTDIR/nvfp4_tests.log), then memcheck and racecheck
#       over the smoke script's NVFP4 cases (OUTDIR/memcheck.log, racecheck.log); prints each one's summary.
device_setup() {
    set -o pipefail
    export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupycache
    python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
}

check_nvfp4() {
    local out=$1 tool
    timeout 200 python3 -m pytest tests/fastpath/test_quantize_nvfp4.py -q -n 8 -p no:cacheprovider --tb=short \
        > "$out/nvfp4_tests.log" 2>&1
    echo "nvfp4 tests: rc=$?"; tail -n 3 "$out/nvfp4_tests.log"
    for tool in memcheck racecheck; do
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/fastpath/sanitizer_smoke.py nvfp4 \
            > "$out/$tool.log" 2>&1
        echo "$tool: rc=$?"; tail -n 2 "$out/$tool.log"
    done
}

check_variant() {
    local v=$1 out=$2 scratch=/tmp/scratch_$1
    shift 2
    local tests=() sanitized=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do tests+=("$1"); shift; done
    [ "$1" = "--" ] && shift && sanitized=("$@")
    rm -rf "$scratch" && mkdir -p "$scratch"
    cp -r refops tests benchmarks pyproject.toml "$scratch"/ && cp -r "_variants/$v/fastpath" "$scratch/fastpath"
    (
        set -o pipefail
        cd "$scratch" || exit 1
        export PYTHONPATH=$scratch CUPY_CACHE_DIR=/tmp/cupycache_$v
        python3 -c "import fastpath; print('fastpath from', fastpath.__file__)"
        timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short "${tests[@]}" 2>&1 | tail -n 12
        echo "tests: rc=$?"
        if [ ${#sanitized[@]} -gt 0 ]; then
            for tool in memcheck racecheck; do
                timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:xdist \
                    -p no:cacheprovider "${sanitized[@]}" 2>&1 | tail -n 4
                echo "$tool: rc=$?"
            done
        fi
    ) > "$out/check_$v.log" 2>&1
    grep -E "fastpath from|passed|failed|rc=|SUMMARY" "$out/check_$v.log"
}

time_variants() {
    local log=$1 cases=$2 root=$PWD
    shift 2
    local names=("$@") v p
    for v in "${names[@]}"; do
        if [ "$v" = tree ]; then p=$root; else p=$root/_variants/$v:$root; fi
        echo "=== $v"
        # shellcheck disable=SC2086  # the cases are separate words on purpose
        eval "set -- $cases"
        PYTHONPATH=$p timeout 100 python3 benchmarks/bench_fastpath.py --parts kernels --out "/tmp/ab_$v" \
            --cases "$@" | grep -E "copy:|GB/s|rror"
    done > "$log" 2>&1
    cat "$log"
}
