// FP8 block scaling (DeepSeek style): 1x128 blocks (1D) or 128x128 tiles (2D), fp32 scales.
//
// Specification: refops/kernels/reference/quant_float8_block.py and quant_float8.compute_scale_from_amax
// (docs/recipes/fp8-block.md#the-arithmetic). Per block with amax a over its in-bounds elements (NaNs skipped):
//   a = fl(eps) if a < fl(eps);  degenerate = a in {0, inf, NaN};
//   s = fp32(RN_double(RN_double(1/a) * fmax))   (torch's float / tensor is reciprocal-then-multiply);
//   s = value_for_inf if s == +inf;  pow2: s = bits(s) & 0xFF800000;  degenerate: s = 1;
//   q = Q_F(RN(float(x) * s)),  scale_inv = fp32(RN_double(1/s)).
// Layouts (M = rows, K = last dim of the input): row-wise data (M, K); column-wise data (K, M) (the
// transpose); GEMM-ready fp32 scales, the caller zero-fills any padding (when there is none, every
// scale is written here):
//   1D row-wise [k/128, m] (ld = round_up(M,4));   1D column-wise [m/128, k] (ld = round_up(K,4));
//   2D row-wise [m/128, k/128];                     2D column-wise [k/128, m/128].
//
// Kernels (suffix = input or output element type):
//   fp8_block_quantize_{rows,cols,both,2d}_*
//       one 128x128 tile per block, 512 threads, three blocks resident per SM (<= 40 registers), so that
//       three tiles of loads are in flight per SM (a persistent form with the next tile loaded into
//       registers kept one per block and reached 79-83 % of a copy, this form 88 % for 1x128 and 92 % for
//       128x128: GPU runs 12, 14, 16, 19); thread t owns rows 4*(t/16)..+3 and columns 8*(t%16)..+7. One pass over
//       the values gives the thread's row and column maxima. A 1x128 row block is a half-warp: its 4 rows'
//       maxima are reduced and scattered over the 16 lanes by 5 shuffles, lane l computes the scale of row
//       l/4 only, 4 shuffles hand the scales out (no barrier); column amaxes (and the 2D tile amax) go
//       through shared memory; the column-wise bytes are transposed in shared memory and written 16 bytes
//       per thread (2D: the row bytes, transposed 4x4 by byte permutes). Values are quantized four at a time
//       (two cvt.rn.satfinite.*x2.f32, the same rounding per value), the fp8 format chosen by one uniform
//       branch per site.
//   fp8_block_dequantize_*
//       rows x 16-byte stores: each thread loads 4 rows of one vector of the data before storing.

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
#define WARPS (TILE_THREADS / 32)

// Q_F(RN(v_j * s)) of elements 4p..4p+3 of one row (raw words), packed little-endian.
template <typename T, bool E5M2>
__device__ __forceinline__ u32 quantize4(const u32* raw, int p, float s) {
    return cast_fp8x4<E5M2>(f32_mul(word_elem<T>(raw, 4 * p), s), f32_mul(word_elem<T>(raw, 4 * p + 1), s),
                            f32_mul(word_elem<T>(raw, 4 * p + 2), s), f32_mul(word_elem<T>(raw, 4 * p + 3), s));
}

// Row words of rows i = 0..3 (bytes Q_F(RN(v * s_i)) of the thread's 8 columns), and, when the column
// words are wanted, the same bytes transposed: byte i of cw[j] = the byte of row i, column j.
template <typename T, bool E5M2>
__device__ __forceinline__ void quantize_rows(const u32 (*raw)[2 * sizeof(T)], const float (&s)[4], u32 (&rw)[4][2]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        rw[i][0] = quantize4<T, E5M2>(raw[i], 0, s[i]);
        rw[i][1] = quantize4<T, E5M2>(raw[i], 1, s[i]);
    }
}

// Column words: byte i of cw[j] = Q_F(RN(v_ij * s_j)).
template <typename T, bool E5M2>
__device__ __forceinline__ void quantize_cols(const u32 (*raw)[2 * sizeof(T)], const float (&s)[8], u32 (&cw)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
        cw[j] = cast_fp8x4<E5M2>(f32_mul(word_elem<T>(raw[0], j), s[j]), f32_mul(word_elem<T>(raw[1], j), s[j]),
                                 f32_mul(word_elem<T>(raw[2], j), s[j]), f32_mul(word_elem<T>(raw[3], j), s[j]));
}

