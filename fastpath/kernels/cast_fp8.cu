// Per-tensor FP8 (delayed and current scaling): amax, cast (+ transpose), dequantize.
//
// Specification: refops/kernels/reference/quant_float8.py (docs/recipes/index.md#the-cast,
// docs/recipes/delayed-scaling.md#the-arithmetic, docs/recipes/current-scaling.md#the-arithmetic).
//   amax      = max |x| over every element, NaNs skipped (fmaxf from 0), exact;
//   q         = Q_F(RN(float(x) * scale)), Q_F = __nv_cvt_float_to_fp8(.., __NV_SATFINITE, F)
//               (equal to the reference's clamp-to-±max-then-cast);
//   scale_inv = RN(1 / scale), computed like the reference: reciprocal in double, rounded once to fp32;
//   dequant   = out_dtype(RN(float(q) * scale_inv));
//   amax_accumulator (delayed scaling) = fmaxf(accumulator, amax).
// Every fp32 operation is one IEEE RN step that keeps subnormals (the f32_* inline-PTX helpers below).
//
// Memory-bound layout. Flat kernels (amax, cast, dequantize) give each block of FLAT_THREADS threads
// whole "chunks" of FLAT_THREADS * UNROLL vectors; thread t takes vectors t, t + FLAT_THREADS, ... of a
// chunk, issues all its loads before using any (UNROLL accesses in flight per thread), and every load
// and store instruction of a warp covers one contiguous span (no half-used sectors). Grids are large
// (one chunk or a few per block), like torch's own element-wise kernels.
//
// Kernels (suffix _f32/_f16/_bf16 = input or output element type):
//   fp8_amax_*            AMAX_CHUNKS chunks of 4 x 16-byte loads per thread; block max, one atomicMax
//   fp8_cast_*            flat row-wise cast, CAST_CHUNKS chunks of 4 x 16-byte loads per thread;
//                         optional accumulator update (delayed scaling)
//   fp8_cast_transpose_*  one 128x128 tile per block, 512 threads, three blocks resident per SM: row-wise
//                         bytes and the transposed (K, M) copy in one pass; four values per pair of
//                         cvt.rn.satfinite.*x2.f32 (the same per-value conversion as Q_F), the column
//                         words by byte permutes; one code path per format and per with/without
//                         accumulator (the block amax is only computed for the accumulator)
//   fp8_dequantize_*      flat, 8 loads per thread, one 16-byte store per load
//   fp8_compute_scale     compute_scale_from_amax on an fp32 amax tensor (one thread per element)
//   fp8_delayed_scaling_update  the delayed-scaling recipe update, in place (one block per slot)

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

#include "ieee_f32.cuh"
#include "elements16.cuh"
#include "fp8_elements.cuh"
#include "fp8_tile128.cuh"
#include "fp8_amax.cuh"

// Element j of T values packed little-endian in 32-bit words, exactly as fp32, through bits16_to_f32: the same
// values as fp8_elements.cuh's word_elem, kept in this form for the flat amax and cast kernels, whose code it
// is as measured and checked on the GPU (word_elem's instruction selection would change their PTX).
template <typename T>
__device__ __forceinline__ float flat_elem(const u32* w, int j) {
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(w[j]);
    } else {
        return bits16_to_f32<T>((w[j >> 1] >> (16 * (j & 1))) & 0xFFFFu);
    }
}

// 16 bytes at a 16-byte aligned address, as four words.
__device__ __forceinline__ void load16(const void* p, u32 (&w)[4]) {
    const uint4 a = *reinterpret_cast<const uint4*>(p);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
}

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

// ------------------------------------------------------------------ amax
#define FLAT_THREADS 256
#define AMAX_UNROLL 4   // 16-byte loads in flight per thread
#define AMAX_CHUNKS 4   // chunks per block: 64 KiB read per block, one atomic per block

