// The activations of the element-wise kernels as fp32 device functions (activation.cu, activation_quantize.cu):
// every unary and gated activation and its derivative, the reference's op sequence op for op (see activation.cu's
// file comment: explicit __fmul_rn / __fadd_rn / __fsub_rn, torch's sigmoid compiled with FMA contraction on),
// applied to a vector of V values. One definition, so the fused activation + quantize kernels compute the very
// values the activation kernels do. Needs vector_io.cuh (Io, for round_trip) and i64.
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once


// Round each value to the storage dtype and back (the reference's .to(dtype) of an intermediate).
template <class Tr, int V>
__device__ __forceinline__ typename Io<Tr, V>::Raw round_trip(float (&f)[V]) {
  const typename Io<Tr, V>::Raw r = Io<Tr, V>::pack(f);
  Io<Tr, V>::unpack(r, f);
  return r;
}

// ------------------------------------------------------------ fp32 helpers
// One torch op each: a single fp32 rounding, never fused with a neighbour.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
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

// The sigmoid, torch.sigmoid's CUDA kernel body 1 / (1 + exp(-v)) (see the file
// comment about FMA contraction), is taken for a whole vector at once (sigmoids
// below) and handed to the activation functions as `s`. The quotient is IEEE
// (correctly rounded): ptxas implements 1 / d as MUFU.RCP and one Newton step,
// r0 + r0 * -(d * r0 - 1) with two FMAs, for a d whose biased exponent is in
// [1, 252] (|d| in [2^-126, 2^126)), and as a subroutine call for the rest, with
// a branch per element that keeps the compiler from interleaving elements.
// rcp_fast is that same sequence, used when every d of the vector is in that
// range (so it gives the same bits); otherwise the vector takes 1 / d as written.
// d = 1 + expf(-v) is >= 1 or NaN (expf is >= 0 or NaN), so |d| >= 2^-126 needs no test;
// `d < 2^126` is false for NaN and inf.
__device__ __forceinline__ float sigmoid_denominator(float v) { return 1.0f + expf(-v); }
__device__ __forceinline__ bool rcp_fast_ok(float d) { return d < 0x1p126f; }
__device__ __forceinline__ float rcp_fast(float d) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(d));
  const float e = __fmaf_rn(d, r0, -1.0f);
  return __fmaf_rn(r0, -e, r0);
}

// ------------------------------------------------------- unary activations
// f(x, s) and f'(x, s), each the reference's op sequence (given in the comments);
// s = sigmoid(arg(x)) for the activations built on a sigmoid (SIGMOID), unused otherwise.
struct NoSigmoid {
  static constexpr bool SIGMOID = false;
  static __device__ __forceinline__ float arg(float, const Params&) { return 0.0f; }
};

struct Identity : NoSigmoid {
  static __device__ __forceinline__ float f(float x, float, const Params&) { return x; }
  static __device__ __forceinline__ float df(float, float, const Params&) { return 1.0f; }
};

struct Gelu : NoSigmoid {  // 0.5 * x * (1.0 + tanh(K * (x + c * x * x * x)))
  static __device__ __forceinline__ float inner(float x) {
    return mul(SQRT_2_OVER_PI, add(x, mul(mul(mul(GELU_CUBIC, x), x), x)));
  }
  static __device__ __forceinline__ float f(float x, float, const Params&) {
    return mul(mul(0.5f, x), add(1.0f, tanhf(inner(x))));
  }
  // 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (K * (1.0 + 3.0 * c * x * x))
  static __device__ __forceinline__ float df(float x, float, const Params&) {
    const float t = tanhf(inner(x));
    const float dinner = mul(SQRT_2_OVER_PI, add(1.0f, mul(mul(GELU_CUBIC_X3, x), x)));
    return add(mul(0.5f, add(1.0f, t)), mul(mul(mul(0.5f, x), sub(1.0f, mul(t, t))), dinner));
  }
};

struct QGelu {  // x * s, s = sigmoid(1.702 * x); derivative s + 1.702 * x * s * (1.0 - s)
  static constexpr bool SIGMOID = true;
  static __device__ __forceinline__ float arg(float x, const Params&) { return mul(QGELU_ALPHA, x); }
  static __device__ __forceinline__ float f(float x, float s, const Params&) { return mul(x, s); }
  static __device__ __forceinline__ float df(float x, float s, const Params&) {
    return add(s, mul(mul(mul(QGELU_ALPHA, x), s), sub(1.0f, s)));
  }
};

struct Relu : NoSigmoid {  // clamp_min(x, 0); derivative (x > 0)
  static __device__ __forceinline__ float f(float x, float, const Params&) { return clamp_min_f(x, 0.0f); }
  static __device__ __forceinline__ float df(float x, float, const Params&) { return x > 0.0f ? 1.0f : 0.0f; }
};

struct SRelu : NoSigmoid {  // r * r with r = clamp_min(x, 0); derivative 2.0 * r
  static __device__ __forceinline__ float f(float x, float, const Params&) {
    const float r = clamp_min_f(x, 0.0f);
    return mul(r, r);
  }
  static __device__ __forceinline__ float df(float x, float, const Params&) {
    return mul(2.0f, clamp_min_f(x, 0.0f));
  }
};

struct Silu {  // x * s, s = sigmoid(x); derivative s + x * s * (1.0 - s)
  static constexpr bool SIGMOID = true;
  static __device__ __forceinline__ float arg(float x, const Params&) { return x; }
  static __device__ __forceinline__ float f(float x, float s, const Params&) { return mul(x, s); }
  static __device__ __forceinline__ float df(float x, float s, const Params&) {
    return add(s, mul(mul(x, s), sub(1.0f, s)));
  }
};

