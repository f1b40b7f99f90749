// FP8 block scaling (DeepSeek style): 1x128 blocks (1D) or 128x128 tiles (2D), fp32 scales.
//
// Specification: refops/kernels/reference/quant_float8_block.py and quant_float8.compute_scale_from_amax
// (recipes-numerics §0.3, §2.4). Per block with amax a over its in-bounds elements (NaNs skipped):
//   a = fl(eps) if a < fl(eps);  degenerate = a in {0, inf, NaN};
//   s = fp32(RN_double(RN_double(1/a) * fmax))   (torch's float / tensor is reciprocal-then-multiply);
//   s = value_for_inf if s == +inf;  pow2: s = bits(s) & 0xFF800000;  degenerate: s = 1;
//   q = Q_F(RN(float(x) * s)),  scale_inv = fp32(RN_double(1/s)).
// Layouts (M = rows, K = last dim of the input): row-wise data (M, K); column-wise data (K, M) (the
// transpose); GEMM-ready fp32 scales, zero padding written by the caller:
//   1D row-wise [k/128, m] (ld = round_up(M,4));   1D column-wise [m/128, k] (ld = round_up(K,4));
//   2D row-wise [m/128, k/128];                     2D column-wise [k/128, m/128].
//
// Kernels (suffix = input or output element type):
//   fp8_block_quantize_*    one 128x128 tile per block of 512 threads; thread t owns rows 4*(t/16)..+3 and
//                           columns 8*(t%16)..+7 (16-byte loads of bf16); row amaxes by warp shuffles,
//                           column amaxes through shared memory; the column-wise bytes are transposed in
//                           shared memory and written 16 bytes per thread.
//   fp8_block_dequantize_*  16 elements per thread and step along the data's rows.

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
F32_COMPARE(f32_lt, "lt", a < b)
// fp32 <-> fp64 conversions, also without .ftz (the double arithmetic itself never flushes).
#ifdef __CUDA_ARCH__
__device__ __forceinline__ double f32_to_f64(float a) {
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ float f64_to_f32_rn(double a) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(a));
    return r;
}
#else
__device__ __forceinline__ double f32_to_f64(float a) { return (double)a; }
__device__ __forceinline__ float f64_to_f32_rn(double a) { return (float)a; }
#endif

// ------------------------------------------------------------------ element helpers
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

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

__device__ __forceinline__ void store_f32(float v, float* out) { *out = v; }
__device__ __forceinline__ void store_f32(float v, __half* out) { *out = __float2half_rn(v); }
__device__ __forceinline__ void store_f32(float v, __nv_bfloat16* out) { *out = __float2bfloat16_rn(v); }

template <typename T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float (&v)[8]) {
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

__device__ __forceinline__ float reciprocal_rn(float s) { return f64_to_f32_rn(__drcp_rn(f32_to_f64(s))); }

// compute_scale_from_amax, step by step as the reference's torch ops do it.
__device__ __forceinline__ float scale_from_amax(float a, float fmax, int pow2, float eps, float value_for_inf) {
    if (f32_lt(a, eps)) a = eps;
    const bool degenerate = is_inf(a) || is_nan(a) || (__float_as_uint(a) & 0x7FFFFFFFu) == 0u;
    float s = f64_to_f32_rn(__dmul_rn(__drcp_rn(f32_to_f64(a)), f32_to_f64(fmax)));
    if (__float_as_uint(s) == 0x7F800000u) s = value_for_inf;  // +inf
    if (pow2) s = __uint_as_float(__float_as_uint(s) & 0xFF800000u);
    return degenerate ? 1.0f : s;
}

// ------------------------------------------------------------------ quantize
#define TILE 128
#define TILE_THREADS 512

__device__ __forceinline__ int swizzle(int c, int r4) { return r4 ^ ((c >> 3) << 1); }

template <typename T>
__device__ __forceinline__ void load_tile(const T* __restrict__ x, int M, int K, int m0, int k0, int vec_ok,
                                          float (&v)[4][8]) {
    const int t = threadIdx.x, cg = t & 15, rg = t >> 4;
    const int k = k0 + 8 * cg;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + 4 * rg + i;
        const T* row = x + (i64)m * K;
        if (m < M && vec_ok && k + 8 <= K) {
            load8(row + k, v[i]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[i][j] = (m < M && k + j < K) ? to_f32(row[k + j]) : 0.0f;
        }
    }
}

// 8 bytes of one row, packed little-endian in two words.
__device__ __forceinline__ void store_row_words(u8* __restrict__ out, int M, int K, int m, int k, int vec_ok,
                                                const u32 (&w)[2]) {
    if (m >= M) return;
    u8* dst = out + (i64)m * K + k;
    if (vec_ok && k + 8 <= K) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (k + j < K) dst[j] = (u8)(w[j >> 2] >> (8 * (j & 3)));
    }
}