// MODE: 1 = 1D row-wise only, 2 = 1D column-wise only, 3 = 1D both, 4 = 2D (row_out / col_out say which usages).
// The fp8 format (e5m2) is uniform: each conversion site branches once to a version with one conversion.
template <typename T, int MODE>
__device__ void block_quantize_impl(const T* __restrict__ x, int M, int K, int vec_in, int vec_row, int vec_col,
                                    int e5m2, float fmax, int pow2, float eps, float value_for_inf,
                                    u8* __restrict__ row_out, float* __restrict__ row_scale, int row_ld,
                                    u8* __restrict__ col_out, float* __restrict__ col_scale, int col_ld) {
    __shared__ u32 tile[2][TILE][33];        // transposed bytes (two buffers, as the grid-stride loop below needs)
    __shared__ float col_part[WARPS][8][16];  // 1D columns: [warp][j][cg], max over the warp's 8 rows of column 8*cg+j
    __shared__ __align__(16) float col_s[TILE];  // 1D column scales
    __shared__ float tile_part[2][WARPS];     // 2D: per-warp maxima, the same
    constexpr int W = 2 * sizeof(T);
    constexpr bool two_d = MODE == 4, rows_1d = MODE == 1 || MODE == 3, cols_1d = MODE == 2 || MODE == 3;
    constexpr u32 FULL = 0xffffffffu;

    const int n_tk = (K + TILE - 1) / TILE;
    const int tiles = ((M + TILE - 1) / TILE) * n_tk;
    const int t = threadIdx.x, cg = t & 15, rg = t >> 4, lane = t & 31, warp = t >> 5;

    int tile_id = blockIdx.x;
    if (tile_id >= tiles) return;  // no tile for this block (n_tk >= 1 below)
    // The launcher starts one block per tile, so the grid-stride loop runs once; it is kept because this form,
    // with two shared buffers, measured 0.149 ms on the 1x128 case against 0.154 ms for the same work written
    // without the loop and with one buffer (GPU runs 12-15, side by side in run 14). Tile coordinates advance by
    // (step_m, step_k) per grid stride (no division in the loop).
    const int step_m = (int)gridDim.x / n_tk, step_k = (int)gridDim.x - step_m * n_tk;
    int am = tile_id / n_tk, ak = tile_id - am * n_tk;  // coordinates of tile_id, then of the next one
    int buf = 0;
    for (; tile_id < tiles; tile_id += gridDim.x) {
        const int tm = am, tk = ak;
        ak += step_k;
        am += step_m;
        if (ak >= n_tk) {
            ak -= n_tk;
            ++am;
        }
        u32 raw[4][W];
        load_tile(x, M, K, tm * TILE, tk * TILE, vec_in, raw);

        const int m0 = tm * TILE, k0 = tk * TILE;
        u32 col_words[8];  // col_words[j]: rows 4*rg..+3 of column 8*cg+j, for the transposed copy
#pragma unroll
        for (int j = 0; j < 8; ++j) col_words[j] = 0u;

        if constexpr (two_d) {
            // One 128x128 block: max over the thread's 32 values, the warp, then the 16 warps.
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) a = f32_max(a, f32_abs(word_elem<T>(raw[i], j)));
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) a = f32_max(a, __shfl_xor_sync(FULL, a, o));
            if (lane == 0) tile_part[buf][warp] = a;
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; ++i) reload(raw[i]);
            a = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) a = f32_max(a, tile_part[buf][w]);
            const float s = scale_from_amax(a, fmax, pow2, eps, value_for_inf);
            if (t == 0) {
                const float si = reciprocal_rn(s);
                if (row_scale != nullptr) row_scale[(i64)tm * row_ld + tk] = si;
                if (col_scale != nullptr) col_scale[(i64)tk * col_ld + tm] = si;
            }
            u32 row_words[4][2];
            const float s4[4] = {s, s, s, s};
            if (e5m2) quantize_rows<T, true>(raw, s4, row_words); else quantize_rows<T, false>(raw, s4, row_words);
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (row_out != nullptr)
                    store_row_words(row_out, M, K, m0 + 4 * rg + i, k0 + 8 * cg, vec_row, row_words[i][0],
                                    row_words[i][1]);
            if (col_out != nullptr) {  // the same bytes serve the column-wise copy
                transpose4x4(row_words[0][0], row_words[1][0], row_words[2][0], row_words[3][0], col_words);
                transpose4x4(row_words[0][1], row_words[1][1], row_words[2][1], row_words[3][1], col_words + 4);
            }
        }
        if constexpr (rows_1d || cols_1d) {
            // One pass over the values: maxima of the thread's 4 rows (8 values each) and 8 columns (4 values
            // each). The maxima are exact and never NaN (they start at 0), so any order gives the same amax.
            float ra[4], ca[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) ra[i] = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) ca[j] = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float v = f32_abs(word_elem<T>(raw[i], j));
                    if constexpr (rows_1d) ra[i] = f32_max(ra[i], v);
                    if constexpr (cols_1d) ca[j] = f32_max(ca[j], v);
                }
            if constexpr (cols_1d) {
                // 128x1 column blocks: the two row groups of the warp, then the 16 warps in shared memory
                // (after the row-wise work below); 128 threads compute the column scales.
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float a = f32_max(ca[j], __shfl_xor_sync(FULL, ca[j], 16));
                    if (lane < 16) col_part[warp][j][cg] = a;
                }
            }
            if constexpr (rows_1d) {
                // A 1x128 row block is a half-warp. Its 4 row maxima are reduced and scattered over the 16
                // lanes (exchange 2 rows with lane ^ 8, 1 row with lane ^ 4, then the same row with lanes ^ 2,
                // ^ 1): lane cg ends with the amax of row 4*rg + cg/4 and computes that row's scale; the lanes
                // fetch the 4 scales by shuffles.
                float ar = max4_scattered<8, 4>(ra, cg);  // row cg / 4
                ar = f32_max(ar, __shfl_xor_sync(FULL, ar, 2));
                ar = f32_max(ar, __shfl_xor_sync(FULL, ar, 1));
                const float sr = scale_from_amax(ar, fmax, pow2, eps, value_for_inf);
                {
                    const int m = m0 + 4 * rg + (cg >> 2);
                    if ((cg & 3) == 0 && m < M) row_scale[(i64)tk * row_ld + m] = reciprocal_rn(sr);
                }
                float s4[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) s4[i] = __shfl_sync(FULL, sr, (lane & 16) | (4 * i));
#pragma unroll
                for (int i = 0; i < 4; ++i) reload(raw[i]);
                u32 row_words[4][2];
                if (e5m2) quantize_rows<T, true>(raw, s4, row_words); else quantize_rows<T, false>(raw, s4, row_words);
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    store_row_words(row_out, M, K, m0 + 4 * rg + i, k0 + 8 * cg, vec_row, row_words[i][0],
                                    row_words[i][1]);
            }
        }
        if constexpr (cols_1d) {
            __syncthreads();
            if (t < TILE) {
                const int rj = t >> 4, rc = t & 15, c = 8 * rc + rj;  // conflict-free reads of col_part
                float a = 0.0f;
#pragma unroll
                for (int w = 0; w < WARPS; ++w) a = f32_max(a, col_part[w][rj][rc]);
                const float s = scale_from_amax(a, fmax, pow2, eps, value_for_inf);
                col_s[c] = s;
                if (k0 + c < K) col_scale[(i64)tm * col_ld + k0 + c] = reciprocal_rn(s);
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; ++i) reload(raw[i]);
            const float4 sa = *reinterpret_cast<const float4*>(col_s + 8 * cg);
            const float4 sb = *reinterpret_cast<const float4*>(col_s + 8 * cg + 4);
            const float cs[8] = {sa.x, sa.y, sa.z, sa.w, sb.x, sb.y, sb.z, sb.w};
            if (e5m2) quantize_cols<T, true>(raw, cs, col_words); else quantize_cols<T, false>(raw, cs, col_words);
        }
        if (MODE != 1 && col_out != nullptr)  // (the barrier in store_col_words also orders tile[buf ^ 1]'s reuse)
            store_col_words(tile[buf], col_words, cg, rg, col_out, M, K, m0, k0, vec_col);
        buf ^= 1;
    }
}