struct Sigmoid {  // s = sigmoid(x); derivative s * (1.0 - s)
  static constexpr bool SIGMOID = true;
  static __device__ __forceinline__ float arg(float x, const Params&) { return x; }
  static __device__ __forceinline__ float f(float, float s, const Params&) { return s; }
  static __device__ __forceinline__ float df(float, float s, const Params&) { return mul(s, sub(1.0f, s)); }
};

// -------------------------------------------------------- gated activations
// y = gate(a) * lin(b); da = dy * gate'(a) * lin(b); db = dy * gate(a) * lin'(b);
// s = sigmoid(arg(a)) as for the unary activations.
template <class U>
struct GatedFromUnary {  // gate = U, lin = identity (b itself, derivative ones)
  static constexpr bool SIGMOID = U::SIGMOID;
  static __device__ __forceinline__ float arg(float a, const Params& p) { return U::arg(a, p); }
  static __device__ __forceinline__ float gate(float a, float s, const Params& p) { return U::f(a, s, p); }
  static __device__ __forceinline__ float gate_d(float a, float s, const Params& p) { return U::df(a, s, p); }
  static __device__ __forceinline__ float lin(float b, const Params&) { return b; }
  static __device__ __forceinline__ float lin_d(float, const Params&) { return 1.0f; }
};

struct ClampedSwiglu {  // p0 = limit, p1 = alpha, p2 = glu_linear_offset
  static constexpr bool SIGMOID = true;
  // s = sigmoid(alpha * ac), ac = clamp_max(a, limit); gate = ac * s
  static __device__ __forceinline__ float arg(float a, const Params& p) { return mul(p.p1, clamp_max_f(a, p.p0)); }
  static __device__ __forceinline__ float gate(float a, float s, const Params& p) {
    return mul(clamp_max_f(a, p.p0), s);
  }
  // where(a <= limit, s + alpha * ac * s * (1.0 - s), 0)
  static __device__ __forceinline__ float gate_d(float a, float s, const Params& p) {
    const float ac = clamp_max_f(a, p.p0);
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
  static constexpr bool SIGMOID = true;
  // beta1 * tanh(a / beta1) * s, s = sigmoid(a)
  static __device__ __forceinline__ float arg(float a, const Params&) { return a; }
  static __device__ __forceinline__ float gate(float a, float s, const Params& p) {
    return mul(mul(p.p0, tanhf(mul(a, p.p1))), s);
  }
  // (1.0 - t * t) * s + beta1 * t * s * (1.0 - s)
  static __device__ __forceinline__ float gate_d(float a, float s, const Params& p) {
    const float t = tanhf(mul(a, p.p1));
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
  static __device__ __forceinline__ float fwd(float a, float, float s, const Params& p) { return A::f(a, s, p); }
  static __device__ __forceinline__ float bwd_a(float dy, float a, float, float s, const Params& p) {
    return mul(dy, A::df(a, s, p));
  }
  static __device__ __forceinline__ float bwd_b(float, float, float, float, const Params&) { return 0.0f; }
};

template <class A>
struct Apply<A, true> {
  static __device__ __forceinline__ float fwd(float a, float b, float s, const Params& p) {
    return mul(A::gate(a, s, p), A::lin(b, p));
  }
  static __device__ __forceinline__ float bwd_a(float dy, float a, float b, float s, const Params& p) {
    return mul(mul(dy, A::gate_d(a, s, p)), A::lin(b, p));
  }
  static __device__ __forceinline__ float bwd_b(float dy, float a, float b, float s, const Params& p) {
    return mul(mul(dy, A::gate(a, s, p)), A::lin_d(b, p));
  }
};

// s[k] = sigmoid(A::arg(a[k])) for a vector (see rcp_fast); zeros when A has no sigmoid.
template <class A, int V>
__device__ __forceinline__ void sigmoids(const float (&a)[V], const Params& p, float (&s)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) s[k] = 0.0f;
  if (!A::SIGMOID) return;
  float d[V];
  bool fast = true;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    d[k] = sigmoid_denominator(A::arg(a[k], p));
    fast = fast & rcp_fast_ok(d[k]);
  }
  if (fast) {
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = rcp_fast(d[k]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = 1.0f / d[k];
  }
}

// y[k] = act(a[k], b[k]) for a vector.
template <class A, bool GATED, int V>
__device__ __forceinline__ void act_forward(const float (&a)[V], const float (&b)[V], const Params& p,
                                            float (&y)[V]) {
  float s[V];
  sigmoids<A, V>(a, p, s);
#pragma unroll
  for (int k = 0; k < V; ++k) y[k] = Apply<A, GATED>::fwd(a[k], b[k], s[k], p);
}

// da[k], db[k] (db only when gated, zeros otherwise) for a vector.
template <class A, bool GATED, int V>
__device__ __forceinline__ void act_backward(const float (&g)[V], const float (&a)[V], const float (&b)[V],
                                             const Params& p, float (&da)[V], float (&db)[V]) {
  float s[V];
  sigmoids<A, V>(a, p, s);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    da[k] = Apply<A, GATED>::bwd_a(g[k], a[k], b[k], s[k], p);
    db[k] = GATED ? Apply<A, GATED>::bwd_b(g[k], a[k], b[k], s[k], p) : 0.0f;
  }
}