__device__ __forceinline__ void store_transposed(u32 (*tile)[33], u8* __restrict__ out, int M, int K, int m0, int k0,
                                                 int vec_ok) {
#pragma unroll
    for (int it = 0; it < 2; ++it) {
        const int idx = threadIdx.x + TILE_THREADS * it;
        const int c = idx >> 3, seg = idx & 7;
        const int k = k0 + c;
        if (k >= K) continue;
        uint4 w;
        w.x = tile[c][swizzle(c, 4 * seg + 0)];
        w.y = tile[c][swizzle(c, 4 * seg + 1)];
        w.z = tile[c][swizzle(c, 4 * seg + 2)];
        w.w = tile[c][swizzle(c, 4 * seg + 3)];
        const int m = m0 + 16 * seg;
        u8* dst = out + (i64)k * M + m;
        if (vec_ok && m + 16 <= M) {
            *reinterpret_cast<uint4*>(dst) = w;
        } else {
            const u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int b = 0; b < 16; ++b)
                if (m + b < M) dst[b] = (u8)(words[b >> 2] >> (8 * (b & 3)));
        }
    }
}

template <typename T>
__device__ void block_quantize_impl(const T* __restrict__ x, int M, int K, int vec_in, int vec_row, int vec_col,
                                    int e5m2, float fmax, int pow2, float eps, float value_for_inf, int two_d,
                                    u8* __restrict__ row_out, float* __restrict__ row_scale, int row_ld,
                                    u8* __restrict__ col_out, float* __restrict__ col_scale, int col_ld) {
    __shared__ u32 tile[TILE][33];
    __shared__ float col_part[TILE_THREADS / 32][TILE];  // per-warp column maxima
    __shared__ float row_amax[TILE];
    __shared__ float row_s[TILE];
    __shared__ float col_s[TILE];
    __shared__ float tile_part[4];

    const int n_tk = (K + TILE - 1) / TILE;
    const int tm = blockIdx.x / n_tk, tk = blockIdx.x % n_tk;
    const int m0 = tm * TILE, k0 = tk * TILE;
    const int t = threadIdx.x, cg = t & 15, rg = t >> 4, lane = t & 31, warp = t >> 5;
    const bool rows_1d = !two_d && row_out != nullptr;
    const bool cols_1d = !two_d && col_out != nullptr;

    float v[4][8];
    load_tile(x, M, K, m0, k0, vec_in, v);

    // Row amaxes: the 16 lanes of a half-warp hold one row's 128 columns.
    if (rows_1d) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float a = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) a = f32_max(a, f32_abs(v[i][j]));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, o));
            if (cg == 0) row_amax[4 * rg + i] = a;
        }
    }
    // Column amaxes (also the 2D tile amax): per warp in registers, then across warps in shared memory.
    if (cols_1d || two_d) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) a = f32_max(a, f32_abs(v[i][j]));
            a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, 16));
            if (lane < 16) col_part[warp][8 * cg + j] = a;
        }
    }
    __syncthreads();
    if (t < TILE) {
        if (rows_1d) {
            const float s = scale_from_amax(row_amax[t], fmax, pow2, eps, value_for_inf);
            row_s[t] = s;
            if (m0 + t < M) row_scale[(i64)tk * row_ld + m0 + t] = reciprocal_rn(s);
        }
    } else if (t < 2 * TILE && (cols_1d || two_d)) {
        const int c = t - TILE;
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < TILE_THREADS / 32; ++w) a = f32_max(a, col_part[w][c]);
        if (two_d) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, o));
            if (lane == 0) tile_part[warp - TILE / 32] = a;
        } else {
            const float s = scale_from_amax(a, fmax, pow2, eps, value_for_inf);
            col_s[c] = s;
            if (k0 + c < K) col_scale[(i64)tm * col_ld + k0 + c] = reciprocal_rn(s);
        }
    }
    __syncthreads();
    if (two_d) {
        if (t == 0) {
            const float a = f32_max(f32_max(tile_part[0], tile_part[1]), f32_max(tile_part[2], tile_part[3]));
            const float s = scale_from_amax(a, fmax, pow2, eps, value_for_inf);
            const float si = reciprocal_rn(s);
            row_s[0] = s;
            if (row_scale != nullptr) row_scale[(i64)tm * row_ld + tk] = si;
            if (col_scale != nullptr) col_scale[(i64)tk * col_ld + tm] = si;
        }
        __syncthreads();
    }

    // Row-wise bytes, packed 4 per word (2D: the same bytes serve both usages).
    u32 packed[4][2];
    if (row_out != nullptr || two_d) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float s = two_d ? row_s[0] : row_s[4 * rg + i];
            packed[i][0] = packed[i][1] = 0u;
