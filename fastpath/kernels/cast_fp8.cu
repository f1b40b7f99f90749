// Per-tensor FP8 (delayed and current scaling): amax, cast (+ transpose), dequantize.
//
// Specification: refops/kernels/reference/quant_float8.py (recipes-numerics §0.2, §2.1, §2.2).
//   amax      = max |x| over every element, NaNs skipped (fmaxf from 0), exact;
//   q         = Q_F(RN(float(x) * scale)), Q_F = __nv_cvt_float_to_fp8(.., __NV_SATFINITE, F)
//               (equal to the reference's clamp-to-±max-then-cast);
//   scale_inv = RN(1 / scale), computed like the reference: reciprocal in double, rounded once to fp32;
//   dequant   = out_dtype(RN(float(q) * scale_inv)).
// Every fp32 operation is one IEEE RN step that keeps subnormals (the f32_* inline-PTX helpers below).
//
// Kernels (suffix _f32/_f16/_bf16 = input or output element type):
//   fp8_amax_*            grid-stride, 8 elements (16 B of bf16) per thread and step, block max, atomicMax
//   fp8_cast_*            flat row-wise cast, 8 elements per thread and step; optional amax of x
//   fp8_cast_transpose_*  128x128 tiles, 512 threads: row-wise bytes and the transposed (K, M) copy
//   fp8_amax_finalize     accumulator = fmaxf(accumulator, amax)  (delayed-scaling amax recording)
//   fp8_dequantize_*      flat, 16 bytes in per thread and step

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

// 16-bit element bits <-> fp32 (exact widening; narrowing is one RNE step, like torch's .to()).
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

// 8 consecutive elements (16-byte aligned) converted exactly to fp32.
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

// 16 fp32 values rounded once to O and stored at a 16-byte aligned address.
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

// The reference's RN(1/s): a double reciprocal rounded once to fp32.
__device__ __forceinline__ float reciprocal_rn(float s) { return f64_to_f32_rn(__drcp_rn(f32_to_f64(s))); }

// Max over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in thread 0.
__device__ __forceinline__ float block_max(float m) {
    __shared__ float partial[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = f32_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // partial may still be read by an earlier call
    if (lane == 0) partial[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = f32_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    return m;
}

// Non-negative fp32 values order like their bit patterns: atomicMax on the bits is an exact max.
__device__ __forceinline__ void atomic_max_nonneg(float* target, float v) {
    atomicMax(reinterpret_cast<unsigned int*>(target), __float_as_uint(v));
}

// ------------------------------------------------------------------ amax
template <typename T>
__device__ void amax_impl(const T* __restrict__ x, i64 n, int vec_ok, float* out, float* out2) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    float m = 0.0f;
    const i64 n8 = vec_ok ? n / 8 : 0;
    i64 i = tid;
    for (; i + 3 * stride < n8; i += 4 * stride) {  // four 16-byte loads in flight per thread
        float v[4][8];
#pragma unroll
        for (int u = 0; u < 4; ++u) load8(x + 8 * (i + u * stride), v[u]);
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int j = 0; j < 8; ++j) m = f32_max(m, f32_abs(v[u][j]));
    }
    for (; i < n8; i += stride) {
        float v[8];
        load8(x + 8 * i, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) m = f32_max(m, f32_abs(v[j]));
    }
    for (i64 e = n8 * 8 + tid; e < n; e += stride) m = f32_max(m, f32_abs(to_f32(x[e])));
    m = block_max(m);
    if (threadIdx.x == 0) {
        atomic_max_nonneg(out, m);
        if (out2 != nullptr) atomic_max_nonneg(out2, m);
    }
}

// ------------------------------------------------------------------ flat row-wise cast
template <typename T>
__device__ void cast_impl(const T* __restrict__ x, i64 n, int vec_ok, const float* __restrict__ scale_p, int e5m2,
                          u8* __restrict__ out, float* __restrict__ scale_inv, float* amax_out) {
    const float s = *scale_p;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = reciprocal_rn(s);
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    float m = 0.0f;
    const i64 n8 = vec_ok ? n / 8 : 0;
    i64 i = tid;
    for (; i + stride < n8; i += 2 * stride) {  // two 16-byte loads in flight per thread
        float v[2][8];
        load8(x + 8 * i, v[0]);
        load8(x + 8 * (i + stride), v[1]);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            uint2 packed = make_uint2(0u, 0u);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                m = f32_max(m, f32_abs(v[u][j]));
                const u32 q = cast_fp8(f32_mul(v[u][j], s), e5m2);
                if (j < 4) packed.x |= q << (8 * j); else packed.y |= q << (8 * (j - 4));
            }
            reinterpret_cast<uint2*>(out)[i + u * stride] = packed;
        }
    }
    for (; i < n8; i += stride) {
        float v[8];
        load8(x + 8 * i, v);
        uint2 packed = make_uint2(0u, 0u);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            m = f32_max(m, f32_abs(v[j]));
            const u32 q = cast_fp8(f32_mul(v[j], s), e5m2);
            if (j < 4) packed.x |= q << (8 * j); else packed.y |= q << (8 * (j - 4));
        }
        reinterpret_cast<uint2*>(out)[i] = packed;
    }
    for (i64 e = n8 * 8 + tid; e < n; e += stride) {
        const float v = to_f32(x[e]);
        m = f32_max(m, f32_abs(v));
        out[e] = (u8)cast_fp8(f32_mul(v, s), e5m2);
    }
    if (amax_out != nullptr) {
        m = block_max(m);
        if (threadIdx.x == 0) atomic_max_nonneg(amax_out, m);
    }
}

