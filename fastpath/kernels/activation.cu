// Activations, bias + activation, activation backward (+ dbias), dbias.
//
// Specification: refops/kernels/reference/activations.py and backend.py, run by
// torch on CUDA one op at a time in fp32. Each torch op is one separately rounded
// fp32 operation here: mul/add/sub are written as __fmul_rn / __fadd_rn /
// __fsub_rn, which are never fused into an FMA, so the sequence is the
// reference's whatever the compiler's FMA setting. The op that is not a single
// rounding, torch's sigmoid kernel (1 / (1 + exp(-x))), is written exactly as
// torch's source and, like torch's kernels, compiled with FMA contraction on
// (nvcc's default, --fmad=true): the compiler then fuses the last multiply of
// expf with the + 1 as it does in torch, and expf/tanhf (libdevice) get the same
// contractions as in torch's build. fastpath/elementwise.py therefore compiles
// this file with --fmad=true. Python constants are rounded to fp32, as torch
// does for a scalar operand. Results are rounded once to the storage dtype
// (RNE): bit-identical to the reference on the same GPU and CUDA version.
// Column sums (dbias) are reductions in another order than torch's and match
// within tolerance.
//
// Layout: every kernel sees a 2-D problem of `rows` rows. A thread owns one
// V-element column vector (one 16-byte access when vectorized) and walks rows
// with a grid-stride loop, loading the next row while it computes the current
// one. Gated activations read halves a = x[:, :n], b = x[:, n:] of rows 2n wide.
// Each kernel body is instantiated twice: 16-byte vectors (`vec`: n % V == 0 and
// 16-byte aligned pointers) and single elements (any n, any alignment).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef long long i64;

// ------------------------------------------------------------ storage types
// `raw` is the stored bit pattern; load() is exact, store() rounds once (RNE).
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

// ------------------------------------------------------------ fp32 helpers
// One torch op each: a single fp32 rounding, never fused with a neighbour.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
// torch.sigmoid's CUDA kernel body, verbatim (see the file comment about FMA contraction).
__device__ __forceinline__ float sigmoid_f(float v) { return 1.0f / (1.0f + expf(-v)); }
// torch.clamp_min / clamp_max / clamp with scalars: NaN passes through, else fmaxf / fminf.
__device__ __forceinline__ float clamp_min_f(float v, float lo) { return v != v ? v : fmaxf(v, lo); }
__device__ __forceinline__ float clamp_max_f(float v, float hi) { return v != v ? v : fminf(v, hi); }
__device__ __forceinline__ float clamp_f(float v, float lo, float hi) { return v != v ? v : fminf(fmaxf(v, lo), hi); }

// The reference's Python constants, rounded to fp32 as torch does for a scalar operand.
#define SQRT_2_OVER_PI 0x1.988454p-1f  // fl(math.sqrt(2 / math.pi))
#define GELU_CUBIC 0x1.6e4e26p-5f      // fl(0.044715)
#define GELU_CUBIC_X3 0x1.12ba9ep-3f   // fl(3.0 * 0.044715), the product taken in double by Python
#define QGELU_ALPHA 0x1.b3b646p+0f     // fl(1.702)

// Per-activation scalars: clamped_swiglu (limit, alpha, glu_linear_offset, -);
// situglu (beta1, fl(1/beta1) as torch's x / beta1 multiplies by it, beta2, fl(1/beta2)).
struct Params {
  float p0, p1, p2, p3;
};

// ------------------------------------------------------- unary activations
// f(x) and f'(x), each the reference's op sequence (given in the comments).
struct Identity {
  static __device__ __forceinline__ float f(float x, const Params&) { return x; }
  static __device__ __forceinline__ float df(float, const Params&) { return 1.0f; }
};

