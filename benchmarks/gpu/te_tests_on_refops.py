"""Run TransformerEngine's own PyTorch tests with refops in TE's place, and report state that tests leave behind.

    python benchmarks/gpu/te_tests_on_refops.py /work/te-src/tests/pytorch/test_fusible_ops.py \\
        [--out DIR] [--device auto|cuda|cpu] [--quantized-on-cpu] [--isolate-fusion-registry] \\
        [--backend reference|fastpath] -- [pytest arguments, e.g. -n 12 -x -k TestTrainingLoops]

From the repository root. TE's test files import ``transformer_engine.pytorch as te``; this script
runs pytest on them with a ``transformer_engine`` package first on ``sys.path`` whose ``pytorch``
is refops (``transformer_engine.pytorch.X`` is ``refops.X``), whose ``common.recipe`` is
``refops.common.recipe``, and which stubs the few names ``tests/pytorch/utils.py`` imports that
refops has no counterpart for (the attention backends, ``InferenceParams``...): a stub raises
``NotImplementedError`` naming itself when used, so a test that needs one fails visibly. A real
TransformerEngine installed on the machine is shadowed, never imported.

``--device cpu`` (the default without a GPU) runs TE's CUDA tests on the CPU: every ``"cuda"``
default of a test or helper function (TE's tests take ``device="cuda"`` keyword-only) becomes
``"cpu"``, tests parametrized over CUDA devices are skipped, and ``torch.cuda``'s RNG state calls
become no-ops. TE's tests skip every quantization recipe off CUDA; ``--quantized-on-cpu`` lifts
that skip (refops runs every recipe on the CPU). With ``--out DIR``: ``DIR/pytest.log`` (the
whole output), ``DIR/junit.xml``, ``DIR/state_left_behind.log`` and ``DIR/summary.txt``.

State left behind. Every test is watched (in each pytest-xdist worker too): refops' fusion-function
registries (``OperationFuser.*_fusion_functions``: TE's API registers for good), the quantization
state (``autocast`` / ``quantized_model_init`` depth and recipe), the kernel backend, torch's set
default device and grad mode. A test that leaves any of them changed gets a line in
``state_left_behind.log``. Registrations are expected (TE's tests register one-shot fusion
functions and never remove them); the line names them. ``--isolate-fusion-registry`` puts the
registries back after each test: one failing test then cannot arm a fusion for the next.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import inspect
import os
import pathlib
import subprocess
import sys
import tempfile
import types
from typing import Any, Callable, Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
THIS_MODULE = pathlib.Path(__file__).stem  # the pytest plugin, loaded with -p in the pytest process

#: Environment variables that carry the options into the pytest process (and its xdist workers).
ENV_DEVICE = "TE_ON_REFOPS_DEVICE"
ENV_QUANTIZED_ON_CPU = "TE_ON_REFOPS_QUANTIZED_ON_CPU"
ENV_ISOLATE = "TE_ON_REFOPS_ISOLATE_FUSION_REGISTRY"
ENV_BACKEND = "TE_ON_REFOPS_BACKEND"
ENV_STATE_LOG = "TE_ON_REFOPS_STATE_LOG"


# =====================================================================================================
# The transformer_engine shim (runs inside the pytest process)
# =====================================================================================================
class _NotInRefops:
    """A name TE's test utilities import that refops has no counterpart for: using it raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{self._name} is not part of refops (stubbed by te_tests_on_refops so that TE's tests import)"
        )

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # probes (pytest, inspect, pickle) see a plain object
            raise AttributeError(attr)
        return self(attr)

    def __repr__(self) -> str:
        return f"<not in refops: {self._name}>"


def _stub(name: str) -> _NotInRefops:
    return _NotInRefops(f"transformer_engine.pytorch.{name}")


#: Modules refops does not have, with the attributes TE's tests/pytorch/utils.py and test files import.
STUB_MODULES: dict[str, dict[str, Any]] = {
    "transformer_engine.pytorch.attention": {},
    "transformer_engine.pytorch.attention.dot_product_attention": {"_attention_backends": {}},
    "transformer_engine.pytorch.attention.dot_product_attention.utils": {
        name: _stub(f"attention.dot_product_attention.utils.{name}")
        for name in ("get_attention_backend", "AttentionParams", "AttentionLogging", "check_set_window_size")
    },
    "transformer_engine.pytorch.cpp_extensions": {},
    "transformer_engine.pytorch.cpp_extensions.fused_attn": {"FusedAttnBackend": _stub("FusedAttnBackend")},
    "transformer_engine.pytorch.module": {},
    "transformer_engine.pytorch.module.base": {"get_dummy_wgrad": _stub("module.base.get_dummy_wgrad")},
    # refops' extra state is never pickled, so TE's opt-in variable changes nothing; the name is TE's.
    "transformer_engine.pytorch._extra_state": {"UNSAFE_PICKLE_EXTRA_STATE_ENV": "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"},
}

