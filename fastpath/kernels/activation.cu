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
// Each kernel body is instantiated for 16-byte vectors (`vec`: n % V == 0 and
// 16-byte aligned pointers) and single elements (any n, any alignment), and the
// forward also with and without a bias.
//
// Speed without changing a bit: 16-bit values travel as 32-bit words (two per
// word; widening is exact, narrowing rounds two at once with the same RNE), the
// index math is running offsets, and the sigmoid's IEEE reciprocal (see
// sigmoid_f) is computed for a whole vector without the per-element branch the
// compiler would emit, falling back to the compiler's own code for the vector
// when any denominator is outside the range where both agree.
//
// The bf16 SiTU-GLU forward has a second kernel (act_fwd_situglu_table_bf16, see
// situ_table_forward_body): its gate and lin are functions of a 16-bit value, so
// each block evaluates them once for a window of values, with the same code, into
// shared-memory tables, and most vectors then take two table loads and one
// multiply per element instead of three exact transcendentals.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef long long i64;

#include "vector_io.cuh"
#include "column_sums.cuh"
#include "activation_functions.cuh"
#include "column_partials.cuh"

// ------------------------------------------------------------------ forward
// Rows r0, r0 + step, r0 + 2 step, ... < rows of one column vector: `row(buf)` computes
// a row from its loaded inputs `buf` while the loads of the next row are in flight
// (two buffers used in turn, so nothing is copied between iterations). `load()` and
// `row()` are called once per row, in row order, and keep their own running pointers.
// walk_rows_from takes the first row's buffer already loaded.
template <class Buf, class Load, class Row>
__device__ __forceinline__ void walk_rows_from(Buf b0, i64 r, i64 rows, i64 step, Load& load, Row& row) {
  Buf b1;
  while (true) {
    bool more = r + step < rows;
    if (more) b1 = load();
    row(b0);
    if (!more) return;
    r += step;
    more = r + step < rows;
    if (more) b0 = load();
    row(b1);
    if (!more) return;
    r += step;
  }
}
template <class Buf, class Load, class Row>
__device__ __forceinline__ void walk_rows(i64 r, i64 rows, i64 step, Load& load, Row& row) {
  walk_rows_from<Buf>(load(), r, rows, step, load, row);
}

template <class Raw>
struct Two {  // the two halves of a gated row (b unused otherwise)
  Raw a, b;
};
template <class Raw>
struct Three {  // dy and the two halves of x
  Raw g, a, b;
};

// y[r, c] = act(pre) with pre = RN(x + bias) (also written to `pre` when given).
// Without a bias pre is x itself (the reference applies the activation to x).
// Unary: x, pre, y are rows x n. Gated: x and pre are rows x 2n, y is rows x n.
template <class A, class Tr, int V, bool GATED, bool BIAS>
__device__ __forceinline__ void forward_body(const typename Tr::raw* __restrict__ x,
                                             const typename Tr::raw* __restrict__ bias,
                                             typename Tr::raw* __restrict__ pre, typename Tr::raw* __restrict__ y,
                                             i64 rows, i64 n, const Params& p) {
  typedef Io<Tr, V> io;
  typedef typename io::Raw Raw;
  const i64 col = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  const i64 r0 = (i64)blockIdx.y * blockDim.y + threadIdx.y;
  if (col >= n || r0 >= rows) return;
  const i64 in_width = GATED ? 2 * n : n;
  float bias_a[V], bias_b[V];
  if (BIAS) {
    io::unpack(io::load(bias + col), bias_a);
    if (GATED) io::unpack(io::load(bias + n + col), bias_b);
  }
  const bool write_pre = BIAS && pre != nullptr;
  const i64 step = (i64)gridDim.y * blockDim.y;
  const i64 in_step = step * in_width, out_step = step * n;
  // Running pointers: the next row to load (x), to write (y, pre).
  const typename Tr::raw* xp = x + r0 * in_width + col;
  typename Tr::raw* yp = y + r0 * n + col;
  typename Tr::raw* pp = write_pre ? pre + r0 * in_width + col : nullptr;
  auto load = [&]() {
    Two<Raw> t;
    t.a = io::load(xp);
    if (GATED) t.b = io::load(xp + n);
    xp += in_step;
    return t;
  };
  auto row = [&](const Two<Raw>& t) {
    float a[V], b[V] = {}, out[V];
    io::unpack(t.a, a);
    if (GATED) io::unpack(t.b, b);
    if (BIAS) {
#pragma unroll
      for (int k = 0; k < V; ++k) a[k] = add(a[k], bias_a[k]);
      const Raw pre_a = round_trip<Tr, V>(a);
      Raw pre_b;
      if (GATED) {
#pragma unroll
        for (int k = 0; k < V; ++k) b[k] = add(b[k], bias_b[k]);
        pre_b = round_trip<Tr, V>(b);
      }
      if (write_pre) {
        io::store(pp, pre_a);
        if (GATED) io::store(pp + n, pre_b);
        pp += in_step;
      }
    }
    act_forward<A, GATED, V>(a, b, p, out);
    io::store(yp, io::pack(out));
    yp += out_step;
  };
  walk_rows<Two<Raw>>(r0, rows, step, load, row);
}

