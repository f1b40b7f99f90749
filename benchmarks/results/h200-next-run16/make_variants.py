"""Build the variants of the next GPU run (run 16, prepared 2026-11-30 without a GPU). Run from the repository root.

_variants/np3form: the tree with ../h200-2026-11-30-run14/fp8_block_np3_form.patch applied (FP8 block quantize in
    run 12's np3 form: the one-iteration grid-stride loop and double buffers kept; 0.149 ms on the 1x128 case in
    runs 12 and 14 against 0.154 ms for the tree's form; PTX identical to run 12's np3). To be tested and taken.
_variants/lnnodb: a timing diagnostic, NOT correct: LayerNorm backward without its bias-gradient sums in shared
    memory (pass 1 neither loads, adds to nor stores them; dbias comes out as zeros). Timed beside the tree and
    RMSNorm backward, it says how much of the gap between LayerNorm backward (74 % of a copy) and RMSNorm backward
    (88 %) those shared-memory sums cost.
"""
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(".").resolve()
PATCH = ROOT / "benchmarks/results/h200-2026-11-30-run14/fp8_block_np3_form.patch"


def fresh(name: str) -> pathlib.Path:
    dst = ROOT / "_variants" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ROOT / "fastpath", dst / "fastpath", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


dst = fresh("np3form")
subprocess.run(["patch", "-p1", "-d", str(dst), "-i", str(PATCH)], check=True)
print("built", dst)

dst = fresh("lnnodb")
norm = dst / "fastpath" / "kernels" / "norm.cu"
text = norm.read_text()
for old in ("      if (DB_SHARED) DbShared<V>::load(db_sh, k, tid, ab);                    \\\n",
            "          if (DB_SHARED) ab[j] += gf[j];                                      \\\n",
            "      if (DB_SHARED) DbShared<V>::store(db_sh, k, tid, ab);                   \\\n"):
    assert text.count(old) == 1, old
    text = text.replace(old, "")
norm.write_text(text)
print("built", dst)
