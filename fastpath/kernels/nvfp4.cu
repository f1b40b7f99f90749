// NVFP4: E2M1 data in 1x16 blocks (or 16x16 tiles), E4M3 block scales, an fp32 global amax.
//
// Specification: refops/kernels/reference/quant_nvfp4.py and refops.formats (recipes-numerics §2.5).
// One orientation (row-wise: x (M, K); column-wise: x^T (K, M), after the RHT when asked), global amax A:
//   S_enc = fminf(RN(fl(6E) / A), FLT_MAX), 1 where A == 0 or S_enc == 0;  S_dec = RN(1 / S_enc);
//   block amax b (2D: of the 16x16 tile);
//   standard: s_b = Q_E4M3(fminf(RN(b * RN(S_enc * fl(1/6))), FLT_MAX));
//   enc_b = fminf(RN(1 / RN(float(s_b) * S_dec)), FLT_MAX);  v = RN(x * enc_b);
//   q = E2M1 RNE satfinite (threshold rule, -0 -> 8, NaN -> 7) or the reference's software stochastic
//       rounding with the caller's byte per element (formats.e2m1_stochastic_round, op for op);
//   4over6: base = RN(RN(b / 6) * S_enc), s4 = Q_E4M3(fminf(RN(base * 1.5), 448)), s6 = Q_E4M3(fminf(base, 448)),
//       both encoded with RN, errors accumulated per block in element order (MAE or MSE), the 16 row
//       errors of a 2D tile summed by the tree (r, r+8) -> (r, r+4) -> (r, r+2) -> (r, r+1)
//       (= xor-shuffles 8, 4, 2, 1); map-to-4 iff err4 < err6.
//   RHT (column-wise, bf16): per 16-chunk along M, y_j = bf16(sum_i x_i * m_ij), summed in ascending i
//       from +0.0 in fp32; x_i * m_ij = ±RN(x_i * (±0.25)) exactly, so it is formed as a signed add.
// Data packs element 2j in the low nibble. Scales are written into zero-padded tensors allocated by the
// caller: row-wise [m, k/16], column-wise [k, m/16].
//
// Kernels (suffix = input or output element type):
//   nvfp4_quantize_*     one 64 x (512 bytes of x) tile per block of 256 threads, staged in shared memory
//                        with 16-byte loads; row-wise tasks (row, 16-block) and column-wise tasks
//                        (column, 16-row chunks) read the tile; 2D tiles and 4over6 trees are half-warp
//                        shuffles. Output: 8 bytes per block and task.
//   nvfp4_rht_amax_bf16  thread per (column, 16-row chunk): amax of x and of the bf16 RHT outputs.
//   nvfp4_dequantize_*   row-wise: 16 elements (8 bytes) per thread and step; column-wise: 64x64
//                        tiles transposed through shared memory.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

// ------------------------------------------------------------------ IEEE fp32 operations
// CuPy appends -ftz=true to every NVRTC compile, after the caller's options, and NVRTC honours the last
// occurrence: ordinary fp32 arithmetic, comparisons and conversions would then compile to their .ftz forms,
// which flush subnormal operands and results to zero. torch's kernels (the reference) keep subnormals, so
// every fp32 operation in this file is one of these inline-PTX instructions, which carry no .ftz whatever
// the compile options (and are never contracted into an FMA). The C++ forms serve the host pass only.
#ifdef __CUDA_ARCH__
#define F32_UNARY(name, ptx, expr) \
    __device__ __forceinline__ float name(float a) { float r; asm(ptx " %0, %1;" : "=f"(r) : "f"(a)); return r; }
