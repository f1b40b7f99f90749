// fp32 and the 16-bit element types of the quantization kernels (cast_fp8.cu, fp8_block.cu, mxfp8.cu,
// nvfp4.cu): exact widening of values and of raw 16-bit bits, one RNE narrowing to bits, and NaN / inf
// classification by bits (no dependence on <cmath> under NVRTC).
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ float bits16_to_f32(u32 b);
template <> __device__ __forceinline__ float bits16_to_f32<__half>(u32 b) {
    return __half2float(__ushort_as_half((unsigned short)b));
}
template <> __device__ __forceinline__ float bits16_to_f32<__nv_bfloat16>(u32 b) {
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)b));
}
template <typename T> __device__ __forceinline__ u32 f32_to_bits16(float v);
template <> __device__ __forceinline__ u32 f32_to_bits16<__half>(float v) { return __half_as_ushort(__float2half_rn(v)); }
template <> __device__ __forceinline__ u32 f32_to_bits16<__nv_bfloat16>(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ bool is_nan(float v) { return (__float_as_uint(v) & 0x7FFFFFFFu) > 0x7F800000u; }
__device__ __forceinline__ bool is_inf(float v) { return (__float_as_uint(v) & 0x7FFFFFFFu) == 0x7F800000u; }
