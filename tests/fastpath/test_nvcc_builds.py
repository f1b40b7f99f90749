"""The compile checks' build cache (``_nvcc_builds.py``), with a fake nvcc that logs its runs: a result is reused only
for the same inputs, a damaged entry is rebuilt, and nvcc's verdict and PTX come back as it gave them."""

from __future__ import annotations

import pathlib
import stat
import time

import pytest
from _nvcc_builds import Build, NvccBuilds, cache_dir

FAKE_NVCC = """#!/bin/sh
# --version, or: flags... (-c SRC -o OBJ -keep -keep-dir DIR | -ptx SRC -o PTX); fails when the source says FAIL.
[ "$1" = "--version" ] && { echo "fake nvcc 1.0"; exit 0; }
echo "$@" >> "{log}"
while [ $# -gt 0 ]; do
  case "$1" in
    -c|-ptx) src="$2"; shift 2;;
    -o) out="$2"; shift 2;;
    -keep-dir) keep="$2"; shift 2;;
    *) shift;;
  esac
done
if grep -q SLOW "$src"; then sleep 30; fi
if grep -q FAIL "$src"; then echo "error: $src says FAIL"; exit 2; fi
case "$out" in
  *.ptx) cat "$src" > "$out";;
  *) touch "$out"; cat "$src" > "$keep/kept.ptx";;
esac
"""


@pytest.fixture
def fake(tmp_path):
    log = tmp_path / "runs.log"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC.replace("{log}", str(log)))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "k.cu").write_text('#include "h.cuh"\n// kernel\n')
    (kernels / "h.cuh").write_text("// header v1\n")

    def runs() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    def builds() -> NvccBuilds:
        return NvccBuilds(str(nvcc), 2, tmp_path / "cache")

    return kernels, builds, runs


def test_a_result_is_reused_only_for_the_same_inputs(fake):
    kernels, builds, runs = fake
    obj = Build("k.cu", ("-arch=sm_90",), "object", source=kernels / "k.cu")
    first = builds().result(obj)
    assert first.ok and not first.cached and first.ptx == '#include "h.cuh"\n// kernel\n' and runs() == 1
    again = builds().result(obj)  # a new session: from the cache
    assert again.cached and (again.ok, again.ptx) == (first.ok, first.ptx) and runs() == 1
    builds().result(Build("k.cu", ("-arch=sm_90", "--ftz=true"), "object", source=kernels / "k.cu"))
    assert runs() == 2  # other flags
    builds().result(Build("k.cu", ("-arch=sm_90",), "ptx", source=kernels / "k.cu"))
    assert runs() == 3  # another kind
    (kernels / "h.cuh").write_text("// header v2\n")
    assert not builds().result(obj).cached and runs() == 4  # a header beside the file changed


def test_one_session_runs_a_build_once_and_compiles_a_failure_again_next_session(fake):
    kernels, builds, runs = fake
    session = builds()
    failing = Build("bad.cu", ("-arch=sm_90",), "ptx", text="FAIL here\n")
    futures = [session.start(failing) for _ in range(3)]
    results = [f.result() for f in futures]
    assert runs() == 1 and all(r is results[0] for r in results)
    assert not results[0].ok and "says FAIL" in results[0].output and results[0].ptx is None
    again = builds().result(failing)  # a new session: a failure is never taken from the cache
    assert not again.cached and not again.ok and "says FAIL" in again.output and runs() == 2


def test_a_damaged_entry_is_built_again(fake):
    kernels, builds, runs = fake
    build = Build("t.cu", (), "ptx", text="// t\n")
    builds().result(build)
    (entry,) = (kernels.parent / "cache").iterdir()
    entry.write_bytes(entry.read_bytes()[:-3])  # cut short by a crash, say
    rebuilt = builds().result(build)
    assert rebuilt.ok and not rebuilt.cached and rebuilt.ptx == "// t\n" and runs() == 2


def test_a_build_stopped_by_the_session_end_is_not_cached(fake):
    kernels, builds, runs = fake
    session = builds()
    future = session.start(Build("slow.cu", (), "ptx", text="SLOW\n"))
    while runs() == 0:  # nvcc has started
        time.sleep(0.01)
    session.close()
    assert not future.result(timeout=10).ok
    assert not (kernels.parent / "cache").exists() or not any((kernels.parent / "cache").iterdir())


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.delenv("REFOPS_NVCC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "refops" / "nvcc"
    monkeypatch.setenv("REFOPS_NVCC_CACHE", "off")
    assert cache_dir() is None
    monkeypatch.setenv("REFOPS_NVCC_CACHE", str(tmp_path / "c"))
    assert cache_dir() == pathlib.Path(tmp_path / "c")


def test_a_build_names_one_source():
    with pytest.raises(ValueError, match="exactly one of source"):
        Build("x.cu", (), "ptx")
    with pytest.raises(ValueError, match="kind must be"):
        Build("x.cu", (), "cubin", text="")