// ------------------------------------------ SiTU-GLU forward by table (bf16)
// The gated-forward path above spends ~54 instructions and 6 MUFU ops per SiTU-GLU
// element on three exact transcendentals (sigmoid and tanhf for the gate, tanhf for
// lin), which makes it instruction-bound. But with 16-bit inputs gate(a) and lin(b)
// are functions of a 16-bit pattern (with a bias too: pre = RN(x + bias) is what
// the activation sees). So every block first evaluates them once per value of a
// window of magnitudes, [2^-24, 2^8) (SITU_BINADES binades x 128 bf16 values),
// with the very code act_forward runs (sigmoids, SituGlu::gate, SituGlu::lin, same
// compile options), into shared memory: gate for both signs of a, lin for |b| only,
// since lin is odd bit for bit: b / beta2 is b * fl(1/beta2), whose sign is b's and
// whose magnitude does not depend on it; tanhf computes from |x| and copies x's sign
// (or is fma(x, p(x * x), x), odd as RN is); beta2 * t likewise. A row vector whose
// 16 values are all in the window then takes y = RN(gate[a] * lin[|b|]) and flips
// the sign of the rounded bf16 y where b < 0: RN(g * -l) = -RN(g * l), ±0 included,
// and bf16 RNE is symmetric, as long as nothing is NaN: the window holds finite
// nonzero values only, and the table is used only when p0..p3 are finite (then
// every gate and lin value is finite). Any other vector (zero, subnormal, tiny,
// >= 256, inf, NaN inputs) is computed by act_forward as in forward_body. Outputs
// are therefore the same bits as forward_body's. Per element that is ~12
// instructions and two shared loads instead of ~54 instructions and 6 MUFU ops.
// Tables: 32 KiB + 16 KiB of static shared memory; blocks of 1024 threads, one per
// SM, walk rows (see elementwise.py), so the table fill (12 evaluations per thread)
// is paid once per SM.
#define SITU_BINADES 32
#define SITU_W (SITU_BINADES * 128)  // values per sign in the window (a power of 2)
#define SITU_BASE (103 << 7)         // bf16 magnitude bits of 2^-24, the window's start

// bf16 bit pattern of the table's gate entry i: the sign from bit log2(SITU_W) of i.
__device__ __forceinline__ unsigned short situ_gate_value(int i) {
  return (unsigned short)(((i & SITU_W) ? 0x8000 : 0) | (SITU_BASE + (i & (SITU_W - 1))));
}

