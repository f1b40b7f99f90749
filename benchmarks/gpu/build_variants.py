"""Build kernel variants for a GPU run (CPU machine, repository root): each is a copy of fastpath/ under
_variants/NAME/fastpath with the run's patches applied, carried to the device (`carry: ["_variants"]`) and used by
variants.sh's check_variant and time_variants. A run's make_variants.py says what each variant is and calls build."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def build(name: str, patches: list[pathlib.Path]) -> pathlib.Path:
    """_variants/NAME: the tree's fastpath/ with ``patches`` applied in order (``patch -p1`` from the copy's root)."""
    dst = ROOT / "_variants" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ROOT / "fastpath", dst / "fastpath", ignore=shutil.ignore_patterns("__pycache__"))
    for patch in patches:
        subprocess.run(["patch", "-p1", "-d", str(dst), "-i", str(patch)], check=True)
    print("built", dst)
    return dst
