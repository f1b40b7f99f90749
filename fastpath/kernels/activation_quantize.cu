// Fused activation + quantize: a unary activation (or its backward) and what the next op's quantizer needs of
// it, in one pass over the input (refops.kernels.fused_activation_interface; docs/recipes/fused-activations.md).
//
// Specification: refops/kernels/reference/fused_activation.py, the unfused kernels composed. v is the
// activation's fp32 result, never rounded: v = A(x) forward, v = dy * A'(x) backward, computed by the very
// device functions of activation.cu (activation_functions.cuh, compiled with the same options: FMA contraction
// on, subnormals kept; fastpath/activation_quantize.py), so v has the bits of the activation kernels run on
// fp32 inputs. Everything after v is an explicit IEEE step (ieee_f32.cuh) or an exact conversion:
//
//   act_cast_t_{fwd,bwd}_<act>_<dtype>   delayed scaling's fully fused pass, 128x128 tiles as cast_fp8.cu's
//       fp8_cast_transpose (512 threads, thread t owns rows 4*(t/16)..+3, columns 8*(t%16)..+7 of a tile):
//       q = Q_F(RN(v * scale)) as row-wise bytes and/or the transposed (K, M) copy, scale_inv = RN(1/scale),
//       the accumulator = fmaxf(accumulator, amax(v)) (compare-and-swap per block, fp8_amax.cuh); backward
//       optionally writes per-tile column sums of v (the bias grad of the unrounded values) to partial[tile
//       row, :], which activation.cu's dbias_finalize adds up. Elements outside the tensor (a partial tile) are
//       loaded as +0 and take no part in the amax or the sums: A(0) need not be 0 (sigmoid).
//   act_amax_{fwd,bwd}_<act>_<dtype>     current scaling's first pass, activation.cu's row-vector layout
//       (threads (tx, ty) over (column vectors, rows), blocks walking rows): out = RN_dtype(v) and
//       amax = max |v| (NaNs skipped; atomicMax on the bits of a zeroed (1,) fp32, exact); backward optionally
//       writes per-block column sums of the rounded values (their bias grad) to partial[blockIdx.y, :].
//
// The bias-grad sums are fp32 additions in this kernel's order, not torch's: they match the reference within
// fp32 summation error (tests/fastpath/test_activation_quantize_differential.py says how).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

#include "ieee_f32.cuh"
#include "elements16.cuh"
#include "fp8_elements.cuh"
#include "fp8_tile128.cuh"
#include "fp8_amax.cuh"
#include "vector_io.cuh"
#include "activation_functions.cuh"
#include "column_partials.cuh"

// v for a vector of N values of a unary activation A (no parameters); g (dy) is read only backward.
template <class A, bool BWD, int N>
__device__ __forceinline__ void unary_values(const float (&g)[N], const float (&a)[N], float (&v)[N]) {
  const Params p = {0.0f, 0.0f, 0.0f, 0.0f};
  float b[N], unused[N];
#pragma unroll
  for (int k = 0; k < N; ++k) b[k] = 0.0f;
  if (BWD)
    act_backward<A, false, N>(g, a, b, p, v, unused);
  else
    act_forward<A, false, N>(a, b, p, v);
}

// Q_F(RN(v[0..3] * s)) packed little-endian (the format is uniform over the launch: no divergence).
__device__ __forceinline__ u32 cast4(const float* v, float s, int e5m2) {
  const float a = f32_mul(v[0], s), b = f32_mul(v[1], s), c = f32_mul(v[2], s), d = f32_mul(v[3], s);
  return e5m2 ? cast_fp8x4<true>(a, b, c, d) : cast_fp8x4<false>(a, b, c, d);
}

