// MXFP8: 1x32 (row-wise), 32x1 (column-wise) blocks or 32x32 tiles (2D), E8M0 scale bytes.
//
// Specification: refops/kernels/reference/quant_mxfp8.py and refops.formats (recipes-numerics §0.4, §2.3).
// Per block with amax a (NaNs skipped):
//   e = e8m0(RN(a * fl(1/fmax)))   (integer rule: round the exponent up, saturate at 254, inf -> 254);
//   q = Q_F(RN(float(x) * 2^(127-e)));   decode: RN(float(q) * 2^(e-127)).
// Data of both usages keeps x's (M, K) layout (not transposed). uint8 scales, zero padding written by the
// caller: row-wise [m, k/32] (ld = round_up(K/32, 4)), column-wise [m/32, k] (ld = round_up(K, 128)).
// Needs M % 32 == 0 and K % 32 == 0.
//
// Kernels (suffix = input or output element type):
//   mxfp8_quantize_*    one 32x128 tile per block of 256 threads; thread t owns row t/8 and columns
//                       16*(t%8)..+15 (two 16-byte loads of bf16, one 16-byte store per usage); a 1x32 block
//                       is a lane pair (shuffle), a 32x1 block a column reduced through shared memory.
//   mxfp8_dequantize_*  16 elements per thread and step.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

// ------------------------------------------------------------------ IEEE fp32 operations
// CuPy appends -ftz=true to every NVRTC compile, after the caller's options, and NVRTC honours the last
// occurrence: ordinary fp32 arithmetic, comparisons and conversions would then compile to their .ftz forms,
// which flush subnormal operands and results to zero. torch's kernels (the reference) keep subnormals, so
// every fp32 operation in this file is one of these inline-PTX instructions, which carry no .ftz whatever
// the compile options (and are never contracted into an FMA). The C++ forms serve the host pass only.
#ifdef __CUDA_ARCH__
#define F32_UNARY(name, ptx, expr) \
    __device__ __forceinline__ float name(float a) { float r; asm(ptx " %0, %1;" : "=f"(r) : "f"(a)); return r; }
#define F32_BINARY(name, ptx, expr)                                                 \
    __device__ __forceinline__ float name(float a, float b) {                       \
        float r;                                                                    \
        asm(ptx " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                         \
        return r;                                                                   \
    }
#define F32_COMPARE(name, cmp, expr)                                                \
    __device__ __forceinline__ bool name(float a, float b) {                        \
        unsigned r;                                                                 \
        asm("{ .reg .pred p; setp." cmp ".f32 p, %1, %2; selp.u32 %0, 1, 0, p; }"   \
            : "=r"(r) : "f"(a), "f"(b));                                            \
        return r != 0u;                                                             \
    }
#else
#define F32_UNARY(name, ptx, expr) __device__ __forceinline__ float name(float a) { return expr; }
#define F32_BINARY(name, ptx, expr) __device__ __forceinline__ float name(float a, float b) { return expr; }
#define F32_COMPARE(name, cmp, expr) __device__ __forceinline__ bool name(float a, float b) { return expr; }
#endif
F32_BINARY(f32_mul, "mul.rn.f32", a * b)
F32_BINARY(f32_max, "max.f32", fmaxf(a, b))
F32_UNARY(f32_abs, "abs.f32", fabsf(a))

// ------------------------------------------------------------------ element helpers
template <typename T> __device__ __forceinline__ float bits16_to_f32(u32 b);
template <> __device__ __forceinline__ float bits16_to_f32<__half>(u32 b) {
    return __half2float(__ushort_as_half((unsigned short)b));
}
template <> __device__ __forceinline__ float bits16_to_f32<__nv_bfloat16>(u32 b) {
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)b));
}
template <typename T> __device__ __forceinline__ u32 f32_to_bits16(float v);
template <> __device__ __forceinline__ u32 f32_to_bits16<__half>(float v) { return __half_as_ushort(__float2half_rn(v)); }
template <> __device__ __forceinline__ u32 f32_to_bits16<__nv_bfloat16>(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <typename T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float* v) {
    if constexpr (sizeof(T) == 4) {
        const float4 a = reinterpret_cast<const float4*>(p)[0];
        const float4 b = reinterpret_cast<const float4*>(p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = bits16_to_f32<T>((w[j >> 1] >> (16 * (j & 1))) & 0xFFFFu);
    }
}

template <typename O>
__device__ __forceinline__ void store16(O* __restrict__ dst, const float (&f)[16]) {
    if constexpr (sizeof(O) == 4) {
        float4* d = reinterpret_cast<float4*>(dst);
#pragma unroll
        for (int w = 0; w < 4; ++w) d[w] = make_float4(f[4 * w], f[4 * w + 1], f[4 * w + 2], f[4 * w + 3]);
    } else {
        u32 w[8];
#pragma unroll
        for (int p = 0; p < 8; ++p) w[p] = f32_to_bits16<O>(f[2 * p]) | (f32_to_bits16<O>(f[2 * p + 1]) << 16);
        uint4* d = reinterpret_cast<uint4*>(dst);
        d[0] = make_uint4(w[0], w[1], w[2], w[3]);
        d[1] = make_uint4(w[4], w[5], w[6], w[7]);
    }
}

__device__ __forceinline__ u32 cast_fp8(float v, int e5m2) {
    return (u32)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

__device__ __forceinline__ float fp8_to_f32(u32 q, int e5m2) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, e5m2 ? __NV_E5M2 : __NV_E4M3);
    return __half2float(__half(h));
}