struct Gelu {  // 0.5 * x * (1.0 + tanh(K * (x + c * x * x * x)))
  static __device__ __forceinline__ float inner(float x) {
    return mul(SQRT_2_OVER_PI, add(x, mul(mul(mul(GELU_CUBIC, x), x), x)));
  }
  static __device__ __forceinline__ float f(float x, const Params&) {
    return mul(mul(0.5f, x), add(1.0f, tanhf(inner(x))));
  }
  // 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (K * (1.0 + 3.0 * c * x * x))
  static __device__ __forceinline__ float df(float x, const Params&) {
    const float t = tanhf(inner(x));
    const float dinner = mul(SQRT_2_OVER_PI, add(1.0f, mul(mul(GELU_CUBIC_X3, x), x)));
    return add(mul(0.5f, add(1.0f, t)), mul(mul(mul(0.5f, x), sub(1.0f, mul(t, t))), dinner));
  }
};

struct QGelu {  // x * sigmoid(1.702 * x); derivative s + 1.702 * x * s * (1.0 - s)
  static __device__ __forceinline__ float f(float x, const Params&) { return mul(x, sigmoid_f(mul(QGELU_ALPHA, x))); }
  static __device__ __forceinline__ float df(float x, const Params&) {
    const float s = sigmoid_f(mul(QGELU_ALPHA, x));
    return add(s, mul(mul(mul(QGELU_ALPHA, x), s), sub(1.0f, s)));
  }
};

struct Relu {  // clamp_min(x, 0); derivative (x > 0)
  static __device__ __forceinline__ float f(float x, const Params&) { return clamp_min_f(x, 0.0f); }
  static __device__ __forceinline__ float df(float x, const Params&) { return x > 0.0f ? 1.0f : 0.0f; }
};

struct SRelu {  // r * r with r = clamp_min(x, 0); derivative 2.0 * r
  static __device__ __forceinline__ float f(float x, const Params&) {
    const float r = clamp_min_f(x, 0.0f);
    return mul(r, r);
  }
  static __device__ __forceinline__ float df(float x, const Params&) { return mul(2.0f, clamp_min_f(x, 0.0f)); }
};

struct Silu {  // x * sigmoid(x); derivative s + x * s * (1.0 - s)
  static __device__ __forceinline__ float f(float x, const Params&) { return mul(x, sigmoid_f(x)); }
  static __device__ __forceinline__ float df(float x, const Params&) {
    const float s = sigmoid_f(x);
    return add(s, mul(mul(x, s), sub(1.0f, s)));
  }
};

struct Sigmoid {  // sigmoid(x); derivative s * (1.0 - s)
  static __device__ __forceinline__ float f(float x, const Params&) { return sigmoid_f(x); }
  static __device__ __forceinline__ float df(float x, const Params&) {
    const float s = sigmoid_f(x);
    return mul(s, sub(1.0f, s));
  }
};

// -------------------------------------------------------- gated activations
// y = gate(a) * lin(b); da = dy * gate'(a) * lin(b); db = dy * gate(a) * lin'(b).
template <class U>
struct GatedFromUnary {  // gate = U, lin = identity (b itself, derivative ones)
  static __device__ __forceinline__ float gate(float a, const Params& p) { return U::f(a, p); }
  static __device__ __forceinline__ float gate_d(float a, const Params& p) { return U::df(a, p); }
  static __device__ __forceinline__ float lin(float b, const Params&) { return b; }
  static __device__ __forceinline__ float lin_d(float, const Params&) { return 1.0f; }
};

struct ClampedSwiglu {  // p0 = limit, p1 = alpha, p2 = glu_linear_offset
  // ac * sigmoid(alpha * ac), ac = clamp_max(a, limit)
  static __device__ __forceinline__ float gate(float a, const Params& p) {
    const float ac = clamp_max_f(a, p.p0);
    return mul(ac, sigmoid_f(mul(p.p1, ac)));
  }
  // where(a <= limit, s + alpha * ac * s * (1.0 - s), 0)
  static __device__ __forceinline__ float gate_d(float a, const Params& p) {
    const float ac = clamp_max_f(a, p.p0);
    const float s = sigmoid_f(mul(p.p1, ac));
    const float d = add(s, mul(mul(mul(p.p1, ac), s), sub(1.0f, s)));
    return a <= p.p0 ? d : 0.0f;
  }
  // clamp(b, -limit, limit) + glu_linear_offset; derivative (-limit <= b <= limit)
  static __device__ __forceinline__ float lin(float b, const Params& p) { return add(clamp_f(b, -p.p0, p.p0), p.p2); }
  static __device__ __forceinline__ float lin_d(float b, const Params& p) {
    return (b >= -p.p0 && b <= p.p0) ? 1.0f : 0.0f;
  }
};