#define F32_BINARY(name, ptx, expr)                                                 \
    __device__ __forceinline__ float name(float a, float b) {                       \
        float r;                                                                    \
        asm(ptx " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                         \
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
#define F32_COMPARE(name, cmp, expr) __device__ __forceinline__ bool name(float a, float b) { return expr; }
#endif
F32_BINARY(f32_mul, "mul.rn.f32", a * b)
F32_BINARY(f32_add, "add.rn.f32", a + b)
F32_BINARY(f32_sub, "sub.rn.f32", a - b)
F32_BINARY(f32_div, "div.rn.f32", a / b)
F32_BINARY(f32_max, "max.f32", fmaxf(a, b))
F32_BINARY(f32_min, "min.f32", fminf(a, b))
F32_UNARY(f32_abs, "abs.f32", fabsf(a))
F32_UNARY(f32_floor, "cvt.rmi.f32.f32", floorf(a))
F32_UNARY(f32_rint, "cvt.rni.f32.f32", rintf(a))
F32_COMPARE(f32_lt, "lt", a < b)
F32_COMPARE(f32_gt, "gt", a > b)
F32_COMPARE(f32_eq, "eq", a == b)
// Truncation of a non-negative fp32 value to u32 (cvt.rzi, without .ftz).
#ifdef __CUDA_ARCH__
__device__ __forceinline__ u32 f32_to_u32_rz(float a) {
    u32 r;
    asm("cvt.rzi.u32.f32 %0, %1;" : "=r"(r) : "f"(a));
    return r;
}
#else
__device__ __forceinline__ u32 f32_to_u32_rz(float a) { return (u32)a; }
#endif

#define FLT_MAX_F 3.40282347e+38f
#define FL_ONE_SIXTH 0x3E2AAAABu
#define RHT_NEGATIVE_SIGNS 0xD7E8u  // indices i with RHT_SIGN_VECTOR[i] = -1

// ------------------------------------------------------------------ element helpers
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

template <typename O>
__device__ __forceinline__ void store16(O* __restrict__ dst, const float (&f)[16]) {
    if constexpr (sizeof(O) == 4) {
        float4* d = reinterpret_cast<float4*>(dst);
#pragma unroll
        for (int w = 0; w < 4; ++w) d[w] = make_float4(f[4 * w], f[4 * w + 1], f[4 * w + 2], f[4 * w + 3]);
    } else {
        u32 w[8];
#pragma unroll
        for (int p = 0; p < 8; ++p) w[p] = f32_to_bits16<O>(f[2 * p]) | (f32_to_bits16<O>(f[2 * p + 1]) << 16);
        uint4* d = reinterpret_cast<uint4*>(dst);
        d[0] = make_uint4(w[0], w[1], w[2], w[3]);
        d[1] = make_uint4(w[4], w[5], w[6], w[7]);
    }
}

// Q_E4M3: saturating RNE (equal to the reference's clamp to ±448, then cast).
__device__ __forceinline__ u32 cast_e4m3(float v) { return (u32)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }

__device__ __forceinline__ float e4m3_to_f32(u32 q) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, __NV_E4M3);
    return __half2float(__half(h));
}

// Classification by bits (no dependence on <cmath> under NVRTC).
__device__ __forceinline__ bool is_nan(float v) { return (__float_as_uint(v) & 0x7FFFFFFFu) > 0x7F800000u; }
__device__ __forceinline__ bool is_inf(float v) { return (__float_as_uint(v) & 0x7FFFFFFFu) == 0x7F800000u; }
__device__ __forceinline__ bool sign_bit(float v) { return (__float_as_uint(v) >> 31) != 0u; }

// ------------------------------------------------------------------ E2M1 (formats.e2m1_*)
__device__ __forceinline__ float e2m1_to_f32(u32 code) {
    const u32 c = code & 7u;
    const float magnitude = c < 4u ? f32_mul(0.5f, (float)c) : (c < 6u ? (float)(c - 2u) : (c == 6u ? 4.0f : 6.0f));
    return __uint_as_float(__float_as_uint(magnitude) | ((code & 8u) << 28));  // code 8 is -0.0
}

__device__ __forceinline__ u32 e2m1_with_sign(u32 magnitude_code, float v) {
    if (is_nan(v)) return 7u;
    return sign_bit(v) ? magnitude_code + 8u : magnitude_code;
}