// ------------------------------------------------------------ delayed scaling: act + amax + cast(-transpose)
// sums: backward only, the tile's column sums per row group (32 x 128, padded), then added in row-group order.
template <class A, typename T, bool BWD>
__device__ __forceinline__ void act_cast_transpose_impl(const T* __restrict__ dy, const T* __restrict__ x, int M,
                                                        int K, int vec_in, int vec_row, int vec_col,
                                                        const float* __restrict__ scale_p, int e5m2,
                                                        u8* __restrict__ row_out, u8* __restrict__ col_out,
                                                        float* __restrict__ scale_inv, float* accumulator,
                                                        float* __restrict__ partial, u32 (*tile)[33],
                                                        float (*sums)[TILE + 1]) {
  constexpr int W = 2 * sizeof(T);
  const int n_tk = (K + TILE - 1) / TILE;
  const int t = threadIdx.x, cg = t & 15, rg = t >> 4;
  const float s = *scale_p;
  if (blockIdx.x == 0 && t == 0) *scale_inv = reciprocal_rn(s);
  const int tm = (int)blockIdx.x / n_tk, tk = (int)blockIdx.x - tm * n_tk;
  const int m0 = tm * TILE, k0 = tk * TILE;
  u32 raw[4][W], graw[4][W];
  load_tile(x, M, K, m0, k0, vec_in, raw);
  if (BWD) load_tile(dy, M, K, m0, k0, vec_in, graw);

  float m = 0.0f, col_sum[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) col_sum[j] = 0.0f;
  u32 rw[4][2];  // rw[i][h]: byte c = q of row 4 * rg + i, column 8 * cg + 4 * h + c of the tile
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float a[8], g[8], v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      a[j] = word_elem<T>(raw[i], j);
      g[j] = BWD ? word_elem<T>(graw[i], j) : 0.0f;
    }
    unary_values<A, BWD, 8>(g, a, v);
    const bool row_in = m0 + 4 * rg + i < M;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (row_in && k0 + 8 * cg + j < K) {
        m = f32_max(m, f32_abs(v[j]));
        if (BWD) col_sum[j] = f32_add(col_sum[j], v[j]);
      }
    }
    rw[i][0] = cast4(v, s, e5m2);
    rw[i][1] = cast4(v + 4, s, e5m2);
  }
  if (row_out != nullptr) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      store_row_words(row_out, M, K, m0 + 4 * rg + i, k0 + 8 * cg, vec_row, rw[i][0], rw[i][1]);
  }
  if (col_out != nullptr) {  // every thread of the block takes this branch (a barrier inside)
    u32 col_words[8];
    transpose4x4(rw[0][0], rw[1][0], rw[2][0], rw[3][0], col_words);
    transpose4x4(rw[0][1], rw[1][1], rw[2][1], rw[3][1], col_words + 4);
    store_col_words(tile, col_words, cg, rg, col_out, M, K, m0, k0, vec_col);
  }
  if (BWD && partial != nullptr) {
#pragma unroll
    for (int j = 0; j < 8; ++j) sums[rg][8 * cg + j] = col_sum[j];
    __syncthreads();
    if (t < TILE) {
      float total = 0.0f;
      for (int r = 0; r < TILE_THREADS / 16; ++r) total = f32_add(total, sums[r][t]);
      if (k0 + t < K) partial[(i64)tm * K + k0 + t] = total;
    }
  }
  if (accumulator != nullptr) {
    m = block_max_linear(m);
    if (t == 0) atomic_fmax_accumulate(accumulator, m);
  }
}

// ------------------------------------------------------------ current scaling: act + amax (+ dbias)
template <class A, class Tr, int V, bool BWD>
__device__ __forceinline__ void act_amax_body(const typename Tr::raw* __restrict__ dy,
                                              const typename Tr::raw* __restrict__ x,
                                              typename Tr::raw* __restrict__ out,
                                              float* amax, float* __restrict__ partial, i64 rows, i64 n) {
  typedef Io<Tr, V> io;
  const i64 col = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  const i64 step = (i64)gridDim.y * blockDim.y;
  float m = 0.0f, acc[V], unused[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = unused[k] = 0.0f;
  if (col < n) {
    for (i64 r = (i64)blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += step) {
      const i64 off = r * n + col;
      float a[V], g[V], v[V];
      io::unpack(io::load(x + off), a);
      if (BWD) io::unpack(io::load(dy + off), g);
      unary_values<A, BWD, V>(g, a, v);
#pragma unroll
      for (int k = 0; k < V; ++k) m = f32_max(m, f32_abs(v[k]));
      io::store(out + off, round_trip<Tr, V>(v));  // v now holds the rounded values
      if (partial != nullptr) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = f32_add(acc[k], v[k]);
      }
    }
  }
  m = block_max_linear(m);  // before write_column_partials, which returns early in most threads
  if (threadIdx.x == 0 && threadIdx.y == 0) atomic_max_nonneg(amax, m);
  if (partial != nullptr) write_column_partials<V, false>(acc, unused, partial, col, n);
}