// ------------------------------------------------------------------ dequantize
// Data viewed as (R, C); scale element of (r, c): 1D [c/128, r], 2D [r/128, c/128].
__device__ __forceinline__ float block_scale_inv(const float* __restrict__ scale, int ld, int two_d, int r, int c) {
    return two_d ? scale[(i64)(r / TILE) * ld + c / TILE] : scale[(i64)(c / TILE) * ld + r];
}

// Blocks of (tx, ty) threads; thread (x, y) owns vector cv = blockIdx.x * tx + x (V elements; V divides 128)
// of the rows rb * ty * DEQ_ROWS + y + i * ty (i < DEQ_ROWS) for row blocks rb = blockIdx.y, + gridDim.y, ...;
// it loads its DEQ_ROWS rows before converting any. V = 16 / sizeof(O) (one 16-byte store) when C % V == 0,
// else 1 (one element).
#define DEQ_ROWS 4

template <typename O, int V>
__device__ void block_dequantize_impl(const u8* __restrict__ q, int R, int C, const float* __restrict__ scale, int ld,
                                      int two_d, int e5m2, O* __restrict__ out) {
    const int cv = blockIdx.x * blockDim.x + threadIdx.x;
    if (cv >= C / V) return;  // no barriers below
    const int c = cv * V;
    const int n_rb = (R + blockDim.y * DEQ_ROWS - 1) / (blockDim.y * DEQ_ROWS);
    for (int rb = blockIdx.y; rb < n_rb; rb += gridDim.y) {
        const int r0 = rb * blockDim.y * DEQ_ROWS + threadIdx.y;
        u32 w[DEQ_ROWS][(V + 3) / 4];
#pragma unroll
        for (int i = 0; i < DEQ_ROWS; ++i) {
            const int r = r0 + i * blockDim.y;
            if (r < R) {
                const u8* src = q + (i64)r * C + c;
                if constexpr (V == 8) {
                    const uint2 a = *reinterpret_cast<const uint2*>(src);
                    w[i][0] = a.x;
                    w[i][1] = a.y;
                } else if constexpr (V == 4) {
                    w[i][0] = *reinterpret_cast<const u32*>(src);
                } else {
                    w[i][0] = *src;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < DEQ_ROWS; ++i) {
            const int r = r0 + i * blockDim.y;
            if (r >= R) continue;
            const float si = block_scale_inv(scale, ld, two_d, r, c);  // V divides 128: one block per vector
            float vals[V];
#pragma unroll
            for (int b = 0; b < V; ++b) vals[b] = f32_mul(fp8_to_f32((w[i][b >> 2] >> (8 * (b & 3))) & 0xFFu, e5m2), si);
            if constexpr (V == 1) {
                store_f32(vals[0], out + (i64)r * C + c);
            } else {
                store_vec16(out + (i64)r * C + c, vals);
            }
        }
    }
}

// ------------------------------------------------------------------ entry points
// Resident 512-thread blocks per SM the quantize kernels are compiled for (a register bound; the launcher
// starts one block per tile): 3 (<= 40 registers) for 16-bit inputs, 1 for fp32 (twice the bytes per tile).
#define FP8_BLOCK_QUANTIZE(T, SUFFIX, TILE_BLOCKS, NAME, MODE)                                                    \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS, TILE_BLOCKS) fp8_block_quantize_##NAME##_##SUFFIX( \
        const T* x, int M, int K, int vec_in, int vec_row, int vec_col, int e5m2, float fmax, int pow2,           \
        float eps, float value_for_inf, u8* row_out, float* row_scale, int row_ld, u8* col_out,                   \
        float* col_scale, int col_ld) {                                                                           \
        block_quantize_impl<T, MODE>(x, M, K, vec_in, vec_row, vec_col, e5m2, fmax, pow2, eps, value_for_inf,     \
                                     row_out, row_scale, row_ld, col_out, col_scale, col_ld);                     \
    }
#define FP8_BLOCK_INSTANTIATE(T, SUFFIX, TILE_BLOCKS)                                                           \
    FP8_BLOCK_QUANTIZE(T, SUFFIX, TILE_BLOCKS, rows, 1)                                                         \
    FP8_BLOCK_QUANTIZE(T, SUFFIX, TILE_BLOCKS, cols, 2)                                                         \
    FP8_BLOCK_QUANTIZE(T, SUFFIX, TILE_BLOCKS, both, 3)                                                         \
    FP8_BLOCK_QUANTIZE(T, SUFFIX, TILE_BLOCKS, 2d, 4)                                                           \
    extern "C" __global__ void __launch_bounds__(256, 8) fp8_block_dequantize_##SUFFIX(                         \
        const u8* q, int R, int C, const float* scale, int ld, int two_d, int e5m2, T* out) {                   \
        block_dequantize_impl<T, 16 / sizeof(T)>(q, R, C, scale, ld, two_d, e5m2, out);                         \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) fp8_block_dequantize_scalar_##SUFFIX(                     \
        const u8* q, int R, int C, const float* scale, int ld, int two_d, int e5m2, T* out) {                   \
        block_dequantize_impl<T, 1>(q, R, C, scale, ld, two_d, e5m2, out);                                      \
    }

FP8_BLOCK_INSTANTIATE(float, f32, 1)
FP8_BLOCK_INSTANTIATE(__half, f16, 3)
FP8_BLOCK_INSTANTIATE(__nv_bfloat16, bf16, 3)
