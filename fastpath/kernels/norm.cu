// LayerNorm, RMSNorm and L2 normalization, forward and backward.
//
// Specification: refops/kernels/reference/norms.py. Statistics are fp32 per row;
// they are reductions in a different order than torch's (products summed with
// FMAs), so results match the reference within tolerance (not bit for bit). Every
// element-wise output keeps the reference's formula and rounds once to the storage
// dtype, except that L2 normalization's backward divides once per row, not per element.
//
// Layout: a row is shared by the blockDim.x threads (TPR, a power of two >= 32) of
// one threadIdx.y; a block holds blockDim.y rows and walks row groups with a
// grid-stride loop. Each thread keeps its part of the row in registers: up to VPT
// V-element packs at columns (k * TPR + threadIdx.x) * V, k < VPT (32-bit column
// math, the same columns in every row), so the row is read from memory once: all of
// a row's loads are issued, in a loop of their own, before the first use of any of
// them (the weight and bias packs, L1 hits, are loaded where used); while it works
// on a row it asks L2 for its part of the block's next row (prefetch.global.L2), so
// the next row's loads hit L2. The forward's vector form also copies that part into
// shared memory (RowStage, cp.async) once it has used the current row's values, and
// loads the next row from there. Backward kernels keep x and dy of the row in
// registers (loaded from L2 as above), accumulate the weight gradient of their rows
// in registers, and write one partial row per row slot (blockIdx.x * blockDim.y +
// threadIdx.y, 16-byte stores); wgrad_finalize sums the partial rows. LayerNorm's
// bias gradient: layer_norm_bwd (blocks of at most 256 threads) keeps it in shared
// memory, each thread only its own slots, and keeps there too each element's g and
// xhat from pass 1 for pass 2 (GPU run 30: 0.251 -> 0.228 ms); layer_norm_bwd_wide
// (512-thread blocks) keeps it in registers too and, lacking registers for x and dy,
// prefetches them into L1 and reads them there in both passes.
// A backward row whose packs are all in range in every thread (rows of TPR * VPT * V
// elements: power-of-two widths from 1024 fp16/bf16 or 512 fp32 elements) runs each
// pass without a branch per pack (NORM_BWD_RUN; zero-centered gamma a compile-time
// choice there too), so the compiler issues the weight loads of all packs at once and
// interleaves the packs' arithmetic; other rows run the general per-pack code.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef long long i64;

#include "vector_io.cuh"
#include "cp_async.cuh"
#include "column_sums.cuh"

// Ask L2 (L1) for the line holding p (a hint: no register, no wait, no effect on results).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

enum Kind { LAYER = 0, RMS = 1, L2 = 2 };

// The forward's vector form stages each thread's packs of the block's next row in shared memory: slot k of
// thread tid is [k * threads + tid] of the dynamic shared memory (VPT 16-byte slots per thread; the launcher
// passes the size). Each thread copies (cp.async) exactly the slots it later reads, so it waits for its own
// copies only, with no barrier; and it refills its slots only after it has used every value it read from them,
// so no copy can overtake a read. (GPU run 23: 4-7 % faster forward kernels; the backward kernels, staging x and
// dy the same way, were not faster, LayerNorm's 4 % slower.)
template <class Raw, int VPT>
struct RowStage {
  Raw* slots;
  int tid, threads;
  __device__ __forceinline__ RowStage() {
    extern __shared__ __align__(16) unsigned char norm_stage_smem[];
    slots = reinterpret_cast<Raw*>(norm_stage_smem);
    tid = threadIdx.y * blockDim.x + threadIdx.x;
    threads = blockDim.x * blockDim.y;
  }
  __device__ __forceinline__ Raw* slot(int k) const { return slots + k * threads + tid; }
  // Start copying this thread's packs of `row` (when ok) into its slots, as one cp.async group.
  template <class R>
  __device__ __forceinline__ void fill(const R* row, const int (&col)[VPT], const bool (&has)[VPT], bool ok) const {
    if (ok) {
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (has[k]) cp_async16(slot(k), row + col[k], 16);
    }
    cp_async_commit();
  }
  __device__ __forceinline__ Raw read(int k) const { return *slot(k); }
};

// 0 + p[0] + p[1] + ... + p[W-1], in that order.
template <int W>
__device__ __forceinline__ float sum_in_order(const float* p) {
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < W; ++w) s += p[w];
  return s;
}