// Round to nearest even on the grid 0, .5, 1, 1.5, 2, 3, 4, 6, saturating (NaN -> 7, -0 -> 8). Equal, for
// every fp32 input (checked exhaustively), to the reference's threshold rule (bounds .25 .75 1.25 1.75 2.5
// 3.5 5 tie to the even code): on each binade the code is rintf of an exact affine map of |v|.
__device__ __forceinline__ u32 e2m1_rne(float v) {
    const float a = f32_abs(v);
    float code;
    if (f32_lt(a, 2.0f)) code = f32_rint(f32_mul(a, 2.0f));                      // 0, .5, 1, 1.5, 2
    else if (f32_lt(a, 4.0f)) code = f32_add(f32_rint(f32_sub(a, 2.0f)), 4.0f);  // 2, 3, 4 (a - 2 exact)
    else code = f32_min(f32_add(f32_rint(f32_mul(f32_sub(a, 4.0f), 0.5f)), 6.0f), 7.0f);  // 4, 6, saturation
    return e2m1_with_sign(f32_to_u32_rz(code), v);
}

__device__ __forceinline__ float sr_step(float a) { return f32_lt(a, 2.0f) ? 0.5f : (f32_lt(a, 4.0f) ? 1.0f : 2.0f); }

// formats.e2m1_stochastic_round: u = byte/256; t = |v| + u*step(|v|); q = min(floor(t/step(t))*step(t), 6).
// step is a power of two, so t/step(t) is the exact product t * (1/step(t)); q is always on the grid, so its
// code is computed rather than looked up (both checked against the reference's form over 9e9 inputs).
__device__ __forceinline__ u32 e2m1_sr(float v, u32 byte) {
    const float a = f32_abs(v);
    const float u = f32_mul((float)byte, 0.00390625f);  // byte / 256, exact
    const float t = f32_add(a, f32_mul(u, sr_step(a)));
    const float step_t = sr_step(t);
    const float inv_step_t = f32_lt(t, 2.0f) ? 2.0f : (f32_lt(t, 4.0f) ? 1.0f : 0.5f);
    float q = f32_mul(f32_floor(f32_mul(t, inv_step_t)), step_t);
    q = is_nan(t) ? 6.0f : (f32_gt(q, 6.0f) ? 6.0f : q);
    const u32 code = f32_lt(q, 2.0f) ? f32_to_u32_rz(f32_mul(q, 2.0f))
                                     : (f32_lt(q, 4.0f) ? f32_to_u32_rz(q) + 2u : (f32_lt(q, 5.0f) ? 6u : 7u));
    return e2m1_with_sign(code, v);
}

// ------------------------------------------------------------------ scales
struct GlobalScale {
    float enc, dec;
};

__device__ __forceinline__ GlobalScale global_scale(float amax, float six_e) {
    float enc = f32_min(f32_div(six_e, amax), FLT_MAX_F);
    if (f32_eq(amax, 0.0f) || f32_eq(enc, 0.0f)) enc = 1.0f;
    return {enc, f32_div(1.0f, enc)};
}

// enc_b = fminf(RN(1 / RN(float(s_b) * S_dec)), FLT_MAX)
__device__ __forceinline__ float block_encode_multiplier(u32 s_b, float s_dec) {
    return f32_min(f32_div(1.0f, f32_mul(e4m3_to_f32(s_b), s_dec)), FLT_MAX_F);
}

__device__ __forceinline__ float half_warp_max(float a) {
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

// Sum of the 16 lanes' values in the reference's tree order (all lanes get the sum).
__device__ __forceinline__ float half_warp_tree_sum(float e) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) e = f32_add(e, __shfl_xor_sync(0xffffffffu, e, o));
    return e;
}

struct Options {
    int two_d, use_4over6, mse;
    float six_e;  // fl(6 * E)
};

// Sequential error of one 4over6 candidate: val = RN(RN(RN(e2m1(q_i) * s_c) * A) / fl(6E)).
__device__ __forceinline__ float candidate_error(const float (&v)[16], const u32 (&codes)[16], float scale, float amax,
                                                 const Options& o) {
    float err = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const float val = f32_div(f32_mul(f32_mul(e2m1_to_f32(codes[i]), scale), amax), o.six_e);
        const float diff = f32_sub(val, v[i]);
        err = f32_add(err, o.mse ? f32_mul(diff, diff) : f32_abs(diff));
    }
    return err;
}

