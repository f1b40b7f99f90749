// MXFP8: 1x32 (row-wise), 32x1 (column-wise) blocks or 32x32 tiles (2D), E8M0 scale bytes.
//
// Specification: refops/kernels/reference/quant_mxfp8.py and refops.formats (docs/recipes/mxfp8.md#the-arithmetic).
// Per block with amax a (NaNs skipped):
//   e = e8m0(RN(a * fl(1/fmax)))   (integer rule: round the exponent up, saturate at 254, inf -> 254);
//   q = Q_F(RN(float(x) * 2^(127-e)));   decode: RN(float(q) * 2^(e-127)).
// Data of both usages keeps x's (M, K) layout (not transposed). uint8 scales: row-wise [m, k/32]
// (ld = round_up(K/32, 4)), column-wise [m/32, k] (ld = round_up(K, 128)); the caller zero-fills any
// padding (when there is none, every scale byte is written here). Needs M % 32 == 0 and K % 32 == 0.
//
// Kernels (suffix = input or output element type):
//   mxfp8_quantize_*    persistent 32x256 tiles, 256 threads; thread t owns rows 4*(t/32)..+3 and columns
//                       8*(t%32)..+7 (one 16-byte load per row for 16-bit inputs; a warp reads 512
//                       contiguous bytes of a row, writes 256). The next tile is loaded into registers
//                       while this one is quantized (tile coordinates advance without division). One pass
//                       over the values gives the thread's row and column maxima. A 1x32 block is 4 lanes:
//                       its 4 rows' maxima are reduced and scattered by 3 shuffles, lane l computes the
//                       scale of row l%4 only and 4 shuffles hand the multipliers out (no barrier); a
//                       32x1 column is reduced over the thread's 4 rows in registers, then over the 8 warps
//                       through shared memory (the reducing thread also stores the column multiplier);
//                       a 32x32 tile over 4 lanes and then the 8 warps. Values are quantized four at a
//                       time (two cvt.rn.satfinite.*x2.f32, the same rounding per value), the fp8 format
//                       chosen by one uniform branch per site.
//   mxfp8_dequantize_*  rows x 16-byte stores: each thread loads 4 rows of one vector before storing.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

#include "ieee_f32.cuh"
#include "elements16.cuh"
#include "fp8_elements.cuh"

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
#define TILE_K 256
#define THREADS 256

// Raw input of one thread's 4 rows x 8 columns (W = 2*sizeof(T) words per row); zeros past K.
template <typename T>
__device__ __forceinline__ void load_tile(const T* __restrict__ x, int K, int m0, int k0, u32 (&raw)[4][2 * sizeof(T)]) {
    constexpr int W = 2 * sizeof(T);
    const int t = threadIdx.x, cg = t & 31, rg = t >> 5;
    const int k = k0 + 8 * cg;
    const T* row = x + (i64)(m0 + 4 * rg) * K + k;
#pragma unroll
    for (int i = 0; i < 4; ++i, row += K) {
        if (k < K) {  // K % 32 == 0: a thread's 8 columns are all in bounds or all out
            const uint4* p = reinterpret_cast<const uint4*>(row);
#pragma unroll
            for (int h = 0; h < W / 4; ++h) {
                const uint4 a = p[h];
                raw[i][4 * h] = a.x; raw[i][4 * h + 1] = a.y; raw[i][4 * h + 2] = a.z; raw[i][4 * h + 3] = a.w;
            }
        } else {
#pragma unroll
            for (int w = 0; w < W; ++w) raw[i][w] = 0u;
        }
    }
}

// 8 bytes q_j = Q_F(RN(v_j * mult_j)) of one row, packed little-endian.
template <typename T, bool E5M2>
__device__ __forceinline__ uint2 quantize8(const u32* raw, const float (&mult)[8]) {
    return make_uint2(cast_fp8x4<E5M2>(f32_mul(word_elem<T>(raw, 0), mult[0]), f32_mul(word_elem<T>(raw, 1), mult[1]),
                                       f32_mul(word_elem<T>(raw, 2), mult[2]), f32_mul(word_elem<T>(raw, 3), mult[3])),
                      cast_fp8x4<E5M2>(f32_mul(word_elem<T>(raw, 4), mult[4]), f32_mul(word_elem<T>(raw, 5), mult[5]),
                                       f32_mul(word_elem<T>(raw, 6), mult[6]), f32_mul(word_elem<T>(raw, 7), mult[7])));
}

