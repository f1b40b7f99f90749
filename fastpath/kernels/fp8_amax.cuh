// The two atomic amax updates of the FP8 kernels (cast_fp8.cu, activation_quantize.cu): an exact max of
// non-negative values into a zeroed amax, and delayed scaling's accumulator = fmaxf(accumulator, amax).
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once

// Non-negative fp32 values order like their bit patterns: atomicMax on the bits is an exact max.
__device__ __forceinline__ void atomic_max_nonneg(float* target, float v) {
    atomicMax(reinterpret_cast<unsigned int*>(target), __float_as_uint(v));
}

// accumulator = fmaxf(accumulator, m), the reference's torch.fmax, by compare-and-swap. The accumulator may
// hold anything (negative, -0, NaN), so an integer atomicMax would not do. Each block applies max.f32 with
// the accumulator as first operand to the value it finds; all block maxima are >= +0 and not NaN, so the
// chain over the blocks equals one fmaxf(accumulator, amax) whatever their order.
__device__ __forceinline__ void atomic_fmax_accumulate(float* accumulator, float m) {
    unsigned int* p = reinterpret_cast<unsigned int*>(accumulator);
    unsigned int old = *reinterpret_cast<volatile unsigned int*>(p);
    for (;;) {
        const unsigned int want = __float_as_uint(f32_max(__uint_as_float(old), m));
        if (want == old) return;
        const unsigned int seen = atomicCAS(p, old, want);
        if (seen == old) return;
        old = seen;
    }
}

// Max of m over the whole block, any block shape of a multiple of 32 threads (at most 1024), through the linear
// thread index; the result is valid in thread (0, 0). Uses f32_max, so NaNs are skipped as fmaxf skips them.
// (cast_fp8.cu's block_max, for its one-dimensional blocks, is the same reduction.)
__device__ __forceinline__ float block_max_linear(float m) {
    __shared__ float partial[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = f32_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, warps = (blockDim.x * blockDim.y) >> 5;
    __syncthreads();  // partial may still be read by an earlier call
    if (lane == 0) partial[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < warps ? partial[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = f32_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    return m;
}