template <typename T>
__device__ void amax_impl(const T* __restrict__ x, i64 n, int vec_ok, float* out, float* out2) {
    constexpr int E = 16 / sizeof(T);
    constexpr int CHUNK = FLAT_THREADS * AMAX_UNROLL;
    const i64 n_vec = vec_ok ? n / E : 0;
    const u8* bytes = reinterpret_cast<const u8*>(x);
    float m[AMAX_UNROLL];
#pragma unroll
    for (int u = 0; u < AMAX_UNROLL; ++u) m[u] = 0.0f;
    const i64 first = (i64)blockIdx.x * (CHUNK * AMAX_CHUNKS) + threadIdx.x;
#pragma unroll 1
    for (int c = 0; c < AMAX_CHUNKS; ++c) {
        const i64 v0 = first + (i64)c * CHUNK;
        u32 w[AMAX_UNROLL][4];
        bool ok[AMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < AMAX_UNROLL; ++u) {
            ok[u] = v0 + u * FLAT_THREADS < n_vec;
            if (ok[u]) load16(bytes + 16 * (v0 + u * FLAT_THREADS), w[u]);
        }
#pragma unroll
        for (int u = 0; u < AMAX_UNROLL; ++u) {
            if (ok[u]) {
#pragma unroll
                for (int j = 0; j < E; ++j) m[u] = f32_max(m[u], f32_abs(flat_elem<T>(w[u], j)));
            }
        }
    }
    // Elements after the last whole vector (every element when vec_ok is 0).
    for (i64 e = n_vec * E + (i64)blockIdx.x * FLAT_THREADS + threadIdx.x; e < n; e += (i64)gridDim.x * FLAT_THREADS)
        m[0] = f32_max(m[0], f32_abs(to_f32(x[e])));
    float mm = m[0];
#pragma unroll
    for (int u = 1; u < AMAX_UNROLL; ++u) mm = f32_max(mm, m[u]);
    mm = block_max(mm);
    if (threadIdx.x == 0) {
        atomic_max_nonneg(out, mm);
        if (out2 != nullptr) atomic_max_nonneg(out2, mm);
    }
}

// ------------------------------------------------------------------ flat row-wise cast
#define CAST_UNROLL 4   // 16-byte loads in flight per thread
#define CAST_CHUNKS 2   // chunks per block

template <typename T>
__device__ void cast_impl(const T* __restrict__ x, i64 n, int vec_ok, const float* __restrict__ scale_p, int e5m2,
                          u8* __restrict__ out, float* __restrict__ scale_inv, float* accumulator) {
    constexpr int E = 16 / sizeof(T);  // elements per 16-byte vector = output bytes per vector
    constexpr int CHUNK = FLAT_THREADS * CAST_UNROLL;
    const float s = *scale_p;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = reciprocal_rn(s);
    const i64 n_vec = vec_ok ? n / E : 0;
    const u8* bytes = reinterpret_cast<const u8*>(x);
    float m = 0.0f;
    const i64 first = (i64)blockIdx.x * (CHUNK * CAST_CHUNKS) + threadIdx.x;
#pragma unroll 1
    for (int c = 0; c < CAST_CHUNKS; ++c) {
        const i64 v0 = first + (i64)c * CHUNK;
        u32 w[CAST_UNROLL][4];
        bool ok[CAST_UNROLL];
#pragma unroll
        for (int u = 0; u < CAST_UNROLL; ++u) {
            ok[u] = v0 + u * FLAT_THREADS < n_vec;
            if (ok[u]) load16(bytes + 16 * (v0 + u * FLAT_THREADS), w[u]);
        }
#pragma unroll
        for (int u = 0; u < CAST_UNROLL; ++u) {
            if (!ok[u]) continue;
            u32 packed[2] = {0u, 0u};
#pragma unroll
            for (int j = 0; j < E; ++j) {
                const float v = flat_elem<T>(w[u], j);
                m = f32_max(m, f32_abs(v));
                packed[j >> 2] |= cast_fp8(f32_mul(v, s), e5m2) << (8 * (j & 3));
            }
            const i64 v = v0 + u * FLAT_THREADS;
            if constexpr (E == 8) {
                reinterpret_cast<uint2*>(out)[v] = make_uint2(packed[0], packed[1]);
            } else {
                reinterpret_cast<u32*>(out)[v] = packed[0];
            }
        }
    }
    for (i64 e = n_vec * E + (i64)blockIdx.x * FLAT_THREADS + threadIdx.x; e < n; e += (i64)gridDim.x * FLAT_THREADS) {
        const float v = to_f32(x[e]);
        m = f32_max(m, f32_abs(v));
        out[e] = (u8)cast_fp8(f32_mul(v, s), e5m2);
    }
    if (accumulator != nullptr) {
        m = block_max(m);
        if (threadIdx.x == 0) atomic_fmax_accumulate(accumulator, m);
    }
}

