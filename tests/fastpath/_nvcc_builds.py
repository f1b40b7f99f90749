"""The nvcc runs of the compile checks: each one started once per session, in the background, and cached on disk.

A compile check (``test_compile.py``, ``test_e2m1_conversion_target.py``, the FTZ check in
``test_quantize_differential.py``) declares what it compiles with ``@pytest.mark.compile(Build(...), ...)``. When
collection ends, ``tests/fastpath/conftest.py`` hands every selected check's builds to one :class:`NvccBuilds`, which
runs them on all cores while the rest of the suite runs (the compile checks are ordered last), and the tests read the
results with ``nvcc_builds.result(build)``.

The results are cached by content: the key covers nvcc's identity (path and ``--version``), the flags, the kind of
build, and the text of the source and of every ``.cuh`` header beside it, so a cached result is the result nvcc gives
for exactly these inputs. The cache lives in ``$REFOPS_NVCC_CACHE`` if set (``off`` disables it), else
``$XDG_CACHE_HOME/refops/nvcc`` (``~/.cache/refops/nvcc``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import zlib
from typing import Optional

__all__ = ["Build", "Built", "NvccBuilds", "cache_dir"]

#: No single nvcc run of these sources takes a minute on an idle core; a hung one fails its check instead of CI.
TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Build:
    """One nvcc run: ``source`` (a file, compiled in place so its ``#include "x.cuh"`` resolve beside it) or ``text``
    (written to a scratch file named ``name``), the flags, and ``kind``: ``"object"`` (``-c``, keeping the PTX that
    the same run generates) or ``"ptx"`` (``-ptx`` only)."""

    name: str
    flags: tuple[str, ...]
    kind: str
    source: Optional[pathlib.Path] = None
    text: Optional[str] = None

    def __post_init__(self) -> None:
        if self.kind not in ("object", "ptx"):
            raise ValueError(f"Build {self.name}: kind must be 'object' or 'ptx', got {self.kind!r}")
        if (self.source is None) == (self.text is None):
            raise ValueError(f"Build {self.name}: give exactly one of source (a file) and text")

    def inputs(self) -> bytes:
        """Every byte nvcc reads from this project: the source and, for a file, each header beside it."""
        if self.text is not None:
            return self.text.encode()
        headers = sorted(self.source.parent.glob("*.cuh"))
        return b"\0".join([self.source.read_bytes(), *(h.name.encode() + h.read_bytes() for h in headers)])


@dataclasses.dataclass(frozen=True)
class Built:
    """nvcc's verdict on a :class:`Build`: exit status 0 or not, its messages, the PTX it wrote (None when it failed),
    and whether this came from the cache."""

    ok: bool
    output: str
    ptx: Optional[str]
    seconds: float
    cached: bool = False


def cache_dir() -> Optional[pathlib.Path]:
    """Where results are kept; None when ``REFOPS_NVCC_CACHE=off``."""
    chosen = os.environ.get("REFOPS_NVCC_CACHE")
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "0", "off", "no") else pathlib.Path(chosen)
    root = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(root) / "refops" / "nvcc"


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone


class NvccBuilds:
    """Runs builds on up to ``jobs`` nvcc processes at once; each distinct build runs at most once per session."""

    def __init__(self, nvcc: str, jobs: int, cache: Optional[pathlib.Path]) -> None:
        self.nvcc = nvcc
        self.cache = cache
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        self._identity = f"{os.path.realpath(nvcc)}\n{version}"
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="nvcc")
        self._futures: dict[str, concurrent.futures.Future] = {}
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False

    def key(self, build: Build) -> str:
        digest = hashlib.sha256()
        for part in (self._identity, build.kind, build.name, "\0".join(build.flags)):
            digest.update(part.encode() + b"\0")
        digest.update(build.inputs())
        return digest.hexdigest()

    def start(self, build: Build) -> concurrent.futures.Future:
        """Queue ``build`` unless it is queued already; its future's result is a :class:`Built`."""
        key = self.key(build)
        with self._lock:
            if key not in self._futures:
                self._futures[key] = self._pool.submit(self._cached_or_run, build, key)
            return self._futures[key]

    def result(self, build: Build) -> Built:
        return self.start(build).result()

    def unfinished(self) -> int:
        """How many of the builds started so far are still queued or running."""
        with self._lock:
            return sum(not future.done() for future in self._futures.values())

    def close(self) -> None:
        """Cancel queued builds and stop running nvcc processes (a session that ends early does not wait on them)."""
        with self._lock:
            self._closed = True
            for process in self._running:
                _kill_group(process)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _cached_or_run(self, build: Build, key: str) -> Built:
        entry = self.cache / f"{key}.json.z" if self.cache is not None else None
        if entry is not None and entry.exists():
            try:
                data = json.loads(zlib.decompress(entry.read_bytes()))
                return Built(data["ok"], data["output"], data["ptx"], 0.0, cached=True)
            except (ValueError, KeyError, OSError, zlib.error):
                pass  # a damaged entry (a crash while writing, say) is compiled again
        built, complete = self._run(build)
        # Only a success is kept: a failure is compiled again next time, so that nvcc killed from outside (a signal,
        # a timeout, close()), which says nothing about the source, can never be remembered as the source's verdict.
        if entry is not None and complete and built.ok:
            entry.parent.mkdir(parents=True, exist_ok=True)
            partial = entry.with_name(f".{key}.{os.getpid()}.{threading.get_ident()}")
            record = {"ok": built.ok, "output": built.output, "ptx": built.ptx}
            partial.write_bytes(zlib.compress(json.dumps(record).encode()))
            partial.replace(entry)
        return built

    def _run(self, build: Build) -> tuple[Built, bool]:
        """nvcc's verdict, and whether nvcc ran to its end (only then is the verdict the source's)."""
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="refops-nvcc-") as tmp:
            work = pathlib.Path(tmp)
            source = build.source
            if source is None:
                source = work / build.name
                source.write_text(build.text)
            stem = pathlib.Path(build.name).stem
            if build.kind == "object":
                cmd = [self.nvcc, *build.flags, "-c", str(source), "-o", str(work / f"{stem}.o"),
                       "-keep", "-keep-dir", str(work)]
            else:
                cmd = [self.nvcc, *build.flags, "-ptx", str(source), "-o", str(work / f"{stem}.ptx")]
            if shutil.which("nice"):  # the tests in the foreground (forked ranks among them) come first
                cmd = ["nice", "-n", "10", *cmd]
            with self._lock:
                if self._closed:
                    raise RuntimeError("the session ended before this build started")
                # Its own process group: nvcc's children (cicc, ptxas) hold the output pipe, so they are stopped too.
                process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           start_new_session=True)
                self._running.add(process)
            complete = True
            try:
                output, _ = process.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                output = process.communicate()[0] + f"\n(killed after {TIMEOUT_S} s)"
                complete = False
            finally:
                with self._lock:
                    self._running.discard(process)
                    complete = complete and not self._closed
            ok = process.returncode == 0
            ptx_files = sorted(work.glob("*.ptx"))
            ptx = ptx_files[0].read_text() if ok and len(ptx_files) == 1 else None
        return Built(ok, output.strip(), ptx, time.perf_counter() - start), complete
