// Column sums of fp32 partial rows, rounded once to the output type: the weight and bias gradients of norm.cu's
// backward kernels and the bias gradient of activation.cu. out[c] = the sum over the `parts` rows of partial[:, c],
// in one order whatever the launch shape: stripe t (threadIdx.y < COLUMN_SUM_STRIPES) adds rows t, t + S, t + 2S,
// ... from +0, and the stripes' sums are then added in stripe order from +0. A block is 32 x S threads; a thread
// takes VC consecutive columns (VC = 1, 2 or 4: 4-, 8- or 16-byte loads; VC > 1 needs a width that VC divides, so
// that every partial row is aligned), with four rows of each of the ARRAYS arrays in flight.
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once

#define COLUMN_SUM_STRIPES 16

template <int VC>
__device__ __forceinline__ void load_columns(const float* p, float (&v)[VC]) {
  if constexpr (VC == 4) {
    const float4 w = *reinterpret_cast<const float4*>(p);
    v[0] = w.x; v[1] = w.y; v[2] = w.z; v[3] = w.w;
  } else if constexpr (VC == 2) {
    const float2 w = *reinterpret_cast<const float2*>(p);
    v[0] = w.x; v[1] = w.y;
  } else {
    v[0] = *p;
  }
}

// stripe_sum: ARRAYS * S * VC * 33 floats of shared memory, [array][stripe][column of the group][thread] (a warp's
// accesses fall in distinct banks).
template <class Tr, int VC, int ARRAYS>
__device__ __forceinline__ void column_sums_body(const float* const (&partial)[ARRAYS], i64 parts, i64 width,
                                                 typename Tr::raw* const (&out)[ARRAYS], float* stripe_sum) {
  constexpr int S = COLUMN_SUM_STRIPES;
  const i64 c0 = ((i64)blockIdx.x * 32 + threadIdx.x) * VC;
  float s[ARRAYS][VC];
#pragma unroll
  for (int a = 0; a < ARRAYS; ++a)
#pragma unroll
    for (int e = 0; e < VC; ++e) s[a][e] = 0.0f;
  if (c0 < width) {
    i64 j = threadIdx.y;
    for (; j + 3 * S < parts; j += 4 * S) {
      float v[ARRAYS][4][VC];
#pragma unroll
      for (int a = 0; a < ARRAYS; ++a)
#pragma unroll
        for (int u = 0; u < 4; ++u) load_columns<VC>(partial[a] + (j + u * S) * width + c0, v[a][u]);
#pragma unroll
      for (int a = 0; a < ARRAYS; ++a)
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int e = 0; e < VC; ++e) s[a][e] += v[a][u][e];
    }
    for (; j < parts; j += S) {
#pragma unroll
      for (int a = 0; a < ARRAYS; ++a) {
        float v[VC];
        load_columns<VC>(partial[a] + j * width + c0, v);
#pragma unroll
        for (int e = 0; e < VC; ++e) s[a][e] += v[e];
      }
    }
  }
#pragma unroll
  for (int a = 0; a < ARRAYS; ++a)
#pragma unroll
    for (int e = 0; e < VC; ++e) stripe_sum[((a * S + threadIdx.y) * VC + e) * 33 + threadIdx.x] = s[a][e];
  __syncthreads();
  if (threadIdx.y != 0 || c0 >= width) return;
#pragma unroll
  for (int a = 0; a < ARRAYS; ++a)
#pragma unroll
    for (int e = 0; e < VC; ++e) {
      float total = 0.0f;
#pragma unroll
      for (int t = 0; t < S; ++t) total += stripe_sum[((a * S + t) * VC + e) * 33 + threadIdx.x];
      out[a][c0 + e] = Tr::store(total);
    }
}

// The entry points' dispatch on the column group width that the launcher chose (vc: 1, 2 or 4), with one shared
// buffer for every form.
template <class Tr, int ARRAYS>
__device__ __forceinline__ void column_sums(const float* const (&partial)[ARRAYS], i64 parts, i64 width,
                                            typename Tr::raw* const (&out)[ARRAYS], int vc) {
  __shared__ float stripe_sum[ARRAYS * COLUMN_SUM_STRIPES * 4 * 33];
  if (vc == 4) column_sums_body<Tr, 4, ARRAYS>(partial, parts, width, out, stripe_sum);
  else if (vc == 2) column_sums_body<Tr, 2, ARRAYS>(partial, parts, width, out, stripe_sum);
  else column_sums_body<Tr, 1, ARRAYS>(partial, parts, width, out, stripe_sum);
}
