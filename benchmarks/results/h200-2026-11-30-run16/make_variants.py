"""Build the variants of the next GPU run (run 16, prepared 2026-11-30 without a GPU). Run from the repository root.

_variants/np3form: the tree with ../h200-2026-11-30-run14/fp8_block_np3_form.patch applied (FP8 block quantize in
    run 12's np3 form: the one-iteration grid-stride loop and double buffers kept; 0.149 ms on the 1x128 case in
    runs 12 and 14 against 0.154 ms for the tree's form; PTX identical to run 12's np3). To be tested and taken.
_variants/lnnodb: a timing diagnostic, NOT correct: LayerNorm backward without its bias-gradient sums in shared
    memory (pass 1 neither loads, adds to nor stores them; dbias comes out as zeros). Timed beside the tree and
    RMSNorm backward, it says how much of the gap between LayerNorm backward (74 % of a copy) and RMSNorm backward
    (88 %) those shared-memory sums cost.
_variants/lnfma: LayerNorm backward's dx with two FMAs per element (per-row constants c_gx = -rstd * mean_gx,
    c_g = -rstd * mean_g: dx = fma(rstd, g, fma(c_gx, xhat, c_g))) instead of rstd * ((g - mean_g) - xhat * mean_gx)
    (five roundings): two instructions fewer per element in pass 2, results within the dtype tolerance the norm
    tests use (not the reference's op order: the docs of norm.cu would have to say so if taken). RMSNorm unchanged.
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

dst = fresh("lnfma")
norm = dst / "fastpath" / "kernels" / "norm.cu"
text = norm.read_text()
pairs = [
    ("          const float centered = KIND == LAYER ? g - mean_g : g;              \\\n"
     "          out[j] = rstd * (centered - xhat * mean_gx);                        \\\n",
     "          if (KIND == LAYER) {                                                \\\n"
     "            out[j] = __fmaf_rn(rstd, g, __fmaf_rn(c_gx, xhat, c_g));          \\\n"
     "          } else {                                                            \\\n"
     "            out[j] = rstd * (g - xhat * mean_gx);                             \\\n"
     "          }                                                                   \\\n"),
    ("    const float mean_g = s[0] * inv_n, mean_gx = s[1] * inv_n;\n",
     "    const float mean_g = s[0] * inv_n, mean_gx = s[1] * inv_n;\n"
     "    const float c_gx = -rstd * mean_gx, c_g = -rstd * mean_g;  // lnfma: dx = fma(rstd, g, fma(c_gx, xhat, c_g))\n"),
]
for old, new in pairs:
    assert text.count(old) == 1, old
    text = text.replace(old, new)
norm.write_text(text)
print("built", dst)