#: Top-level names of ``transformer_engine.pytorch`` that refops lacks, stubbed the same way.
STUB_ATTRIBUTES: dict[str, Any] = {"InferenceParams": _stub("InferenceParams")}

#: ``transformer_engine.<prefix>`` is ``refops.<target>``.
ALIASES = {"transformer_engine.pytorch": "refops", "transformer_engine.common": "refops.common"}


def _alias_target(fullname: str) -> Optional[str]:
    for prefix, target in ALIASES.items():
        if fullname == prefix or fullname.startswith(prefix + "."):
            return target + fullname[len(prefix):]
    return None


class _ExistingModuleLoader(importlib.abc.Loader):
    """Loads an alias as the already imported refops module itself (same object, so isinstance agrees)."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._spec  # importlib set the alias's spec on it; refops' own stays


class _StubModuleLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, f"Stub of {spec.name} (not part of refops)")
        module.__path__ = []  # a package, so deeper stubs import
        module.__dict__.update(STUB_MODULES[spec.name])
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _TransformerEngineFinder(importlib.abc.MetaPathFinder):
    """``transformer_engine.pytorch.*`` and ``transformer_engine.common.*`` resolve to refops (or a stub)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname in STUB_MODULES:
            return importlib.machinery.ModuleSpec(fullname, _StubModuleLoader(), is_package=True)
        if fullname == "transformer_engine.pytorch":
            return importlib.machinery.ModuleSpec(fullname, _ProxyLoader(), is_package=True)
        target_name = _alias_target(fullname)
        if target_name is None:
            return None
        try:
            module = importlib.import_module(target_name)
        except ModuleNotFoundError:
            return None  # the import fails with TE's module name: refops has no such module
        return importlib.machinery.ModuleSpec(
            fullname, _ExistingModuleLoader(module), is_package=hasattr(module, "__path__")
        )