// ------------------------------------------------------------------ cast + transpose
// 128x128 tiles, 512 threads, one tile per block (the launcher starts a block per tile). Thread t owns rows
// 4*(t/16)..+3 and columns 8*(t%16)..+7 of a tile (W = 2*sizeof(T) words of raw input per row). Small blocks
// (<= 40 registers a thread, one shared tile) let three of them reside per SM, so three tiles of loads are in
// flight per SM: a persistent form, two blocks per SM each loading its next tile into registers while it
// cast the current one, kept one tile in flight per block and reached 83 % of a copy where this form reaches
// 92 % (GPU run 12; the pure address pattern's ceiling is 92 %, run 11's diag_access_patterns.py, in git history).
// The transposed bytes go through shared memory (the layout and the tile loads and stores, shared with
// fp8_block.cu, are in fp8_tile128.cuh). A thread's 4x8 bytes are cast as row words (cast_fp8x4) and turned
// into its 8 column words by a 4x4 byte transpose per half (__byte_perm); full tiles store the row words
// without bounds checks.

// The 8 elements of one row of a thread's tile part (raw words as loaded), exactly as fp32; the pointer
// argument only selects the input type.
__device__ __forceinline__ void unpack_row8(const float*, const u32 (&w)[8], float (&v)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __uint_as_float(w[j]);
}
__device__ __forceinline__ void unpack_row8(const __nv_bfloat16*, const u32 (&w)[4], float (&v)[8]) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // a bf16 value is the upper half of its fp32 value
        v[2 * p] = __uint_as_float(w[p] << 16);
        v[2 * p + 1] = __uint_as_float(w[p] & 0xFFFF0000u);
    }
}
__device__ __forceinline__ void unpack_row8(const __half*, const u32 (&w)[4], float (&v)[8]) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        __half2 h;
        *reinterpret_cast<u32*>(&h) = w[p];
        v[2 * p] = __low2float(h);  // cvt.f32.f16 of each half, as __half2float
        v[2 * p + 1] = __high2float(h);
    }
}

