"""How fast can the memory access patterns of the tile kernels go at all? A diagnostic, GPU only.

    python benchmarks/diag_access_patterns.py [--rows 16384] [--cols 8192]

Kernels that only move bytes (no arithmetic, no shared memory) in the address patterns of the fast
path's tile kernels, on a 16384 x 8192 bf16 tensor, timed beside torch's device-to-device copy:

- ``flat``: a grid-stride 16-byte copy (what the flat kernels do);
- ``tile-copy TMxTK``: a block reads a TM x TK tile of bf16 and writes it back at the same place of
  another tensor;
- ``fp8-pattern TMxTK``: a block reads a TM x TK bf16 tile and writes TM x TK bytes in the row-wise
  layout plus TK x TM bytes in the transposed (K, M) layout: the traffic of the FP8 cast + transpose
  (and, give or take the scales, of the FP8 block kernels), without its arithmetic;
- ``transpose-bf16 TMxTK``: the tile written transposed as bf16.

Each store takes its bytes from the loaded values, so stores wait for loads as in the real kernels. One
tile per block (many blocks resident), 256 threads. ``hint`` = 1 adds the L1::no_allocate + L2::256B
prefetch-size hint to loads and .cs to stores; 2 marks loads and stores L2::evict_first. A pattern's
figure is the ceiling of any kernel that moves the same bytes in that order; the % is of the copy.
"""

from __future__ import annotations

import argparse
import sys

import torch

KERNEL = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ uint4 ld16(const void* p) {
    uint4 v;
#if HINT == 1
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#elif HINT == 2
    asm volatile("{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 " ld.global.nc.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], pol;\n}"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
    v = __ldg(reinterpret_cast<const uint4*>(p));
#endif
    return v;
}
__device__ __forceinline__ void st16(void* p, uint4 v) {
#if HINT == 1
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
#elif HINT == 2
    asm volatile("{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 " st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, pol;\n}"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
#else
    *reinterpret_cast<uint4*>(p) = v;
#endif
}
__device__ __forceinline__ void st8(void* p, uint2 v) {
#if HINT == 1
    asm volatile("st.global.cs.v2.u32 [%0], {%1,%2};" :: "l"(p), "r"(v.x), "r"(v.y));
#elif HINT == 2
    asm volatile("{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 " st.global.L2::cache_hint.v2.u32 [%0], {%1,%2}, pol;\n}" :: "l"(p), "r"(v.x), "r"(v.y));
#else
    *reinterpret_cast<uint2*>(p) = v;
#endif
}

// 8 loads in flight per thread, then 8 stores.
extern "C" __global__ void __launch_bounds__(256) flat_copy(const uint4* x, uint4* y, u64 n16) {
    const u64 step = (u64)gridDim.x * 256;
    for (u64 base = (u64)blockIdx.x * 256 * 8 + threadIdx.x; base < n16; base += step * 8) {
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) if (base + i * 256 < n16) v[i] = ld16(x + base + i * 256);
#pragma unroll
        for (int i = 0; i < 8; ++i) if (base + i * 256 < n16) st16(y + base + i * 256, v[i]);
    }
}

// A TM x TK bf16 tile per block; NV = TM * TK / 8 / 256 16-byte loads per thread, issued together.
#define NV (TM * TK / 2048)
#define VPR (TK / 8)  // 16-byte vectors per tile row
extern "C" __global__ void __launch_bounds__(256) tile_pattern(const unsigned short* x, int M, int K, int mode,
                                                              unsigned short* y, unsigned char* row_out,
                                                              unsigned char* col_out) {
    const int tiles_k = K / TK;
    const int m0 = (blockIdx.x / tiles_k) * TM, k0 = (blockIdx.x % tiles_k) * TK;
    uint4 v[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int idx = threadIdx.x + 256 * i, r = idx / VPR, c = (idx % VPR) * 8;
        v[i] = ld16(x + (u64)(m0 + r) * K + k0 + c);
    }
    u32 mix = 0;
#pragma unroll
    for (int i = 0; i < NV; ++i) mix ^= v[i].x ^ v[i].w;
    if (mode == 0) {  // tile copy
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int idx = threadIdx.x + 256 * i, r = idx / VPR, c = (idx % VPR) * 8;
            st16(y + (u64)(m0 + r) * K + k0 + c, v[i]);
        }
    } else if (mode == 1) {  // fp8 pattern: row bytes (8 per load) + transposed bytes
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int idx = threadIdx.x + 256 * i, r = idx / VPR, c = (idx % VPR) * 8;
            st8(row_out + (u64)(m0 + r) * K + k0 + c, make_uint2(v[i].x ^ v[i].y, v[i].z ^ v[i].w));
        }
        // TK rows of TM bytes: TM / 16 vectors per row, NV / 2 per thread.
