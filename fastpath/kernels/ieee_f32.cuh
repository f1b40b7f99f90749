// IEEE fp32 operations for the quantization kernels (cast_fp8.cu, fp8_block.cu, mxfp8.cu, nvfp4.cu).
//
// CuPy appends -ftz=true to every NVRTC compile, after the caller's options, and NVRTC honours the last
// occurrence: ordinary fp32 arithmetic, comparisons and conversions would then compile to their .ftz forms,
// which flush subnormal operands and results to zero. torch's kernels (the reference) keep subnormals, so
// every fp32 operation of those kernels is one of these inline-PTX instructions, which carry no .ftz whatever
// the compile options (and are never contracted into an FMA). The C++ forms serve the host pass only.
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it (so the compile cache keys
// on it too); nvcc (fastpath.compile_check) finds it beside the source.
#pragma once

#ifdef __CUDA_ARCH__
#define F32_UNARY(name, ptx, expr) \
    __device__ __forceinline__ float name(float a) { float r; asm(ptx " %0, %1;" : "=f"(r) : "f"(a)); return r; }
#define F32_BINARY(name, ptx, expr)                                                 \
    __device__ __forceinline__ float name(float a, float b) {                       \
        float r;                                                                    \
        asm(ptx " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                         \
        return r;                                                                   \
    }
#define F32_TERNARY(name, ptx, expr)                                                \
    __device__ __forceinline__ float name(float a, float b, float c) {              \
        float r;                                                                    \
        asm(ptx " %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));             \
        return r;                                                                   \
    }
#define F32_COMPARE(name, cmp, expr)                                                \
    __device__ __forceinline__ bool name(float a, float b) {                        \
        unsigned r;                                                                 \
        asm("{ .reg .pred p; setp." cmp ".f32 p, %1, %2; selp.u32 %0, 1, 0, p; }"   \
            : "=r"(r) : "f"(a), "f"(b));                                            \
        return r != 0u;                                                             \
    }
#else
#define F32_UNARY(name, ptx, expr) __device__ __forceinline__ float name(float a) { return expr; }
#define F32_BINARY(name, ptx, expr) __device__ __forceinline__ float name(float a, float b) { return expr; }
#define F32_TERNARY(name, ptx, expr) __device__ __forceinline__ float name(float a, float b, float c) { return expr; }
#define F32_COMPARE(name, cmp, expr) __device__ __forceinline__ bool name(float a, float b) { return expr; }
__device__ __forceinline__ float host_sat(float r) { return r != r ? 0.0f : (r < 0.0f ? 0.0f : (r > 1.0f ? 1.0f : r)); }
#endif
F32_BINARY(f32_mul, "mul.rn.f32", a * b)
F32_BINARY(f32_add, "add.rn.f32", a + b)
F32_BINARY(f32_sub, "sub.rn.f32", a - b)
F32_BINARY(f32_div, "div.rn.f32", a / b)
F32_BINARY(f32_max, "max.f32", fmaxf(a, b))
F32_BINARY(f32_min, "min.f32", fminf(a, b))
F32_UNARY(f32_abs, "abs.f32", fabsf(a))
F32_UNARY(f32_neg, "neg.f32", -a)
F32_UNARY(f32_floor, "cvt.rmi.f32.f32", floorf(a))
F32_UNARY(f32_rint, "cvt.rni.f32.f32", rintf(a))
F32_COMPARE(f32_lt, "lt", a < b)
F32_COMPARE(f32_gt, "gt", a > b)
F32_COMPARE(f32_eq, "eq", a == b)
// Saturating forms (result clamped to [0, 1], NaN to +0) and the fused multiply-add: used only by
// nvfp4.cu's E2M1 encodings, whose every step is exact or a single rounding of an exact value (see there).
F32_BINARY(f32_mul_sat, "mul.rn.sat.f32", host_sat(a * b))
F32_TERNARY(f32_fma, "fma.rn.f32", fmaf(a, b, c))
F32_TERNARY(f32_fma_sat, "fma.rn.sat.f32", host_sat(fmaf(a, b, c)))
// Rounded toward -infinity (nvfp4.cu's e2m1_sr_min3: a floor on an integer grid). The host forms round to nearest;
// they serve the host pass only.
F32_BINARY(f32_add_rm, "add.rm.f32", a + b)
F32_TERNARY(f32_fma_rm, "fma.rm.f32", fmaf(a, b, c))
// fp32 <-> fp64 conversions, also without .ftz (the double arithmetic itself never flushes).
#ifdef __CUDA_ARCH__
__device__ __forceinline__ double f32_to_f64(float a) {
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ float f64_to_f32_rn(double a) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(a));
    return r;
}
#else
__device__ __forceinline__ double f32_to_f64(float a) { return (double)a; }
__device__ __forceinline__ float f64_to_f32_rn(double a) { return (float)a; }
#endif