// E5M2: the FP8 format; AMAX: whether the block max of |x| goes to the accumulator (delayed scaling).
template <typename T, bool E5M2, bool AMAX>
__device__ void cast_transpose_impl(const T* __restrict__ x, int M, int K, int vec_in, int vec_row, int vec_col,
                                    const float* __restrict__ scale_p, u8* __restrict__ row_out,
                                    u8* __restrict__ col_out, float* __restrict__ scale_inv, float* accumulator,
                                    u32 (*tile)[33]) {
    constexpr int W = 2 * sizeof(T);
    const int n_tk = (K + TILE - 1) / TILE;
    const int t = threadIdx.x, cg = t & 15, rg = t >> 4;
    const float s = *scale_p;
    if (blockIdx.x == 0 && t == 0) *scale_inv = reciprocal_rn(s);
    // Tile blockIdx.x of the row-major grid of tiles.
    const int tm = (int)blockIdx.x / n_tk, tk = (int)blockIdx.x - tm * n_tk;
    const int m0 = tm * TILE, k0 = tk * TILE;
    u32 raw[4][W];
    load_tile(x, M, K, m0, k0, vec_in, raw);

    // rw[i][h]: byte c = q of row 4 * rg + i, column 8 * cg + 4 * h + c of the tile.
    float m = 0.0f;
    u32 rw[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float v[8];
        unpack_row8(x, raw[i], v);
        if (AMAX) {
#pragma unroll
            for (int j = 0; j < 8; ++j) m = f32_max(m, f32_abs(v[j]));
        }
        rw[i][0] = cast_fp8x4<E5M2>(f32_mul(v[0], s), f32_mul(v[1], s), f32_mul(v[2], s), f32_mul(v[3], s));
        rw[i][1] = cast_fp8x4<E5M2>(f32_mul(v[4], s), f32_mul(v[5], s), f32_mul(v[6], s), f32_mul(v[7], s));
    }
    if (row_out != nullptr) {
        if (vec_row && m0 + TILE <= M && k0 + TILE <= K) {  // a full tile: no bounds to check
            u8* dst = row_out + ((i64)(m0 + 4 * rg) * K + k0 + 8 * cg);
#pragma unroll
            for (int i = 0; i < 4; ++i, dst += K) *reinterpret_cast<uint2*>(dst) = make_uint2(rw[i][0], rw[i][1]);
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i)
                store_row_words(row_out, M, K, m0 + 4 * rg + i, k0 + 8 * cg, vec_row, rw[i][0], rw[i][1]);
        }
    }
    if (col_out != nullptr) {
        // col_words[j]: byte i = q of row 4 * rg + i, column 8 * cg + j (a 4x4 byte transpose per half).
        u32 col_words[8];
        transpose4x4(rw[0][0], rw[1][0], rw[2][0], rw[3][0], col_words);
        transpose4x4(rw[0][1], rw[1][1], rw[2][1], rw[3][1], col_words + 4);
        store_col_words(tile, col_words, cg, rg, col_out, M, K, m0, k0, vec_col);
    }
    if (AMAX) {
        m = block_max(m);
        if (t == 0) atomic_fmax_accumulate(accumulator, m);
    }
}

template <typename T>
__device__ __forceinline__ void cast_transpose_dispatch(const T* x, int M, int K, int vec_in, int vec_row,
                                                        int vec_col, const float* scale_p, int e5m2, u8* row_out,
                                                        u8* col_out, float* scale_inv, float* accumulator) {
    __shared__ u32 tile[TILE][33];  // the transposed bytes
    if (e5m2) {
        if (accumulator != nullptr)
            cast_transpose_impl<T, true, true>(x, M, K, vec_in, vec_row, vec_col, scale_p, row_out, col_out,
                                               scale_inv, accumulator, tile);
        else
            cast_transpose_impl<T, true, false>(x, M, K, vec_in, vec_row, vec_col, scale_p, row_out, col_out,
                                                scale_inv, accumulator, tile);
    } else {
        if (accumulator != nullptr)
            cast_transpose_impl<T, false, true>(x, M, K, vec_in, vec_row, vec_col, scale_p, row_out, col_out,
                                                scale_inv, accumulator, tile);
        else
            cast_transpose_impl<T, false, false>(x, M, K, vec_in, vec_row, vec_col, scale_p, row_out, col_out,
                                                 scale_inv, accumulator, tile);
    }
}

// ------------------------------------------------------------------ dequantize
#define DEQ_UNROLL 8  // loads in flight per thread