struct SituGlu {  // p0 = beta1, p1 = fl(1/beta1), p2 = beta2, p3 = fl(1/beta2)
  // beta1 * tanh(a / beta1) * sigmoid(a)
  static __device__ __forceinline__ float gate(float a, const Params& p) {
    return mul(mul(p.p0, tanhf(mul(a, p.p1))), sigmoid_f(a));
  }
  // (1.0 - t * t) * s + beta1 * t * s * (1.0 - s)
  static __device__ __forceinline__ float gate_d(float a, const Params& p) {
    const float t = tanhf(mul(a, p.p1));
    const float s = sigmoid_f(a);
    return add(mul(sub(1.0f, mul(t, t)), s), mul(mul(mul(p.p0, t), s), sub(1.0f, s)));
  }
  // beta2 * tanh(b / beta2); derivative 1.0 - t * t
  static __device__ __forceinline__ float lin(float b, const Params& p) { return mul(p.p2, tanhf(mul(b, p.p3))); }
  static __device__ __forceinline__ float lin_d(float b, const Params& p) {
    const float t = tanhf(mul(b, p.p3));
    return sub(1.0f, mul(t, t));
  }
};

// Unary activations seen through the gated interface's forward/backward shape.
template <class A, bool GATED>
struct Apply;

template <class A>
struct Apply<A, false> {
  static __device__ __forceinline__ float fwd(float a, float, const Params& p) { return A::f(a, p); }
  static __device__ __forceinline__ float bwd_a(float dy, float a, float, const Params& p) {
    return mul(dy, A::df(a, p));
  }
  static __device__ __forceinline__ float bwd_b(float, float, float, const Params&) { return 0.0f; }
};

template <class A>
struct Apply<A, true> {
  static __device__ __forceinline__ float fwd(float a, float b, const Params& p) {
    return mul(A::gate(a, p), A::lin(b, p));
  }
  static __device__ __forceinline__ float bwd_a(float dy, float a, float b, const Params& p) {
    return mul(mul(dy, A::gate_d(a, p)), A::lin(b, p));
  }
  static __device__ __forceinline__ float bwd_b(float dy, float a, float b, const Params& p) {
    return mul(mul(dy, A::gate(a, p)), A::lin_d(b, p));
  }
};

// ------------------------------------------------------------------ forward
// y[r, c] = act(pre) with pre = RN(x + bias) (also written to `pre` when given).
// Without a bias, pre = RN(x + (-0.0)) = x exactly, so one code path serves both.
// Unary: x, pre, y are rows x n. Gated: x and pre are rows x 2n, y is rows x n.
template <class A, class Tr, int V, bool GATED>
__device__ __forceinline__ void forward_body(const typename Tr::raw* __restrict__ x,
                                             const typename Tr::raw* __restrict__ bias,
                                             typename Tr::raw* __restrict__ pre, typename Tr::raw* __restrict__ y,
                                             i64 rows, i64 n, const Params& p) {
  typedef typename Tr::raw R;
  const i64 col = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  i64 r = (i64)blockIdx.y * blockDim.y + threadIdx.y;
  if (col >= n || r >= rows) return;
  const i64 in_width = GATED ? 2 * n : n;
  float bias_a[V], bias_b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) bias_a[k] = bias_b[k] = -0.0f;
  if (bias != nullptr) {
    const Pack<R, V> ba = load_pack<V>(bias + col);
#pragma unroll
    for (int k = 0; k < V; ++k) bias_a[k] = Tr::load(ba.v[k]);
    if (GATED) {
      const Pack<R, V> bb = load_pack<V>(bias + n + col);
#pragma unroll
      for (int k = 0; k < V; ++k) bias_b[k] = Tr::load(bb.v[k]);
    }
  }
  const i64 step = (i64)gridDim.y * blockDim.y;
  Pack<R, V> next_a = load_pack<V>(x + r * in_width + col), next_b;
  if (GATED) next_b = load_pack<V>(x + r * in_width + n + col);
  for (; r < rows; r += step) {
    const Pack<R, V> in_a = next_a, in_b = next_b;
    if (r + step < rows) {
      next_a = load_pack<V>(x + (r + step) * in_width + col);
      if (GATED) next_b = load_pack<V>(x + (r + step) * in_width + n + col);
    }
    Pack<R, V> out, pre_a, pre_b;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      pre_a.v[k] = Tr::store(add(Tr::load(in_a.v[k]), bias_a[k]));
      if (GATED) pre_b.v[k] = Tr::store(add(Tr::load(in_b.v[k]), bias_b[k]));
      const float a = Tr::load(pre_a.v[k]);
      const float b = GATED ? Tr::load(pre_b.v[k]) : 0.0f;
      out.v[k] = Tr::store(Apply<A, GATED>::fwd(a, b, p));
    }
    if (pre != nullptr) {
      store_pack<V>(pre + r * in_width + col, pre_a);
      if (GATED) store_pack<V>(pre + r * in_width + n + col, pre_b);
    }
    store_pack<V>(y + r * n + col, out);
  }
}