// Quantize one block of 16 values: returns the scale byte, codes packed in *lo (elements 0-7), *hi (8-15).
// 2D blocks reduce over the half-warp, so every lane of a warp must call this together.
__device__ __forceinline__ u32 quantize_block(const float (&v)[16], bool sr, const u32 (&rnd)[4], float amax,
                                              GlobalScale gs, const Options& o, u32* lo, u32* hi) {
    float b = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) b = f32_max(b, f32_abs(v[i]));
    if (o.two_d) b = half_warp_max(b);
    u32 codes[16];
    u32 s_b;
    if (!o.use_4over6) {
        s_b = cast_e4m3(f32_min(f32_mul(b, f32_mul(gs.enc, __uint_as_float(FL_ONE_SIXTH))), FLT_MAX_F));
        const float enc = block_encode_multiplier(s_b, gs.dec);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const float x = f32_mul(v[i], enc);
            codes[i] = sr ? e2m1_sr(x, (rnd[i >> 2] >> (8 * (i & 3))) & 0xFFu) : e2m1_rne(x);
        }
    } else {
        const float base = f32_mul(f32_div(b, 6.0f), gs.enc);
        const u32 s4 = cast_e4m3(f32_min(f32_mul(base, 1.5f), 448.0f));
        const u32 s6 = cast_e4m3(f32_min(base, 448.0f));
        const float enc4 = block_encode_multiplier(s4, gs.dec), enc6 = block_encode_multiplier(s6, gs.dec);
        u32 codes4[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            codes4[i] = e2m1_rne(f32_mul(v[i], enc4));
            codes[i] = e2m1_rne(f32_mul(v[i], enc6));
        }
        float err4 = candidate_error(v, codes4, e4m3_to_f32(s4), amax, o);
        float err6 = candidate_error(v, codes, e4m3_to_f32(s6), amax, o);
        if (o.two_d) {
            err4 = half_warp_tree_sum(err4);
            err6 = half_warp_tree_sum(err6);
        }
        const bool map4 = f32_lt(err4, err6);  // ties and NaN errors choose map-to-6
        s_b = map4 ? s4 : s6;
        if (map4)
#pragma unroll
            for (int i = 0; i < 16; ++i) codes[i] = codes4[i];
    }
    *lo = *hi = 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        *lo |= codes[i] << (4 * i);
        *hi |= codes[i + 8] << (4 * i);
    }
    return s_b;
}

// hadamard_transform_16 on one chunk, in place; inputs and outputs are bf16 values held as fp32.
__device__ __forceinline__ void rht16(float (&v)[16], int sign_mask) {
    float p[16];
#pragma unroll
    for (int i = 0; i < 16; ++i)
        p[i] = f32_mul(v[i], (sign_mask && ((RHT_NEGATIVE_SIGNS >> i) & 1u)) ? -0.25f : 0.25f);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) acc = (__popc(i & j) & 1) ? f32_sub(acc, p[i]) : f32_add(acc, p[i]);
        v[j] = __bfloat162float(__float2bfloat16_rn(acc));
    }
}

// ------------------------------------------------------------------ quantize
#define TILE_ROWS 64
#define TILE_BYTES 512                    // bytes of one tile row of x
#define ROW_PITCH (TILE_BYTES + 16)       // shared-memory row pitch (keeps 16-byte reads conflict-light)
#define THREADS 256

template <typename T>
__device__ __forceinline__ float tile_elem(const u8* tile, int r, int c) {
    return to_f32(*reinterpret_cast<const T*>(tile + r * ROW_PITCH + c * (int)sizeof(T)));
}