class _ProxyLoader(importlib.abc.Loader):
    """``transformer_engine.pytorch``: a module that reads refops' names, then the stubbed ones.

    A module of its own rather than refops itself, so that the stubs never become refops
    attributes; every name it returns is refops' own object.
    """

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        import refops

        module = types.ModuleType(spec.name, refops.__doc__)
        module.__path__ = []

        def __getattr__(name: str) -> Any:
            if hasattr(refops, name):
                return getattr(refops, name)
            if name in STUB_ATTRIBUTES:
                return STUB_ATTRIBUTES[name]
            raise AttributeError(f"transformer_engine.pytorch (refops) has no attribute {name!r}")

        module.__getattr__ = __getattr__  # type: ignore[attr-defined]
        module.__all__ = list(refops.__all__)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_shim(package: types.ModuleType) -> None:
    """Called by the ``transformer_engine/__init__.py`` this script writes: route TE's names to refops."""
    if not any(isinstance(f, _TransformerEngineFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TransformerEngineFinder())
    package.__version__ = "refops"


_SHIM_INIT = f'''"""transformer_engine for TE's tests, backed by refops (written by {THIS_MODULE}.py)."""
from {THIS_MODULE} import install_shim

install_shim(__import__(__name__))
'''


def write_shim(directory: pathlib.Path) -> pathlib.Path:
    """``directory/transformer_engine/__init__.py``; put ``directory`` first on ``sys.path``."""
    package = directory / "transformer_engine"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(_SHIM_INIT)
    return directory


# =====================================================================================================
# The pytest plugin (loaded with -p te_tests_on_refops in the pytest process and its workers)
# =====================================================================================================
def _is_cuda(value: Any) -> bool:
    import torch

    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    return isinstance(value, torch.device) and value.type == "cuda"


def _cpu_like(value: Any) -> Any:
    import torch

    return torch.device("cpu") if isinstance(value, torch.device) else "cpu"


def _move_cuda_defaults_to_cpu(func: Callable) -> bool:
    """Rewrite ``"cuda"`` defaults (keyword-only and positional) of ``func`` and what it wraps. True if any."""
    changed = False
    seen: set[int] = set()
    while func is not None and id(func) not in seen:
        seen.add(id(func))
        target = getattr(func, "__func__", func)
        kwdefaults = getattr(target, "__kwdefaults__", None)
        if kwdefaults:
            for key, value in kwdefaults.items():
                if _is_cuda(value):
                    kwdefaults[key] = _cpu_like(value)
                    changed = True
        defaults = getattr(target, "__defaults__", None)
        if defaults and any(_is_cuda(v) for v in defaults):
            target.__defaults__ = tuple(_cpu_like(v) if _is_cuda(v) else v for v in defaults)
            changed = True
        func = getattr(func, "__wrapped__", None)
    return changed


def _move_module_defaults_to_cpu(module: types.ModuleType) -> None:
    """Every function and method defined in ``module`` (helpers such as make_reference_and_test_tensors)."""
    for value in list(vars(module).values()):
        if inspect.isfunction(value) and value.__module__ == module.__name__:
            _move_cuda_defaults_to_cpu(value)
        elif inspect.isclass(value) and value.__module__ == module.__name__:
            for member in vars(value).values():
                member = getattr(member, "__func__", member)
                if inspect.isfunction(member):
                    _move_cuda_defaults_to_cpu(member)


def _allow_quantization_on_cpu(module: types.ModuleType) -> None:
    """TE's ``maybe_skip_quantization`` skips any recipe off CUDA; refops runs them on the CPU."""
    original = getattr(module, "maybe_skip_quantization", None)
    if original is None or getattr(original, "_te_on_refops", False):
        return

    def maybe_skip_quantization(quantization: Any, *args: Any, device: Any = None, **kwargs: Any) -> None:
        if device is not None and not _is_cuda(device):
            device = "cuda"  # only the check's notion of device: nothing is allocated there
        return original(quantization, *args, device=device, **kwargs)

    maybe_skip_quantization._te_on_refops = True  # type: ignore[attr-defined]
    module.maybe_skip_quantization = maybe_skip_quantization


def _cuda_rng_as_no_ops() -> None:
    """TE's reset_rng_states saves and restores torch.cuda's RNG state; without CUDA there is none."""
    import torch

    torch.cuda.get_rng_state = lambda device="cuda": torch.empty(0, dtype=torch.uint8)
    torch.cuda.set_rng_state = lambda new_state, device="cuda": None


def pytest_configure(config: Any) -> None:
    import torch

    import refops

    if os.environ.get(ENV_BACKEND):
        refops.use_backend(os.environ[ENV_BACKEND])
    if os.environ.get(ENV_DEVICE) == "cpu" and not torch.cuda.is_available():
        _cuda_rng_as_no_ops()


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    if os.environ.get(ENV_DEVICE) != "cpu":
        return
    modules = {item.module for item in items if getattr(item, "module", None) is not None}
    utils = sys.modules.get("utils")
    for module in modules | ({utils} if utils is not None else set()):
        _move_module_defaults_to_cpu(module)
        if os.environ.get(ENV_QUANTIZED_ON_CPU):
            _allow_quantization_on_cpu(module)
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        cuda_params = sorted(name for name, value in params.items() if _is_cuda(value))
        if cuda_params:
            item.add_marker(pytest.mark.skip(reason=f"CPU run: parametrized with a CUDA {', '.join(cuda_params)}"))
        elif getattr(item, "function", None) is not None:
            _move_cuda_defaults_to_cpu(item.function)


# ------------------------------------------------------------------------------- state left behind
def _fusion_registries() -> dict[str, list]:
    from refops.ops.fuser import OperationFuser

    return {
        "forward_backward": OperationFuser.forward_backward_fusion_functions,
        "forward": OperationFuser.forward_fusion_functions,
        "backward": OperationFuser.backward_fusion_functions,
    }


def _global_state() -> dict[str, Any]:
    """What one test must not change for the next (beyond the fusion registries)."""
    import torch

    from refops.kernels import registry
    from refops.ops.placement import explicit_default_device
    from refops.quantization import thread_state

    s = thread_state.current()
    return {
        "autocast": (s.enabled, s.depth, type(s.recipe).__name__ if s.recipe is not None else None),
        "quantized_model_init": (s.parameters_enabled, type(s.parameters_recipe).__name__
                                 if s.parameters_recipe is not None else None),
        "kernel backend": registry.current_backend().name,
        "default device": str(explicit_default_device()),
        "grad mode": (torch.is_grad_enabled(), torch.is_inference_mode_enabled()),
    }


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", repr(func))


def _log_state_left_behind(nodeid: str, problems: list[str]) -> None:
    line = f"{nodeid}\t" + "; ".join(problems) + "\n"
    path = os.environ.get(ENV_STATE_LOG)
    if path:
        with open(path, "a") as log:  # one write per line: xdist workers append to the same file
            log.write(line)
    _LEFT_BEHIND.append(line.rstrip("\n"))


_LEFT_BEHIND: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any):
    """Around each test's setup, call and teardown: compare the state before and after."""
    registries = _fusion_registries()
    before = {kind: list(functions) for kind, functions in registries.items()}
    state_before = _global_state()
    try:
        yield
    finally:
        problems = []
        for kind, functions in registries.items():
            added = [f for f in functions if not any(f is g for g in before[kind])]
            removed = [f for f in before[kind] if not any(f is g for g in functions)]
            if added or removed:
                change = ", ".join([f"+{_name(f)}" for f in added] + [f"-{_name(f)}" for f in removed])
                problems.append(f"{kind} fusion functions {change}")
                if os.environ.get(ENV_ISOLATE):
                    functions[:] = before[kind]
        state_after = _global_state()
        problems += [f"{key}: {state_before[key]} -> {state_after[key]}"
                     for key in state_before if state_before[key] != state_after[key]]
        if problems:
            _log_state_left_behind(item.nodeid, problems)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _LEFT_BEHIND:
        terminalreporter.section("state left behind by tests (te_tests_on_refops)")
        for line in _LEFT_BEHIND:
            terminalreporter.write_line(line)


