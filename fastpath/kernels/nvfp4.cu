// NVFP4: E2M1 data in 1x16 blocks (or 16x16 tiles), E4M3 block scales, an fp32 global amax.
//
// Specification: refops/kernels/reference/quant_nvfp4.py and refops.formats (docs/recipes/nvfp4.md#the-arithmetic).
// One orientation (row-wise: x (M, K); column-wise: x^T (K, M), after the RHT when asked), global amax A:
//   S_enc = fminf(RN(fl(6E) / A), FLT_MAX), 1 where A == 0 or S_enc == 0;  S_dec = RN(1 / S_enc);
//   block amax b (2D: of the 16x16 tile);
//   standard: s_b = Q_E4M3(fminf(RN(b * RN(S_enc * fl(1/6))), FLT_MAX));
//   enc_b = fminf(RN(1 / RN(float(s_b) * S_dec)), FLT_MAX);  v = RN(x * enc_b);
//   q = E2M1 RNE satfinite (threshold rule, -0 -> 8, NaN -> 7) or the reference's software stochastic
//       rounding with the caller's byte per element (formats.e2m1_stochastic_round, op for op);
//   4over6: base = RN(RN(b / 6) * S_enc), s4 = Q_E4M3(fminf(RN(base * 1.5), 448)), s6 = Q_E4M3(fminf(base, 448)),
//       both encoded with RN, errors accumulated per block in element order (MAE or MSE), the 16 row
//       errors of a 2D tile summed by the tree (r, r+8) -> (r, r+4) -> (r, r+2) -> (r, r+1);
//       map-to-4 iff err4 < err6.
//   RHT (column-wise, bf16): per 16-chunk along M, y_j = bf16(sum_i x_i * m_ij), summed in ascending i
//       from +0.0 in fp32; x_i * m_ij = ±RN(x_i * (±0.25)) exactly, so it is formed as a signed add.
// Data packs element 2j in the low nibble. Scales are written into tensors allocated by the caller
// (zero-padded where the padded shape exceeds the data): row-wise [m, k/16], column-wise [k, m/16].
//
// Kernels (suffix = input or output element type):
//   nvfp4_amax_*            pass 1: streaming NaN-skipping amax (4 x 16-byte loads per thread and step).
//   nvfp4_rht_amax_bf16     pass 1 with the column-wise RHT: amax of x and of the bf16 RHT outputs
//                           (a thread takes 4 columns x 16 rows, read as 8-byte loads). The amax of x is
//                           the integer maximum of the |x| bits already taken for rht_exact (the NaN-skipping
//                           packed maximum only for a chunk holding a NaN); an exact chunk's RHT amax is
//                           bf16(fma(max |z|, 0.25, +0)) over the butterfly outputs z, its last stage
//                           folded as |lo| + |hi| (rht16_fwht_absmax_unscaled: no per-output rounding),
//                           and the scaling taken once, on the largest max |z| of a thread's exact chunks
//                           (rht16_output). Its grid is one wave of resident blocks.
//   nvfp4_quantize_<v>_*    pass 2, one kernel per option set <v> (std, 2d, sr, 2d_sr, rht, sr_rht, 4o6,
//                           4o6_2d): persistent blocks walk 64-row x 256-byte tiles (last tile first, so
//                           pass 1's most recent lines are still in L2; tile coordinates advanced by a
//                           subtraction with borrow, no division per tile); tiles are staged in shared memory
//                           by a double-buffered cp.async pipeline (an interior tile from one 64-bit offset per
//                           tile, without bounds checks; outputs addressed from per-tile bases, TileOut; GPU runs
//                           33-34: about 3 instructions per element fewer; one barrier per tile, XOR-swizzled
//                           16-byte chunks: conflict-free for both passes); row-wise 16-blocks and column-wise
//                           (2 columns x 16 rows) blocks are read from the stage; every thread writes
//                           8-byte code groups that its neighbours complete to whole 32-byte sectors.
//   nvfp4_dequantize_*      row-wise, 16-bit outputs: a warp per 32 consecutive 16-blocks, a lane per
//                           block decoded through byte-permute tables, halves swapped between lane pairs by
//                           shuffles so that both 16-byte stores of the warp are 512 contiguous bytes (fp32:
//                           a thread per 16-block); one wave of resident blocks, grid-stride. Column-wise:
//                           one 64 x 256 tile of bf16/fp16 pairs (512 threads; fp32: 64 x 64, 256 threads)
//                           per block, a block per tile (m-major), 4 (fp32: >= 6) resident per SM; each
//                           thread's inputs loaded together (all independent; a warp reads 128 contiguous
//                           bytes per data row), decoded into a shared tile (one barrier) and stored as
//                           16-byte chunks; the 16-blocks of a column across the lanes (coalesced data and
//                           scale loads), shared words XOR-swizzled (no bank conflicts).
//
// Fast paths (bit-identical by construction, see each helper): block amaxes as packed 16-bit integer
// maxima of |x| bits (a NaN shows as bits above infinity and sends the block to the exact generic path);
// the encode multipliers enc_b looked up in a 128-entry table per orientation; E2M1 RNE codes as the minimum of
// three fused multiply-adds (e2m1_rne_min3) where a block's scaled values stay below 7, else from three
// saturating ones (e2m1_rne_acc); stochastically rounded codes likewise (e2m1_sr_min3); codes packed with
// shifts; bf16 halves of a word widened by one shift or mask. 4over6: the decoded candidate values
// RN(RN(RN(e2m1(k) * s) * A) / fl(6E)) of every scale byte s and magnitude k are built once per block (a 128 x 8
// table per orientation, the reference's ops), so a block's errors need no division: per element and candidate
// one table load, RN(T - |x|) and the accumulation (equal to the reference's |diff| / diff^2, see
// four_over_six_rne); a block holding a NaN has NaN errors (as in the reference) and maps to 6.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

#include "ieee_f32.cuh"
#include "elements16.cuh"
#include "cp_async.cuh"