// The 16 elements of tile row r from column c0 (16-byte aligned), read as 16-byte vectors.
template <typename T>
__device__ __forceinline__ void tile_row16(const u8* tile, int r, int c0, float (&v)[16]) {
    const uint4* p = reinterpret_cast<const uint4*>(tile + r * ROW_PITCH + c0 * (int)sizeof(T));
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint4 q = p[w];
            v[4 * w] = __uint_as_float(q.x); v[4 * w + 1] = __uint_as_float(q.y);
            v[4 * w + 2] = __uint_as_float(q.z); v[4 * w + 3] = __uint_as_float(q.w);
        }
    } else {
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            const uint4 q = p[w];
            const u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) v[8 * w + j] = bits16_to_f32<T>((words[j >> 1] >> (16 * (j & 1))) & 0xFFFFu);
        }
    }
}

__device__ __forceinline__ void load_random(const u8* __restrict__ base, u32 (&rnd)[4]) {
    const uint4 w = *reinterpret_cast<const uint4*>(base);
    rnd[0] = w.x; rnd[1] = w.y; rnd[2] = w.z; rnd[3] = w.w;
}

template <typename T>
__device__ void nvfp4_quantize_impl(const T* __restrict__ x, int M, int K,
                                    u8* __restrict__ row_data, u8* __restrict__ row_scale, int row_ld,
                                    const float* __restrict__ row_amax, const u8* __restrict__ row_rand,
                                    u8* __restrict__ col_data, u8* __restrict__ col_scale, int col_ld,
                                    const float* __restrict__ col_amax, const u8* __restrict__ col_rand,
                                    Options o, int rht, int sign_mask) {
    constexpr int TC = TILE_BYTES / (int)sizeof(T);  // tile columns: 256 (16-bit) or 128 (fp32)
    constexpr int NB = TC / 16;                      // 16-blocks per tile row
    constexpr int VEC = 16 / (int)sizeof(T);         // elements per 16-byte load
    __shared__ __align__(16) u8 tile[TILE_ROWS * ROW_PITCH];

    const int n_tk = (K + TC - 1) / TC;
    const int m0 = (blockIdx.x / n_tk) * TILE_ROWS, k0 = (blockIdx.x % n_tk) * TC;
    const int t = threadIdx.x;

    // Stage the tile (out-of-bounds elements read as zero; K % 16 == 0 keeps vectors whole).
#pragma unroll
    for (int it = 0; it < TILE_ROWS * (TILE_BYTES / 16) / THREADS; ++it) {
        const int idx = t + THREADS * it;
        const int r = idx / (TILE_BYTES / 16), seg = idx % (TILE_BYTES / 16);
        const int m = m0 + r, k = k0 + seg * VEC;
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (m < M && k < K) w = *reinterpret_cast<const uint4*>(x + (i64)m * K + k);
        *reinterpret_cast<uint4*>(tile + r * ROW_PITCH + seg * 16) = w;
    }
    __syncthreads();

    if (row_data != nullptr) {
        const float amax = *row_amax;
        const GlobalScale gs = global_scale(amax, o.six_e);
#pragma unroll 1
        for (int q = t; q < TILE_ROWS * NB; q += THREADS) {
            // 2D: a half-warp holds the 16 rows of one tile; otherwise lanes walk along a row.
            const int r = o.two_d ? (q / (16 * NB)) * 16 + (q & 15) : q / NB;
            const int b = o.two_d ? (q / 16) % NB : q % NB;
            const int m = m0 + r, kb = k0 / 16 + b;
            const bool valid = m < M && 16 * kb < K;
            float v[16];
            tile_row16<T>(tile, r, 16 * b, v);
            u32 rnd[4] = {0u, 0u, 0u, 0u};
            const bool sr = row_rand != nullptr;
            if (sr && valid) load_random(row_rand + (i64)m * K + 16 * kb, rnd);
            u32 lo, hi;
            const u32 s_b = quantize_block(v, sr, rnd, amax, gs, o, &lo, &hi);
            if (valid) {
                *reinterpret_cast<uint2*>(row_data + (i64)m * (K / 2) + 8 * kb) = make_uint2(lo, hi);
                row_scale[(i64)m * row_ld + kb] = (u8)s_b;
            }
        }
    }
    if (col_data != nullptr) {
        const float amax = *col_amax;
        const GlobalScale gs = global_scale(amax, o.six_e);
        constexpr int CHUNKS = TILE_ROWS / 16 * TC / THREADS;  // chunks per thread: 4 (16-bit) or 2 (fp32)
        const int c = t % TC, k = k0 + c;
#pragma unroll 1
        for (int j = 0; j < CHUNKS; ++j) {
            const int chunk = (t / TC) * CHUNKS + j;
            const int m = m0 + 16 * chunk;  // first row of the chunk; M % 16 == 0
            const bool valid = k < K && m < M;
            float v[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) v[i] = tile_elem<T>(tile, 16 * chunk + i, c);
            if (rht) rht16(v, sign_mask);
            u32 rnd[4] = {0u, 0u, 0u, 0u};
            const bool sr = col_rand != nullptr;
            if (sr && valid) load_random(col_rand + (i64)k * M + m, rnd);
            u32 lo, hi;
            const u32 s_b = quantize_block(v, sr, rnd, amax, gs, o, &lo, &hi);
            if (valid) {
                *reinterpret_cast<uint2*>(col_data + (i64)k * (M / 2) + m / 2) = make_uint2(lo, hi);
                col_scale[(i64)k * col_ld + m / 16] = (u8)s_b;
            }
        }
    }
}