// Byte offsets into the tables of the bf16 value in bits [16h, 16h + 16) of word w:
// k4 = 4 * (|v| bits - SITU_BASE), < 4 SITU_W inside the window (below it, it wraps
// around to >= 2^32 - 4 SITU_BASE), the lin table's offset; the gate table's adds
// 4 SITU_W when v < 0 (an OR, as k4 < 4 SITU_W wherever the offset is used).
template <int h>
__device__ __forceinline__ unsigned situ_k4(unsigned w) {
  return (h ? (w >> 14) & 0x1fffcu : (w << 2) & 0x1fffcu) - 4u * SITU_BASE;
}
template <int h>
__device__ __forceinline__ unsigned situ_gate_offset(unsigned w, unsigned k4) {
  return k4 | ((h ? w >> 17 : w >> 1) & (4u * SITU_W));
}
__device__ __forceinline__ float situ_entry(const float* table, unsigned byte_offset) {
  return *reinterpret_cast<const float*>(reinterpret_cast<const char*>(table) + byte_offset);
}

template <bool BIAS>
__device__ __forceinline__ void situ_table_forward_body(const unsigned short* __restrict__ x,
                                                        const unsigned short* __restrict__ bias,
                                                        unsigned short* __restrict__ pre,
                                                        unsigned short* __restrict__ y, i64 rows, i64 n,
                                                        const Params& p, float* gate_tab, float* lin_tab) {
  typedef Io<BF16, 8> io;
  typedef io::Raw Raw;
  const i64 col = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  const i64 r0 = (i64)blockIdx.y * blockDim.y + threadIdx.y;
  const bool active = col < n && r0 < rows;
  const i64 in_width = 2 * n;
  const i64 step = (i64)gridDim.y * blockDim.y;
  const i64 in_step = step * in_width, out_step = step * n;
  // Running pointers: the next row to load (x), to write (y, pre).
  const unsigned short* xp = x + r0 * in_width + col;
  auto load = [&]() {
    Two<Raw> t;
    t.a = io::load(xp);
    t.b = io::load(xp + n);
    xp += in_step;
    return t;
  };
  // The first row's loads are in flight while the block fills the tables.
  Two<Raw> first;
  if (active) first = load();
  const int threads = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
  for (int i = tid; i < 2 * SITU_W; i += threads) {
    float a[1] = {BF16::load(situ_gate_value(i))}, s[1];
    sigmoids<SituGlu, 1>(a, p, s);
    gate_tab[i] = SituGlu::gate(a[0], s[0], p);
  }
  for (int i = tid; i < SITU_W; i += threads) lin_tab[i] = SituGlu::lin(BF16::load(SITU_BASE + i), p);
  __syncthreads();
  if (!active) return;

  // A window bit set from the start closes the table (some parameter is inf or NaN).
  const unsigned closed =
      (isfinite(p.p0) && isfinite(p.p1) && isfinite(p.p2) && isfinite(p.p3)) ? 0u : 4u * SITU_W;
  float bias_a[8], bias_b[8];
  if (BIAS) {
    io::unpack(io::load(bias + col), bias_a);
    io::unpack(io::load(bias + n + col), bias_b);
  }
  const bool write_pre = BIAS && pre != nullptr;
  unsigned short* yp = y + r0 * n + col;
  unsigned short* pp = write_pre ? pre + r0 * in_width + col : nullptr;
  auto row = [&](const Two<Raw>& t) {
    Raw ra = t.a, rb = t.b;  // the activation's inputs as bf16 words
    if (BIAS) {
      float a[8], b[8];
      io::unpack(t.a, a);
      io::unpack(t.b, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        a[k] = add(a[k], bias_a[k]);
        b[k] = add(b[k], bias_b[k]);
      }
      ra = round_trip<BF16, 8>(a);
      rb = round_trip<BF16, 8>(b);
      if (write_pre) {
        io::store(pp, ra);
        io::store(pp + n, rb);
        pp += in_step;
      }
    }
    const unsigned wa[4] = {ra.x, ra.y, ra.z, ra.w}, wb[4] = {rb.x, rb.y, rb.z, rb.w};
    // `window` ORs every k4: < 4 SITU_W exactly when all of them are.
    unsigned ga[8], lb[8], window = closed;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const unsigned ka0 = situ_k4<0>(wa[j]), ka1 = situ_k4<1>(wa[j]);
      lb[2 * j] = situ_k4<0>(wb[j]);
      lb[2 * j + 1] = situ_k4<1>(wb[j]);
      ga[2 * j] = situ_gate_offset<0>(wa[j], ka0);
      ga[2 * j + 1] = situ_gate_offset<1>(wa[j], ka1);
      window |= ka0 | ka1 | lb[2 * j] | lb[2 * j + 1];
    }
    float out[8];
    Raw yr;
    if (window < 4u * SITU_W) {
#pragma unroll
      for (int k = 0; k < 8; ++k) out[k] = mul(situ_entry(gate_tab, ga[k]), situ_entry(lin_tab, lb[k]));
      yr = io::pack(out);
      // y for b < 0 is -y for |b|: flip the sign of those bf16 results.
      yr.x ^= wb[0] & 0x80008000u;
      yr.y ^= wb[1] & 0x80008000u;
      yr.z ^= wb[2] & 0x80008000u;
      yr.w ^= wb[3] & 0x80008000u;
    } else {
      float a[8], b[8];
      io::unpack(ra, a);
      io::unpack(rb, b);
      act_forward<SituGlu, true, 8>(a, b, p, out);
      yr = io::pack(out);
    }
    io::store(yp, yr);
    yp += out_step;
  };
  walk_rows_from<Two<Raw>>(first, r0, rows, step, load, row);
}