// Truncation of a non-negative fp32 value to u32 (cvt.rzi, without .ftz).
#ifdef __CUDA_ARCH__
__device__ __forceinline__ u32 f32_to_u32_rz(float a) {
    u32 r;
    asm("cvt.rzi.u32.f32 %0, %1;" : "=r"(r) : "f"(a));
    return r;
}
// Per 16-bit half: unsigned maximum, minimum and wrapping sum.
__device__ __forceinline__ u32 max_u16x2(u32 a, u32 b) {
    u32 r;
    asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 min_u16x2(u32 a, u32 b) {
    u32 r;
    asm("min.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 add_u16x2(u32 a, u32 b) {
    u32 r;
    asm("add.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#else
__device__ __forceinline__ u32 f32_to_u32_rz(float a) { return (u32)a; }
__device__ __forceinline__ u32 max_u16x2(u32 a, u32 b) {
    const u32 lo = (a & 0xFFFFu) > (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
    const u32 hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
    return lo | (hi << 16);
}
__device__ __forceinline__ u32 min_u16x2(u32 a, u32 b) {
    const u32 lo = (a & 0xFFFFu) < (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
    const u32 hi = (a >> 16) < (b >> 16) ? (a >> 16) : (b >> 16);
    return lo | (hi << 16);
}
__device__ __forceinline__ u32 add_u16x2(u32 a, u32 b) { return ((a + b) & 0xFFFFu) | (((a >> 16) + (b >> 16)) << 16); }
#endif

#define FLT_MAX_F 3.40282347e+38f
#define FL_ONE_SIXTH 0x3E2AAAABu
#define RHT_NEGATIVE_SIGNS 0xD7E8u  // indices i with RHT_SIGN_VECTOR[i] = -1

// ------------------------------------------------------------------ element helpers
// The low / high 16-bit element of a word as fp32 (bf16: the bits moved to the top, one instruction).
template <typename T> __device__ __forceinline__ float lo16_to_f32(u32 w) { return bits16_to_f32<T>(w & 0xFFFFu); }
template <typename T> __device__ __forceinline__ float hi16_to_f32(u32 w) { return bits16_to_f32<T>(w >> 16); }
template <> __device__ __forceinline__ float lo16_to_f32<__nv_bfloat16>(u32 w) { return __uint_as_float(w << 16); }
template <> __device__ __forceinline__ float hi16_to_f32<__nv_bfloat16>(u32 w) { return __uint_as_float(w & 0xFFFF0000u); }

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

__device__ __forceinline__ bool sign_bit(float v) { return (__float_as_uint(v) >> 31) != 0u; }

// ------------------------------------------------------------------ E2M1 (formats.e2m1_*)
// Exact decode, built from bits: magnitude codes 2..7 are 1, 1.5, 2, 3, 4, 6 = ((c + 252) << 22) as fp32 bits.
__device__ __forceinline__ float e2m1_to_f32(u32 code) {
    const u32 c = code & 7u;
    const u32 magnitude = c >= 2u ? (c + 252u) << 22 : (c == 1u ? 0x3F000000u : 0u);
    return __uint_as_float(magnitude | ((code & 8u) << 28));  // code 8 is -0.0
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

// hadamard_transform_16 on one chunk, in place, in the reference's order; inputs and outputs are bf16
// values held as fp32.
__device__ __forceinline__ void rht16_sequential(float (&v)[16], int sign_mask) {
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

// The first butterfly stage of the signed chunk, z[i] = s_i v_i + s_j v_j and z[j] = s_i v_i - s_j v_j (j = i + 1,
// i even), with each sign folded into its add or subtract: b - a for -a + b, (-a) - b for -a - b (the negation an
// operand modifier). Each is the same IEEE operation on the same values as with the signed operands, so the results
// are identical, zeros' signs included.
template <bool SIGNS>
__device__ __forceinline__ void fwht_signed_stage1(const float (&v)[16], float (&z)[16]) {
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
        const bool ni = SIGNS && ((RHT_NEGATIVE_SIGNS >> i) & 1u), nj = SIGNS && ((RHT_NEGATIVE_SIGNS >> (i + 1)) & 1u);
        const float a = v[i], b = v[i + 1];
        if (!ni && !nj) {
            z[i] = f32_add(a, b);
            z[i + 1] = f32_sub(a, b);
        } else if (!ni) {  // a - b, a + b
            z[i] = f32_sub(a, b);
            z[i + 1] = f32_add(a, b);
        } else if (!nj) {  // -a + b, -a - b
            z[i] = f32_sub(b, a);
            z[i + 1] = f32_sub(f32_neg(a), b);
        } else {  // -a - b, -a + b
            z[i] = f32_sub(f32_neg(a), b);
            z[i + 1] = f32_sub(b, a);
        }
    }
}

// The same by the fast Walsh-Hadamard transform (4 butterfly stages, 64 additions), for a chunk whose every
// signed partial sum is exact (rht_exact): then each of the reference's sums is the exact value
// 0.25 * sum_i s_i H_ij x_i whatever the order, and so is every butterfly output; the final
// fma(z, 0.25, +0) scales exactly and turns an exact zero into +0.0, as the reference's sum from +0.0 gives.
// The bf16 RHT output of an exact unscaled butterfly output z: bf16(fma(z, 0.25, +0)). Odd and non-decreasing in
// z, so the largest magnitude of many outputs is the output of the largest |z|.
__device__ __forceinline__ float rht16_output(float z) {
    return __bfloat162float(__float2bfloat16_rn(f32_fma(z, 0.25f, 0.0f)));
}

template <bool SIGNS>
__device__ __forceinline__ void rht16_fwht(float (&v)[16]) {
    float z[16];
    fwht_signed_stage1<SIGNS>(v, z);
#pragma unroll
    for (int b = 2; b < 16; b <<= 1) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            if (i & b) continue;
            const float lo = z[i], hi = z[i | b];
            z[i] = f32_add(lo, hi);
            z[i | b] = f32_sub(lo, hi);
        }
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = rht16_output(z[j]);
}

// max_j |z_j|, the largest unscaled butterfly output of a chunk that rht16_fwht may take (rht_exact), without
// forming the outputs: rht16_output of it is max_j |bf16(RHT(v))_j| (the outputs are rht16_output(z_j), odd and
// non-decreasing); and for the last butterfly pair (lo + hi, lo - hi), both exact, the larger magnitude is
// |lo| + |hi|, which is one of them up to sign and so exact as well.
template <bool SIGNS>
__device__ __forceinline__ float rht16_fwht_absmax_unscaled(const float (&v)[16]) {
    float z[16];
    fwht_signed_stage1<SIGNS>(v, z);
#pragma unroll
    for (int b = 2; b < 8; b <<= 1) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            if (i & b) continue;
            const float lo = z[i], hi = z[i | b];
            z[i] = f32_add(lo, hi);
            z[i | b] = f32_sub(lo, hi);
        }
    }
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = f32_max(m, f32_add(f32_abs(z[i]), f32_abs(z[i + 8])));
    return m;
}


// Whether every signed partial sum of a chunk of 16 bf16 values is exact in fp32, from the chunk's largest
// |x| bits (max_bits) and smallest nonzero |x| bits minus one (min_key; 0xFFFF when all are zero). All
// values are multiples of 2^(e_min - 134) (e_min: smallest nonzero exponent field, subnormals as 1) and every
// partial sum is below 16 * 2^(e_max - 126) = 2^(e_max - 122): exact when that is at most 2^24 units, i.e.
// e_max - e_min <= 12, and finite when e_max <= 250 (which also excludes infinities and NaNs).
__device__ __forceinline__ bool rht_exact(u32 max_bits, u32 min_key) {
    const u32 e_max = max_bits >> 7, e_min = (min_key + 1u) >> 7;
    return e_max <= 250u && e_max <= (e_min > 1u ? e_min : 1u) + 12u;
}

__device__ __forceinline__ void rht16(float (&v)[16], int sign_mask, bool exact) {
    if (!exact) rht16_sequential(v, sign_mask);
    else if (sign_mask) rht16_fwht<true>(v);
    else rht16_fwht<false>(v);
}

// Per 16-bit half of the words of 16 rows: max |x| bits and min (|x| bits - 1), for rht_exact.
__device__ __forceinline__ void rht_exact_keys(const u32 (&w)[16], u32* max_bits, u32* min_key) {
    u32 mx = 0u, mn = 0xFFFFFFFFu;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const u32 a = w[i] & 0x7FFF7FFFu;
        mx = max_u16x2(mx, a);
        mn = min_u16x2(mn, add_u16x2(a, 0xFFFFFFFFu));
    }
    *max_bits = mx;
    *min_key = mn;
}

// ------------------------------------------------------------------ block encoding
struct Options {
    int mse;
    float six_e;  // fl(6 * E)
};

// Per orientation: the global amax A, S_enc, S_dec and the standard scale multiplier RN(S_enc * fl(1/6)).
struct Pass {
    float amax, enc, dec, mult;
};

__device__ __forceinline__ Pass make_pass(float amax, float six_e) {
    const GlobalScale gs = global_scale(amax, six_e);
    return {amax, gs.enc, gs.dec, f32_mul(gs.enc, __uint_as_float(FL_ONE_SIXTH))};
}

// E2M1 RNE of |v| (v not NaN), returned as the fp32 bits of M + code with M = 1.5 * 2^23 (ulp 1):
//   code = rint(min(2a, 4)) + rint(clamp(a - 2, 0, 2)) + rint(clamp(a/2 - 2, 0, 1)),  a = |v|,
// i.e. RNE on each binade of the grid (step .5 below 2, 1 on [2, 4], 2 on [4, 6], saturating at 6).
// Every step is exact or one rounding of an exact value: sat(a * .5) * 4 = min(2a, 4) (a / 2 is exact
// except for subnormal a, whose code is 0 either way); fma(a, .5, -1) = (a - 2) / 2 exactly on [2, 4] and
// fma(a, .5, -2) = a/2 - 2 exactly on [4, 6] (saturated to 0 or 1 outside); each accumulation rounds an
// exact sum to the integer grid once, and whenever a term is a tie the accumulated integer part is even
// (M, M + 4 or M + 6), so ties-to-even on the sum is ties-to-even on the term. A NaN saturates to 0, so
// blocks holding a NaN take e2m1_rne. Equal to e2m1_rne on every non-NaN fp32 input (checked exhaustively).
#define E2M1_ACC_MAGIC 12582912.0f      // 1.5 * 2^23
#define E2M1_ACC_PACK_BIAS 0x3F400000u  // sum over i < 8 of (bits(M) << 4i), modulo 2^32
__device__ __forceinline__ u32 e2m1_rne_acc(float v) {
    const float a = f32_abs(v);
    float acc = f32_fma(f32_mul_sat(a, 0.5f), 4.0f, E2M1_ACC_MAGIC);
    acc = f32_fma(f32_fma_sat(a, 0.5f, -1.0f), 2.0f, acc);
    acc = f32_add(acc, f32_fma_sat(a, 0.5f, -2.0f));
    return __float_as_uint(acc);
}

// The same bits, M + code, for |v| < 7 (v not NaN), in four instructions instead of six: on [0, 6] the code is
// rint of the concave piecewise-linear S(a) = min(2a, a + 2, a/2 + 4) (slopes 2, 1, 1/2 on the binades of the grid;
// S(6) = 7), so M + code = RN(M + S(a)) = min(RN(M + 2a), RN((M + 2) + a), RN((M + 4) + a/2)) because rounding is
// non-decreasing; each term is one rounding of an exact value (one FFMA or FADD, |v| an operand modifier), and a
// tie rounds to the even code, as in e2m1_rne_acc. Below 7 the third term stays under M + 7.5, so no saturation is
// needed: callers check that a block's largest |v| is below 7 (e2m1_rne_below7_ok) and otherwise take the generic
// path. Equal to e2m1_rne_acc for every fp32 |v| < 7 (checked exhaustively: tests/fastpath/e2m1_min3_exhaustive.py);
// the minimum of the three bit patterns (positive floats order as integers) is one VIMNMX3 on sm_90.
__device__ __forceinline__ u32 e2m1_rne_min3(float v) {
    const float a = f32_abs(v);
    const u32 p1 = __float_as_uint(f32_fma(a, 2.0f, E2M1_ACC_MAGIC));
    const u32 p2 = __float_as_uint(f32_add(a, E2M1_ACC_MAGIC + 2.0f));
    const u32 p3 = __float_as_uint(f32_fma(a, 0.5f, E2M1_ACC_MAGIC + 4.0f));
    const u32 m = p1 < p2 ? p1 : p2;
    return m < p3 ? m : p3;
}

// formats.e2m1_stochastic_round of a non-NaN v as the bits M + code, with the random byte at byte j of word w. The
// reference's t = RN(|v| + u * step(|v|)) (u = byte / 256; step 0.5 below 2, 1 below 4, else 2) is one FFMA of
// byte / 512 (built exactly from bits: 2^14 + byte * 2^-9, less 2^14) and 2^clamp(e, 0, 2) (e: |v|'s binade; the
// exponent bits of |v| clamped to [1, 4]). Its code floor(t / step(t)) on the grid, capped at 7, is
// floor(S(t)) with the concave S of e2m1_rne_min3, so M + code = min(RD(M + 2t), RD((M + 2) + t), RD((M + 4) + t/2),
// M + 7) with RD rounding toward -infinity (each one rounding of an exact value; the cap holds for every t,
// infinity included). Equal to e2m1_sr on non-NaN inputs: checked against the reference on every fp32 value below 8
// with three bytes each (tests/fastpath/e2m1_min3_exhaustive.py, 0 mismatches), and in CI with every byte on values
// near every grid point and bound (tests/fastpath/test_e2m1_min3.py).
__device__ __forceinline__ u32 e2m1_sr_min3(float v, u32 w, int j) {
    const float a = f32_abs(v);
    const float u = f32_sub(__uint_as_float(__byte_perm(w, 0x46800000u, 0x7650u + (u32)j)), 16384.0f);
    const float s = __uint_as_float(__float_as_uint(f32_min(f32_max(a, 1.0f), 4.0f)) & 0x7F800000u);
    const float t = f32_fma(u, s, a);
    const u32 p1 = __float_as_uint(f32_fma_rm(t, 2.0f, E2M1_ACC_MAGIC));
    const u32 p2 = __float_as_uint(f32_add_rm(t, E2M1_ACC_MAGIC + 2.0f));
    const u32 p3 = __float_as_uint(f32_fma_rm(t, 0.5f, E2M1_ACC_MAGIC + 4.0f));
    const u32 m = p1 < p2 ? p1 : p2, cap = __float_as_uint(E2M1_ACC_MAGIC + 7.0f);
    const u32 m3 = m < p3 ? m : p3;
    return m3 < cap ? m3 : cap;
}

// Whether every RN(x_i * enc) of a block whose amax is b (NaN-free) is below 7 in magnitude, so that e2m1_rne_min3
// serves: RN is non-decreasing, so the largest |RN(x_i * enc)| is RN(b * enc).
__device__ __forceinline__ bool e2m1_rne_below7_ok(float b, float enc) { return f32_lt(f32_mul(b, enc), 7.0f); }

// Sign bits of a 16-block at the code sign positions (bit 4i+3 of lo for element i < 8, of hi for 8..15).
struct Signs {
    u32 lo, hi;
};

__device__ __forceinline__ Signs signs_of(const float (&v)[16]) {
    Signs s = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        s.lo |= (__float_as_uint(v[i]) >> 31) << (4 * i + 3);
        s.hi |= (__float_as_uint(v[i + 8]) >> 31) << (4 * i + 3);
    }
    return s;
}

// The same from 16-bit elements held in pairs: element 2j in the low half of word j (row-wise blocks).
// Element 2j+1's sign is bit 7 of byte 3 of word j and goes to bit 7 of byte j; element 2j's is bit 7 of
// byte 1 and goes to bit 3 of byte j: two byte gathers per 8 elements and a shift.
__device__ __forceinline__ u32 signs8_of_pairs(u32 w0, u32 w1, u32 w2, u32 w3) {
    const u32 p = __byte_perm(w0, w1, 0x7531), q = __byte_perm(w2, w3, 0x7531);  // bytes 1 and 3 of each
    return (__byte_perm(p, q, 0x7531) & 0x80808080u) | ((__byte_perm(p, q, 0x6420) >> 4) & 0x08080808u);
}

// Column-wise blocks of 16-bit elements: row i's word holds columns 0 (low half) and 1 (high half) of the
// two blocks; rows 2j+1 land on bit 7 and rows 2j on bit 3 of byte j (byte 1 or 3 of each row word).
__device__ __forceinline__ void signs8_of_rows(const u32* w, u32* col0, u32* col1) {
    const u32 pe = __byte_perm(w[0], w[2], 0x7531), qe = __byte_perm(w[4], w[6], 0x7531);
    const u32 po = __byte_perm(w[1], w[3], 0x7531), qo = __byte_perm(w[5], w[7], 0x7531);
    *col0 = (__byte_perm(po, qo, 0x6420) & 0x80808080u) | ((__byte_perm(pe, qe, 0x6420) >> 4) & 0x08080808u);
    *col1 = (__byte_perm(po, qo, 0x7531) & 0x80808080u) | ((__byte_perm(pe, qe, 0x7531) >> 4) & 0x08080808u);
}

// Codes of RN(v_i * enc) for a NaN-free block whose products are below 7 in magnitude (e2m1_rne_below7_ok; enc > 0
// and finite, so the sign of the product, -0 included, is the sign of v_i): magnitudes from e2m1_rne_min3, sign
// bits from sg (the signs of v).
__device__ __forceinline__ void encode16_rne(const float (&v)[16], float enc, Signs sg, u32* lo, u32* hi) {
    u32 l = 0u, h = 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        l += e2m1_rne_min3(f32_mul(v[i], enc)) << (4 * i);
        h += e2m1_rne_min3(f32_mul(v[i + 8], enc)) << (4 * i);
    }
    *lo = (l - E2M1_ACC_PACK_BIAS) | sg.lo;
    *hi = (h - E2M1_ACC_PACK_BIAS) | sg.hi;
}

// Stochastically rounded codes of RN(v_i * enc) for a NaN-free block (e2m1_sr_min3; the signs from sg, as in
// encode16_rne): element i takes byte i % 4 of rnd[i / 4].
__device__ __forceinline__ void encode16_sr(const float (&v)[16], float enc, const u32 (&rnd)[4], Signs sg, u32* lo,
                                            u32* hi) {
    u32 l = 0u, h = 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        l += e2m1_sr_min3(f32_mul(v[i], enc), rnd[i >> 2], i & 3) << (4 * i);
        h += e2m1_sr_min3(f32_mul(v[i + 8], enc), rnd[(i + 8) >> 2], i & 3) << (4 * i);
    }
    *lo = (l - E2M1_ACC_PACK_BIAS) | sg.lo;
    *hi = (h - E2M1_ACC_PACK_BIAS) | sg.hi;
}