// The 4 rows of a thread: row i with multipliers mult[i] (one per row) or mult8 (one per column).
template <typename T, bool E5M2>
__device__ __forceinline__ void quantize_rows(const u32 (*raw)[2 * sizeof(T)], const float (&mult)[4], uint2 (&q)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float m8[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) m8[j] = mult[i];
        q[i] = quantize8<T, E5M2>(raw[i], m8);
    }
}
template <typename T, bool E5M2>
__device__ __forceinline__ void quantize_rows(const u32 (*raw)[2 * sizeof(T)], const float (&mult8)[8], uint2 (&q)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = quantize8<T, E5M2>(raw[i], mult8);
}
template <typename T, typename Mult>
__device__ __forceinline__ void quantize_rows(int e5m2, const u32 (*raw)[2 * sizeof(T)], const Mult& mult, uint2 (&q)[4]) {
    if (e5m2) quantize_rows<T, true>(raw, mult, q); else quantize_rows<T, false>(raw, mult, q);
}

// MODE: 1 = 1D row-wise only, 2 = 1D column-wise only, 3 = 1D both, 4 = 2D (row_out / col_out say which usages).
template <typename T, int MODE>
__device__ void mxfp8_quantize_impl(const T* __restrict__ x, int M, int K, int e5m2, float inv_fmax,
                                    u8* __restrict__ row_out, u8* __restrict__ row_scale, int row_ld,
                                    u8* __restrict__ col_out, u8* __restrict__ col_scale, int col_ld) {
    constexpr int W = 2 * sizeof(T);
    constexpr int WARPS = THREADS / 32;
    constexpr u32 FULL = 0xffffffffu;
    __shared__ float col_part[WARPS][8][32];          // [warp][j][cg]: column 8*cg + j, max over the warp's 4 rows
    __shared__ __align__(16) float col_mult[TILE_K];  // column multipliers 2^(127-e) of the tile
    __shared__ float tile_part[2][WARPS][8];          // 2D: [buffer][warp][32-column block]

    const int n_tk = (K + TILE_K - 1) / TILE_K;
    const int tiles = (M / TILE_M) * n_tk;
    const int t = threadIdx.x, cg = t & 31, rg = t >> 5, lane = t & 31;
    constexpr bool two_d = MODE == 4, rows_1d = MODE == 1 || MODE == 3, cols_1d = MODE == 2 || MODE == 3;

    u32 next[4][W];
    int tile_id = blockIdx.x;
    if (tile_id >= tiles) return;  // no tile for this block (n_tk >= 1 below)
    // Tile coordinates advance by (step_m, step_k) per grid stride (no division in the loop).
    const int step_m = (int)gridDim.x / n_tk, step_k = (int)gridDim.x - step_m * n_tk;
    int am = tile_id / n_tk, ak = tile_id - am * n_tk;  // coordinates of tile_id, then of the tile loaded ahead
    load_tile(x, K, am * TILE_M, ak * TILE_K, next);
    int buf = 0;
    for (; tile_id < tiles; tile_id += gridDim.x) {
        const int m0 = am * TILE_M, k0 = ak * TILE_K;
        ak += step_k;
        am += step_m;
        if (ak >= n_tk) {
            ak -= n_tk;
            ++am;
        }
        u32 raw[4][W];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int w = 0; w < W; ++w) raw[i][w] = next[i][w];
        const int ahead = tile_id + gridDim.x;
        if (ahead < tiles) load_tile(x, K, am * TILE_M, ak * TILE_K, next);

        const int k = k0 + 8 * cg;
        const bool valid = k < K;
        const i64 off0 = (i64)(m0 + 4 * rg) * K + k;  // element (row 4*rg, column k) of the tile; rows K apart

        if constexpr (two_d) {
            // 32x32 tile: max over the thread's 32 values, its 4-lane group, then the 8 warps.
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) a = f32_max(a, f32_abs(word_elem<T>(raw[i], j)));
            a = f32_max(a, __shfl_xor_sync(FULL, a, 1));
            a = f32_max(a, __shfl_xor_sync(FULL, a, 2));
            if ((cg & 3) == 0) tile_part[buf][rg][cg >> 2] = a;
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; ++i) reload(raw[i]);
            float b = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) b = f32_max(b, tile_part[buf][w][cg >> 2]);
            const u32 e = e8m0_from_f32(f32_mul(b, inv_fmax));
            const float mult1 = e8m0_encode_multiplier(e);
            const float mult[4] = {mult1, mult1, mult1, mult1};
            if (valid) {
                uint2 q[4];
                quantize_rows<T>(e5m2, raw, mult, q);  // the same bytes serve both usages
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const i64 off = off0 + (i64)i * K;
                    if (row_out != nullptr) {
                        *reinterpret_cast<uint2*>(row_out + off) = q[i];
                        if ((cg & 3) == i) row_scale[(i64)(m0 + 4 * rg + i) * row_ld + k / 32] = (u8)e;
                    }
                    if (col_out != nullptr) *reinterpret_cast<uint2*>(col_out + off) = q[i];
                }
                if (col_out != nullptr && rg == 0) {
                    const u32 e4 = e * 0x01010101u;
                    *reinterpret_cast<uint2*>(col_scale + (i64)(m0 / 32) * col_ld + k) = make_uint2(e4, e4);
                }
            }
            buf ^= 1;
            continue;
        }
        // One pass over the values: maxima of the thread's 4 rows (8 values each) and 8 columns (4 values
        // each). The maxima are exact and never NaN (they start at 0), so any order gives the same amax.
        float ra[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ca[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if constexpr (rows_1d || cols_1d) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float v = f32_abs(word_elem<T>(raw[i], j));
                    if constexpr (rows_1d) ra[i] = f32_max(ra[i], v);
                    if constexpr (cols_1d) ca[j] = f32_max(ca[j], v);
                }
        }
        if constexpr (cols_1d) {
            // 32x1 blocks: the thread's 4 rows, then the 8 warps in shared memory (after the row-wise work).
#pragma unroll
            for (int j = 0; j < 8; ++j) col_part[rg][j][cg] = ca[j];
        }
        if constexpr (rows_1d) {
            // A 1x32 block is the 4-lane group of cg. Its 4 row maxima are reduced and scattered over the 4
            // lanes (exchange 2 rows with lane ^ 2, 1 row with lane ^ 1): lane cg ends with the amax of row
            // 4*rg + cg%4, computes that row's scale byte and multiplier, and the lanes fetch the 4
            // multipliers by shuffles; no barrier.
            const float ar = max4_scattered<2, 1>(ra, cg);  // row cg % 4
            const u32 e = e8m0_from_f32(f32_mul(ar, inv_fmax));
            const float mult1 = e8m0_encode_multiplier(e);
            float mult[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) mult[i] = __shfl_sync(FULL, mult1, (lane & ~3) | i);
            if (valid) {
                row_scale[(i64)(m0 + 4 * rg + (cg & 3)) * row_ld + k / 32] = (u8)e;
                if constexpr (!cols_1d) {  // (with both usages, reconverting costs registers here)
#pragma unroll
                    for (int i = 0; i < 4; ++i) reload(raw[i]);
                }
                uint2 q[4];
                quantize_rows<T>(e5m2, raw, mult, q);
#pragma unroll
                for (int i = 0; i < 4; ++i) *reinterpret_cast<uint2*>(row_out + off0 + (i64)i * K) = q[i];
            }
        }
        if constexpr (cols_1d) {
            __syncthreads();
            {
                // Thread t reduces column 8 * (t % 32) + t / 32 (conflict-free reads of col_part).
                const int rj = t >> 5, rc = t & 31, c = 8 * rc + rj;
                float a = 0.0f;
#pragma unroll
                for (int w = 0; w < WARPS; ++w) a = f32_max(a, col_part[w][rj][rc]);
                const u32 e = e8m0_from_f32(f32_mul(a, inv_fmax));
                col_mult[c] = e8m0_encode_multiplier(e);
                if (k0 + c < K) col_scale[(i64)(m0 / 32) * col_ld + k0 + c] = (u8)e;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; ++i) reload(raw[i]);
            if (valid) {
                const float4 ma = *reinterpret_cast<const float4*>(col_mult + 8 * cg);
                const float4 mb = *reinterpret_cast<const float4*>(col_mult + 8 * cg + 4);
                const float mult[8] = {ma.x, ma.y, ma.z, ma.w, mb.x, mb.y, mb.z, mb.w};
                uint2 q[4];
                quantize_rows<T>(e5m2, raw, mult, q);
#pragma unroll
                for (int i = 0; i < 4; ++i) *reinterpret_cast<uint2*>(col_out + off0 + (i64)i * K) = q[i];
            }
        }
    }
}

