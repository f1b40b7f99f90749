"""The NVRTC path every fast-path module compiles through, checked on any machine with a fake CuPy.

CuPy's ``RawModule`` appends ``-ftz=true`` after the caller's options (cupy/cupy#9576), so the
kernels go to NVRTC directly (``fastpath._compile``): these tests check the options each module
hands it (no flush to zero; activation.cu with FMA contraction like torch's kernels, the others
without), that shared headers are inlined (NVRTC has no include path to ``fastpath/kernels``),
and the on-disk cache of compiled modules.
"""

from __future__ import annotations

import pytest

from fastpath.elementwise import ACTIVATION_GROUPS


def _fake_cupy(monkeypatch, calls: dict, *, with_assemble: bool = True) -> None:
    """Just enough of CuPy for ``compile_module``: NVRTC, module loading, include paths, devices.
    ``calls`` records what reached NVRTC (``compiles`` counts the compilations)."""
    import sys
    import types

    def compile_using_nvrtc(source, options=(), arch=None, filename="kern.cu", **kwargs):
        calls.update(source=source, options=tuple(options), filename=filename,
                     compiles=calls.get("compiles", 0) + 1)
        return b"compiled:" + source.encode(), None

    class Module:
        def load(self, binary):
            calls["loaded"] = binary

        def get_function(self, name):
            return name

    class Device:
        compute_capability = "90"

        def __init__(self, index):
            calls["device"] = index

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def module(name: str, **attributes) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attributes)
        return m

    nvrtc = module("cupy_backends.cuda.libs.nvrtc", getVersion=lambda: (13, 0))
    compiler = module("cupy.cuda.compiler", compile_using_nvrtc=compile_using_nvrtc)
    function = module("cupy.cuda.function", Module=Module)
    cuda = module("cupy.cuda", compiler=compiler, function=function, Device=Device, get_cuda_path=lambda: "/opt/cuda")
    core = module("cupy._core.core")
    if with_assemble:  # CuPy's include paths around the caller's options, as RawModule gets them
        core.assemble_cupy_compiler_options = lambda o: ("-I/cccl",) + o + ("-I/cupy",)
    modules = {
        "cupy": module("cupy", cuda=cuda, __version__="14.2.0"), "cupy.cuda": cuda, "cupy.cuda.compiler": compiler,
        "cupy.cuda.function": function, "cupy._core": module("cupy._core", core=core), "cupy._core.core": core,
        "cupy_backends": module("cupy_backends"), "cupy_backends.cuda": module("cupy_backends.cuda"),
        "cupy_backends.cuda.libs": module("cupy_backends.cuda.libs", nvrtc=nvrtc),
        "cupy_backends.cuda.libs.nvrtc": nvrtc,
    }
    for name, m in modules.items():
        monkeypatch.setitem(sys.modules, name, m)


@pytest.mark.parametrize("with_assemble", [True, False], ids=["cupy-include-paths", "older-cupy"])
def test_activation_kernels_are_compiled_without_flushing_subnormals(monkeypatch, with_assemble):
    """cupy.RawModule appends -ftz=true after the caller's options (cupy/cupy#9576), so the
    activation module goes to NVRTC directly: it must get ACTIVATION_COMPILE_OPTIONS (--ftz=false,
    --fmad=true) and the include paths, and no -ftz=true."""
    from fastpath.elementwise import ACTIVATION_COMPILE_OPTIONS, _group_module

    calls: dict = {}
    _fake_cupy(monkeypatch, calls, with_assemble=with_assemble)
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    _group_module.cache_clear()
    try:
        module = _group_module("swiglu", 3)
    finally:
        _group_module.cache_clear()  # the fake module must not outlive this test
    assert module.get_function("act_fwd_swiglu_f32") == "act_fwd_swiglu_f32"
    assert calls["loaded"] == b"compiled:" + calls["source"].encode()
    assert calls["device"] == 3 and calls["filename"] == "activation.cu"
    assert calls["source"].startswith(f"#define ACTIVATION_GROUP {ACTIVATION_GROUPS['swiglu']}\n")
    assert '#include "' not in calls["source"], "NVRTC has no include path to fastpath/kernels: inline the headers"
    assert "struct Io16x8" in calls["source"]  # from vector_io.cuh
    options = calls["options"]
    assert "--ftz=false" in ACTIVATION_COMPILE_OPTIONS and "--fmad=true" in ACTIVATION_COMPILE_OPTIONS
    assert all(o in options for o in ACTIVATION_COMPILE_OPTIONS), options
    assert not any("ftz=true" in o for o in options), options
    assert ("-I/cupy" in options) if with_assemble else ("-I/opt/cuda/include" in options), options


def test_compiled_modules_are_cached_on_disk(monkeypatch, tmp_path):
    """The second process (here: a second call) loads the binary instead of compiling; a damaged
    cache file is recompiled; other options are another entry."""
    from fastpath._compile import compile_module

    calls: dict = {}
    _fake_cupy(monkeypatch, calls)
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    compile_module("k1", ("-std=c++17",), 0)
    compile_module("k1", ("-std=c++17",), 0)
    assert calls["compiles"] == 1 and calls["loaded"] == b"compiled:k1"
    (entry,) = (tmp_path / "fastpath").iterdir()
    entry.write_bytes(entry.read_bytes()[:-1])  # truncated by a crash, say
    compile_module("k1", ("-std=c++17",), 0)
    assert calls["compiles"] == 2 and calls["loaded"] == b"compiled:k1"
    compile_module("k1", ("-std=c++17", "--fmad=true"), 0)
    assert calls["compiles"] == 3 and len(list((tmp_path / "fastpath").iterdir())) == 2


def test_compile_module_refuses_flush_to_zero(monkeypatch):
    from fastpath._compile import compile_module

    _fake_cupy(monkeypatch, {})
    with pytest.raises(ValueError, match="flush-to-zero"):
        compile_module("", ("-std=c++17", "-ftz=true"), 0)


def test_every_fast_path_kernel_is_compiled_without_flushing_subnormals(monkeypatch):
    """The quantize and norm kernels go through _cuda.get_kernel: the same NVRTC path, --ftz=false."""
    from fastpath import _cuda

    calls: dict = {}
    _fake_cupy(monkeypatch, calls)
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    _cuda._module.cache_clear()
    _cuda._kernel.cache_clear()
    try:
        _cuda.get_kernel("cast_fp8.cu", "fp8_amax_f32", 0)
    finally:
        _cuda._module.cache_clear()
        _cuda._kernel.cache_clear()
    assert "--ftz=false" in calls["options"] and "--fmad=false" in calls["options"]
    assert not any("ftz=true" in o for o in calls["options"])
    assert calls["filename"] == "cast_fp8.cu"
    assert '#include "' not in calls["source"], "NVRTC has no include path to fastpath/kernels: inline the headers"