// Per-block column sums of `acc` (V values per thread, one set per half) reduced
// over threadIdx.y, written to partial[blockIdx.y, :]. Every thread must call it.
template <int V, bool GATED>
__device__ __forceinline__ void write_column_partials(const float (&acc_a)[V], const float (&acc_b)[V],
                                                      float* __restrict__ partial, i64 col, i64 n) {
  extern __shared__ float scratch[];  // [halves][blockDim.y][blockDim.x * V]
  const i64 out_width = GATED ? 2 * n : n;
  float* row = partial + (i64)blockIdx.y * out_width;
  float sum_a[V], sum_b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    sum_a[k] = acc_a[k];
    sum_b[k] = acc_b[k];
  }
  if (blockDim.y > 1) {
    const int lane_cols = blockDim.x * V;
    const int half_size = blockDim.y * lane_cols;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      scratch[threadIdx.y * lane_cols + threadIdx.x * V + k] = acc_a[k];
      if (GATED) scratch[half_size + threadIdx.y * lane_cols + threadIdx.x * V + k] = acc_b[k];
    }
    __syncthreads();
    if (threadIdx.y != 0) return;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      sum_a[k] = sum_b[k] = 0.0f;
      for (int j = 0; j < (int)blockDim.y; ++j) {
        sum_a[k] += scratch[j * lane_cols + threadIdx.x * V + k];
        if (GATED) sum_b[k] += scratch[half_size + j * lane_cols + threadIdx.x * V + k];
      }
    }
  }
  if (col < n) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      row[col + k] = sum_a[k];
      if (GATED) row[n + col + k] = sum_b[k];
    }
  }
}