#pragma unroll
        for (int i = 0; i < NV / 2; ++i) {
            const int idx = threadIdx.x + 256 * i, r = idx / (TM / 16), c = (idx % (TM / 16)) * 16;
            st16(col_out + (u64)(k0 + r) * M + m0 + c, make_uint4(v[2 * i].x, v[2 * i].y ^ mix, v[2 * i + 1].z, mix));
        }
    } else {  // bf16 transposed: TK rows of TM bf16, TM / 8 vectors per row
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int idx = threadIdx.x + 256 * i, r = idx / (TM / 8), c = (idx % (TM / 8)) * 8;
            st16(y + (u64)(k0 + r) * M + m0 + c, make_uint4(v[i].y, v[i].x ^ mix, v[i].w, v[i].z));
        }
    }
}
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=8192)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    import cupy

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from _timing import median_ms

    M, K = args.rows, args.cols
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    row_out = torch.empty(M, K, dtype=torch.uint8, device="cuda")
    col_out = torch.empty(K, M, dtype=torch.uint8, device="cuda")
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    copy_ms, _ = median_ms(lambda: y.copy_(x), reps=30)
    copy_gbs = 2 * x.nbytes / copy_ms / 1e6
    print(f"torch copy: {copy_ms:.4f} ms, {copy_gbs:.0f} GB/s (100%)")

    def report(name: str, ms: float, nbytes: int) -> None:
        gbs = nbytes / ms / 1e6
        print(f"{name:34s} {ms:.4f} ms {gbs:6.0f} GB/s {100 * gbs / copy_gbs:5.1f}%")

    modules = {}

    def kernel(name: str, tm: int, tk: int, hint: int):
        key = (tm, tk, hint)
        if key not in modules:
            modules[key] = cupy.RawModule(code=KERNEL, options=("-std=c++17", f"-DTM={tm}", f"-DTK={tk}",
                                                                f"-DHINT={hint}"))
        return modules[key].get_function(name)

    for hint in (0, 1, 2):
        f = kernel("flat_copy", 128, 128, hint)
        n16 = x.nbytes // 16
        grid = sms * 8

        def run_flat(f=f, n16=n16, grid=grid):
            with stream:
                f((grid,), (256,), (x.data_ptr(), y.data_ptr(), cupy.uint64(n16)))

        report(f"flat copy hint={hint}", median_ms(run_flat, reps=30)[0], 2 * x.nbytes)

    shapes = [(128, 128), (64, 128), (256, 64), (128, 64), (64, 256), (32, 256), (256, 128), (128, 256)]
    for mode, label, factor in ((0, "tile-copy", 4), (1, "fp8-pattern", 4), (2, "transpose-bf16", 4)):
        for tm, tk in shapes:
            if tm * tk < 4096 or M % tm or K % tk:
                continue
            for hint in ((0, 1, 2) if (tm, tk) == (128, 128) else (0,)):
                f = kernel("tile_pattern", tm, tk, hint)
                grid = (M // tm) * (K // tk)

                def run_tile(f=f, grid=grid, mode=mode):
                    with stream:
                        f((grid,), (256,), (x.data_ptr(), cupy.int32(M), cupy.int32(K), cupy.int32(mode),
                                            y.data_ptr(), row_out.data_ptr(), col_out.data_ptr()))

                report(f"{label} {tm}x{tk} hint={hint}", median_ms(run_tile, reps=30)[0], factor * M * K)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