// Any block (NaN included): e2m1_rne, or the stochastic rounding with the caller's bytes.
template <bool SR>
__device__ __forceinline__ void encode16_generic(const float (&v)[16], float enc, const u32 (&rnd)[4], u32* lo,
                                                 u32* hi) {
    u32 l = 0u, h = 0u;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const float x = f32_mul(v[i], enc);
        const u32 code = SR ? e2m1_sr(x, (rnd[i >> 2] >> (8 * (i & 3))) & 0xFFu) : e2m1_rne(x);
        if (i < 8) l |= code << (4 * i);
        else h |= code << (4 * (i - 8));
    }
    *lo = l;
    *hi = h;
}

// NaN-skipping amax of 16 values from 0 (fmaxf order does not matter for a maximum).
__device__ __forceinline__ float amax16(const float (&v)[16]) {
    float b = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) b = f32_max(b, f32_abs(v[i]));
    return b;
}

// amax16 through the integer maximum of |v| bits (non-negative floats order as integers); *nan when
// the block holds a NaN (bits above infinity), and then the float form.
__device__ __forceinline__ float amax16_nan(const float (&v)[16], bool* nan) {
    u32 m = 0u;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const u32 a = __float_as_uint(v[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    *nan = m > 0x7F800000u;
    return *nan ? amax16(v) : __uint_as_float(m);
}

// Maximum over the lanes of a group of `width` (a power of two <= 16, aligned) lanes.
template <int WIDTH>
__device__ __forceinline__ float group_max(float a) {
#pragma unroll
    for (int o = 1; o < WIDTH; o <<= 1) a = f32_max(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

// ------------------------------------------------------------------ 4over6
// The reference's decoded value of a candidate code depends only on the scale byte s and the magnitude k:
//   val = RN(RN(RN(e2m1(k) * float(s)) * A) / fl(6E)),  negated (bit for bit) for a negative code,
// since every step is a correctly rounded product or quotient of non-negative non-NaN factors (A >= 0, s
// <= 0x7E) and so symmetric in the sign of e2m1(q). One table T[s][k] (128 x 8 fp32, the same ops) per
// orientation is built once per block; blocks read it through 32-bit shared addresses.
#define VAL_ENTRIES 1024
__device__ __forceinline__ float candidate_value(u32 s, u32 k, float amax, float six_e) {
    return f32_div(f32_mul(f32_mul(e2m1_to_f32(k), e4m3_to_f32(s)), amax), six_e);
}

#ifdef __CUDA_ARCH__
__device__ __forceinline__ float lds_f32(u32 addr) {
    float r;
    asm("ld.shared.f32 %0, [%1];" : "=f"(r) : "r"(addr));
    return r;
}
__device__ __forceinline__ u32 shared_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
#else
__device__ __forceinline__ float lds_f32(u32 addr) { return *reinterpret_cast<const float*>((unsigned long long)addr); }
__device__ __forceinline__ u32 shared_addr(const void* p) { return (u32)(unsigned long long)p; }
#endif

struct Candidates {
    u32 s4, s6, lo4, hi4, lo6, hi6;
    float err4, err6;
};

// Codes and sequential errors of both candidates of a NaN-free block, element by element. The code of
// x_i has x_i's sign (encode16_rne), so val_i = ±T[s][k_i] with x_i's sign and RN(val_i - x_i) =
// ±RN(T[s][k_i] - |x_i|) (RN is symmetric): |diff| and RN(diff * diff) are the reference's bit for bit (a
// zero diff may differ only in its sign), and err = RN(err + |diff|) or RN(err + RN(diff * diff)) runs in the
// reference's element order from +0. The magnitude k_i is the low 3 bits of e2m1_rne_min3's or e2m1_rne_acc's
// result (bits(M) + k_i), so the table address is base4 + 4 * bits with base4 = &T[s4][0] - 4 * bits(M) (mod 2^32).
#define E2M1_ACC_MAGIC_BITS 0x4B400000u  // bits(E2M1_ACC_MAGIC)
template <bool MSE, bool MIN3>
__device__ __forceinline__ void four_over_six_rne(const float (&v)[16], float enc4, float enc6, u32 base4, u32 base6,
                                                  Signs sg, Candidates& c) {
    u32 l4 = 0u, h4 = 0u, l6 = 0u, h6 = 0u;
    float e4 = 0.0f, e6 = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const float x4 = f32_mul(v[i], enc4), x6 = f32_mul(v[i], enc6);
        const u32 b4 = MIN3 ? e2m1_rne_min3(x4) : e2m1_rne_acc(x4), b6 = MIN3 ? e2m1_rne_min3(x6) : e2m1_rne_acc(x6);
        if (i < 8) {
            l4 += b4 << (4 * i);
            l6 += b6 << (4 * i);
        } else {
            h4 += b4 << (4 * (i - 8));
            h6 += b6 << (4 * (i - 8));
        }
        const float a = f32_abs(v[i]);
        const float d4 = f32_sub(lds_f32(base4 + (b4 << 2)), a), d6 = f32_sub(lds_f32(base6 + (b6 << 2)), a);
        e4 = f32_add(e4, MSE ? f32_mul(d4, d4) : f32_abs(d4));
        e6 = f32_add(e6, MSE ? f32_mul(d6, d6) : f32_abs(d6));
    }
    c.lo4 = (l4 - E2M1_ACC_PACK_BIAS) | sg.lo;
    c.hi4 = (h4 - E2M1_ACC_PACK_BIAS) | sg.hi;
    c.lo6 = (l6 - E2M1_ACC_PACK_BIAS) | sg.lo;
    c.hi6 = (h6 - E2M1_ACC_PACK_BIAS) | sg.hi;
    c.err4 = e4;
    c.err6 = e6;
}

// Both 4over6 candidates of one block (val_tab: shared address of this orientation's T); the caller sums 2D
// errors over the tile and picks. A block holding a NaN has NaN errors in the reference (diff = val - NaN,
// and NaN propagates through every later sum), so both are NaN here and the block (2D: its tile) maps to 6.
__device__ __forceinline__ Candidates four_over_six(const float (&v)[16], float b, bool has_nan, Signs sg,
                                                    const Pass& ps, const float* enc_tab, u32 val_tab,
                                                    const Options& o) {
    Candidates c;
    const float base = f32_mul(f32_div(b, 6.0f), ps.enc);
    c.s4 = cast_e4m3(f32_min(f32_mul(base, 1.5f), 448.0f));
    c.s6 = cast_e4m3(f32_min(base, 448.0f));
    const float enc4 = enc_tab[c.s4], enc6 = enc_tab[c.s6];
    if (has_nan) {
        const u32 none[4] = {0u, 0u, 0u, 0u};
        encode16_generic<false>(v, enc4, none, &c.lo4, &c.hi4);
        encode16_generic<false>(v, enc6, none, &c.lo6, &c.hi6);
        c.err4 = c.err6 = __uint_as_float(0x7FFFFFFFu);
    } else {
        const u32 base4 = val_tab + 32u * c.s4 - (E2M1_ACC_MAGIC_BITS << 2);
        const u32 base6 = val_tab + 32u * c.s6 - (E2M1_ACC_MAGIC_BITS << 2);
        const bool min3 = e2m1_rne_below7_ok(b, enc4) && e2m1_rne_below7_ok(b, enc6);
        if (o.mse) {
            if (min3) four_over_six_rne<true, true>(v, enc4, enc6, base4, base6, sg, c);
            else four_over_six_rne<true, false>(v, enc4, enc6, base4, base6, sg, c);
        } else {
            if (min3) four_over_six_rne<false, true>(v, enc4, enc6, base4, base6, sg, c);
            else four_over_six_rne<false, false>(v, enc4, enc6, base4, base6, sg, c);
        }
    }
    return c;
}

// The chosen candidate: map-to-4 iff err4 < err6 (ties and NaN errors choose map-to-6).
__device__ __forceinline__ u32 pick(const Candidates& c, u32* lo, u32* hi) {
    const bool map4 = f32_lt(c.err4, c.err6);
    *lo = map4 ? c.lo4 : c.lo6;
    *hi = map4 ? c.hi4 : c.hi6;
    return map4 ? c.s4 : c.s6;
}

// Scale byte and codes of one block whose amax (2D: tile amax) is b; 4over6 is handled by the callers.
template <bool SR>
__device__ __forceinline__ u32 encode_standard(const float (&v)[16], float b, bool has_nan, Signs sg,
                                               const u32 (&rnd)[4], const Pass& ps, const float* enc_tab, u32* lo,
                                               u32* hi) {
    const u32 s_b = cast_e4m3(f32_min(f32_mul(b, ps.mult), FLT_MAX_F));  // in [0, 0x7E]: b >= 0, not NaN
    const float enc = enc_tab[s_b];  // = block_encode_multiplier(s_b, S_dec)
    if (has_nan || (!SR && !e2m1_rne_below7_ok(b, enc))) encode16_generic<SR>(v, enc, rnd, lo, hi);
    else if (SR) encode16_sr(v, enc, rnd, sg, lo, hi);
    else encode16_rne(v, enc, sg, lo, hi);
    return s_b;
}

__device__ __forceinline__ void load_random(const u8* __restrict__ base, u32 (&rnd)[4]) {
    const uint4 w = *reinterpret_cast<const uint4*>(base);
    rnd[0] = w.x; rnd[1] = w.y; rnd[2] = w.z; rnd[3] = w.w;
}

// ------------------------------------------------------------------ quantize (pass 2)
#define THREADS 256
#define QROWS 64                            // tile rows
#define QROW_BYTES 256                      // bytes of x per tile row (128 bf16/fp16 or 64 fp32 columns)
#define QSTAGES 2
#define QSTAGE_BYTES (QROWS * QROW_BYTES)   // 16 KiB

// Byte offset of 16-byte chunk ch (0..15) of tile row r: chunks XOR-swizzled by (2 * ((r >> 4) & 3)) ^ (r & 7),
// so that the row pass (8 lanes on 8 consecutive rows, one chunk each), the column pass (8 lanes on 8
// consecutive words of rows 16c + i, c = 0..3, or 16 words of two chunk rows) and the cp.async writes
// (8 lanes on one row's chunks) each touch 32 distinct banks per 128 bytes.
__device__ __forceinline__ int chunk_offset(int r, int ch) {
    return r * QROW_BYTES + ((ch ^ ((((r >> 4) & 3) << 1) ^ (r & 7))) << 4);
}

struct QArgs {
    const void* x;
    int M, K;
    u8* row_data;
    u8* row_scale;
    int row_ld;
    const float* row_amax;
    const u8* row_rand;
    u8* col_data;
    u8* col_scale;
    int col_ld;
    const float* col_amax;
    const u8* col_rand;
    Options o;
    int sign_mask;
};

// Whether the tile at (m0, k0), tc columns wide, lies wholly inside x: then none of its chunks or blocks needs a
// bounds check.
__device__ __forceinline__ bool interior_tile(const QArgs& a, int m0, int k0, int tc) {
    return m0 + QROWS <= a.M && k0 + tc <= a.K;
}

// One tile's outputs: each output's address at the tile's first row and column (row-wise: row m0, block k0 / 16;
// column-wise: row k0, block m0 / 16), so that a thread adds only its own offset within the tile; full: interior_tile.
struct TileOut {
    u8* row_data;
    u8* row_scale;
    u8* col_data;
    u8* col_scale;
    bool full;
};

__device__ __forceinline__ TileOut tile_out(const QArgs& a, int m0, int k0, int tc) {
    const bool do_row = a.row_data != nullptr, do_col = a.col_data != nullptr;
    return {do_row ? a.row_data + (i64)m0 * (a.K / 2) + k0 / 2 : nullptr,
            do_row ? a.row_scale + (i64)m0 * a.row_ld + k0 / 16 : nullptr,
            do_col ? a.col_data + (i64)k0 * (a.M / 2) + m0 / 2 : nullptr,
            do_col ? a.col_scale + (i64)k0 * a.col_ld + m0 / 16 : nullptr,
            interior_tile(a, m0, k0, tc)};
}

template <typename T> struct Bits16;
template <> struct Bits16<__nv_bfloat16> { static constexpr u32 inf = 0x7F80u; };
template <> struct Bits16<__half> { static constexpr u32 inf = 0x7C00u; };

// Row-wise 16-blocks of one staged tile. Lane mapping: 8 lanes on 8 rows of one block (1D), or 16 lanes on
// the 16 rows of a 16x16 tile (2D: tile amax and 4over6 error tree by xor-shuffles within the 16 lanes).
template <typename T, bool TWO_D, bool SR, bool FOUR6>
__device__ __forceinline__ void row_pass(const u8* st, int m0, int k0, const TileOut& to, const QArgs& a,
                                         const Pass& ps, const float* enc_tab, u32 val_tab) {
    constexpr int CH = (int)sizeof(T);          // 16-byte chunks per block
    constexpr int NB = QROW_BYTES / (16 * CH);  // blocks per tile row: 8 or 4
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 1
    for (int j = 0; j < NB / 4; ++j) {
        const int r = TWO_D ? 16 * (warp & 3) + (lane & 15) : 8 * warp + (lane & 7);
        const int b = TWO_D ? (lane >> 4) + 2 * (warp >> 2) + 4 * j : (lane >> 3) + 4 * j;
        const int m = m0 + r, kb = (k0 >> 4) + b;
        const bool valid = to.full || (m < a.M && 16 * kb < a.K);
        u32 rnd[4] = {0u, 0u, 0u, 0u};
        if (SR && valid) load_random(a.row_rand + (i64)m * a.K + 16 * kb, rnd);
        u32 w[4 * CH];
#pragma unroll
        for (int q = 0; q < CH; ++q) {
            const uint4 c = *reinterpret_cast<const uint4*>(st + chunk_offset(r, CH * b + q));
            w[4 * q] = c.x; w[4 * q + 1] = c.y; w[4 * q + 2] = c.z; w[4 * q + 3] = c.w;
        }
        float v[16];
        float bmax;
        bool has_nan;
        Signs sg;
        if constexpr (sizeof(T) == 2) {
            sg.lo = signs8_of_pairs(w[0], w[1], w[2], w[3]);
            sg.hi = signs8_of_pairs(w[4], w[5], w[6], w[7]);
            u32 mx = 0u;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                v[2 * i] = lo16_to_f32<T>(w[i]);
                v[2 * i + 1] = hi16_to_f32<T>(w[i]);
                mx = max_u16x2(mx, w[i] & 0x7FFF7FFFu);
            }
            mx = max_u16x2(mx, mx >> 16) & 0xFFFFu;
            has_nan = mx > Bits16<T>::inf;
            bmax = has_nan ? amax16(v) : bits16_to_f32<T>(mx);
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) v[i] = __uint_as_float(w[i]);
            bmax = amax16_nan(v, &has_nan);
            sg = signs_of(v);
        }
        if (TWO_D) bmax = group_max<16>(bmax);
        u32 lo, hi, s_b;
        if constexpr (FOUR6) {
            Candidates c = four_over_six(v, bmax, has_nan, sg, ps, enc_tab, val_tab, a.o);
            if (TWO_D) {
#pragma unroll
                for (int o = 8; o > 0; o >>= 1) {  // rows (r, r+8) -> (r, r+4) -> (r, r+2) -> (r, r+1)
                    c.err4 = f32_add(c.err4, __shfl_xor_sync(0xffffffffu, c.err4, o));
                    c.err6 = f32_add(c.err6, __shfl_xor_sync(0xffffffffu, c.err6, o));
                }
            }
            s_b = pick(c, &lo, &hi);
        } else {
            s_b = encode_standard<SR>(v, bmax, has_nan, sg, rnd, ps, enc_tab, &lo, &hi);
        }
        if (valid) {
            *reinterpret_cast<uint2*>(to.row_data + (i64)r * (a.K / 2) + 8 * b) = make_uint2(lo, hi);
            to.row_scale[(i64)r * a.row_ld + b] = (u8)s_b;
        }
    }
}

// Column-wise blocks of one staged tile: a thread takes one 32-bit word column (2 bf16/fp16 columns or one
// fp32 column) of the 16 rows 16c..16c+15. Lanes: 8 words x 4 chunks (16-bit) or 16 words x 2 chunks (fp32),
// so the 16 columns of a 2D tile sit in 8 (16) neighbouring lanes and the 4 chunk writes of a column fill
// one 32-byte sector.
template <typename T, bool TWO_D, bool SR, bool RHT, bool FOUR6>
__device__ __forceinline__ void col_pass(const u8* st, int m0, int k0, const TileOut& to, const QArgs& a,
                                         const Pass& ps, const float* enc_tab, u32 val_tab) {
    constexpr int CPW = 4 / (int)sizeof(T);  // columns per word
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wd = CPW == 2 ? 8 * warp + (lane & 7) : 16 * (warp >> 1) + (lane & 15);
    const int c = CPW == 2 ? lane >> 3 : (warp & 1) + 2 * (lane >> 4);
    const int m = m0 + 16 * c;
    u32 rnd[CPW][4];
#pragma unroll
    for (int h = 0; h < CPW; ++h) {
        rnd[h][0] = rnd[h][1] = rnd[h][2] = rnd[h][3] = 0u;
        const int k = k0 + CPW * wd + h;
        if (SR && k < a.K && m < a.M) load_random(a.col_rand + (i64)k * a.M + m, rnd[h]);
    }
    u32 w[16];
#pragma unroll
    for (int i = 0; i < 16; ++i)
        w[i] = *reinterpret_cast<const u32*>(st + chunk_offset(16 * c + i, wd >> 2) + 4 * (wd & 3));
    u32 mx = 0u, keys_max = 0u, keys_min = 0u;
    if constexpr (CPW == 2 && !RHT) {
#pragma unroll
        for (int i = 0; i < 16; ++i) mx = max_u16x2(mx, w[i] & 0x7FFF7FFFu);
    }
    if constexpr (RHT) rht_exact_keys(w, &keys_max, &keys_min);
    float v[CPW][16];
    float bmax[CPW];
    bool has_nan[CPW];
    Signs sg[CPW];
    if constexpr (CPW == 2 && !RHT) {
        signs8_of_rows(w, &sg[0].lo, &sg[CPW - 1].lo);
        signs8_of_rows(w + 8, &sg[0].hi, &sg[CPW - 1].hi);
    }
#pragma unroll
    for (int h = 0; h < CPW; ++h) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            if constexpr (CPW == 2) v[h][i] = h ? hi16_to_f32<T>(w[i]) : lo16_to_f32<T>(w[i]);
            else v[h][i] = __uint_as_float(w[i]);
        }
        if constexpr (RHT) rht16(v[h], a.sign_mask, rht_exact((keys_max >> (16 * h)) & 0xFFFFu, (keys_min >> (16 * h)) & 0xFFFFu));
        if constexpr (CPW == 2 && !RHT) {
            const u32 bits = (mx >> (16 * h)) & 0xFFFFu;
            has_nan[h] = bits > Bits16<T>::inf;
            bmax[h] = has_nan[h] ? amax16(v[h]) : bits16_to_f32<T>(bits);
        } else {
            bmax[h] = amax16_nan(v[h], &has_nan[h]);
            sg[h] = signs_of(v[h]);
        }
    }
    if (TWO_D) {
        float t = CPW == 2 ? f32_max(bmax[0], bmax[CPW - 1]) : bmax[0];
        t = group_max<8 * (3 - CPW)>(t);  // 8 lanes x 2 columns, or 16 lanes x 1 column
#pragma unroll
        for (int h = 0; h < CPW; ++h) bmax[h] = t;
    }
    u32 lo[CPW], hi[CPW], s_b[CPW];
    if constexpr (FOUR6) {
        Candidates cd[CPW];
#pragma unroll
        for (int h = 0; h < CPW; ++h) cd[h] = four_over_six(v[h], bmax[h], has_nan[h], sg[h], ps, enc_tab, val_tab, a.o);
        if (TWO_D) {  // columns (c, c+8) -> (c, c+4) -> (c, c+2) -> (c, c+1) of the tile
#pragma unroll
            for (int o = (CPW == 2 ? 4 : 8); o > 0; o >>= 1) {
#pragma unroll
                for (int h = 0; h < CPW; ++h) {
                    cd[h].err4 = f32_add(cd[h].err4, __shfl_xor_sync(0xffffffffu, cd[h].err4, o));
                    cd[h].err6 = f32_add(cd[h].err6, __shfl_xor_sync(0xffffffffu, cd[h].err6, o));
                }
            }
            if (CPW == 2) {
                const float e4 = f32_add(cd[0].err4, cd[CPW - 1].err4), e6 = f32_add(cd[0].err6, cd[CPW - 1].err6);
#pragma unroll
                for (int h = 0; h < CPW; ++h) {
                    cd[h].err4 = e4;
                    cd[h].err6 = e6;
                }
            }
        }
#pragma unroll
        for (int h = 0; h < CPW; ++h) s_b[h] = pick(cd[h], &lo[h], &hi[h]);
    } else {
#pragma unroll
        for (int h = 0; h < CPW; ++h)
            s_b[h] = encode_standard<SR>(v[h], bmax[h], has_nan[h], sg[h], rnd[h], ps, enc_tab, &lo[h], &hi[h]);
    }