#pragma unroll
            for (int j = 0; j < 8; ++j) packed[i][j >> 2] |= cast_fp8(f32_mul(v[i][j], s), e5m2) << (8 * (j & 3));
            if (row_out != nullptr) store_row_words(row_out, M, K, m0 + 4 * rg + i, k0 + 8 * cg, vec_row, packed[i]);
        }
    }
    if (col_out != nullptr) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c = 8 * cg + j;
            u32 word = 0u;
            if (two_d) {
#pragma unroll
                for (int i = 0; i < 4; ++i) word |= ((packed[i][j >> 2] >> (8 * (j & 3))) & 0xFFu) << (8 * i);
            } else {
                const float s = col_s[c];
#pragma unroll
                for (int i = 0; i < 4; ++i) word |= cast_fp8(f32_mul(v[i][j], s), e5m2) << (8 * i);
            }
            tile[c][swizzle(c, rg)] = word;
        }
        __syncthreads();
        store_transposed(tile, col_out, M, K, m0, k0, vec_col);
    }
}

// ------------------------------------------------------------------ dequantize
// data viewed as (R, C); scale element of (r, c): 1D [c/128, r], 2D [r/128, c/128].
__device__ __forceinline__ float block_scale_inv(const float* __restrict__ scale, int ld, int two_d, i64 r, i64 c) {
    return two_d ? scale[(r / TILE) * ld + c / TILE] : scale[(c / TILE) * ld + r];
}

template <typename O>
__device__ void block_dequantize_impl(const u8* __restrict__ q, i64 R, i64 C, int vec_ok, const float* __restrict__ scale,
                                      int ld, int two_d, int e5m2, O* __restrict__ out) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec_ok) {  // C % 16 == 0: a group of 16 never straddles a 128-block
        const i64 groups_per_row = C / 16, n = R * groups_per_row;
        for (i64 g = tid; g < n; g += stride) {
            const i64 r = g / groups_per_row, c = (g % groups_per_row) * 16;
            const float si = block_scale_inv(scale, ld, two_d, r, c);
            const uint4 raw = *reinterpret_cast<const uint4*>(q + r * C + c);
            const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
            float vals[16];
#pragma unroll
            for (int b = 0; b < 16; ++b)
                vals[b] = f32_mul(fp8_to_f32((words[b >> 2] >> (8 * (b & 3))) & 0xFFu, e5m2), si);
            store16(out + r * C + c, vals);
        }
    } else {
        const i64 n = R * C;
        for (i64 e = tid; e < n; e += stride) {
            const i64 r = e / C, c = e % C;
            store_f32(f32_mul(fp8_to_f32(q[e], e5m2), block_scale_inv(scale, ld, two_d, r, c)), &out[e]);
        }
    }
}

// ------------------------------------------------------------------ entry points
#define FP8_BLOCK_INSTANTIATE(T, SUFFIX)                                                                        \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) fp8_block_quantize_##SUFFIX(                    \
        const T* x, int M, int K, int vec_in, int vec_row, int vec_col, int e5m2, float fmax, int pow2,         \
        float eps, float value_for_inf, int two_d, u8* row_out, float* row_scale, int row_ld, u8* col_out,      \
        float* col_scale, int col_ld) {                                                                         \
        block_quantize_impl<T>(x, M, K, vec_in, vec_row, vec_col, e5m2, fmax, pow2, eps, value_for_inf, two_d,  \
                               row_out, row_scale, row_ld, col_out, col_scale, col_ld);                         \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) fp8_block_dequantize_##SUFFIX(                            \
        const u8* q, i64 R, i64 C, int vec_ok, const float* scale, int ld, int two_d, int e5m2, T* out) {       \
        block_dequantize_impl<T>(q, R, C, vec_ok, scale, ld, two_d, e5m2, out);                                 \
    }

FP8_BLOCK_INSTANTIATE(float, f32)
FP8_BLOCK_INSTANTIATE(__half, f16)
FP8_BLOCK_INSTANTIATE(__nv_bfloat16, bf16)
