"""Build the variants of GPU run 17 (2026-11-30). Run from the repository root.

_variants/l1: every norm kernel asks for its next row's lines with prefetch.global.L1 instead of .L2, so that a
    row's first loads hit L1 (next to the SM) rather than L2. A hint only: results cannot change.
_variants/lnc2: LayerNorm backward's dx as fma(-c2, x - mean, rstd * (g - mean_g)), c2 = rstd * rstd * mean_gx
    once per row (algebraically rstd * (g - mean_g - xhat * mean_gx)): five operations per element instead of
    seven. x - mean and g - mean_g are exact zeros where the reference's are (one-element rows, constant rows),
    unlike run 16's lnfma, which failed there.
_variants/l1c2: both.
"""
import pathlib
import shutil

ROOT = pathlib.Path(".").resolve()


def fresh(name: str) -> pathlib.Path:
    dst = ROOT / "_variants" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ROOT / "fastpath", dst / "fastpath", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def edit(dst: pathlib.Path, pairs: list[tuple[str, str]]) -> None:
    norm = dst / "fastpath" / "kernels" / "norm.cu"
    text = norm.read_text()
    for old, new in pairs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    norm.write_text(text)
    print("built", dst)


L1 = [
    ("        if (has[k]) prefetch_l2(xn + col[k]);\n", "        if (has[k]) prefetch_l1(xn + col[k]);\n"),
    ("          prefetch_l2(xrow + row_step * n + col[k]);\n          prefetch_l2(dyrow + row_step * n + col[k]);\n",
     "          prefetch_l1(xrow + row_step * n + col[k]);\n          prefetch_l1(dyrow + row_step * n + col[k]);\n"),
]
C2 = [
    ("          const float xhat = KIND == LAYER ? (xf[j] - mean) * rstd : xf[j] * rstd; \\\n"
     "          const float g = gf[j] * gamma_of(wf[j], (ZC));                      \\\n"
     "          const float centered = KIND == LAYER ? g - mean_g : g;              \\\n"
     "          out[j] = rstd * (centered - xhat * mean_gx);                        \\\n",
     "          const float g = gf[j] * gamma_of(wf[j], (ZC));                      \\\n"
     "          if (KIND == LAYER) {                                                \\\n"
     "            out[j] = __fmaf_rn(-c2, xf[j] - mean, rstd * (g - mean_g));       \\\n"
     "          } else {                                                            \\\n"
     "            out[j] = rstd * (g - (xf[j] * rstd) * mean_gx);                   \\\n"
     "          }                                                                   \\\n"),
    ("    const float mean_g = s[0] * inv_n, mean_gx = s[1] * inv_n;\n",
     "    const float mean_g = s[0] * inv_n, mean_gx = s[1] * inv_n;\n"
     "    const float c2 = rstd * rstd * mean_gx;  // lnc2\n"),
]
edit(fresh("l1"), L1)
edit(fresh("lnc2"), C2)
edit(fresh("l1c2"), L1 + C2)
