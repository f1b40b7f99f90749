// LayerNorm, RMSNorm and L2 normalization, forward and backward.
//
// Specification: refops/kernels/reference/norms.py. Statistics are fp32 per row;
// they are reductions in a different order than torch's, so results match the
// reference within tolerance (not bit for bit). Every element-wise step keeps
// the reference's formula and rounds once to the storage dtype.
//
// Layout: a row is shared by the blockDim.x threads (TPR, a power of two >= 32) of
// one threadIdx.y; a block holds blockDim.y rows and walks row groups with a
// grid-stride loop. Each thread keeps its part of the row in registers: up to VPT
// V-element packs at columns (k * TPR + threadIdx.x) * V, k < VPT, so the row is
// read from memory once. Backward kernels also accumulate the weight (and bias)
// gradients of their rows in registers and write one partial row per row slot
// (blockIdx.x * blockDim.y + threadIdx.y); wgrad_finalize sums the partial rows.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef long long i64;

// ------------------------------------------------------------ storage types
struct F32 {
  typedef float raw;
  static __device__ __forceinline__ float load(raw v) { return v; }
  static __device__ __forceinline__ raw store(float v) { return v; }
};
struct F16 {
  typedef unsigned short raw;
  static __device__ __forceinline__ float load(raw v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ raw store(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
struct BF16 {
  typedef unsigned short raw;
  static __device__ __forceinline__ float load(raw v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  static __device__ __forceinline__ raw store(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

template <typename R, int N>
struct alignas(sizeof(R) * N) Pack {
  R v[N];
};

template <int N, typename R>
__device__ __forceinline__ Pack<R, N> load_pack(const R* p) {
  return *reinterpret_cast<const Pack<R, N>*>(p);
}

template <int N, typename R>
__device__ __forceinline__ void store_pack(R* p, const Pack<R, N>& v) {
  *reinterpret_cast<Pack<R, N>*>(p) = v;
}

enum Kind { LAYER = 0, RMS = 1, L2 = 2 };

// Sum of v over the blockDim.x threads sharing a row. Every thread of the block
// calls it the same number of times (the row loops are uniform per block).
__device__ __forceinline__ float row_sum(float v) {
  __shared__ float partial[32];  // [threadIdx.y][warp of the row], at most 32 warps per block
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (blockDim.x == 32) return v;
  const int warps = blockDim.x / 32;
  __syncthreads();  // the previous call's readers are done with `partial`
  if ((threadIdx.x & 31) == 0) partial[threadIdx.y * warps + threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < warps; ++w) s += partial[threadIdx.y * warps + w];
  return s;
}

// gamma = weight, or 1 + weight when zero-centered (the reference's weight32 + 1.0).
template <class Tr>
__device__ __forceinline__ float gamma_of(typename Tr::raw w, bool zero_centered) {
  const float g = Tr::load(w);
  return zero_centered ? g + 1.0f : g;
}

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
  typedef typename Tr::raw R;
  const float inv_n = 1.0f / (float)n;
  for (i64 base = (i64)blockIdx.x * blockDim.y; base < rows; base += (i64)gridDim.x * blockDim.y) {
    const i64 r = base + threadIdx.y;
    const bool row_ok = r < rows;
    Pack<R, V> xv[VPT];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const i64 c = ((i64)k * blockDim.x + threadIdx.x) * V;
      if (row_ok && c < n) {
        xv[k] = load_pack<V>(x + r * n + c);
#pragma unroll
        for (int j = 0; j < V; ++j) sum += Tr::load(xv[k].v[j]);
      }
    }
    float mean = 0.0f;
    if (KIND == LAYER) mean = row_sum(sum) * inv_n;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const i64 c = ((i64)k * blockDim.x + threadIdx.x) * V;
      if (row_ok && c < n) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = KIND == LAYER ? Tr::load(xv[k].v[j]) - mean : Tr::load(xv[k].v[j]);
          sq += d * d;
        }
      }
    }
    sq = row_sum(sq);
    const float rstd = rsqrtf((KIND == L2 ? sq : sq * inv_n) + eps);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const i64 c = ((i64)k * blockDim.x + threadIdx.x) * V;
      if (row_ok && c < n) {
        Pack<R, V> wv, bv, out;
        if (KIND != L2) wv = load_pack<V>(weight + c);
        if (KIND == LAYER) bv = load_pack<V>(bias + c);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float xj = Tr::load(xv[k].v[j]);
          float v;
          if (KIND == LAYER) {
            v = ((xj - mean) * rstd) * gamma_of<Tr>(wv.v[j], zero_centered) + Tr::load(bv.v[j]);
          } else if (KIND == RMS) {
            v = (xj * rstd) * gamma_of<Tr>(wv.v[j], zero_centered);
          } else {
            v = xj * rstd;
          }
          out.v[j] = Tr::store(v);
        }
        store_pack<V>(y + r * n + c, out);
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
// L2:    dx = r * (dy - x * sum(x * dy) / (sum(x^2) + eps)), r the saved rsqrt norm
template <int KIND, class Tr, int V, int VPT>
__device__ __forceinline__ void backward_body(const typename Tr::raw* __restrict__ dy,
                                              const typename Tr::raw* __restrict__ x,
                                              const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                                              const typename Tr::raw* __restrict__ weight,
                                              typename Tr::raw* __restrict__ dx, float* __restrict__ partial_w,
                                              float* __restrict__ partial_b, i64 rows, i64 n, float eps,
                                              bool zero_centered) {
  typedef typename Tr::raw R;
  const float inv_n = 1.0f / (float)n;
  float acc_w[VPT][V], acc_b[VPT][V];
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) acc_w[k][j] = acc_b[k][j] = 0.0f;

  for (i64 base = (i64)blockIdx.x * blockDim.y; base < rows; base += (i64)gridDim.x * blockDim.y) {
    const i64 r = base + threadIdx.y;
    const bool row_ok = r < rows;
    const float mean = (KIND == LAYER && row_ok) ? mean_in[r] : 0.0f;
    const float rstd = row_ok ? rstd_in[r] : 0.0f;
    // The second pass reads x and dy again (cache hits): registers hold the
    // weight-gradient accumulators instead.
    float s1 = 0.0f, s2 = 0.0f;  // LAYER/RMS: sum(g), sum(g * xhat); L2: sum(x^2), sum(x * dy)
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const i64 c = ((i64)k * blockDim.x + threadIdx.x) * V;
      if (row_ok && c < n) {
        const Pack<R, V> xv = load_pack<V>(x + r * n + c);
        const Pack<R, V> gv = load_pack<V>(dy + r * n + c);
        Pack<R, V> wv;
        if (KIND != L2) wv = load_pack<V>(weight + c);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float xj = Tr::load(xv.v[j]);
          const float dyj = Tr::load(gv.v[j]);
          if (KIND == L2) {
            s1 += xj * xj;
            s2 += xj * dyj;
          } else {
            const float xhat = KIND == LAYER ? (xj - mean) * rstd : xj * rstd;
            const float g = dyj * gamma_of<Tr>(wv.v[j], zero_centered);
            s1 += g;
            s2 += g * xhat;
            acc_w[k][j] += dyj * xhat;
            acc_b[k][j] += dyj;
          }
        }
      }
    }
    if (KIND != RMS) s1 = row_sum(s1);
    s2 = row_sum(s2);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const i64 c = ((i64)k * blockDim.x + threadIdx.x) * V;
      if (row_ok && c < n) {
        const Pack<R, V> xv = load_pack<V>(x + r * n + c);
        const Pack<R, V> gv = load_pack<V>(dy + r * n + c);
        Pack<R, V> wv, out;
        if (KIND != L2) wv = load_pack<V>(weight + c);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float xj = Tr::load(xv.v[j]);
          const float dyj = Tr::load(gv.v[j]);
          float v;
          if (KIND == L2) {
            v = rstd * (dyj - (xj * s2) / (s1 + eps));
          } else {
            const float xhat = KIND == LAYER ? (xj - mean) * rstd : xj * rstd;
            const float g = dyj * gamma_of<Tr>(wv.v[j], zero_centered);
            const float centered = KIND == LAYER ? g - s1 * inv_n : g;
            v = rstd * (centered - xhat * (s2 * inv_n));
          }
          out.v[j] = Tr::store(v);
        }
        store_pack<V>(dx + r * n + c, out);
      }
    }
  }
  if (KIND == L2) return;
  const i64 slot = (i64)blockIdx.x * blockDim.y + threadIdx.y;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const i64 c = ((i64)k * blockDim.x + threadIdx.x) * V;
    if (c < n) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        partial_w[slot * n + c + j] = acc_w[k][j];
        if (KIND == LAYER) partial_b[slot * n + c + j] = acc_b[k][j];
      }
    }
  }
}