// The same sum over `warps` partials. Rows of more than one warp have 2, 4, 8 or 16 warps: each count gets code
// unrolled at compile time; a loop with a runtime bound serves any other count. With that loop alone, LayerNorm
// backward's row sums took about 200 instructions per warp and row, 18 % of the kernel's, most of them the loop's
// (GPU run 20); unrolled, the kernel ran 3 % faster.
__device__ __forceinline__ float sum_partials(const float* p, int warps) {
  switch (warps) {
    case 2: return sum_in_order<2>(p);
    case 4: return sum_in_order<4>(p);
    case 8: return sum_in_order<8>(p);
    case 16: return sum_in_order<16>(p);
    default: {
      float s = 0.0f;
      for (int w = 0; w < warps; ++w) s += p[w];
      return s;
    }
  }
}

// Sums of v[0..NV) over the blockDim.x threads sharing a row, in every one of them.
// Every thread of the block calls it the same number of times (the row loops are
// uniform per block) with its own `parity`. Calls alternate between two buffers:
// a call writes its buffer only after the previous call's barrier, which every
// thread passes after reading the buffer of the call before, so one barrier a call.
#define MAX_BLOCK_WARPS 16  // blocks of at most 512 threads
template <int NV>
__device__ __forceinline__ void row_sums(float (&v)[NV], int& parity) {
  __shared__ float partial[2][NV][MAX_BLOCK_WARPS];  // [buffer][value][threadIdx.y * warps + warp of the row]
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
  }
  if (blockDim.x == 32) return;
  const int warps = blockDim.x / 32;
  float(*buf)[MAX_BLOCK_WARPS] = partial[parity];
  parity ^= 1;
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int i = 0; i < NV; ++i) buf[i][threadIdx.y * warps + threadIdx.x / 32] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < NV; ++i) v[i] = sum_partials(buf[i] + threadIdx.y * warps, warps);
}

// gamma = weight, or 1 + weight when zero-centered (the reference's weight32 + 1.0).
__device__ __forceinline__ float gamma_of(float w, bool zero_centered) { return zero_centered ? w + 1.0f : w; }