#pragma unroll
    for (int h = 0; h < CPW; ++h) {
        const int k = k0 + CPW * wd + h, kt = CPW * wd + h;  // kt: the column within the tile
        if (to.full || (k < a.K && m < a.M)) {
            *reinterpret_cast<uint2*>(to.col_data + (i64)kt * (a.M / 2) + 8 * c) = make_uint2(lo[h], hi[h]);
            to.col_scale[(i64)kt * a.col_ld + c] = (u8)s_b[h];
        }
    }
}

// Pass 2: persistent blocks walk the tiles from the last one (pass 1 read the tensor forwards), each tile
// staged by a double-buffered cp.async pipeline (the next tile loads while this one is processed); one
// barrier per tile (it also guards the stage being refilled, which every thread finished in the previous
// iteration).
template <typename T, bool TWO_D, bool SR, bool RHT, bool FOUR6>
__device__ __forceinline__ void quantize_tiles(const QArgs& a) {
    __shared__ __align__(128) u8 stages[QSTAGES][QSTAGE_BYTES];
    __shared__ float enc_tab[2][128];
    const int t = threadIdx.x;
    const bool do_row = a.row_data != nullptr, do_col = a.col_data != nullptr;
    Pass rp = {0.0f, 1.0f, 1.0f, 0.0f}, cp = rp;
    if (do_row) rp = make_pass(*a.row_amax, a.o.six_e);
    if (do_col) cp = make_pass(*a.col_amax, a.o.six_e);
    if (t < 128) enc_tab[0][t] = block_encode_multiplier((u32)t, rp.dec);
    else enc_tab[1][t - 128] = block_encode_multiplier((u32)(t - 128), cp.dec);
    __shared__ float val_tab[FOUR6 ? 2 : 1][FOUR6 ? VAL_ENTRIES : 1];  // 4over6 candidate values
    if constexpr (FOUR6) {
#pragma unroll 1
        for (int i = t; i < VAL_ENTRIES; i += THREADS) {
            if (do_row) val_tab[0][i] = candidate_value((u32)i >> 3, (u32)i & 7u, rp.amax, a.o.six_e);
            if (do_col) val_tab[1][i] = candidate_value((u32)i >> 3, (u32)i & 7u, cp.amax, a.o.six_e);
        }
    }
    const u32 row_vals = FOUR6 ? shared_addr(val_tab[0]) : 0u, col_vals = FOUR6 ? shared_addr(val_tab[FOUR6 ? 1 : 0]) : 0u;

    constexpr int TC = QROW_BYTES / (int)sizeof(T);  // tile columns
    constexpr int VEC = 16 / (int)sizeof(T);         // elements per chunk
    const int n_tk = (a.K + TC - 1) / TC;
    const int n_tiles = ((a.M + QROWS - 1) / QROWS) * n_tk;
    const T* x = reinterpret_cast<const T*>(a.x);
    // Tile (tm, tk) = divmod(n_tiles - 1 - blockIdx.x - it * gridDim.x, n_tk), walked without divisions:
    // each step subtracts gridDim.x = g_m * n_tk + g_k with a borrow; the walk ends when tm < 0.
    const int g_m = (int)gridDim.x / n_tk, g_k = (int)gridDim.x - g_m * n_tk;
    const int first = n_tiles - 1 - (int)blockIdx.x;
    int tm = first < 0 ? -1 : first / n_tk;
    int tk = first - tm * n_tk;
    auto advance = [&](int& m, int& k) {
        m -= g_m;
        k -= g_k;
        if (k < 0) {
            k += n_tk;
            --m;
        }
    };
    // Thread t stages chunk t % 16 of the tile rows t / 16 + 16 q: in an interior tile, at these element offsets from
    // the tile's first element (one 64-bit product per tile instead of one per chunk and a bounds check each).
    const int s_r = t >> 4, s_ch = t & 15;
    const i64 s_off = (i64)s_r * a.K + s_ch * VEC, s_step = (i64)16 * a.K;
    auto stage = [&](int buf, int sm, int sk) {
        if (sm >= 0) {
            const int m0 = sm * QROWS, k0 = sk * TC;
            u8* st = stages[buf];
            if (interior_tile(a, m0, k0, TC)) {
                const T* src = x + (i64)m0 * a.K + k0 + s_off;
#pragma unroll
                for (int q = 0; q < QSTAGE_BYTES / 16 / THREADS; ++q)
                    cp_async16(st + chunk_offset(s_r + 16 * q, s_ch), src + q * s_step, 16);
            } else {  // an edge tile: chunks outside x are zero-filled
#pragma unroll
                for (int q = 0; q < QSTAGE_BYTES / 16 / THREADS; ++q) {
                    const int id = t + THREADS * q, r = id >> 4, ch = id & 15;
                    const int mm = m0 + r, kk = k0 + ch * VEC;
                    const bool ok = mm < a.M && kk < a.K;  // K % 16 == 0: chunks are whole
                    cp_async16(st + chunk_offset(r, ch), ok ? x + (i64)mm * a.K + kk : x, ok ? 16 : 0);
                }
            }
        }
        cp_async_commit();
    };
    stage(0, tm, tk);
    int nm = tm, nk = tk;  // the next tile
    advance(nm, nk);
#pragma unroll 1
    for (int it = 0; tm >= 0; ++it) {
        cp_async_wait<0>();
        __syncthreads();
        stage((it + 1) % QSTAGES, nm, nk);
        const int m0 = tm * QROWS, k0 = tk * TC;
        const u8* st = stages[it % QSTAGES];
        const TileOut to = tile_out(a, m0, k0, TC);
        if (do_row) row_pass<T, TWO_D, SR, FOUR6>(st, m0, k0, to, a, rp, enc_tab[0], row_vals);
        if (do_col) col_pass<T, TWO_D, SR, RHT, FOUR6>(st, m0, k0, to, a, cp, enc_tab[1], col_vals);
        tm = nm;
        tk = nk;
        advance(nm, nk);
    }
}

