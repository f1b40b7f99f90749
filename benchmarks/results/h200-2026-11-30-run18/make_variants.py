"""Build the variants of GPU run 18 (2026-11-30). Run from the repository root.

LayerNorm backward at 16384 x 8192 bf16 runs 256-thread blocks, a block per row, 32 elements per thread, two
blocks (16 warps) per SM (128 registers). These variants give rows of 4097-8192 fp16/bf16 (2049-4096 fp32)
elements to 512-thread blocks, 16 elements per thread (VPT = 2), two blocks (32 warps) per SM:

_variants/p2r: layer_norm_bwd_p2: x, dy and both gradient accumulators in registers (64 a thread; ptxas spills
    116 bytes for bf16).
_variants/p2s: layer_norm_bwd_p2s: the bias-gradient sums in shared memory (as layer_norm_bwd), x, dy and the
    weight-gradient sums in registers.
_variants/p2sc2: p2s with run 17's lnc2 form of dx (fma(-c2, x - mean, rstd * (g - mean_g))).
Each also keeps the tree's kernels; FASTPATH_LN_P2=0 in the environment sends every row to them.
"""
import pathlib
import shutil

ROOT = pathlib.Path(".").resolve()


def fresh(name: str) -> pathlib.Path:
    dst = ROOT / "_variants" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ROOT / "fastpath", dst / "fastpath", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def edit(path: pathlib.Path, pairs: list[tuple[str, str]]) -> None:
    text = path.read_text()
    for old, new in pairs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)


COMMON = [
    ("template <int V>\nstruct DbShared {", "template <int V, int STRIDE = DB_THREADS>\nstruct DbShared {"),
    ("        const float4 w = *reinterpret_cast<const float4*>(base + ((k * (V / 4) + q) * DB_THREADS + t) * 4);",
     "        const float4 w = *reinterpret_cast<const float4*>(base + ((k * (V / 4) + q) * STRIDE + t) * 4);"),
    ("      for (int j = 0; j < V; ++j) v[j] = base[(k * V + j) * DB_THREADS + t];",
     "      for (int j = 0; j < V; ++j) v[j] = base[(k * V + j) * STRIDE + t];"),
    ("        *reinterpret_cast<float4*>(base + ((k * (V / 4) + q) * DB_THREADS + t) * 4) =",
     "        *reinterpret_cast<float4*>(base + ((k * (V / 4) + q) * STRIDE + t) * 4) ="),
    ("      for (int j = 0; j < V; ++j) base[(k * V + j) * DB_THREADS + t] = v[j];",
     "      for (int j = 0; j < V; ++j) base[(k * V + j) * STRIDE + t] = v[j];"),
    ("template <int KIND, class Tr, int V, int VPT, bool DB_SHARED = false>\n__device__ __forceinline__ void backward_body(",
     "template <int KIND, class Tr, int V, int VPT, bool DB_SHARED = false, bool KEEP = false>\n"
     "__device__ __forceinline__ void backward_body("),
    ("  constexpr bool reread = KIND == LAYER && !DB_SHARED;\n",
     "  constexpr bool reread = KIND == LAYER && !DB_SHARED && !KEEP;\n"
     "  constexpr int DBS = VPT == 2 ? 512 : DB_THREADS;  // threads whose bias-gradient slots db_sh holds\n"),
    ("  if (DB_SHARED && blockDim.x * blockDim.y > DB_THREADS) __trap();",
     "  if (DB_SHARED && blockDim.x * blockDim.y > DBS) __trap();"),
    ("      if (DB_SHARED) DbShared<V>::load(db_sh, k, tid, ab);                    \\\n      _Pragma",
     "      if (DB_SHARED) DbShared<V, DBS>::load(db_sh, k, tid, ab);               \\\n      _Pragma"),
    ("      if (DB_SHARED) DbShared<V>::store(db_sh, k, tid, ab);                   \\\n",
     "      if (DB_SHARED) DbShared<V, DBS>::store(db_sh, k, tid, ab);              \\\n"),
    ("    for (int k = 0; k < VPT; ++k) DbShared<V>::store(db_sh, k, tid, zero);",
     "    for (int k = 0; k < VPT; ++k) DbShared<V, DBS>::store(db_sh, k, tid, zero);"),
    ("      if (DB_SHARED) DbShared<V>::load(db_sh, k, tid, ab);\n#pragma unroll",
     "      if (DB_SHARED) DbShared<V, DBS>::load(db_sh, k, tid, ab);\n#pragma unroll"),
    ('''  extern "C" __global__ void __launch_bounds__(512)                                                                \\
      layer_norm_bwd_wide_##SUFFIX(''',
     '''  extern "C" __global__ void __launch_bounds__(512, 2)                                                             \\
      layer_norm_bwd_p2_##SUFFIX(const TR::raw* dy, const TR::raw* x, const float* mean, const float* rstd,        \\
                                 const TR::raw* w, TR::raw* dx, float* partial_w, float* partial_b, i64 rows,      \\
                                 i64 n, int zero_centered, int vec) {                                              \\
    __shared__ __align__(16) float db_sh[P2_SHARED ? 2 * V * 512 : 4];                                             \\
    backward_body<LAYER, TR, V, 2, P2_SHARED, true>(dy, x, mean, rstd, w, dx, partial_w, partial_b, rows, n, 0.0f, \\
                                                    zero_centered != 0, db_sh);                                    \\
  }                                                                                                                \\
  extern "C" __global__ void __launch_bounds__(512)                                                                \\
      layer_norm_bwd_wide_##SUFFIX('''),
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
LAUNCHER = [
    ('''    wide = kind == "layer_norm" and tpr * rpb > _DB_THREADS
    name = f"{kind}_bwd_wide_{suffix}" if wide else f"{kind}_bwd_{suffix}"
''', '''    wide = kind == "layer_norm" and tpr * rpb > _DB_THREADS
    name = f"{kind}_bwd_wide_{suffix}" if wide else f"{kind}_bwd_{suffix}"
    import os
    if (kind == "layer_norm" and vec and os.environ.get("FASTPATH_LN_P2", "1") == "1"
            and 256 * 2 * _VECTOR_WIDTH[x.dtype] < n <= 512 * 2 * _VECTOR_WIDTH[x.dtype]):
        name, tpr, rpb = f"layer_norm_bwd_p2_{suffix}", 512, 1
'''),
]


def build(name: str, shared: bool, c2: bool) -> None:
    dst = fresh(name)
    norm = dst / "fastpath" / "kernels" / "norm.cu"
    edit(norm, COMMON + (C2 if c2 else []))
    norm.write_text(norm.read_text().replace("#define DB_THREADS 256\n",
                                             f"#define DB_THREADS 256\n#define P2_SHARED {int(shared)}\n"))
    edit(dst / "fastpath" / "norms.py", LAUNCHER)
    print("built", dst)


build("p2r", shared=False, c2=False)
build("p2s", shared=True, c2=False)
build("p2sc2", shared=True, c2=True)