// ----------------------------------------------------------------- backward
// dx = act'(x) applied to dy (dy is rows x n; x and dx are rows x n, or rows x 2n
// when gated). With `partial`, also the per-block column sums of the rounded dx.
template <class A, class Tr, int V, bool GATED>
__device__ __forceinline__ void backward_body(const typename Tr::raw* __restrict__ dy,
                                              const typename Tr::raw* __restrict__ x,
                                              typename Tr::raw* __restrict__ dx, float* __restrict__ partial,
                                              i64 rows, i64 n, const Params& p) {
  typedef Io<Tr, V> io;
  typedef typename io::Raw Raw;
  const i64 col = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  const i64 in_width = GATED ? 2 * n : n;
  const i64 r0 = (i64)blockIdx.y * blockDim.y + threadIdx.y;
  float acc_a[V], acc_b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc_a[k] = acc_b[k] = 0.0f;
  const bool sums = partial != nullptr;
  if (col < n && r0 < rows) {
    const i64 step = (i64)gridDim.y * blockDim.y;
    const i64 x_step = step * in_width, dy_step = step * n;
    // Running pointers: the next row to load (dy, x) and to write (dx).
    const typename Tr::raw* gp = dy + r0 * n + col;
    const typename Tr::raw* xp = x + r0 * in_width + col;
    typename Tr::raw* dp = dx + r0 * in_width + col;
    auto load = [&]() {
      Three<Raw> t;
      t.g = io::load(gp);
      t.a = io::load(xp);
      if (GATED) t.b = io::load(xp + n);
      gp += dy_step;
      xp += x_step;
      return t;
    };
    auto row = [&](const Three<Raw>& t) {
      float g[V], a[V], b[V] = {}, da[V], db[V];
      io::unpack(t.g, g);
      io::unpack(t.a, a);
      if (GATED) io::unpack(t.b, b);
      act_backward<A, GATED, V>(g, a, b, p, da, db);
      io::store(dp, round_trip<Tr, V>(da));
      if (GATED) io::store(dp + n, round_trip<Tr, V>(db));
      dp += x_step;
      if (sums) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          acc_a[k] += da[k];
          if (GATED) acc_b[k] += db[k];
        }
      }
    };
    walk_rows<Three<Raw>>(r0, rows, step, load, row);
  }
  if (sums) write_column_partials<V, GATED>(acc_a, acc_b, partial, col, n);
}