// ------------------------------------------------------------------ amax (pass 1)
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

// Per 16-bit half: NaN-skipping bf16 / fp16 maximum (a NaN operand yields the other operand).
#ifdef __CUDA_ARCH__
__device__ __forceinline__ u32 max_bf16x2(u32 a, u32 b) {
    u32 r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 max_f16x2(u32 a, u32 b) {
    u32 r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#else
template <typename T>
__device__ __forceinline__ u32 host_max16(u32 a, u32 b, u32 nan) {
    const float x = bits16_to_f32<T>(a), y = bits16_to_f32<T>(b);
    return x != x ? (y != y ? nan : b) : (y != y ? a : (y > x ? b : a));
}
__device__ __forceinline__ u32 max_bf16x2(u32 a, u32 b) {
    return host_max16<__nv_bfloat16>(a & 0xFFFFu, b & 0xFFFFu, 0x7FFFu) |
           (host_max16<__nv_bfloat16>(a >> 16, b >> 16, 0x7FFFu) << 16);
}
__device__ __forceinline__ u32 max_f16x2(u32 a, u32 b) {
    return host_max16<__half>(a & 0xFFFFu, b & 0xFFFFu, 0x7FFFu) | (host_max16<__half>(a >> 16, b >> 16, 0x7FFFu) << 16);
}
#endif
template <typename T> __device__ __forceinline__ u32 max16x2(u32 a, u32 b);
template <> __device__ __forceinline__ u32 max16x2<__nv_bfloat16>(u32 a, u32 b) { return max_bf16x2(a, b); }
template <> __device__ __forceinline__ u32 max16x2<__half>(u32 a, u32 b) { return max_f16x2(a, b); }

__device__ __forceinline__ void publish_max(float m, float* out) {
    if (threadIdx.x == 0 && out != nullptr) atomicMax(reinterpret_cast<unsigned int*>(out), __float_as_uint(m));
}

// NaN-skipping amax of n16 16-byte vectors into out1 (and out2): 4 independent loads per thread and step;
// 16-bit types reduce |x| pairwise with the NaN-skipping packed maximum.
template <typename T>
__device__ __forceinline__ void amax_impl(const uint4* __restrict__ x, i64 n16, float* out1, float* out2) {
    const i64 stride = (i64)gridDim.x * THREADS;
    u32 acc16 = 0u;
    float acc = 0.0f;
#pragma unroll 1
    for (i64 base = (i64)blockIdx.x * THREADS + threadIdx.x; base < n16; base += 4 * stride) {
        uint4 w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) w[u] = base + u * stride < n16 ? x[base + u * stride] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const u32 words[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                if constexpr (sizeof(T) == 2) acc16 = max16x2<T>(acc16, words[q] & 0x7FFF7FFFu);
                else acc = f32_max(acc, f32_abs(__uint_as_float(words[q])));
            }
        }
    }
    if constexpr (sizeof(T) == 2)
        acc = f32_max(f32_max(0.0f, bits16_to_f32<T>(acc16 & 0xFFFFu)), bits16_to_f32<T>(acc16 >> 16));
    acc = block_max(acc);
    publish_max(acc, out1);
    publish_max(acc, out2);
}