// Classification by bits (no dependence on <cmath> under NVRTC).
__device__ __forceinline__ bool is_nan(float v) { return (__float_as_uint(v) & 0x7FFFFFFFu) > 0x7F800000u; }
__device__ __forceinline__ bool is_inf(float v) { return (__float_as_uint(v) & 0x7FFFFFFFu) == 0x7F800000u; }

// ------------------------------------------------------------------ E8M0 (formats.e8m0_*)
// Biased exponent of v >= 0 rounded up to a power of two, saturating at 2^127.
__device__ __forceinline__ u32 e8m0_from_f32(float v) {
    if (is_nan(v)) return 0xFFu;
    if (is_inf(v)) return 0xFEu;
    const u32 bits = __float_as_uint(v) & 0x7FFFFFFFu;
    if (bits == 0u) return 0u;
    const u32 exponent = bits >> 23, mantissa = bits & 0x7FFFFFu;
    const bool round_up = mantissa > 0u && exponent != 254u && !(exponent == 0u && mantissa <= 0x400000u);
    return exponent + (round_up ? 1u : 0u);
}

// 2^(127-e): e = 254 gives 2^-127, e = 0 gives 2^127, e = 255 gives NaN.
__device__ __forceinline__ float e8m0_encode_multiplier(u32 e) {
    if (e == 255u) return __uint_as_float(0x7FC00000u);
    const int biased = 254 - (int)e;
    return __uint_as_float(biased >= 1 ? ((u32)biased << 23) : 0x00400000u);
}

// 2^(e-127): e = 0 gives 2^-127, e = 255 gives NaN.
__device__ __forceinline__ float e8m0_to_f32(u32 e) {
    if (e == 255u) return __uint_as_float(0x7FC00000u);
    return __uint_as_float(e == 0u ? 0x00400000u : (e << 23));
}

// ------------------------------------------------------------------ quantize
#define TILE_M 32
#define TILE_K 128
#define THREADS 256

