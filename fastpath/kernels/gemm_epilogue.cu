// The bias epilogue of a GEMM whose cuBLAS call cannot take the bias: torch._scaled_mm takes no bias with FP8
// block scales, so those GEMMs write fp32 and this kernel finishes them in one pass.
//
// Specification: the reference's Linear+Bias arithmetic (refops/kernels/reference/gemm.py, bias=):
//   out[r, c] = RN16(RN32(wide[r, c] + float(bias[c])))
// one IEEE fp32 add (add.rn.f32, subnormals kept) and one round-to-nearest-even to the 16-bit output,
// exactly what torch computes for (wide + bias.float()).to(out_dtype), which was two passes over the fp32
// result (add, then cast) and a second fp32 buffer.
//
// Layout: a thread takes four consecutive values of a row (cols % 4 == 0: one 16-byte load, one 8-byte
// store); grid-stride loop over the (rows * cols / 4) quads.
// Kernels: bias_add_round_{out}_{bias}, out in {bf16, f16}, bias in {bf16, f16 (= out), f32}.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef long long i64;

#include "ieee_f32.cuh"
#include "elements16.cuh"

template <typename Out, typename Bias>
__device__ __forceinline__ void bias_add_round(const float* __restrict__ wide, const Bias* __restrict__ bias,
                                               Out* __restrict__ out, i64 rows, i64 cols) {
    const i64 quads = rows * cols / 4;
    for (i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += (i64)gridDim.x * blockDim.x) {
        const float4 v = reinterpret_cast<const float4*>(wide)[q];
        const i64 c = (q * 4) % cols;
        const u32 b0 = f32_to_bits16<Out>(f32_add(v.x, to_f32(bias[c])));
        const u32 b1 = f32_to_bits16<Out>(f32_add(v.y, to_f32(bias[c + 1])));
        const u32 b2 = f32_to_bits16<Out>(f32_add(v.z, to_f32(bias[c + 2])));
        const u32 b3 = f32_to_bits16<Out>(f32_add(v.w, to_f32(bias[c + 3])));
        reinterpret_cast<uint2*>(out)[q] = make_uint2(b0 | (b1 << 16), b2 | (b3 << 16));
    }
}

#define BIAS_ADD_ROUND(OUT, OUT_NAME, BIAS, BIAS_NAME)                                                          \
    extern "C" __global__ void __launch_bounds__(256) bias_add_round_##OUT_NAME##_##BIAS_NAME(                  \
        const float* wide, const BIAS* bias, OUT* out, i64 rows, i64 cols) {                                    \
        bias_add_round<OUT, BIAS>(wide, bias, out, rows, cols);                                                 \
    }

BIAS_ADD_ROUND(__nv_bfloat16, bf16, __nv_bfloat16, bf16)
BIAS_ADD_ROUND(__nv_bfloat16, bf16, float, f32)
BIAS_ADD_ROUND(__half, f16, __half, f16)
BIAS_ADD_ROUND(__half, f16, float, f32)