// Pass 1 of a column-wise RHT quantization: amax of x (if amax_x) and of the bf16(RHT(x^T)) chunks.
// A thread takes 4 columns x 16 rows (16 8-byte loads, consecutive lanes on consecutive column groups).
extern "C" __global__ void __launch_bounds__(THREADS)
    nvfp4_rht_amax_bf16(const __nv_bfloat16* __restrict__ x, int M, int K, int sign_mask, float* amax_x,
                        float* amax_rht) {
    const int groups = K / 4;
    const i64 n_tasks = (i64)(M / 16) * groups;
    const i64 stride = (i64)gridDim.x * THREADS;
    const i64 first = (i64)blockIdx.x * THREADS + threadIdx.x;
    // (chunk, group) of the task, advanced by the stride without divisions in the loop
    i64 chunk = first / groups;
    int group = (int)(first - chunk * groups);
    const i64 stride_chunks = stride / groups;
    const int stride_groups = (int)(stride - stride_chunks * groups);
    float ay = 0.0f, my = 0.0f;  // my: the largest unscaled magnitude of the exact chunks
    u32 ax16 = 0u;
#pragma unroll 1
    for (i64 task = first; task < n_tasks; task += stride) {
        const uint2* p = reinterpret_cast<const uint2*>(x + 16 * chunk * K) + group;
        uint2 w[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) w[i] = p[(i64)i * groups];
        u32 wx[16], wy[16], kx_max, kx_min, ky_max, ky_min;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            wx[i] = w[i].x;
            wy[i] = w[i].y;
        }
        rht_exact_keys(wx, &kx_max, &kx_min);
        rht_exact_keys(wy, &ky_max, &ky_min);
        // amax of x: the integer maximum of the |x| bits (ax16 is never NaN) unless a value is NaN (bits above
        // infinity), then the NaN-skipping maximum
        const u32 kmax = max_u16x2(kx_max, ky_max);
        if ((kmax & 0xFFFFu) > 0x7F80u || (kmax >> 16) > 0x7F80u) {
#pragma unroll
            for (int i = 0; i < 16; ++i) ax16 = max_bf16x2(max_bf16x2(ax16, wx[i] & 0x7FFF7FFFu), wy[i] & 0x7FFF7FFFu);
        } else {
            ax16 = max_u16x2(ax16, kmax);
        }
#pragma unroll
        for (int col = 0; col < 4; ++col) {
            float v[16];
#pragma unroll
            for (int i = 0; i < 16; ++i)
                v[i] = (col & 1) ? hi16_to_f32<__nv_bfloat16>(col < 2 ? wx[i] : wy[i])
                                 : lo16_to_f32<__nv_bfloat16>(col < 2 ? wx[i] : wy[i]);
            const int sh = 16 * (col & 1);
            const bool exact = col < 2 ? rht_exact((kx_max >> sh) & 0xFFFFu, (kx_min >> sh) & 0xFFFFu)
                                       : rht_exact((ky_max >> sh) & 0xFFFFu, (ky_min >> sh) & 0xFFFFu);
            if (!exact) {
                rht16_sequential(v, sign_mask);
                ay = f32_max(ay, amax16(v));
            } else {
                my = f32_max(my, sign_mask ? rht16_fwht_absmax_unscaled<true>(v) : rht16_fwht_absmax_unscaled<false>(v));
            }
        }
        group += stride_groups;
        chunk += stride_chunks;
        if (group >= groups) {
            group -= groups;
            ++chunk;
        }
    }
    ay = block_max(f32_max(ay, rht16_output(my)));
    publish_max(ay, amax_rht);
    if (amax_x != nullptr) {
        float ax = f32_max(f32_max(0.0f, bits16_to_f32<__nv_bfloat16>(ax16 & 0xFFFFu)),
                           bits16_to_f32<__nv_bfloat16>(ax16 >> 16));
        ax = block_max(ax);
        publish_max(ax, amax_x);
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

__device__ __forceinline__ bool is_finite(float v) { return (__float_as_uint(v) & 0x7F800000u) != 0x7F800000u; }

// 16-bit outputs of one block as 8 words (elements 2j, 2j+1 in word j). For a finite final scale the 16
// possible results are the 8 magnitudes' O(RN(e2m1 * fs)) and, for codes 8..15, the same with the sign bit
// flipped (RN and the casts are symmetric; zero products keep the sign of the product): each element is
// gathered from byte tables with byte permutes and its sign bit xor-ed in. Otherwise decode_block.
template <typename O>
__device__ __forceinline__ void decode_block16(uint2 packed, float fs, u32 (&out)[8]) {
    if (!is_finite(fs)) {
        float f[16];
        decode_block(packed, fs, f);
#pragma unroll
        for (int p = 0; p < 8; ++p) out[p] = f32_to_bits16<O>(f[2 * p]) | (f32_to_bits16<O>(f[2 * p + 1]) << 16);
        return;
    }
    u32 q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        q[j] = f32_to_bits16<O>(f32_mul(e2m1_to_f32(2 * j), fs)) |
               (f32_to_bits16<O>(f32_mul(e2m1_to_f32(2 * j + 1), fs)) << 16);
    const u32 lo_bytes0 = __byte_perm(q[0], q[1], 0x6420), hi_bytes0 = __byte_perm(q[0], q[1], 0x7531);
    const u32 lo_bytes1 = __byte_perm(q[2], q[3], 0x6420), hi_bytes1 = __byte_perm(q[2], q[3], 0x7531);
#pragma unroll
    for (int g = 0; g < 4; ++g) {  // elements 4g..4g+3
        const u32 s = ((g < 2 ? packed.x : packed.y) >> (16 * (g & 1))) & 0xFFFFu;
        const u32 sel = s & 0x7777u;
        const u32 lo_b = __byte_perm(lo_bytes0, lo_bytes1, sel), hi_b = __byte_perm(hi_bytes0, hi_bytes1, sel);
        // sign bits 3, 7 (11, 15) of s go to bits 15, 31 of the word
        out[2 * g] = __byte_perm(lo_b, hi_b, 0x5140) ^ (((s & 0x88u) * 0x01001000u) & 0x80008000u);
        out[2 * g + 1] = __byte_perm(lo_b, hi_b, 0x7362) ^ (((s & 0x8800u) * 0x00010010u) & 0x80008000u);
    }
}

// Row-wise data (R, C/2) -> out (R, C). Blocks are numbered g = r * (C/16) + b; data and outputs are
// contiguous in g (data row stride C/2 = 8 * C/16). fp32 outputs: a thread per 16-block, grid-stride (row,
// block) advanced without divisions. 16-bit outputs: a warp per chunk of 32 consecutive blocks (1 KiB of
// bf16/fp16), grid-stride over whole chunks: lane L decodes block 16 * (L & 1) + (L >> 1) of the chunk, the
// lane pair (2j, 2j+1) then swaps one 16-byte half (four shuffles) so that each of the warp's two 16-byte
// stores writes 512 contiguous bytes (lane L: half L & 1 of block 16 s + (L >> 1)). An incomplete last chunk
// is decoded a block per lane with direct stores. The decoded words are those of decode_block16 in any case.
template <typename O>
__device__ __forceinline__ void nvfp4_dequantize_rows_impl(const u8* __restrict__ data, i64 R, i64 C,
                                                           const u8* __restrict__ scale, int ld,
                                                           const float* __restrict__ amax, int amax_per_row,
                                                           float inv_six_e, O* __restrict__ out) {
    const i64 nb = C / 16, n = R * nb;
    if constexpr (sizeof(O) == 4) {
        const i64 stride = (i64)gridDim.x * blockDim.x;
        i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x;
        if (g >= n) return;
        i64 r = g / nb, b = g - r * nb;
        const i64 stride_r = stride / nb, stride_b = stride - stride_r * nb;
#pragma unroll 1
        for (; g < n; g += stride) {
            const float a = amax[amax_per_row ? r : 0];
            const uint2 packed = *reinterpret_cast<const uint2*>(data + r * (C / 2) + 8 * b);
            const float fs = f32_mul(f32_mul(e4m3_to_f32(scale[r * ld + b]), a), inv_six_e);
            float vals[16];
            decode_block(packed, fs, vals);
            store16(out + r * C + 16 * b, vals);
            b += stride_b;
            r += stride_r;
            if (b >= nb) {
                b -= nb;
                ++r;
            }
        }
    } else {
        const int lane = threadIdx.x & 31;
        const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
        const i64 n_full = n >> 5;  // whole chunks
        i64 c = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;  // warp-uniform
        if (c < n_full) {
            const u32 odd = (u32)lane & 1u;
            i64 g = 32 * c + 16 * odd + (lane >> 1);
            i64 r = g / nb, b = g - r * nb;
            const i64 step = 32 * warps, step_r = step / nb, step_b = step - step_r * nb;
            const uint2* src = reinterpret_cast<const uint2*>(data) + g;  // block g's 8 bytes
            uint4* dst = reinterpret_cast<uint4*>(out) + 64 * c + lane;    // 16-byte slot of store 0
#pragma unroll 1
            for (; c < n_full; c += warps) {
                const float a = amax[amax_per_row ? r : 0];
                const uint2 packed = *src;
                const float fs = f32_mul(f32_mul(e4m3_to_f32(scale[r * ld + b]), a), inv_six_e);
                u32 w[8];
                decode_block16<O>(packed, fs, w);
                // even lanes keep half 0 (store 0) and send half 1; odd lanes keep half 1 (store 1), send half 0
                u32 keep[4], recv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    keep[i] = odd ? w[4 + i] : w[i];
                    recv[i] = __shfl_xor_sync(0xFFFFFFFFu, odd ? w[i] : w[4 + i], 1);
                }
                const uint4 s0 = odd ? make_uint4(recv[0], recv[1], recv[2], recv[3])
                                     : make_uint4(keep[0], keep[1], keep[2], keep[3]);
                const uint4 s1 = odd ? make_uint4(keep[0], keep[1], keep[2], keep[3])
                                     : make_uint4(recv[0], recv[1], recv[2], recv[3]);
                dst[0] = s0;
                dst[32] = s1;
                src += step;
                dst += 2 * step;
                b += step_b;
                r += step_r;
                if (b >= nb) {
                    b -= nb;
                    ++r;
                }
            }
        }
        if (c == n_full) {  // the incomplete last chunk (n % 32 blocks), if any
            const i64 g = 32 * c + lane;
            if (g < n) {
                const i64 r = g / nb, b = g - r * nb;
                const float a = amax[amax_per_row ? r : 0];
                const uint2 packed = reinterpret_cast<const uint2*>(data)[g];
                const float fs = f32_mul(f32_mul(e4m3_to_f32(scale[r * ld + b]), a), inv_six_e);
                u32 w[8];
                decode_block16<O>(packed, fs, w);
                uint4* d = reinterpret_cast<uint4*>(out) + 2 * g;
                d[0] = make_uint4(w[0], w[1], w[2], w[3]);
                d[1] = make_uint4(w[4], w[5], w[6], w[7]);
            }
        }
    }
}