// ------------------------------------------------------------------ dequantize
// Blocks of (tx, ty) threads; thread (x, y) owns 16-byte output vector cv = blockIdx.x * tx + x of the rows
// rb * ty * ROWS + y + i * ty (i < ROWS) for row blocks rb = blockIdx.y, blockIdx.y + gridDim.y, ...; it
// loads its ROWS rows before converting any.
#define DEQ_ROWS 4

template <typename O>
__device__ void mxfp8_dequantize_impl(const u8* __restrict__ q, int M, int K, const u8* __restrict__ scale, int ld,
                                      int columnwise, int scale_vec, int e5m2, O* __restrict__ out) {
    constexpr int E = 16 / sizeof(O);  // fp8 bytes per load = output elements per 16-byte store
    const int cv = blockIdx.x * blockDim.x + threadIdx.x;
    if (cv >= K / E) return;  // no barriers below
    const int k = cv * E;
    const int n_rb = (M + blockDim.y * DEQ_ROWS - 1) / (blockDim.y * DEQ_ROWS);
    for (int rb = blockIdx.y; rb < n_rb; rb += gridDim.y) {
        const int r0 = rb * blockDim.y * DEQ_ROWS + threadIdx.y;
        u32 w[DEQ_ROWS][E / 4];
#pragma unroll
        for (int i = 0; i < DEQ_ROWS; ++i) {
            const int m = r0 + i * blockDim.y;
            if (m < M) {
                if constexpr (E == 8) {
                    const uint2 a = *reinterpret_cast<const uint2*>(q + (i64)m * K + k);
                    w[i][0] = a.x;
                    w[i][1] = a.y;
                } else {
                    w[i][0] = *reinterpret_cast<const u32*>(q + (i64)m * K + k);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < DEQ_ROWS; ++i) {
            const int m = r0 + i * blockDim.y;
            if (m >= M) continue;
            float sv[E];
            if (columnwise) {
                const u8* s = scale + (i64)(m / 32) * ld + k;
                if (scale_vec) {
                    u32 sw[E / 4];
                    if constexpr (E == 8) {
                        const uint2 a = *reinterpret_cast<const uint2*>(s);
                        sw[0] = a.x;
                        sw[1] = a.y;
                    } else {
                        sw[0] = *reinterpret_cast<const u32*>(s);
                    }
#pragma unroll
                    for (int b = 0; b < E; ++b) sv[b] = e8m0_to_f32((sw[b >> 2] >> (8 * (b & 3))) & 0xFFu);
                } else {
#pragma unroll
                    for (int b = 0; b < E; ++b) sv[b] = e8m0_to_f32(s[b]);
                }
            } else {
                const float s1 = e8m0_to_f32(scale[(i64)m * ld + k / 32]);
#pragma unroll
                for (int b = 0; b < E; ++b) sv[b] = s1;
            }
            float vals[E];
#pragma unroll
            for (int b = 0; b < E; ++b) vals[b] = f32_mul(fp8_to_f32((w[i][b >> 2] >> (8 * (b & 3))) & 0xFFu, e5m2), sv[b]);
            store_vec16(out + (i64)m * K + k, vals);
        }
    }
}

// ------------------------------------------------------------------ entry points
// Resident blocks per SM of the persistent quantize kernels (the launcher sizes its grid with them):
// 4 x 256 threads (<= 64 registers) for 16-bit inputs, 2 for fp32 (twice the bytes per tile).
// One quantize kernel per mode (rows, cols, both: 1D usages; 2d: 32x32 tiles, either usage).
#define MXFP8_QUANTIZE(T, SUFFIX, TILE_BLOCKS, NAME, MODE)                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS, TILE_BLOCKS) mxfp8_quantize_##NAME##_##SUFFIX(       \
        const T* x, int M, int K, int e5m2, float inv_fmax, u8* row_out, u8* row_scale, int row_ld,             \
        u8* col_out, u8* col_scale, int col_ld) {                                                               \
        mxfp8_quantize_impl<T, MODE>(x, M, K, e5m2, inv_fmax, row_out, row_scale, row_ld, col_out, col_scale,   \
                                     col_ld);                                                                   \
    }
#define MXFP8_INSTANTIATE(T, SUFFIX, TILE_BLOCKS)                                                               \
    MXFP8_QUANTIZE(T, SUFFIX, TILE_BLOCKS, rows, 1)                                                             \
    MXFP8_QUANTIZE(T, SUFFIX, TILE_BLOCKS, cols, 2)                                                             \
    MXFP8_QUANTIZE(T, SUFFIX, TILE_BLOCKS, both, 3)                                                             \
    MXFP8_QUANTIZE(T, SUFFIX, TILE_BLOCKS, 2d, 4)                                                               \
    extern "C" __global__ void __launch_bounds__(256) mxfp8_dequantize_##SUFFIX(                               \
        const u8* q, int M, int K, const u8* scale, int ld, int columnwise, int scale_vec, int e5m2, T* out) {  \
        mxfp8_dequantize_impl<T>(q, M, K, scale, ld, columnwise, scale_vec, e5m2, out);                         \
    }

MXFP8_INSTANTIATE(float, f32, 2)
MXFP8_INSTANTIATE(__half, f16, 4)
MXFP8_INSTANTIATE(__nv_bfloat16, bf16, 4)
