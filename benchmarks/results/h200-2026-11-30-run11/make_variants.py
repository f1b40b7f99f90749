"""Build _variants/hint1 and _variants/hint2: copies of fastpath/ whose FP8 tile kernels (fp8_tile128.cuh,
cast_fp8.cu's full-tile row store) and 16-byte vector loads/stores (vector_io.cuh: norms, activations) carry
cache hints. hint1: loads L1::no_allocate + L2::256B prefetch size, stores .cs; hint2: loads and stores
L2::evict_first. Results are unchanged by construction (hints only). Run from the repository root."""
import pathlib
import shutil

ROOT = pathlib.Path(".").resolve()
HELPERS = {
    1: r'''
__device__ __forceinline__ uint4 hint_ld16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ void hint_st16(void* p, uint4 v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void hint_st8(void* p, uint2 v) {
    asm volatile("st.global.cs.v2.u32 [%0], {%1,%2};" :: "l"(p), "r"(v.x), "r"(v.y) : "memory");
}
''',
    2: r'''
__device__ __forceinline__ uint4 hint_ld16(const void* p) {
    uint4 v;
    asm volatile("{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 " ld.global.nc.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], pol;\n}"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ void hint_st16(void* p, uint4 v) {
    asm volatile("{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 " st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, pol;\n}"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void hint_st8(void* p, uint2 v) {
    asm volatile("{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 " st.global.L2::cache_hint.v2.u32 [%0], {%1,%2}, pol;\n}" :: "l"(p), "r"(v.x), "r"(v.y) : "memory");
}
''',
}


def patch(path: pathlib.Path, pairs) -> None:
    text = path.read_text()
    for old, new in pairs:
        assert text.count(old) >= 1, (path, old)
        text = text.replace(old, new)
    path.write_text(text)


for hint, helpers in HELPERS.items():
    dst = ROOT / "_variants" / f"hint{hint}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ROOT / "fastpath", dst / "fastpath", ignore=shutil.ignore_patterns("__pycache__"))
    k = dst / "fastpath" / "kernels"
    patch(k / "fp8_tile128.cuh", [
        ("#define TILE 128", helpers + "\n#define TILE 128"),
        ("const uint4 a = p[h];", "const uint4 a = hint_ld16(p + h);"),
        ("*reinterpret_cast<uint2*>(dst) = make_uint2(w0, w1);", "hint_st8(dst, make_uint2(w0, w1));"),
        ("*reinterpret_cast<uint4*>(dst) = w;", "hint_st16(dst, w);"),
    ])
    patch(k / "cast_fp8.cu", [
        ("*reinterpret_cast<uint2*>(dst) = make_uint2(rw[i][0], rw[i][1]);",
         "hint_st8(dst, make_uint2(rw[i][0], rw[i][1]));"),
    ])
    patch(k / "vector_io.cuh", [
        ("template <class Tr>\nstruct Io16x8 {", helpers + "\ntemplate <class Tr>\nstruct Io16x8 {"),
        ("static __device__ __forceinline__ Raw load(const R* p) { return *reinterpret_cast<const uint4*>(p); }",
         "static __device__ __forceinline__ Raw load(const R* p) { return hint_ld16(p); }"),
        ("static __device__ __forceinline__ void store(R* p, const Raw& v) { *reinterpret_cast<uint4*>(p) = v; }",
         "static __device__ __forceinline__ void store(R* p, const Raw& v) { hint_st16(p, v); }"),
    ])
    print("built", dst)