// Threads per block of the column-wise dequantize: 512 for 16-bit outputs (tiles of 256 m), THREADS for fp32.
#define DEQ_COLS_THREADS(T) (sizeof(T) == 2 ? 512 : THREADS)

// Column-wise data (K, M/2) -> out (M, K), through a shared tile of 64 k x DM m. 16-bit outputs (512 threads):
// a thread decodes columns k, k+1 of one 16-row block into 16 words (k, k+1) of the tile [m][k/2] (DM = 256);
// fp32 (THREADS threads): one column into the float tile [m][k] (DM = 64). Rows of the tile then leave as
// 16-byte stores (a warp writes 4 or 2 whole 128- or 256-byte row segments per store). The 16-blocks of a
// column run fastest across the lanes (16-bit: a warp reads 4 data rows of 128 contiguous bytes and their
// contiguous scale bytes; fp32: 8 data rows of 32 bytes).
// Shared layouts (both bijections of a row's words, the chunk reads undo exactly what the word writes do):
//   16-bit: word kp (k pair) of row ml lies at kp ^ (4 * (ml >> 4 & 7) + 2 * (ml >> 7 & 1)): its 16-byte chunk
//     XOR-swizzled by the row's 16-block mod 8 and, for the tile's second 128 rows, its word pairs swapped
//     inside the chunk. A warp's word writes (16 blocks x 2 k pairs: chunk slot by mb & 7, word by the k pair
//     and mb >> 3) touch 32 distinct banks; 8 lanes read one row's 8 chunks. A thread's chunk reads lie at
//     rows ml0 + 64 q (ml0 < 64), so the pair swap is q >> 1: a register renaming, known at compile time.
//   fp32: chunk ch of row ml lies at ch ^ (2 * (ml >> 4)): free of bank conflicts for both passes.
// One tile per block: the launcher starts a block per tile (grid = n_tm * n_tk), tile blockIdx.x numbered
// m-major (consecutive blocks step k: the blocks in flight together write whole output rows, a contiguous band
// of DM-row groups). Small blocks (one shared tile, 32 or 16 KiB; few registers: DEQ_COLS_MINB resident per SM)
// keep many tiles' loads in flight per SM instead of a persistent block prefetching its next tile into
// registers. A thread's inputs (data words, scale bytes, per-row amaxes) are all issued back to back,
// independent, then decoded into the tile; one barrier, then the tile's chunks are read and stored.
template <typename O>
__device__ __forceinline__ void nvfp4_dequantize_cols_impl(const u8* __restrict__ data, int K, int M,
                                                           const u8* __restrict__ scale, int ld,
                                                           const float* __restrict__ amax, int amax_per_row,
                                                           float inv_six_e, O* __restrict__ out) {
    using u64 = unsigned long long;
    constexpr int NT = DEQ_COLS_THREADS(O);        // threads per block: 512 or THREADS
    constexpr int DM = sizeof(O) == 2 ? 256 : 64;  // tile rows (m)
    constexpr int WPR = 64 * (int)sizeof(O) / 4;   // 32-bit words per tile row: 32 or 64
    constexpr int MBS = DM / 16;                   // 16-blocks per tile column: 16 or 4
    constexpr int NC = sizeof(O) == 2 ? 2 : 1;     // tile columns a thread decodes
    constexpr int CPR = WPR / 4;                   // 16-byte chunks per tile row: 8 or 16
    static_assert(NC * NT / MBS == 64, "a thread per (16-block, tile column group) of the 64 tile columns");
    __shared__ __align__(16) u32 tile[DM * WPR];   // 32 KiB (16-bit) or 16 KiB (fp32)
    // swizzle of row ml's chunks: 16-bit: its block mod 8 over the 8 chunks; fp32: 2 x its block (0..3)
    auto swz = [](int ml) { return sizeof(O) == 2 ? ((ml >> 4) & 7) : ((ml >> 4) << 1); };
    const int n_tk = (K + 63) / 64;
    // tile (tm, tk) = divmod(blockIdx.x, n_tk) (the launcher's grid is exactly the n_tm * n_tk tiles)
    const int tm = (int)blockIdx.x / n_tk, tk = (int)blockIdx.x - tm * n_tk;
    const int t = threadIdx.x;
    const int mb = t & (MBS - 1), kl = NC * (t / MBS);  // rows 16mb..16mb+15, columns kl..kl+NC-1 of the tile
    constexpr int RS = NT / CPR;  // tile rows between a thread's stored chunks: 64 or 16
    static_assert(sizeof(O) != 2 || RS == 64, "the pair swap of row ml0 + RS q (ml0 < RS) is q >> 1");
    const int ml0 = t / CPR, ch = t % CPR;
    const u64 row_step = (u64)RS * (u32)K / (16 / sizeof(O));  // the same in 16-byte chunks
    {
        // the thread's 16-block, where it lies inside the tensor (K % 16 == 0: then so does column kl+1)
        const int k = 64 * tk + kl, m = DM * tm + 16 * mb;
        if (k < K && m < M) {  // (non-negative indices: unsigned address arithmetic)
            uint2 d[NC];
            u32 s[NC];
            float a[NC];
            const u8* dp = data + (u64)(u32)k * (u32)(M / 2) + ((u32)m >> 1);
            const u8* sp = scale + (u64)(u32)k * (u32)ld + ((u32)m >> 4);
#pragma unroll
            for (int h = 0; h < NC; ++h) {
                d[h] = __ldg(reinterpret_cast<const uint2*>(dp + (u64)h * (u32)(M / 2)));
                s[h] = __ldg(sp + (u64)h * (u32)ld);
                a[h] = __ldg(amax + (amax_per_row ? k + h : 0));  // per row, or the global amax
            }
            if constexpr (sizeof(O) == 2) {
                const float fs0 = f32_mul(f32_mul(e4m3_to_f32(s[0]), a[0]), inv_six_e);
                const float fs1 = f32_mul(f32_mul(e4m3_to_f32(s[1]), a[1]), inv_six_e);
                const int kp = kl >> 1;
                // kp ^ (4 * swz(16mb + i) + 2 * ((16mb + i) >> 7 & 1)): rows 16mb..16mb+15 share mb
                const int col = kp ^ (((mb & 7) << 2) | ((mb >> 3) << 1));
                if (is_finite(fs0) && is_finite(fs1)) {  // (decode_block16's table path for both)
                    u32 wa[8], wb[8];
                    decode_block16<O>(d[0], fs0, wa);
                    decode_block16<O>(d[1], fs1, wb);
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        tile[(16 * mb + 2 * j) * WPR + col] = __byte_perm(wa[j], wb[j], 0x5410);
                        tile[(16 * mb + 2 * j + 1) * WPR + col] = __byte_perm(wa[j], wb[j], 0x7632);
                    }
                } else {  // rare (an infinite or NaN final scale): the same words, a column at a time as halves
                    unsigned short* half = reinterpret_cast<unsigned short*>(tile);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        u32 w[8];
                        decode_block16<O>(d[h], h ? fs1 : fs0, w);
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            half[2 * ((16 * mb + 2 * j) * WPR + col) + h] = (unsigned short)(w[j] & 0xFFFFu);
                            half[2 * ((16 * mb + 2 * j + 1) * WPR + col) + h] = (unsigned short)(w[j] >> 16);
                        }
                    }
                }
            } else {
                float vals[16];
                decode_block(d[0], f32_mul(f32_mul(e4m3_to_f32(s[0]), a[0]), inv_six_e), vals);
                const int col = (((kl >> 2) ^ (mb << 1)) << 2) | (kl & 3);  // swz(16mb + i) == 2mb
#pragma unroll
                for (int i = 0; i < 16; ++i) tile[(16 * mb + i) * WPR + col] = __float_as_uint(vals[i]);
            }
        }
    }
    __syncthreads();
    // chunk ch of tile rows ml0 + RS * q: 16 / sizeof(O) outputs at (m0 + ml0 + RS * q, k). All chunks are
    // read first (rows past M hold unwritten words, never stored), then stored: the shared loads overlap.
    const int m = DM * tm + ml0, k = 64 * tk + ch * (16 / (int)sizeof(O));
    uint4 v[DM / RS];
