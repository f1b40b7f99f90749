// Element helpers of the FP8 quantization kernels (cast_fp8.cu, fp8_block.cu, mxfp8.cu): exact conversions
// between fp32 and 16-bit element bits, packed element access, rounded 16-byte stores.
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

__device__ __forceinline__ void store_f32(float v, float* out) { *out = v; }
__device__ __forceinline__ void store_f32(float v, __half* out) { *out = __float2half_rn(v); }
__device__ __forceinline__ void store_f32(float v, __nv_bfloat16* out) { *out = __float2bfloat16_rn(v); }

template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<__nv_bfloat16> { static constexpr bool value = true; };

// The bits of element idx of x, and placing them as element j of packed words.
template <typename T>
__device__ __forceinline__ u32 elem_bits(const T* x, i64 idx) {
    if constexpr (sizeof(T) == 4) {
        return reinterpret_cast<const u32*>(x)[idx];
    } else {
        return reinterpret_cast<const unsigned short*>(x)[idx];
    }
}
template <typename T>
__device__ __forceinline__ void set_elem_bits(u32* w, int j, u32 b) {
    if constexpr (sizeof(T) == 4) {
        w[j] = b;
    } else {
        w[j >> 1] |= b << (16 * (j & 1));
    }
}

// 16 bytes of O values (16 / sizeof(O) of them) rounded once from fp32 and stored at a 16-byte aligned address.
template <typename O>
__device__ __forceinline__ void store_vec16(O* __restrict__ dst, const float (&f)[16 / sizeof(O)]) {
    if constexpr (sizeof(O) == 4) {
        *reinterpret_cast<float4*>(dst) = make_float4(f[0], f[1], f[2], f[3]);
    } else {
        u32 w[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) w[p] = f32_to_bits16<O>(f[2 * p]) | (f32_to_bits16<O>(f[2 * p + 1]) << 16);
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}
