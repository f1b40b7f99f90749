// Per-block column sums of the element-wise kernels' bias gradients (activation.cu, activation_quantize.cu):
// each thread's V column sums (one set per half when gated) reduced over threadIdx.y in the block's dynamic
// shared memory, then written as the block's row of partial sums, which column_sums.cuh adds up.
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once


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