# =====================================================================================================
# The command line
# =====================================================================================================
def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tests", nargs="+", help="TE test files or node ids (e.g. /work/te-src/tests/pytorch/test_fusible_ops.py)")
    parser.add_argument("--out", type=pathlib.Path, help="write pytest.log, junit.xml, state_left_behind.log, summary.txt here")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="cpu: run TE's CUDA tests on the CPU (auto: cuda when torch sees a GPU)")
    parser.add_argument("--quantized-on-cpu", action="store_true", help="with --device cpu: do not skip quantized tests")
    parser.add_argument("--isolate-fusion-registry", action="store_true",
                        help="put refops' fusion-function registries back after every test")
    parser.add_argument("--backend", help="refops kernel backend for the run (reference or fastpath)")
    return parser.parse_args(ours), pytest_args


def _summary(junit: pathlib.Path) -> str:
    import xml.etree.ElementTree as ET

    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    failed: list[str] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        counts["failed" if outcome == "failure" else outcome] += 1
        if outcome in ("failure", "error"):
            message = next(child for child in case if child.tag == outcome).get("message", "")
            failed.append(f"{case.get('classname')}::{case.get('name')}: {message.splitlines()[0][:200] if message else ''}")
    lines = [", ".join(f"{n} {k}" for k, n in counts.items())] + sorted(failed)
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    args, pytest_args = _parse(sys.argv[1:] if argv is None else argv)
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("te_tests_on_refops: --device cuda, but torch sees no GPU (use --device cpu)")
    out = args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="te_on_refops_") as tmp:
        shim = write_shim(pathlib.Path(tmp))
        state_log = (out or pathlib.Path(tmp)) / "state_left_behind.log"
        state_log.unlink(missing_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(shim), str(pathlib.Path(__file__).resolve().parent), str(ROOT)]
            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        env[ENV_DEVICE] = device
        env[ENV_STATE_LOG] = str(state_log)
        for name, on in ((ENV_QUANTIZED_ON_CPU, args.quantized_on_cpu), (ENV_ISOLATE, args.isolate_fusion_registry)):
            env.pop(name, None)
            if on:
                env[name] = "1"
        env.pop(ENV_BACKEND, None)
        if args.backend:
            env[ENV_BACKEND] = args.backend
        command = [sys.executable, "-m", "pytest", *args.tests, "-p", THIS_MODULE, "-p", "no:cacheprovider"]
        if out is not None:
            command += ["--junitxml", str(out / "junit.xml")]
        command += pytest_args
        print("te_tests_on_refops:", " ".join(command), f"(device {device})", flush=True)
        if out is None:
            return subprocess.run(command, env=env, cwd=ROOT).returncode
        with open(out / "pytest.log", "w") as log:
            process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
            assert process.stdout is not None
            for line in process.stdout:
                sys.stdout.write(line)
                log.write(line)
            returncode = process.wait()
        junit = out / "junit.xml"
        summary = _summary(junit) if junit.exists() else "no junit.xml (pytest did not get to write it)\n"
        left = state_log.read_text() if state_log.exists() else ""
        summary += f"\nstate left behind: {len(left.splitlines())} tests (state_left_behind.log)\n"
        (out / "summary.txt").write_text(summary)
        print(summary, end="")
        return returncode


if __name__ == "__main__":
    sys.exit(main())