// --------------------------------------------------------------------- dbias
// Per-block column sums of g (rows x n) into partial[blockIdx.y, :]: each thread
// sums its column vector over rows r, r + step, ..., four independent loads at a time.
template <class Tr, int V>
__device__ __forceinline__ void column_partials_body(const typename Tr::raw* __restrict__ g,
                                                     float* __restrict__ partial, i64 rows, i64 n) {
  typedef Io<Tr, V> io;
  typedef typename io::Raw Raw;
  const i64 col = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * V;
  const i64 step = (i64)gridDim.y * blockDim.y;
  float acc[V], unused[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = unused[k] = 0.0f;
  if (col < n) {
    const i64 off_step = step * n;
    i64 r = (i64)blockIdx.y * blockDim.y + threadIdx.y;
    i64 off = r * n + col;
    for (; r + 3 * step < rows; r += 4 * step, off += 4 * off_step) {
      Raw in[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) in[u] = io::load(g + off + u * off_step);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float f[V];
        io::unpack(in[u], f);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += f[k];
      }
    }
    for (; r < rows; r += step, off += off_step) {
      float f[V];
      io::unpack(io::load(g + off), f);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += f[k];
    }
  }
  write_column_partials<V, false>(acc, unused, partial, col, n);
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
    if (bias != nullptr) {                                                                                       \
      if (vec)                                                                                                   \
        forward_body<ACT, TR, V, GATED, true>(x, bias, pre, y, rows, n, p);                                      \
      else                                                                                                       \
        forward_body<ACT, TR, 1, GATED, true>(x, bias, pre, y, rows, n, p);                                      \
    } else {                                                                                                     \
      if (vec)                                                                                                   \
        forward_body<ACT, TR, V, GATED, false>(x, bias, pre, y, rows, n, p);                                     \
      else                                                                                                       \
        forward_body<ACT, TR, 1, GATED, false>(x, bias, pre, y, rows, n, p);                                     \
    }                                                                                                            \
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
// act_fwd_situglu_table_bf16(x, bias|0, pre|0, y, rows, n, p0..p3): 16-byte vectors only
// (n % 8 == 0, 16-byte aligned pointers); blocks of up to 1024 threads (see situ_table_forward_body).
extern "C" __global__ void __launch_bounds__(1024)
    act_fwd_situglu_table_bf16(const unsigned short* __restrict__ x, const unsigned short* __restrict__ bias,
                               unsigned short* __restrict__ pre, unsigned short* __restrict__ y, i64 rows, i64 n,
                               float p0, float p1, float p2, float p3) {
  const Params p = {p0, p1, p2, p3};
  __shared__ float gate_tab[2 * SITU_W];  // [sign of a][|a| bits - SITU_BASE]
  __shared__ float lin_tab[SITU_W];       // [|b| bits - SITU_BASE]
  if (bias != nullptr)
    situ_table_forward_body<true>(x, bias, pre, y, rows, n, p, gate_tab, lin_tab);
  else
    situ_table_forward_body<false>(x, bias, pre, y, rows, n, p, gate_tab, lin_tab);
}
#endif

// dbias_partial_<dtype>(g, partial, rows, n, vec): grid (column blocks, row blocks), any block shape.
// dbias_finalize_<dtype>(partial, parts, width, out, vc): grid (ceil(width / (32 vc))), block (32,
// COLUMN_SUM_STRIPES) (column_sums.cuh).
#define DEFINE_DBIAS(SUFFIX, TR, V)                                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      dbias_partial_##SUFFIX(const TR::raw* __restrict__ g, float* __restrict__ partial, i64 rows, i64 n,        \
                             int vec) {                                                                          \
    if (vec)                                                                                                     \
      column_partials_body<TR, V>(g, partial, rows, n);                                                          \
    else                                                                                                         \
      column_partials_body<TR, 1>(g, partial, rows, n);                                                          \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(32 * COLUMN_SUM_STRIPES)                                          \
      dbias_finalize_##SUFFIX(const float* __restrict__ partial, i64 parts, i64 width, TR::raw* __restrict__ out,  \
                              int vc) {                                                                          \
    const float* const partials[1] = {partial};                                                                  \
    TR::raw* const outs[1] = {out};                                                                              \
    column_sums<TR, 1>(partials, parts, width, outs, vc);                                                        \
  }

#if GROUP_ENABLED(16)
DEFINE_DBIAS(f32, F32, 4)
DEFINE_DBIAS(f16, F16, 8)
DEFINE_DBIAS(bf16, BF16, 8)
#endif
