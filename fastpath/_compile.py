"""Compiling CUDA sources with NVRTC, exactly as asked, and caching the binaries on disk.

Not ``cupy.RawModule``: CuPy appends ``-ftz=true`` after the caller's options
(cupy/cupy#9576) and NVRTC takes the last occurrence, so subnormals would flush
to zero and results would differ from torch's kernels. Compiling with
``compile_using_nvrtc`` (what ``RawModule`` calls after appending the flag) and
the include paths ``RawModule`` adds gives the same code without the flag.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
from typing import Any, Optional, Sequence

__all__ = ["compile_module"]


def compile_module(source: str, options: Sequence[str], device_index: int, *, filename: str = "kernel.cu") -> Any:
    """``source`` compiled by NVRTC with exactly ``options`` and loaded on device ``device_index``.

    Returns a ``cupy.cuda.function.Module`` (``get_function(name)`` gives a kernel that
    ``_cuda.launch`` runs). Not ``cupy.RawModule``: CuPy appends ``-ftz=true`` after the
    caller's options (cupy/cupy#9576, ``cupy.cuda.compiler._compile_with_cache_cuda``) and
    NVRTC takes the last occurrence, so ``--ftz=false`` there is silently overridden and
    subnormal results flush to zero. Compiling with ``compile_using_nvrtc`` (what RawModule
    calls after appending the flag) and the include paths RawModule adds gives the same code
    without the flag. Compiled modules are kept under ``$CUPY_CACHE_DIR/fastpath``
    (default ``~/.cupy/kernel_cache``) unless ``CUPY_CACHE_IN_MEMORY=1``.
    """
    import cupy
    from cupy.cuda import compiler, function

    options = _with_include_paths(cupy, tuple(options))
    if any(o.lstrip("-") == "ftz=true" for o in options):
        raise ValueError(f"compile_module: flush-to-zero would break bit-exactness; options {options}")
    with cupy.cuda.Device(device_index):
        cache = _cache_file(cupy, source, options, device_index)
        binary = _read_cached(cache)
        if binary is None:
            compiled = compiler.compile_using_nvrtc(source, options=options, filename=filename)
            binary = compiled[0] if isinstance(compiled, tuple) else compiled  # (binary, names) in CuPy >= 9
            _write_cached(cache, binary)
        module = function.Module()
        module.load(binary)
    return module


def _with_include_paths(cupy: Any, options: tuple[str, ...]) -> tuple[str, ...]:
    """``options`` plus the include paths ``cupy.RawModule`` adds (CCCL, CuPy's and the CUDA toolkit's headers)."""
    try:
        from cupy._core.core import assemble_cupy_compiler_options
    except ImportError:  # older CuPy: the CUDA toolkit's headers are all these kernels include
        cuda_path = cupy.cuda.get_cuda_path()
        return options + ((f"-I{os.path.join(cuda_path, 'include')}",) if cuda_path else ())
    return tuple(assemble_cupy_compiler_options(options))


def _cache_file(cupy: Any, source: str, options: tuple[str, ...], device_index: int) -> Optional[pathlib.Path]:
    """The cache entry for this compile, keyed by everything that changes the code (None: do not cache)."""
    if os.environ.get("CUPY_CACHE_IN_MEMORY") == "1":
        return None
    try:
        from cupy_backends.cuda.libs import nvrtc

        identity = (source, options, nvrtc.getVersion(), cupy.cuda.Device(device_index).compute_capability,
                    cupy.__version__)
    except Exception:  # without the NVRTC version a cached binary could be stale: compile every time
        return None
    root = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    return pathlib.Path(root) / "fastpath" / (hashlib.sha256(repr(identity).encode()).hexdigest() + ".bin")


def _read_cached(path: Optional[pathlib.Path]) -> Optional[bytes]:
    """The cached binary, or None when absent or damaged (the file starts with the binary's SHA-256)."""
    try:
        data = path.read_bytes() if path is not None else b""
    except OSError:
        return None
    digest, binary = data[:64], data[64:]
    return binary if binary and digest == hashlib.sha256(binary).hexdigest().encode() else None


def _write_cached(path: Optional[pathlib.Path], binary: bytes) -> None:
    """Write atomically (other processes may read it at the same time); a cache that cannot be written is skipped."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
            tmp.write(hashlib.sha256(binary).hexdigest().encode() + binary)
        os.replace(tmp.name, path)
    except OSError:
        pass