template <typename O>
__device__ void dequantize_impl(const u8* __restrict__ q, i64 n, int vec_ok, const float* __restrict__ scale_inv_p,
                                int e5m2, O* __restrict__ out) {
    constexpr int E = 16 / sizeof(O);  // fp8 bytes per load = output elements per 16-byte store
    constexpr int CHUNK = FLAT_THREADS * DEQ_UNROLL;
    const float si = *scale_inv_p;
    const i64 n_vec = vec_ok ? n / E : 0;
    const i64 v0 = (i64)blockIdx.x * CHUNK + threadIdx.x;
    u32 w[DEQ_UNROLL][E / 4];
    bool ok[DEQ_UNROLL];
#pragma unroll
    for (int u = 0; u < DEQ_UNROLL; ++u) {
        const i64 v = v0 + u * FLAT_THREADS;
        ok[u] = v < n_vec;
        if (ok[u]) {
            if constexpr (E == 8) {
                const uint2 a = reinterpret_cast<const uint2*>(q)[v];
                w[u][0] = a.x;
                w[u][1] = a.y;
            } else {
                w[u][0] = reinterpret_cast<const u32*>(q)[v];
            }
        }
    }
#pragma unroll
    for (int u = 0; u < DEQ_UNROLL; ++u) {
        if (!ok[u]) continue;
        float vals[E];
#pragma unroll
        for (int b = 0; b < E; ++b) vals[b] = f32_mul(fp8_to_f32((w[u][b >> 2] >> (8 * (b & 3))) & 0xFFu, e5m2), si);
        store_vec16(out + (v0 + u * FLAT_THREADS) * E, vals);
    }
    for (i64 e = n_vec * E + (i64)blockIdx.x * FLAT_THREADS + threadIdx.x; e < n; e += (i64)gridDim.x * FLAT_THREADS)
        store_f32(f32_mul(fp8_to_f32(q[e], e5m2), si), &out[e]);
}

// ------------------------------------------------------------------ scale from amax
// compute_scale_from_amax, element-wise (the reference's torch ops on a (1,) tensor cost ~250 us of host
// time per call; this is one launch). Every step is a double operation or an exact widening, so nothing
// flushes: a < eps (eps rounded to fp32 first, as torch does with a Python scalar); a in {0, inf, NaN}
// -> 1; s = RN_f32(fmax / a) with the quotient in double (innocuous double rounding, as the reference);
// s == +inf -> value_for_inf (rounded to fp32); pow2 zeroes the mantissa bits.
extern "C" __global__ void fp8_compute_scale(const float* amax, i64 n, double fmax, double eps,
                                             double value_for_inf, int pow2, float* scale) {
    const double eps_f32 = f32_to_f64(f64_to_f32_rn(eps));
    const float inf_replacement = f64_to_f32_rn(value_for_inf);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        double a = f32_to_f64(amax[i]);
        if (a < eps_f32) a = eps_f32;
        const bool degenerate = isinf(a) || isnan(a) || a == 0.0;
        float s = f64_to_f32_rn(fmax / a);
        if (__float_as_uint(s) == 0x7F800000u) s = inf_replacement;
        if (pow2) s = __uint_as_float(__float_as_uint(s) & 0xFF800000u);
        scale[i] = degenerate ? 1.0f : s;
    }
}

// ------------------------------------------------------------------ entry points
// Resident 512-thread blocks per SM the tile kernel is compiled for (a register bound; the launcher starts one
// block per tile): 3 (<= 40 registers) for 16-bit inputs, 2 (<= 64) for fp32, whose tiles are twice the bytes.
#define FP8_INSTANTIATE(T, SUFFIX, TILE_BLOCKS)                                                                     \
    extern "C" __global__ void __launch_bounds__(FLAT_THREADS, 8)                                                  \
        fp8_amax_##SUFFIX(const T* x, i64 n, int vec_ok, float* out, float* out2) {                                \
        amax_impl<T>(x, n, vec_ok, out, out2);                                                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(FLAT_THREADS)                                                     \
        fp8_cast_##SUFFIX(const T* x, i64 n, int vec_ok, const float* scale, int e5m2, u8* out, float* scale_inv, \
                          float* accumulator) {                                                                    \
        cast_impl<T>(x, n, vec_ok, scale, e5m2, out, scale_inv, accumulator);                                      \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS, TILE_BLOCKS)                                        \
        fp8_cast_transpose_##SUFFIX(const T* x, int M, int K, int vec_in, int vec_row, int vec_col,                \
                                    const float* scale, int e5m2, u8* row_out, u8* col_out, float* scale_inv,      \
                                    float* accumulator) {                                                          \
        cast_transpose_dispatch<T>(x, M, K, vec_in, vec_row, vec_col, scale, e5m2, row_out, col_out, scale_inv,    \
                                   accumulator);                                                                   \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(FLAT_THREADS, 8)                                                  \
        fp8_dequantize_##SUFFIX(const u8* q, i64 n, int vec_ok, const float* scale_inv, int e5m2, T* out) {        \
        dequantize_impl<T>(q, n, vec_ok, scale_inv, e5m2, out);                                                    \
    }