// ------------------------------------------------------------------ forward
// LAYER: y = (x - mean) * rstd * gamma + beta, rstd = rsqrt(mean((x - mean)^2) + eps)
// RMS:   y = x * rstd * gamma,                 rstd = rsqrt(mean(x^2) + eps)
// L2:    y = x * rstd,                         rstd = rsqrt(sum(x^2) + eps)
template <int KIND, class Tr, int V, int VPT>
__device__ __forceinline__ void forward_body(const typename Tr::raw* __restrict__ x,
                                             const typename Tr::raw* __restrict__ weight,
                                             const typename Tr::raw* __restrict__ bias,
                                             typename Tr::raw* __restrict__ y, float* __restrict__ mean_out,
                                             float* __restrict__ rstd_out, i64 rows, i64 n, float eps,
                                             bool zero_centered) {
  typedef Io<Tr, V> io;
  typedef typename io::Raw Raw;
  typedef typename Tr::raw R;
  const float inv_n = 1.0f / (float)n;
  const i64 row_step = (i64)gridDim.x * blockDim.y;
  // This thread's columns, the same in every row (32-bit: n <= 512 * VPT * V).
  int col[VPT];
  bool has[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    col[k] = (k * (int)blockDim.x + (int)threadIdx.x) * V;
    has[k] = col[k] < n;
  }
  constexpr bool STAGED = V > 1;  // the vector form: the next row staged in shared memory (RowStage)
  const RowStage<Raw, VPT> stage;
  if (STAGED) {
    const i64 r0 = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    stage.fill(x + r0 * n, col, has, r0 < rows);
  }
  int parity = 0;
  for (i64 base = (i64)blockIdx.x * blockDim.y; base < rows; base += row_step) {
    const i64 r = base + threadIdx.y;
    const bool row_ok = r < rows;
    const R* xr = x + r * n;
    R* yr = y + r * n;
    // Every load of the row is issued before the first use of any of them (staged: its copies were).
    Raw xv[VPT];
    if (STAGED) cp_async_wait<0>();
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (row_ok && has[k]) xv[k] = STAGED ? stage.read(k) : io::load(xr + col[k]);
    if (r + row_step < rows) {  // into L2 (staged: so that the next row's copies hit L2)
      const R* xn = xr + row_step * n;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (has[k]) prefetch_l2(xn + col[k]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (row_ok && has[k]) {
        float f[V];
        io::unpack(xv[k], f);
#pragma unroll
        for (int j = 0; j < V; ++j) sum += f[j];
      }
    }
    float mean = 0.0f;
    if (KIND == LAYER) {
      float s[1] = {sum};
      row_sums<1>(s, parity);
      mean = s[0] * inv_n;
    }
    float sq[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (row_ok && has[k]) {
        float f[V];
        io::unpack(xv[k], f);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = KIND == LAYER ? f[j] - mean : f[j];
          sq[0] = __fmaf_rn(d, d, sq[0]);
        }
      }
    }
    if (STAGED) stage.fill(xr + row_step * n, col, has, r + row_step < rows);  // every staged value is used
    row_sums<1>(sq, parity);
    const float rstd = rsqrtf((KIND == L2 ? sq[0] : sq[0] * inv_n) + eps);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (row_ok && has[k]) {
        float f[V], w[V], b[V], out[V];
        io::unpack(xv[k], f);
        if (KIND != L2) io::unpack(io::load(weight + col[k]), w);
        if (KIND == LAYER) io::unpack(io::load(bias + col[k]), b);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (KIND == LAYER) {
            out[j] = ((f[j] - mean) * rstd) * gamma_of(w[j], zero_centered) + b[j];
          } else if (KIND == RMS) {
            out[j] = (f[j] * rstd) * gamma_of(w[j], zero_centered);
          } else {
            out[j] = f[j] * rstd;
          }
        }
        io::store(yr + col[k], io::pack(out));
      }
    }
    if (row_ok && threadIdx.x == 0) {
      if (KIND == LAYER) mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// ----------------------------------------------------------------- backward
// LAYER: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, xhat = (x - mean) * rstd;
//        dweight += dy * xhat, dbias += dy (per column, over the block's rows)
// RMS:   dx = rstd * (g - xhat * mean(g * xhat)), xhat = x * rstd; dweight += dy * xhat
// L2:    dx = r * (dy - x * q), q = sum(x * dy) / (sum(x^2) + eps) once per row, r the saved rsqrt norm
// The backward's two passes over a row's packs (in backward_body's scope): PASS1 adds the
// row's sums to s and the gradient accumulators, PASS2 writes dx. FULL (a constant): every
// pack in range, no branch per pack, so the compiler issues the weight loads of all packs
// at once and interleaves their arithmetic; ZC: zero-centered gamma, a constant where
// known. NORM_BWD_RUN picks the form. (Macros: NVRTC takes no generic lambdas.)
#define NORM_BWD_PASS1(FULL, ZC)                                              \
  _Pragma("unroll") for (int k = 0; k < VPT; ++k) {                           \
    if ((FULL) || (row_ok && has[k])) {                                       \
      float xf[V], gf[V], wf[V], ab[V], g_st[V], xhat_st[V];                  \
      io::unpack(reread ? io::load(xrow + col[k]) : xr[k], xf);               \
      io::unpack(reread ? io::load(dyrow + col[k]) : gr[k], gf);              \
      if (KIND != L2) io::unpack(io::load(weight + col[k]), wf);              \
      if (DB_SHARED) DbShared<V>::load(db_sh, k, tid, ab);                    \
      _Pragma("unroll") for (int j = 0; j < V; ++j) {                         \
        if (KIND == L2) {                                                     \
          s[0] = __fmaf_rn(xf[j], xf[j], s[0]);                               \
          s[1] = __fmaf_rn(xf[j], gf[j], s[1]);                               \
        } else {                                                              \
          const float xhat = KIND == LAYER ? (xf[j] - mean) * rstd : xf[j] * rstd; \
          const float g = gf[j] * gamma_of(wf[j], (ZC));                      \
          if (KIND == LAYER) s[0] += g;                                       \
          s[1] = __fmaf_rn(g, xhat, s[1]);                                    \
          acc_w[k][j] = __fmaf_rn(gf[j], xhat, acc_w[k][j]);                  \
          if (db_regs) acc_b[db_regs ? k : 0][j] += gf[j];                    \
          if (DB_SHARED) ab[j] += gf[j];                                      \
          if (DB_SHARED) g_st[j] = g;                                         \
          if (DB_SHARED) xhat_st[j] = xhat;                                   \
        }                                                                     \
      }                                                                       \
      if (DB_SHARED) DbShared<V>::store(db_sh, k, tid, ab);                   \
      if (DB_SHARED) DbShared<V>::store(g_sh, k, tid, g_st);                  \
      if (DB_SHARED) DbShared<V>::store(xhat_sh, k, tid, xhat_st);            \
    }                                                                         \
  }
#define NORM_BWD_PASS2(FULL, ZC)                                              \
  _Pragma("unroll") for (int k = 0; k < VPT; ++k) {                           \
    if ((FULL) || (row_ok && has[k])) {                                       \
      float xf[V], gf[V], wf[V], out[V];                                      \
      if (DB_SHARED) {                                                        \
        DbShared<V>::load(g_sh, k, tid, gf);                                  \
        DbShared<V>::load(xhat_sh, k, tid, xf);                               \
      } else {                                                                \
        io::unpack(reread ? io::reload(xrow + col[k]) : xr[k], xf);           \
        io::unpack(reread ? io::reload(dyrow + col[k]) : gr[k], gf);          \
        if (KIND != L2) io::unpack(io::load(weight + col[k]), wf);            \
      }                                                                       \
      _Pragma("unroll") for (int j = 0; j < V; ++j) {                         \
        if (DB_SHARED) {                                                      \
          out[j] = rstd * ((gf[j] - mean_g) - xf[j] * mean_gx);               \
        } else if (KIND == L2) {                                              \
          out[j] = rstd * (gf[j] - xf[j] * q);                                \
        } else {                                                              \
          const float xhat = KIND == LAYER ? (xf[j] - mean) * rstd : xf[j] * rstd; \
          const float g = gf[j] * gamma_of(wf[j], (ZC));                      \
          const float centered = KIND == LAYER ? g - mean_g : g;              \
          out[j] = rstd * (centered - xhat * mean_gx);                        \
        }                                                                     \
      }                                                                       \
      io::store(dx + r * n + col[k], io::pack(out));                          \
    }                                                                         \
  }
#define NORM_BWD_RUN(PASS)                  \
  if (!full) {                              \
    PASS(false, zero_centered)              \
  } else if (KIND == L2 || !zero_centered) { \
    PASS(true, false)                       \
  } else {                                  \
    PASS(true, true)                        \
  }

// Bias-gradient accumulators in shared memory (LayerNorm backward, blocks of at most
// DB_THREADS threads): thread t's value for pack k, element j lies at group
// (k * V + j) / G, slot t, lane j % G of a [VPT * V / G][DB_THREADS][G] array (G = 4
// for the vector forms: one 16-byte access per 4 values, consecutive threads at
// consecutive 16 bytes). Only thread t ever touches its slots: no barrier needed.
#define DB_THREADS 256
template <int V>
struct DbShared {
  enum { G = V % 4 == 0 ? 4 : 1 };
  static __device__ __forceinline__ void load(const float* base, int k, int t, float (&v)[V]) {
    if (G == 4) {
#pragma unroll
      for (int q = 0; q < V / 4; ++q) {
        const float4 w = *reinterpret_cast<const float4*>(base + ((k * (V / 4) + q) * DB_THREADS + t) * 4);
        v[4 * q] = w.x;
        v[4 * q + 1] = w.y;
        v[4 * q + 2] = w.z;
        v[4 * q + 3] = w.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = base[(k * V + j) * DB_THREADS + t];
    }
  }
  static __device__ __forceinline__ void store(float* base, int k, int t, const float (&v)[V]) {
    if (G == 4) {
#pragma unroll
      for (int q = 0; q < V / 4; ++q)
        *reinterpret_cast<float4*>(base + ((k * (V / 4) + q) * DB_THREADS + t) * 4) =
            make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) base[(k * V + j) * DB_THREADS + t] = v[j];
    }
  }
};

// V floats to p: 16-byte stores when V is a multiple of 4 (p is then 16-byte aligned:
// the partial rows' width n is a multiple of V), else one float at a time. One 4-byte
// store per float to the thread-strided partial rows touched 32 L2 sectors per warp
// store for 4 useful ones (GPU run 29: 8 % of LayerNorm backward's sectors).
template <int V>
__device__ __forceinline__ void store_floats(float* p, const float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int q = 0; q < V / 4; ++q)
      *reinterpret_cast<float4*>(p + 4 * q) = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = v[j];
  }
}