// Max over the block; the result is valid in thread 0.
__device__ __forceinline__ float block_max(float m) {
    __shared__ float partial[THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = f32_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) partial[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < THREADS / 32 ? partial[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = f32_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    return m;
}

// Pass 1 of a column-wise RHT quantization: amax of x (if amax_x) and of the bf16(RHT(x^T)) chunks.
// A block of 256 threads covers 64 rows x 256 columns; a thread takes one column, four 16-row chunks.
extern "C" __global__ void __launch_bounds__(THREADS)
    nvfp4_rht_amax_bf16(const __nv_bfloat16* __restrict__ x, int M, int K, int sign_mask, float* amax_x,
                        float* amax_rht) {
    const int n_tk = (K + THREADS - 1) / THREADS;
    const int m0 = (blockIdx.x / n_tk) * TILE_ROWS, k = (blockIdx.x % n_tk) * THREADS + threadIdx.x;
    float ax = 0.0f, ay = 0.0f;
    if (k < K) {
#pragma unroll 1
        for (int chunk = 0; chunk < TILE_ROWS / 16; ++chunk) {
            const int m = m0 + 16 * chunk;
            if (m >= M) break;
            float v[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                v[i] = __bfloat162float(x[(i64)(m + i) * K + k]);
                ax = f32_max(ax, f32_abs(v[i]));
            }
            rht16(v, sign_mask);
#pragma unroll
            for (int i = 0; i < 16; ++i) ay = f32_max(ay, f32_abs(v[i]));
        }
    }
    ay = block_max(ay);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax_rht), __float_as_uint(ay));
    if (amax_x != nullptr) {
        ax = block_max(ax);
        if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax_x), __float_as_uint(ax));
    }
}

// ------------------------------------------------------------------ dequantize
// final_scale = RN(RN(float(s_b) * A) * fl(1/(6E))); value = RN(e2m1(q) * final_scale).
__device__ __forceinline__ void decode_block(uint2 packed, float final_scale, float (&out)[16]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        out[i] = f32_mul(e2m1_to_f32(packed.x >> (4 * i)), final_scale);
        out[i + 8] = f32_mul(e2m1_to_f32(packed.y >> (4 * i)), final_scale);
    }
}