FP8_INSTANTIATE(float, f32, 2)
FP8_INSTANTIATE(__half, f16, 3)
FP8_INSTANTIATE(__nv_bfloat16, bf16, 3)

// ------------------------------------------------------------------ delayed scaling
// One delayed-scaling recipe update: KernelBackend.delayed_scaling_update, whose docstring states it (the
// reference's torch code is the spec): history (L, n) row-major, scale (n,), amax (n,) (amax may be history's
// row 0: every thread reads the slot's amax before the block writes the slot). m is the fmaxf-fold from 0 of
// old[1..L-1] and amax ("max"), num / m is one RN. Every fp32 operation without .ftz (ieee_f32.cuh): subnormal
// amaxes count.
// One block per slot, its threads across the history: a history of 1024 rows read and shifted by one thread
// took ~50 us per launch. The fold is a tree of fmaxf over partial folds that each start from 0: fmaxf skips
// NaN and every operand is >= 0 or NaN, so the tree gives the sequential fold's value (m's sign of zero
// never matters: only m > 0 sets a scale). The shift goes in chunks of blockDim rows, every read of a chunk
// before any write of it, chunks in increasing row order (a chunk reads only rows above the rows it writes).
extern "C" __global__ void fp8_delayed_scaling_update(float* history, float* scale, const float* amax, i64 length,
                                                      i64 n, int algo_max, double numerator) {
    __shared__ float warp_fold[32];
    const float num = f64_to_f32_rn(numerator);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (i64 i = blockIdx.x; i < n; i += gridDim.x) {
        const float a0 = amax[i];
        if (f32_eq(a0, 0.0f)) continue;  // the same for every thread of the block
        float part = 0.0f;
        if (algo_max) {
            for (i64 j = 1 + threadIdx.x; j < length; j += blockDim.x) part = f32_max(part, history[j * n + i]);
            for (int offset = 16; offset > 0; offset >>= 1)
                part = f32_max(part, __shfl_down_sync(0xffffffffu, part, offset));
            if (lane == 0) warp_fold[warp] = part;
        }
        __syncthreads();  // the fold's reads and amax[i] (maybe history[i]) are done before any write below
        for (i64 c = 1; c + 1 < length; c += blockDim.x) {
            const i64 j = c + threadIdx.x;
            const bool moves = j + 1 < length;
            const float v = moves ? history[(j + 1) * n + i] : 0.0f;
            __syncthreads();
            if (moves) history[j * n + i] = v;
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            float m = a0;
            if (algo_max) {
                m = 0.0f;
                for (int w = 0; w < warps; ++w) m = f32_max(m, warp_fold[w]);
                m = f32_max(m, a0);
            }
            if (length > 1) history[(length - 1) * n + i] = a0;
            history[i] = 0.0f;
            const bool finite = (__float_as_uint(m) & 0x7F800000u) != 0x7F800000u;
            if (finite && f32_gt(m, 0.0f)) {
                float s = f32_div(num, m);
                if ((__float_as_uint(s) & 0x7FFFFFFFu) == 0x7F800000u) s = __uint_as_float(0x7F7FFFFFu);
                scale[i] = s;
            }
        }
        __syncthreads();  // warp_fold is read before the next slot overwrites it
    }
}