// DB_SHARED (LAYER only): the bias-gradient accumulators live in shared memory
// (db_sh, VPT * V * DB_THREADS floats, 16-byte aligned), followed there by pass 1's g
// and xhat of every pack (as many floats each), which pass 2 reads back instead of
// unpacking x, dy and gamma again; x and dy of the row are loaded into registers for
// pass 1 (blocks of at most DB_THREADS threads). Without it LAYER keeps both
// accumulators in registers and re-reads x and dy from L1.
template <int KIND, class Tr, int V, int VPT, bool DB_SHARED = false>
__device__ __forceinline__ void backward_body(const typename Tr::raw* __restrict__ dy,
                                              const typename Tr::raw* __restrict__ x,
                                              const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                                              const typename Tr::raw* __restrict__ weight,
                                              typename Tr::raw* __restrict__ dx, float* __restrict__ partial_w,
                                              float* __restrict__ partial_b, i64 rows, i64 n, float eps,
                                              bool zero_centered, float* db_sh = nullptr) {
  // DB_SHARED: pass 1's g and xhat of each pack, read back by pass 2 (the same fp32 values it would recompute).
  float* const g_sh = DB_SHARED ? db_sh + VPT * V * DB_THREADS : nullptr;
  float* const xhat_sh = DB_SHARED ? g_sh + VPT * V * DB_THREADS : nullptr;
  typedef Io<Tr, V> io;
  typedef typename io::Raw Raw;
  typedef typename Tr::raw R;
  // LAYER without DB_SHARED: x and dy are re-read (L1) instead of kept in registers.
  constexpr bool reread = KIND == LAYER && !DB_SHARED;
  constexpr bool db_regs = KIND == LAYER && !DB_SHARED;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  if (DB_SHARED && blockDim.x * blockDim.y > DB_THREADS) __trap();  // the launcher never does this
  const float inv_n = 1.0f / (float)n;
  const i64 row_step = (i64)gridDim.x * blockDim.y;
  // This thread's columns, the same in every row (32-bit: n <= 512 * VPT * V).
  int col[VPT];
  bool has[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    col[k] = (k * (int)blockDim.x + (int)threadIdx.x) * V;
    has[k] = col[k] < n;
  }
  float acc_w[VPT][V], acc_b[db_regs ? VPT : 1][V];
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      acc_w[k][j] = 0.0f;
      if (db_regs) acc_b[db_regs ? k : 0][j] = 0.0f;
    }
  if (DB_SHARED) {
    const float zero[V] = {};
#pragma unroll
    for (int k = 0; k < VPT; ++k) DbShared<V>::store(db_sh, k, tid, zero);
  }

  int parity = 0;
  for (i64 base = (i64)blockIdx.x * blockDim.y; base < rows; base += row_step) {
    const i64 r = base + threadIdx.y;
    const bool row_ok = r < rows;
    const bool next_ok = r + row_step < rows;
    const float mean = (KIND == LAYER && row_ok) ? mean_in[r] : 0.0f;
    const float rstd = row_ok ? rstd_in[r] : 0.0f;
    const R* xrow = x + r * n;
    const R* dyrow = dy + r * n;
    // All of the row's x and dy is requested before its first use: loaded into
    // registers, packed, and kept there for the second pass; or (LAYER without
    // DB_SHARED, whose bias-gradient accumulators take those registers) prefetched
    // into L1 and loaded where used, in both passes (L1 hits).
    Raw xr[VPT], gr[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (row_ok && has[k]) {
        if (reread) {
          prefetch_l1(xrow + col[k]);
          prefetch_l1(dyrow + col[k]);
        } else {
          xr[k] = io::load(xrow + col[k]);
          gr[k] = io::load(dyrow + col[k]);
        }
      }
    }
    if (next_ok) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (has[k]) {
          prefetch_l2(xrow + row_step * n + col[k]);
          prefetch_l2(dyrow + row_step * n + col[k]);
        }
      }
    }
    // Every pack of the row in range for every thread of the row (the last thread's last
    // pack is): the packs' code without branches (NORM_BWD_RUN). Uniform per warp (a warp
    // is one row), so no warp runs both forms. Not for `reread` (layer_norm_bwd_wide),
    // which has no registers to spare for it.
    const bool full = !reread && row_ok && (VPT * (int)blockDim.x - 1) * V < n;
    float s[2] = {0.0f, 0.0f};  // LAYER/RMS: sum(g), sum(g * xhat); L2: sum(x^2), sum(x * dy)
    NORM_BWD_RUN(NORM_BWD_PASS1)
    if (KIND == RMS) {
      float s1[1] = {s[1]};
      row_sums<1>(s1, parity);
      s[1] = s1[0];
    } else {
      row_sums<2>(s, parity);
    }
    const float mean_g = s[0] * inv_n, mean_gx = s[1] * inv_n;
    const float q = KIND == L2 ? s[1] / (s[0] + eps) : 0.0f;
    NORM_BWD_RUN(NORM_BWD_PASS2)
  }
  if (KIND == L2) return;
  const i64 slot = (i64)blockIdx.x * blockDim.y + threadIdx.y;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (has[k]) {
      float ab[V];
      if (DB_SHARED) DbShared<V>::load(db_sh, k, tid, ab);
      store_floats(partial_w + slot * n + col[k], acc_w[k]);
      if (db_regs) store_floats(partial_b + slot * n + col[k], acc_b[db_regs ? k : 0]);
      if (DB_SHARED) store_floats(partial_b + slot * n + col[k], ab);
    }
  }
}