// ------------------------------------------------------------------ cast + transpose
// One 128x128 tile per block of 512 threads. Thread t owns rows 4*(t/16)..+3 and columns
// 8*(t%16)..+7 of the tile. The transposed bytes go through shared memory: word tile[c][r4]
// holds rows 4*r4..4*r4+3 of column c; rows are padded to 33 words and the word index is
// XOR-swizzled so both the writes and the 16-byte read-out are free of bank conflicts.
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

__device__ __forceinline__ void store_row_bytes(u8* __restrict__ out, int M, int K, int m, int k, int vec_ok,
                                                const u32 (&q)[8]) {
    if (m >= M) return;
    u8* dst = out + (i64)m * K + k;
    if (vec_ok && k + 8 <= K) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(q[0] | (q[1] << 8) | (q[2] << 16) | (q[3] << 24),
                                                    q[4] | (q[5] << 8) | (q[6] << 16) | (q[7] << 24));
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (k + j < K) dst[j] = (u8)q[j];
    }
}

// Write the transposed tile (column k of x becomes row k of the (K, M) output).
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
__device__ void cast_transpose_impl(const T* __restrict__ x, int M, int K, int vec_in, int vec_row, int vec_col,
                                    const float* __restrict__ scale_p, int e5m2, u8* __restrict__ row_out,
                                    u8* __restrict__ col_out, float* __restrict__ scale_inv, float* amax_out) {
    __shared__ u32 tile[TILE][33];
    const int n_tk = (K + TILE - 1) / TILE;
    const int m0 = (blockIdx.x / n_tk) * TILE, k0 = (blockIdx.x % n_tk) * TILE;
    const int t = threadIdx.x, cg = t & 15, rg = t >> 4;
    const float s = *scale_p;
    if (blockIdx.x == 0 && t == 0) *scale_inv = reciprocal_rn(s);

    float v[4][8];
    load_tile(x, M, K, m0, k0, vec_in, v);
    float m = 0.0f;
    u32 q[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            m = f32_max(m, f32_abs(v[i][j]));
            q[i][j] = cast_fp8(f32_mul(v[i][j], s), e5m2);
        }
    if (row_out != nullptr)
#pragma unroll
        for (int i = 0; i < 4; ++i) store_row_bytes(row_out, M, K, m0 + 4 * rg + i, k0 + 8 * cg, vec_row, q[i]);
    if (col_out != nullptr) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c = 8 * cg + j;
            tile[c][swizzle(c, rg)] = q[0][j] | (q[1][j] << 8) | (q[2][j] << 16) | (q[3][j] << 24);
        }
        __syncthreads();
        store_transposed(tile, col_out, M, K, m0, k0, vec_col);
    }
    if (amax_out != nullptr) {
        m = block_max(m);
        if (t == 0) atomic_max_nonneg(amax_out, m);
    }
}

// ------------------------------------------------------------------ dequantize
template <typename O>
__device__ void dequantize_impl(const u8* __restrict__ q, i64 n, int vec_ok, const float* __restrict__ scale_inv_p,
                                int e5m2, O* __restrict__ out) {
    const float si = *scale_inv_p;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 n16 = vec_ok ? n / 16 : 0;
    for (i64 i = tid; i < n16; i += stride) {
        const uint4 raw = reinterpret_cast<const uint4*>(q)[i];
        const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
        float vals[16];
#pragma unroll
        for (int b = 0; b < 16; ++b)
            vals[b] = f32_mul(fp8_to_f32((words[b >> 2] >> (8 * (b & 3))) & 0xFFu, e5m2), si);
        store16(out + 16 * i, vals);
    }
    for (i64 e = n16 * 16 + tid; e < n; e += stride) store_f32(f32_mul(fp8_to_f32(q[e], e5m2), si), &out[e]);
}

// ------------------------------------------------------------------ entry points
extern "C" __global__ void fp8_amax_finalize(float* accumulator, const float* amax) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *accumulator = f32_max(*accumulator, *amax);
}

#define FP8_INSTANTIATE(T, SUFFIX)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        fp8_amax_##SUFFIX(const T* x, i64 n, int vec_ok, float* out, float* out2) {                                \
        amax_impl<T>(x, n, vec_ok, out, out2);                                                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        fp8_cast_##SUFFIX(const T* x, i64 n, int vec_ok, const float* scale, int e5m2, u8* out, float* scale_inv, \
                          float* amax_out) {                                                                       \
        cast_impl<T>(x, n, vec_ok, scale, e5m2, out, scale_inv, amax_out);                                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS)                                                     \
        fp8_cast_transpose_##SUFFIX(const T* x, int M, int K, int vec_in, int vec_row, int vec_col,                \
                                    const float* scale, int e5m2, u8* row_out, u8* col_out, float* scale_inv,      \
                                    float* amax_out) {                                                             \
        cast_transpose_impl<T>(x, M, K, vec_in, vec_row, vec_col, scale, e5m2, row_out, col_out, scale_inv,        \
                               amax_out);                                                                          \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        fp8_dequantize_##SUFFIX(const u8* q, i64 n, int vec_ok, const float* scale_inv, int e5m2, T* out) {        \
        dequantize_impl<T>(q, n, vec_ok, scale_inv, e5m2, out);                                                    \
    }

FP8_INSTANTIATE(float, f32)
FP8_INSTANTIATE(__half, f16)
FP8_INSTANTIATE(__nv_bfloat16, bf16)
