"""Imports run one way: formats, layouts -> recipe -> kernels -> quantization -> ops -> sharding -> distributed ->
testing -> cli; ``fastpath`` reaches refops only through ``kernels``, ``layouts`` and ``formats``; no cycles.

Every import counts, those inside functions included (a function-level import is how a cycle hides); only
imports under ``if TYPE_CHECKING:`` are left out, since they never run.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: The layer of each part of refops, lowest first. Parts of one layer may import each other.
LAYERS: dict[str, int] = {
    "refops.formats": 0, "refops.layouts": 0, "refops.trace": 0, "refops.recipe_checks": 0, "refops.version": 0,
    "refops.recipe": 1, "refops.common": 1,
    "refops.kernels": 2,
    "refops.quantization": 3,
    "refops.ops": 4, "refops.graphs": 4,
    "refops.sharding": 5,
    "refops.distributed": 6,
    "refops.testing": 7, "refops.demo": 7,
    "refops.cli": 8, "refops.__main__": 8,
    "refops": 9,  # the package itself: its __init__ gathers the public names of every layer
}
#: What the fast path's kernel library may use of refops: the seam, and the formats and layouts it shares.
FASTPATH_MAY_IMPORT = ("refops.kernels", "refops.layouts", "refops.formats")
#: A program on top of both packages (it times refops' ops on the fast path), not part of the kernel library.
FASTPATH_PROGRAMS = ("fastpath.benchmark",)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for package in ("refops", "fastpath") for p in sorted((ROOT / package).rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def _imports(name: str, path: pathlib.Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, module imported)`` for every import that runs; ``from X import y`` counts as ``X.y`` when that is a
    module, else as ``X``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if sub in known else target


def _layer(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")


def _graph() -> dict[str, list[tuple[int, str]]]:
    modules = _modules()
    known = set(modules)
    return {name: [(line, target) for line, target in _imports(name, path, known)
                   if target.split(".")[0] in ("refops", "fastpath")]
            for name, path in modules.items()}


def test_every_refops_module_has_a_layer():
    without = [name for name in _modules() if name.startswith("refops") and _layer_or_none(name) is None]
    assert not without, f"modules that belong to no layer (add them to LAYERS): {without}"
    assert _layer("refops.sharding.row_blocks") == LAYERS["refops.sharding"]  # a submodule takes its package's


def _layer_or_none(module: str):
    try:
        return _layer(module)
    except AssertionError:
        return None


def test_no_refops_import_goes_up_a_layer():
    upward = []
    for name, imports in _graph().items():
        if not name.startswith("refops") or name == "refops":
            continue
        for line, target in imports:
            if target.startswith("fastpath"):
                upward.append(f"{name}:{line} imports {target} (refops never imports the fast path)")
            elif _layer(target) > _layer(name):
                upward.append(f"{name}:{line} (layer {_layer(name)}) imports {target} (layer {_layer(target)})")
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_the_fast_path_reaches_refops_only_through_the_seam():
    outside = []
    for name, imports in _graph().items():
        if not name.startswith("fastpath") or name.startswith(FASTPATH_PROGRAMS):
            continue
        for line, target in imports:
            if target.startswith("refops") and not target.startswith(FASTPATH_MAY_IMPORT):
                outside.append(f"{name}:{line} imports {target}")
    assert not outside, "fastpath may import only " + ", ".join(FASTPATH_MAY_IMPORT) + ":\n" + "\n".join(outside)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    """Between modules, a package's ``__init__`` apart: importing a package's submodule runs its ``__init__``
    first, so a submodule that imports its own package's re-exports is no cycle of the code."""
    modules = set(_modules())
    edges: dict[str, set[str]] = {}
    for name, imports in _graph().items():
        targets = {t for _, t in imports if t in modules and t != name}
        edges[name] = {t for t in targets if not (modules and _is_package(t) and name.startswith(t + "."))}
    # A package's __init__ importing its own submodules is how packages are built; count only code modules.
    code_edges = {n: {t for t in ts if not _is_package(t)} for n, ts in edges.items() if not _is_package(n)}
    assert _cycles(code_edges) == [], f"import cycles: {_cycles(code_edges)}"


def _is_package(name: str) -> bool:
    return (ROOT / pathlib.Path(*name.split(".")) / "__init__.py").exists()