// ------------------------------------------------------------- entry points
// act_cast_t_fwd_<act>_<dtype>(x, M, K, vec_in, vec_row, vec_col, scale, e5m2, row|0, col|0, scale_inv, acc|0)
// act_cast_t_bwd_<act>_<dtype>(dy, x, M, K, vec_in, vec_row, vec_col, scale, e5m2, row|0, col|0, scale_inv,
//                              acc|0, partial|0): one 512-thread block per 128x128 tile.
// act_amax_fwd_<act>_<dtype>(x, y, amax, rows, n, vec)
// act_amax_bwd_<act>_<dtype>(dy, x, dx, amax, partial|0, rows, n, vec): 256-thread (tx, ty) blocks; with
//     partial, dynamic shared memory of blockDim.x * blockDim.y * V floats when blockDim.y > 1.
#define DEFINE_FUSED_T(NAME, ACT, SUFFIX, T, TR, V)                                                               \
  extern "C" __global__ void __launch_bounds__(TILE_THREADS)                                                     \
      act_cast_t_fwd_##NAME##_##SUFFIX(const T* __restrict__ x, int M, int K, int vec_in, int vec_row,            \
                                       int vec_col, const float* __restrict__ scale, int e5m2, u8* row_out,       \
                                       u8* col_out, float* scale_inv, float* accumulator) {                       \
    __shared__ u32 tile[TILE][33];                                                                               \
    act_cast_transpose_impl<ACT, T, false>(nullptr, x, M, K, vec_in, vec_row, vec_col, scale, e5m2, row_out,     \
                                           col_out, scale_inv, accumulator, nullptr, tile, nullptr);             \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(TILE_THREADS)                                                     \
      act_cast_t_bwd_##NAME##_##SUFFIX(const T* __restrict__ dy, const T* __restrict__ x, int M, int K,           \
                                       int vec_in, int vec_row, int vec_col, const float* __restrict__ scale,     \
                                       int e5m2, u8* row_out, u8* col_out, float* scale_inv, float* accumulator,  \
                                       float* partial) {                                                          \
    __shared__ u32 tile[TILE][33];                                                                               \
    __shared__ float sums[TILE_THREADS / 16][TILE + 1];                                                          \
    act_cast_transpose_impl<ACT, T, true>(dy, x, M, K, vec_in, vec_row, vec_col, scale, e5m2, row_out, col_out,  \
                                          scale_inv, accumulator, partial, tile, sums);                          \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      act_amax_fwd_##NAME##_##SUFFIX(const TR::raw* __restrict__ x, TR::raw* __restrict__ y, float* amax,         \
                                     i64 rows, i64 n, int vec) {                                                  \
    if (vec)                                                                                                     \
      act_amax_body<ACT, TR, V, false>(nullptr, x, y, amax, nullptr, rows, n);                                   \
    else                                                                                                         \
      act_amax_body<ACT, TR, 1, false>(nullptr, x, y, amax, nullptr, rows, n);                                   \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      act_amax_bwd_##NAME##_##SUFFIX(const TR::raw* __restrict__ dy, const TR::raw* __restrict__ x,               \
                                     TR::raw* __restrict__ dx, float* amax, float* partial, i64 rows, i64 n,      \
                                     int vec) {                                                                   \
    if (vec)                                                                                                     \
      act_amax_body<ACT, TR, V, true>(dy, x, dx, amax, partial, rows, n);                                        \
    else                                                                                                         \
      act_amax_body<ACT, TR, 1, true>(dy, x, dx, amax, partial, rows, n);                                        \
  }

#define DEFINE_FUSED(NAME, ACT)                             \
  DEFINE_FUSED_T(NAME, ACT, f32, float, F32, 4)             \
  DEFINE_FUSED_T(NAME, ACT, f16, __half, F16, 8)            \
  DEFINE_FUSED_T(NAME, ACT, bf16, __nv_bfloat16, BF16, 8)

// As activation.cu: the whole file defines every kernel (the CI compile check); the launcher prepends
// `#define FUSED_GROUP k` (fastpath/activation_quantize.py, FUSED_GROUPS) to compile one activation's kernels.
#ifndef FUSED_GROUP
#define FUSED_GROUP 0
#endif
#define FUSED_ENABLED(k) (FUSED_GROUP == 0 || FUSED_GROUP == (k))

#if FUSED_ENABLED(1)
DEFINE_FUSED(identity, Identity)
#endif
#if FUSED_ENABLED(2)
DEFINE_FUSED(gelu, Gelu)
#endif
#if FUSED_ENABLED(3)
DEFINE_FUSED(qgelu, QGelu)
#endif
#if FUSED_ENABLED(4)
DEFINE_FUSED(relu, Relu)
#endif
#if FUSED_ENABLED(5)
DEFINE_FUSED(srelu, SRelu)
#endif
#if FUSED_ENABLED(6)
DEFINE_FUSED(silu, Silu)
#endif
#if FUSED_ENABLED(7)
DEFINE_FUSED(sigmoid, Sigmoid)
#endif