// ----------------------------------------------------------------- backward
// dx = act'(x) applied to dy (dy is rows x n; x and dx are rows x n, or rows x 2n
// when gated). With `partial`, also the per-block column sums of the rounded dx.
template <class A, class Tr, int V, bool GATED>
__device__ __forceinline__ void backward_body(const typename Tr::raw* __restrict__ dy,
                                              const typename Tr::raw* __restrict__ x,
                                              typename Tr::raw* __restrict__ dx, float* __restrict__ partial,
                                              i64 rows, i64 n, const Params& p) {
  typedef typename Tr::raw R;
  const i64 col = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  const i64 in_width = GATED ? 2 * n : n;
  const i64 step = (i64)gridDim.y * blockDim.y;
  i64 r = (i64)blockIdx.y * blockDim.y + threadIdx.y;
  float acc_a[V], acc_b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc_a[k] = acc_b[k] = 0.0f;
  if (col < n && r < rows) {
    Pack<R, V> next_dy = load_pack<V>(dy + r * n + col), next_a = load_pack<V>(x + r * in_width + col), next_b;
    if (GATED) next_b = load_pack<V>(x + r * in_width + n + col);
    for (; r < rows; r += step) {
      const Pack<R, V> in_dy = next_dy, in_a = next_a, in_b = next_b;
      if (r + step < rows) {
        next_dy = load_pack<V>(dy + (r + step) * n + col);
        next_a = load_pack<V>(x + (r + step) * in_width + col);
        if (GATED) next_b = load_pack<V>(x + (r + step) * in_width + n + col);
      }
      Pack<R, V> out_a, out_b;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float g = Tr::load(in_dy.v[k]);
        const float a = Tr::load(in_a.v[k]);
        const float b = GATED ? Tr::load(in_b.v[k]) : 0.0f;
        out_a.v[k] = Tr::store(Apply<A, GATED>::bwd_a(g, a, b, p));
        acc_a[k] += Tr::load(out_a.v[k]);
        if (GATED) {
          out_b.v[k] = Tr::store(Apply<A, GATED>::bwd_b(g, a, b, p));
          acc_b[k] += Tr::load(out_b.v[k]);
        }
      }
      store_pack<V>(dx + r * in_width + col, out_a);
      if (GATED) store_pack<V>(dx + r * in_width + n + col, out_b);
    }
  }
  if (partial != nullptr) write_column_partials<V, GATED>(acc_a, acc_b, partial, col, n);
}

// --------------------------------------------------------------------- dbias
// Per-block column sums of g (rows x n) into partial[blockIdx.y, :].
template <class Tr, int V>
__device__ __forceinline__ void column_partials_body(const typename Tr::raw* __restrict__ g,
                                                     float* __restrict__ partial, i64 rows, i64 n) {
  typedef typename Tr::raw R;
  const i64 col = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  const i64 step = (i64)gridDim.y * blockDim.y;
  float acc[V], unused[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = unused[k] = 0.0f;
  if (col < n) {
    for (i64 r = (i64)blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += step) {
      const Pack<R, V> in = load_pack<V>(g + r * n + col);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += Tr::load(in.v[k]);
    }
  }
  write_column_partials<V, false>(acc, unused, partial, col, n);
}

// out[c] = sum over the `parts` rows of partial[:, c], in fp32, rounded once.
template <class Tr>
__device__ __forceinline__ void column_finalize_body(const float* __restrict__ partial, i64 parts, i64 width,
                                                     typename Tr::raw* __restrict__ out) {
  const i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= width) return;
  float s = 0.0f;
  for (i64 j = 0; j < parts; ++j) s += partial[j * width + col];
  out[col] = Tr::store(s);
}

// ------------------------------------------------------------- entry points
// act_fwd_<name>_<dtype>(x, bias|0, pre|0, y, rows, n, vec, p0..p3)
// act_bwd_<name>_<dtype>(dy, x, dx, partial|0, rows, n, vec, p0..p3)
// `vec` selects 16-byte vectors (n % V == 0 and 16-byte aligned pointers) or scalars.
#define DEFINE_ACTIVATION_T(NAME, ACT, GATED, SUFFIX, TR, V)                                                      \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      act_fwd_##NAME##_##SUFFIX(const TR::raw* __restrict__ x, const TR::raw* __restrict__ bias,                 \
                                TR::raw* __restrict__ pre, TR::raw* __restrict__ y, i64 rows, i64 n, int vec,    \
                                float p0, float p1, float p2, float p3) {                                        \
    const Params p = {p0, p1, p2, p3};                                                                           \
    if (vec)                                                                                                     \
      forward_body<ACT, TR, V, GATED>(x, bias, pre, y, rows, n, p);                                              \
    else                                                                                                         \
      forward_body<ACT, TR, 1, GATED>(x, bias, pre, y, rows, n, p);                                              \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      act_bwd_##NAME##_##SUFFIX(const TR::raw* __restrict__ dy, const TR::raw* __restrict__ x,                   \
                                TR::raw* __restrict__ dx, float* __restrict__ partial, i64 rows, i64 n, int vec, \
                                float p0, float p1, float p2, float p3) {                                        \
    const Params p = {p0, p1, p2, p3};                                                                           \
    if (vec)                                                                                                     \
      backward_body<ACT, TR, V, GATED>(dy, x, dx, partial, rows, n, p);                                          \
    else                                                                                                         \
      backward_body<ACT, TR, 1, GATED>(dy, x, dx, partial, rows, n, p);                                          \
  }