// ------------------------------------------------------------- entry points
// Blocks have at most 512 threads (MAX_BLOCK_WARPS warps) and at most 64 registers a
// thread, so that two such blocks, or four of 256 threads, fit on an SM. `vec`:
// 16-byte packs (n % V == 0, 16-byte aligned pointers, n <= 512 * 4 * V); otherwise
// single elements (n <= 512 * 8). Backward kernels keep their gradient accumulators
// in registers and are bounded by 512 threads only, except layer_norm_bwd: at most
// DB_THREADS (256) threads, whose bias-gradient sums, g and xhat it keeps in dynamic
// shared memory (3 * DB_FLOATS(V) * DB_THREADS floats: 96 KiB for fp16/bf16, 48 KiB
// for fp32, which the launcher opts in to); the launcher sends 512-thread blocks to
// layer_norm_bwd_wide.

#define VEC_PPT 4
#define SCALAR_PPT 8
// Floats of each of the bias gradient, g and xhat that a thread keeps in shared memory
// (layer_norm_bwd): the larger of the two forms.
#define DB_FLOATS(V) ((VEC_PPT * (V)) > SCALAR_PPT ? (VEC_PPT * (V)) : SCALAR_PPT)

#define DEFINE_NORMS(SUFFIX, TR, V)                                                                                 \
  extern "C" __global__ void __launch_bounds__(512, 2)                                                            \
      layer_norm_fwd_##SUFFIX(const TR::raw* x, const TR::raw* w, const TR::raw* b, TR::raw* y, float* mean,       \
                              float* rstd, i64 rows, i64 n, float eps, int zero_centered, int vec) {               \
    if (vec)                                                                                                       \
      forward_body<LAYER, TR, V, VEC_PPT>(x, w, b, y, mean, rstd, rows, n, eps, zero_centered != 0);               \
    else                                                                                                           \
      forward_body<LAYER, TR, 1, SCALAR_PPT>(x, w, b, y, mean, rstd, rows, n, eps, zero_centered != 0);            \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(512, 2)                                                            \
      rms_norm_fwd_##SUFFIX(const TR::raw* x, const TR::raw* w, TR::raw* y, float* rstd, i64 rows, i64 n,          \
                            float eps, int zero_centered, int vec) {                                               \
    if (vec)                                                                                                       \
      forward_body<RMS, TR, V, VEC_PPT>(x, w, nullptr, y, nullptr, rstd, rows, n, eps, zero_centered != 0);        \
    else                                                                                                           \
      forward_body<RMS, TR, 1, SCALAR_PPT>(x, w, nullptr, y, nullptr, rstd, rows, n, eps, zero_centered != 0);     \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(512, 2)                                                            \
      l2_norm_fwd_##SUFFIX(const TR::raw* x, TR::raw* y, float* rnorm, i64 rows, i64 n, float eps, int vec) {      \
    if (vec)                                                                                                       \
      forward_body<L2, TR, V, VEC_PPT>(x, nullptr, nullptr, y, nullptr, rnorm, rows, n, eps, false);               \
    else                                                                                                           \
      forward_body<L2, TR, 1, SCALAR_PPT>(x, nullptr, nullptr, y, nullptr, rnorm, rows, n, eps, false);            \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(DB_THREADS, 2)                                                      \
      layer_norm_bwd_##SUFFIX(const TR::raw* dy, const TR::raw* x, const float* mean, const float* rstd,           \
                              const TR::raw* w, TR::raw* dx, float* partial_w, float* partial_b, i64 rows, i64 n,  \
                              int zero_centered, int vec) {                                                        \
    extern __shared__ __align__(16) float db_sh[]; /* 3 x DB_FLOATS(V) * DB_THREADS: launcher's shared_mem */      \
    if (vec)                                                                                                       \
      backward_body<LAYER, TR, V, VEC_PPT, true>(dy, x, mean, rstd, w, dx, partial_w, partial_b, rows, n, 0.0f,    \
                                                 zero_centered != 0, db_sh);                                       \
    else                                                                                                           \
      backward_body<LAYER, TR, 1, SCALAR_PPT, true>(dy, x, mean, rstd, w, dx, partial_w, partial_b, rows, n, 0.0f, \
                                                    zero_centered != 0, db_sh);                                    \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(512)                                                                \
      layer_norm_bwd_wide_##SUFFIX(const TR::raw* dy, const TR::raw* x, const float* mean, const float* rstd,      \
                                   const TR::raw* w, TR::raw* dx, float* partial_w, float* partial_b, i64 rows,    \
                                   i64 n, int zero_centered, int vec) {                                            \
    if (vec)                                                                                                       \
      backward_body<LAYER, TR, V, VEC_PPT>(dy, x, mean, rstd, w, dx, partial_w, partial_b, rows, n, 0.0f,          \
                                           zero_centered != 0);                                                    \
    else                                                                                                           \
      backward_body<LAYER, TR, 1, SCALAR_PPT>(dy, x, mean, rstd, w, dx, partial_w, partial_b, rows, n, 0.0f,       \
                                              zero_centered != 0);                                                 \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(512)                                                               \
      rms_norm_bwd_##SUFFIX(const TR::raw* dy, const TR::raw* x, const float* rstd, const TR::raw* w, TR::raw* dx, \
                            float* partial_w, i64 rows, i64 n, int zero_centered, int vec) {                       \
    if (vec)                                                                                                       \
      backward_body<RMS, TR, V, VEC_PPT>(dy, x, nullptr, rstd, w, dx, partial_w, nullptr, rows, n, 0.0f,           \
                                         zero_centered != 0);                                                      \
    else                                                                                                           \
      backward_body<RMS, TR, 1, SCALAR_PPT>(dy, x, nullptr, rstd, w, dx, partial_w, nullptr, rows, n, 0.0f,        \
                                            zero_centered != 0);                                                   \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(512, 2)                                                            \
      l2_norm_bwd_##SUFFIX(const TR::raw* dy, const TR::raw* x, const float* rnorm, TR::raw* dx, i64 rows, i64 n,  \
                           float eps, int vec) {                                                                   \
    if (vec)                                                                                                       \
      backward_body<L2, TR, V, VEC_PPT>(dy, x, nullptr, rnorm, nullptr, dx, nullptr, nullptr, rows, n, eps,        \
                                        false);                                                                    \
    else                                                                                                           \
      backward_body<L2, TR, 1, SCALAR_PPT>(dy, x, nullptr, rnorm, nullptr, dx, nullptr, nullptr, rows, n, eps,     \
                                           false);                                                                 \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(32 * COLUMN_SUM_STRIPES)                                           \
      wgrad_finalize_##SUFFIX(const float* partial_a, const float* partial_b, i64 parts, i64 n, TR::raw* out_a,    \
                              TR::raw* out_b, int vc) {                                                            \
    if (partial_b != nullptr) {                                                                                    \
      const float* const partial[2] = {partial_a, partial_b};                                                      \
      TR::raw* const out[2] = {out_a, out_b};                                                                      \
      column_sums<TR, 2>(partial, parts, n, out, vc);                                                              \
    } else {                                                                                                       \
      const float* const partial[1] = {partial_a};                                                                 \
      TR::raw* const out[1] = {out_a};                                                                             \
      column_sums<TR, 1>(partial, parts, n, out, vc);                                                              \
    }                                                                                                              \
  }

DEFINE_NORMS(f32, F32, 4)
DEFINE_NORMS(f16, F16, 8)
DEFINE_NORMS(bf16, BF16, 8)