// out_a[c] = sum_j partial_a[j, c] (and the same for b when given), fp32, rounded once.
template <class Tr>
__device__ __forceinline__ void finalize_body(const float* __restrict__ partial_a,
                                              const float* __restrict__ partial_b, i64 parts, i64 n,
                                              typename Tr::raw* __restrict__ out_a,
                                              typename Tr::raw* __restrict__ out_b) {
  const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float sa = 0.0f, sb = 0.0f;
  for (i64 j = 0; j < parts; ++j) {
    sa += partial_a[j * n + c];
    if (partial_b != nullptr) sb += partial_b[j * n + c];
  }
  out_a[c] = Tr::store(sa);
  if (partial_b != nullptr) out_b[c] = Tr::store(sb);
}

// ------------------------------------------------------------- entry points
// Blocks have at most 512 threads. `vec`: 16-byte packs (n % V == 0, 16-byte aligned
// pointers, n <= 512 * 4 * V); otherwise single elements (n <= 512 * 8).

#define VEC_PPT 4
#define SCALAR_PPT 8

#define DEFINE_NORMS(SUFFIX, TR, V)                                                                                 \
  extern "C" __global__ void __launch_bounds__(512)                                                               \
      layer_norm_fwd_##SUFFIX(const TR::raw* x, const TR::raw* w, const TR::raw* b, TR::raw* y, float* mean,       \
                              float* rstd, i64 rows, i64 n, float eps, int zero_centered, int vec) {               \
    if (vec)                                                                                                       \
      forward_body<LAYER, TR, V, VEC_PPT>(x, w, b, y, mean, rstd, rows, n, eps, zero_centered != 0);               \
    else                                                                                                           \
      forward_body<LAYER, TR, 1, SCALAR_PPT>(x, w, b, y, mean, rstd, rows, n, eps, zero_centered != 0);            \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(512)                                                               \
      rms_norm_fwd_##SUFFIX(const TR::raw* x, const TR::raw* w, TR::raw* y, float* rstd, i64 rows, i64 n,          \
                            float eps, int zero_centered, int vec) {                                               \
    if (vec)                                                                                                       \
      forward_body<RMS, TR, V, VEC_PPT>(x, w, nullptr, y, nullptr, rstd, rows, n, eps, zero_centered != 0);        \
    else                                                                                                           \
      forward_body<RMS, TR, 1, SCALAR_PPT>(x, w, nullptr, y, nullptr, rstd, rows, n, eps, zero_centered != 0);     \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(512)                                                               \
      l2_norm_fwd_##SUFFIX(const TR::raw* x, TR::raw* y, float* rnorm, i64 rows, i64 n, float eps, int vec) {      \
    if (vec)                                                                                                       \
      forward_body<L2, TR, V, VEC_PPT>(x, nullptr, nullptr, y, nullptr, rnorm, rows, n, eps, false);               \
    else                                                                                                           \
      forward_body<L2, TR, 1, SCALAR_PPT>(x, nullptr, nullptr, y, nullptr, rnorm, rows, n, eps, false);            \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(512)                                                               \
      layer_norm_bwd_##SUFFIX(const TR::raw* dy, const TR::raw* x, const float* mean, const float* rstd,           \
                              const TR::raw* w, TR::raw* dx, float* partial_w, float* partial_b, i64 rows, i64 n,  \
                              int zero_centered, int vec) {                                                        \
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
  extern "C" __global__ void __launch_bounds__(512)                                                               \
      l2_norm_bwd_##SUFFIX(const TR::raw* dy, const TR::raw* x, const float* rnorm, TR::raw* dx, i64 rows, i64 n,  \
                           float eps, int vec) {                                                                   \
    if (vec)                                                                                                       \
      backward_body<L2, TR, V, VEC_PPT>(dy, x, nullptr, rnorm, nullptr, dx, nullptr, nullptr, rows, n, eps,        \
                                        false);                                                                    \
    else                                                                                                           \
      backward_body<L2, TR, 1, SCALAR_PPT>(dy, x, nullptr, rnorm, nullptr, dx, nullptr, nullptr, rows, n, eps,     \
                                           false);                                                                 \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(256)                                                                \
      wgrad_finalize_##SUFFIX(const float* partial_a, const float* partial_b, i64 parts, i64 n, TR::raw* out_a,    \
                              TR::raw* out_b) {                                                                    \
    finalize_body<TR>(partial_a, partial_b, parts, n, out_a, out_b);                                               \
  }

DEFINE_NORMS(f32, F32, 4)
DEFINE_NORMS(f16, F16, 8)
DEFINE_NORMS(bf16, BF16, 8)
