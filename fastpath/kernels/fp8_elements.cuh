// Element helpers of the FP8 quantization kernels (cast_fp8.cu, fp8_block.cu, mxfp8.cu), after elements16.cuh:
// packed element access, rounded 16-byte stores, the FP8 conversions (one value, four packed) and the
// reference's reciprocal.
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once

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




__device__ __forceinline__ u32 cast_fp8(float v, int e5m2) {
    return (u32)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}


__device__ __forceinline__ float fp8_to_f32(u32 q, int e5m2) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, e5m2 ? __NV_E5M2 : __NV_E4M3);
    return __half2float(__half(h));
}


__device__ __forceinline__ float reciprocal_rn(float s) { return f64_to_f32_rn(__drcp_rn(f32_to_f64(s))); }


// The words are left unchanged, but the compiler must assume they changed: values converted from them are
// recomputed after this point instead of being held in registers across barriers (register pressure).
template <int N>
__device__ __forceinline__ void reload(u32 (&w)[N]) {
#ifdef __CUDA_ARCH__
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(w[i]));
#endif
}


// Element j of T values packed little-endian in 32-bit words, exactly as fp32.
// (bf16: the bits moved to the top half, one instruction; fp16: cvt.f32.f16 of either half, one instruction.)
template <typename T>
__device__ __forceinline__ float word_elem(const u32* w, int j) {
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(w[j]);
    } else if constexpr (IsBf16<T>::value) {
        return __uint_as_float((j & 1) ? (w[j >> 1] & 0xFFFF0000u) : (w[j >> 1] << 16));
    } else {
        const __half2 h = *reinterpret_cast<const __half2*>(&w[j >> 1]);
        return (j & 1) ? __high2float(h) : __low2float(h);
    }
}


// Q_F(a), Q_F(b), Q_F(c), Q_F(d) packed little-endian: two cvt.rn.satfinite.*x2.f32 (the same per-value
// rounding as cast_fp8) and one mov.b32 {lo, hi}. E5M2 is a template parameter: one conversion is emitted.
template <bool E5M2>
__device__ __forceinline__ u32 cast_fp8x4(float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    u32 r;
    if constexpr (E5M2) {
        asm("{ .reg .b16 lo, hi; cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1; cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;"
            " mov.b32 %0, {lo, hi}; }" : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
    } else {
        asm("{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1; cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;"
            " mov.b32 %0, {lo, hi}; }" : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
    }
    return r;
#else
    const int e5m2 = E5M2 ? 1 : 0;
    return cast_fp8(a, e5m2) | (cast_fp8(b, e5m2) << 8) | (cast_fp8(c, e5m2) << 16) | (cast_fp8(d, e5m2) << 24);
#endif
}

// Four row maxima ra[0..3] held by each lane of a group, reduced over the group and scattered: the lane whose bits
// D2 and D1 are (b2, b1) ends with the maximum, over the lanes that differ from it in those bits, of row 2*b2 + b1
// (it exchanges two rows with lane ^ D2, then one row with lane ^ D1). Callers reduce further over other lane bits.
template <int D2, int D1>
__device__ __forceinline__ float max4_scattered(const float (&ra)[4], int lane) {
    const bool b2 = (lane & D2) != 0, b1 = (lane & D1) != 0;
    float h0 = b2 ? ra[2] : ra[0], h1 = b2 ? ra[3] : ra[1];  // rows 2*b2, 2*b2 + 1
    const float g0 = b2 ? ra[0] : ra[2], g1 = b2 ? ra[1] : ra[3];
    h0 = f32_max(h0, __shfl_xor_sync(0xffffffffu, g0, D2));
    h1 = f32_max(h1, __shfl_xor_sync(0xffffffffu, g1, D2));
    const float ar = b1 ? h1 : h0;  // row 2*b2 + b1
    return f32_max(ar, __shfl_xor_sync(0xffffffffu, b1 ? h0 : h1, D1));
}