// 16 bytes q = Q_F(RN(v * mult_j)) stored at dst (16-byte aligned).
__device__ __forceinline__ void store_q16(u8* __restrict__ dst, const float (&v)[16], const float (&mult)[16],
                                          int e5m2) {
    u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int j = 0; j < 16; ++j) w[j >> 2] |= cast_fp8(f32_mul(v[j], mult[j]), e5m2) << (8 * (j & 3));
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename T>
__device__ void mxfp8_quantize_impl(const T* __restrict__ x, int M, int K, int e5m2, float inv_fmax, int two_d,
                                    u8* __restrict__ row_out, u8* __restrict__ row_scale, int row_ld,
                                    u8* __restrict__ col_out, u8* __restrict__ col_scale, int col_ld) {
    __shared__ float col_part[THREADS / 32][TILE_K];
    __shared__ u32 col_e[TILE_K];
    __shared__ u32 tile_e[TILE_K / 32];

    const int n_tk = (K + TILE_K - 1) / TILE_K;
    const int m0 = (blockIdx.x / n_tk) * TILE_M, k0 = (blockIdx.x % n_tk) * TILE_K;
    const int t = threadIdx.x, cg = t & 7, r = t >> 3, lane = t & 31, warp = t >> 5;
    const int m = m0 + r, k = k0 + 16 * cg;
    const bool valid = k < K;  // K % 32 == 0: a thread's 16 columns are all in bounds or all out
    const bool rows_1d = !two_d && row_out != nullptr;
    const bool cols_1d = !two_d && col_out != nullptr;

    float v[16];
    if (valid) {
        load8(x + (i64)m * K + k, v);
        load8(x + (i64)m * K + k + 8, v + 8);
    } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = 0.0f;
    }

    // Column (and 2D tile) amaxes: 4 rows per warp by shuffles, 8 warps through shared memory.
    if (cols_1d || two_d) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            float a = f32_abs(v[j]);
            a = f32_max(0.0f, a);  // NaN -> 0, like fmaxf from 0
            a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, 8));
            a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, 16));
            if (lane < 8) col_part[warp][16 * cg + j] = a;
        }
        __syncthreads();
        if (t < TILE_K) {
            float a = 0.0f;
#pragma unroll
            for (int w = 0; w < THREADS / 32; ++w) a = f32_max(a, col_part[w][t]);
            if (two_d) {
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, o));
                if (lane == 0) tile_e[warp] = e8m0_from_f32(f32_mul(a, inv_fmax));
            } else {
                const u32 e = e8m0_from_f32(f32_mul(a, inv_fmax));
                col_e[t] = e;
                if (k0 + t < K) col_scale[(i64)(m0 / 32) * col_ld + k0 + t] = (u8)e;
            }
        }
        __syncthreads();
    }

    if (two_d) {
        const u32 e = tile_e[cg >> 1];
        float mult[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) mult[j] = e8m0_encode_multiplier(e);
        if (valid) {
            if (row_out != nullptr) {
                store_q16(row_out + (i64)m * K + k, v, mult, e5m2);
                if ((cg & 1) == 0) row_scale[(i64)m * row_ld + k / 32] = (u8)e;
            }
            if (col_out != nullptr) store_q16(col_out + (i64)m * K + k, v, mult, e5m2);
        }
        if (col_out != nullptr && t < TILE_K && k0 + t < K)
            col_scale[(i64)(m0 / 32) * col_ld + k0 + t] = (u8)tile_e[t >> 5];
        return;
    }
    if (rows_1d) {
        // A 1x32 block is the lane pair (cg, cg ^ 1).
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j) a = f32_max(a, f32_abs(v[j]));
        a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, 1));
        const u32 e = e8m0_from_f32(f32_mul(a, inv_fmax));
        float mult[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) mult[j] = e8m0_encode_multiplier(e);
        if (valid) {
            store_q16(row_out + (i64)m * K + k, v, mult, e5m2);
            if ((cg & 1) == 0) row_scale[(i64)m * row_ld + k / 32] = (u8)e;
        }
    }
    if (cols_1d && valid) {
        float mult[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) mult[j] = e8m0_encode_multiplier(col_e[16 * cg + j]);
        store_q16(col_out + (i64)m * K + k, v, mult, e5m2);
    }
}

// ------------------------------------------------------------------ dequantize
template <typename O>
__device__ void mxfp8_dequantize_impl(const u8* __restrict__ q, i64 M, i64 K, const u8* __restrict__ scale, int ld,
                                      int columnwise, int e5m2, O* __restrict__ out) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 groups_per_row = K / 16, n = M * groups_per_row;
    for (i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x; g < n; g += stride) {
        const i64 m = g / groups_per_row, k = (g % groups_per_row) * 16;
        const uint4 raw = *reinterpret_cast<const uint4*>(q + m * K + k);
        const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
        float vals[16];
        if (columnwise) {
            const u8* s = scale + (m / 32) * ld + k;
#pragma unroll
            for (int b = 0; b < 16; ++b)
                vals[b] = f32_mul(fp8_to_f32((words[b >> 2] >> (8 * (b & 3))) & 0xFFu, e5m2), e8m0_to_f32(s[b]));
        } else {
            const float sv = e8m0_to_f32(scale[m * ld + k / 32]);
#pragma unroll
            for (int b = 0; b < 16; ++b)
                vals[b] = f32_mul(fp8_to_f32((words[b >> 2] >> (8 * (b & 3))) & 0xFFu, e5m2), sv);
        }
        store16(out + m * K + k, vals);
    }
}

// ------------------------------------------------------------------ entry points
#define MXFP8_INSTANTIATE(T, SUFFIX)                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS) mxfp8_quantize_##SUFFIX(                             \
        const T* x, int M, int K, int e5m2, float inv_fmax, int two_d, u8* row_out, u8* row_scale, int row_ld,  \
        u8* col_out, u8* col_scale, int col_ld) {                                                               \
        mxfp8_quantize_impl<T>(x, M, K, e5m2, inv_fmax, two_d, row_out, row_scale, row_ld, col_out, col_scale,  \
                               col_ld);                                                                         \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) mxfp8_dequantize_##SUFFIX(                               \
        const u8* q, i64 M, i64 K, const u8* scale, int ld, int columnwise, int e5m2, T* out) {                 \
        mxfp8_dequantize_impl<T>(q, M, K, scale, ld, columnwise, e5m2, out);                                    \
    }

MXFP8_INSTANTIATE(float, f32)
MXFP8_INSTANTIATE(__half, f16)
MXFP8_INSTANTIATE(__nv_bfloat16, bf16)