#pragma unroll
    for (int q = 0; q < DM / RS; ++q) {
        const int ml = ml0 + RS * q;
        const uint4 c = *reinterpret_cast<const uint4*>(&tile[ml * WPR + 4 * (ch ^ swz(ml))]);
        // 16-bit, rows 128..255 (q >= 2): words 0, 1, 2, 3 of the chunk were stored at 2, 3, 0, 1
        v[q] = sizeof(O) == 2 && (q >> 1) ? make_uint4(c.z, c.w, c.x, c.y) : c;
    }
    uint4* dst = reinterpret_cast<uint4*>(out + (u64)(u32)m * (u32)K + (u32)k);
#pragma unroll
    for (int q = 0; q < DM / RS; ++q, dst += row_step)
        if (k < K && m + RS * q < M) *dst = v[q];  // K % 16 == 0: chunks are whole
}

// ------------------------------------------------------------------ entry points
// MINB: resident blocks per SM the register budget is sized for (4: <= 64 registers; 3: <= 85; 2: <= 128); the
// launcher's grid is one wave of them (the occupancy query). GPU run 35 timed every form at the next MINB up (none
// spills): 4over6 0.365 -> 0.355 ms at 4 and the RHT form 0.260 -> 0.257 ms at 3, but 1x16 0.197 -> 0.206 ms and
// 16x16 0.247 -> 0.263 ms at 4, so only the first two moved.
#define NVFP4_QUANTIZE_ENTRY(T, SUFFIX, VARIANT, TWO_D, SR, RHT, FOUR6, MINB)                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) nvfp4_quantize_##VARIANT##_##SUFFIX(           \
        const T* x, int M, int K, u8* row_data, u8* row_scale, int row_ld, const float* row_amax,              \
        const u8* row_rand, u8* col_data, u8* col_scale, int col_ld, const float* col_amax, const u8* col_rand, \
        int mse, float six_e, int sign_mask) {                                                                 \
        const QArgs a = {x,        M,         K,      row_data, row_scale, row_ld,           row_amax, row_rand, \
                         col_data, col_scale, col_ld, col_amax, col_rand,  Options{mse, six_e}, sign_mask};    \
        quantize_tiles<T, TWO_D, SR, RHT, FOUR6>(a);                                                           \
    }

// Row-wise dequantize: 6 resident blocks (<= 40 registers) for 16-bit outputs, 8 (<= 32) for fp32.
#define DEQ_ROWS_MINB(T) (sizeof(T) == 2 ? 6 : 8)
// Column-wise dequantize (a block per tile; 16-bit outputs: 512 threads, 32 KiB of shared memory per block,
// 4 resident blocks, <= 32 registers; fp32: THREADS threads, 16 KiB, 6 resident, <= 40 registers); the
// launcher's grid is the number of tiles.
#define DEQ_COLS_MINB(T) (sizeof(T) == 2 ? 4 : 6)

#define NVFP4_INSTANTIATE(T, SUFFIX)                                                                            \
    NVFP4_QUANTIZE_ENTRY(T, SUFFIX, std, false, false, false, false, 3)                                           \
    NVFP4_QUANTIZE_ENTRY(T, SUFFIX, 2d, true, false, false, false, 3)                                             \
    NVFP4_QUANTIZE_ENTRY(T, SUFFIX, sr, false, true, false, false, 3)                                             \
    NVFP4_QUANTIZE_ENTRY(T, SUFFIX, 2d_sr, true, true, false, false, 3)                                           \
    NVFP4_QUANTIZE_ENTRY(T, SUFFIX, 4o6, false, false, false, true, 4)                                            \
    NVFP4_QUANTIZE_ENTRY(T, SUFFIX, 4o6_2d, true, false, false, true, 3)                                          \
    extern "C" __global__ void __launch_bounds__(THREADS) nvfp4_amax_##SUFFIX(const uint4* x, i64 n16,         \
                                                                              float* out1, float* out2) {      \
        amax_impl<T>(x, n16, out1, out2);                                                                      \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, DEQ_ROWS_MINB(T)) nvfp4_dequantize_rows_##SUFFIX(                      \
        const u8* data, i64 R, i64 C, const u8* scale, int ld, const float* amax, int amax_per_row,             \
        float inv_six_e, T* out) {                                                                              \
        nvfp4_dequantize_rows_impl<T>(data, R, C, scale, ld, amax, amax_per_row, inv_six_e, out);               \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(DEQ_COLS_THREADS(T), DEQ_COLS_MINB(T)) nvfp4_dequantize_cols_##SUFFIX(          \
        const u8* data, int K, int M, const u8* scale, int ld, const float* amax, int amax_per_row,             \
        float inv_six_e, T* out) {                                                                              \
        nvfp4_dequantize_cols_impl<T>(data, K, M, scale, ld, amax, amax_per_row, inv_six_e, out);               \
    }

NVFP4_INSTANTIATE(float, f32)
NVFP4_INSTANTIATE(__half, f16)
NVFP4_INSTANTIATE(__nv_bfloat16, bf16)
// The column-wise RHT needs bf16 input.
NVFP4_QUANTIZE_ENTRY(__nv_bfloat16, bf16, rht, false, false, true, false, 3)
NVFP4_QUANTIZE_ENTRY(__nv_bfloat16, bf16, sr_rht, false, true, true, false, 2)