// Row-wise data (R, C/2) -> out (R, C).
template <typename O>
__device__ void nvfp4_dequantize_rows_impl(const u8* __restrict__ data, i64 R, i64 C, const u8* __restrict__ scale,
                                           int ld, const float* __restrict__ amax, int amax_per_row,
                                           float inv_six_e, O* __restrict__ out) {
    const i64 blocks_per_row = C / 16, n = R * blocks_per_row;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x; g < n; g += stride) {
        const i64 r = g / blocks_per_row, b = g % blocks_per_row;
        const float a = amax[amax_per_row ? r : 0];
        const float fs = f32_mul(f32_mul(e4m3_to_f32(scale[r * ld + b]), a), inv_six_e);
        float vals[16];
        decode_block(*reinterpret_cast<const uint2*>(data + r * (C / 2) + 8 * b), fs, vals);
        store16(out + r * C + 16 * b, vals);
    }
}

// Column-wise data (K, M/2) -> out (M, K): 64 (k) x 64 (m) tiles transposed through shared memory.
template <typename O>
__device__ void nvfp4_dequantize_cols_impl(const u8* __restrict__ data, int K, int M, const u8* __restrict__ scale,
                                           int ld, const float* __restrict__ amax, int amax_per_row,
                                           float inv_six_e, O* __restrict__ out) {
    __shared__ float tile[64][65];  // [m][k]
    const int n_tm = (M + 63) / 64;
    const int k0 = (blockIdx.x / n_tm) * 64, m0 = (blockIdx.x % n_tm) * 64;
    const int t = threadIdx.x;
    {
        const int kl = t & 63, blk = t >> 6;  // column kl of the tile, rows 16*blk..+15
        const int k = k0 + kl, m = m0 + 16 * blk;
        if (k < K && m < M) {
            const float a = amax[amax_per_row ? k : 0];
            const float fs = f32_mul(f32_mul(e4m3_to_f32(scale[(i64)k * ld + m / 16]), a), inv_six_e);
            float vals[16];
            decode_block(*reinterpret_cast<const uint2*>(data + (i64)k * (M / 2) + m / 2), fs, vals);
#pragma unroll
            for (int i = 0; i < 16; ++i) tile[16 * blk + i][kl] = vals[i];
        }
    }
    __syncthreads();
    {
        const int ml = t >> 2, seg = t & 3;  // row ml of the output tile, columns 16*seg..+15
        const int m = m0 + ml, k = k0 + 16 * seg;
        if (m < M && k < K) {  // K % 16 == 0
            float vals[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) vals[i] = tile[ml][16 * seg + i];
            store16(out + (i64)m * K + k, vals);
        }
    }
}

// ------------------------------------------------------------------ entry points
#define NVFP4_INSTANTIATE(T, SUFFIX)                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS) nvfp4_quantize_##SUFFIX(                             \
        const T* x, int M, int K, u8* row_data, u8* row_scale, int row_ld, const float* row_amax,              \
        const u8* row_rand, u8* col_data, u8* col_scale, int col_ld, const float* col_amax, const u8* col_rand, \
        int two_d, int use_4over6, int mse, float six_e, int rht, int sign_mask) {                              \
        const Options o = {two_d, use_4over6, mse, six_e};                                                      \
        nvfp4_quantize_impl<T>(x, M, K, row_data, row_scale, row_ld, row_amax, row_rand, col_data, col_scale,   \
                               col_ld, col_amax, col_rand, o, rht, sign_mask);                                  \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) nvfp4_dequantize_rows_##SUFFIX(                          \
        const u8* data, i64 R, i64 C, const u8* scale, int ld, const float* amax, int amax_per_row,             \
        float inv_six_e, T* out) {                                                                              \
        nvfp4_dequantize_rows_impl<T>(data, R, C, scale, ld, amax, amax_per_row, inv_six_e, out);               \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) nvfp4_dequantize_cols_##SUFFIX(                          \
        const u8* data, int K, int M, const u8* scale, int ld, const float* amax, int amax_per_row,             \
        float inv_six_e, T* out) {                                                                              \
        nvfp4_dequantize_cols_impl<T>(data, K, M, scale, ld, amax, amax_per_row, inv_six_e, out);               \
    }

NVFP4_INSTANTIATE(float, f32)
NVFP4_INSTANTIATE(__half, f16)
NVFP4_INSTANTIATE(__nv_bfloat16, bf16)