#define DEFINE_ACTIVATION(NAME, ACT, GATED)                  \
  DEFINE_ACTIVATION_T(NAME, ACT, GATED, f32, F32, 4)         \
  DEFINE_ACTIVATION_T(NAME, ACT, GATED, f16, F16, 8)         \
  DEFINE_ACTIVATION_T(NAME, ACT, GATED, bf16, BF16, 8)

// Compiling the whole file defines every kernel (the CI compile check does that).
// The launcher compiles one group at a time, prepending `#define ACTIVATION_GROUP k`
// (fastpath/elementwise.py, ACTIVATION_GROUPS), so a process compiles only the
// activations it uses.
#ifndef ACTIVATION_GROUP
#define ACTIVATION_GROUP 0
#endif
#define GROUP_ENABLED(k) (ACTIVATION_GROUP == 0 || ACTIVATION_GROUP == (k))

#if GROUP_ENABLED(1)
DEFINE_ACTIVATION(identity, Identity, false)
#endif
#if GROUP_ENABLED(2)
DEFINE_ACTIVATION(gelu, Gelu, false)
#endif
#if GROUP_ENABLED(3)
DEFINE_ACTIVATION(qgelu, QGelu, false)
#endif
#if GROUP_ENABLED(4)
DEFINE_ACTIVATION(relu, Relu, false)
#endif
#if GROUP_ENABLED(5)
DEFINE_ACTIVATION(srelu, SRelu, false)
#endif
#if GROUP_ENABLED(6)
DEFINE_ACTIVATION(silu, Silu, false)
#endif
#if GROUP_ENABLED(7)
DEFINE_ACTIVATION(sigmoid, Sigmoid, false)
#endif
#if GROUP_ENABLED(8)
DEFINE_ACTIVATION(glu, GatedFromUnary<Sigmoid>, true)
#endif
#if GROUP_ENABLED(9)
DEFINE_ACTIVATION(geglu, GatedFromUnary<Gelu>, true)
#endif
#if GROUP_ENABLED(10)
DEFINE_ACTIVATION(qgeglu, GatedFromUnary<QGelu>, true)
#endif
#if GROUP_ENABLED(11)
DEFINE_ACTIVATION(reglu, GatedFromUnary<Relu>, true)
#endif
#if GROUP_ENABLED(12)
DEFINE_ACTIVATION(sreglu, GatedFromUnary<SRelu>, true)
#endif
#if GROUP_ENABLED(13)
DEFINE_ACTIVATION(swiglu, GatedFromUnary<Silu>, true)
#endif
#if GROUP_ENABLED(14)
DEFINE_ACTIVATION(clamped_swiglu, ClampedSwiglu, true)
#endif
#if GROUP_ENABLED(15)
DEFINE_ACTIVATION(situglu, SituGlu, true)
#endif

// dbias_partial_<dtype>(g, partial, rows, n, vec); dbias_finalize_<dtype>(partial, parts, width, out)
#define DEFINE_DBIAS(SUFFIX, TR, V)                                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      dbias_partial_##SUFFIX(const TR::raw* __restrict__ g, float* __restrict__ partial, i64 rows, i64 n,        \
                             int vec) {                                                                          \
    if (vec)                                                                                                     \
      column_partials_body<TR, V>(g, partial, rows, n);                                                          \
    else                                                                                                         \
      column_partials_body<TR, 1>(g, partial, rows, n);                                                          \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      dbias_finalize_##SUFFIX(const float* __restrict__ partial, i64 parts, i64 width, TR::raw* __restrict__ out) { \
    column_finalize_body<TR>(partial, parts, width, out);                                                        \
  }

#if GROUP_ENABLED(16)
DEFINE_DBIAS(f32, F32, 4)
DEFINE_DBIAS(f16, F16, 8)
DEFINE_DBIAS(bf16, BF16, 8)
#endif
