// The 128 x 128 tile input and output of the FP8 kernels that also write a transposed copy (cast_fp8.cu's
// cast + transpose, fp8_block.cu): 512 threads, thread t owns rows 4*(t/16)..+3 and columns 8*(t%16)..+7 of
// a tile; the transposed bytes go through a shared tile of words tile[c][r4] (rows 4*r4..+3 of column c),
// rows padded to 33 words and the word index XOR-swizzled (swizzle), so that both its writes and its 16-byte
// read-out are free of bank conflicts. A thread's 4 rows of bytes become its 8 column words by 4x4 byte
// transposes (transpose4x4), which store_col_words puts through the shared tile.
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once

#define TILE 128
#define TILE_THREADS 512

__device__ __forceinline__ int swizzle(int c, int r4) { return r4 ^ ((c >> 3) << 1); }

template <typename T>
__device__ __forceinline__ void load_tile(const T* __restrict__ x, int M, int K, int m0, int k0, int vec_ok,
                                          u32 (&raw)[4][2 * sizeof(T)]) {
    constexpr int W = 2 * sizeof(T);
    const int t = threadIdx.x, cg = t & 15, rg = t >> 4;
    const int k = k0 + 8 * cg;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + 4 * rg + i;
        if (m < M && vec_ok && k + 8 <= K) {
            const uint4* p = reinterpret_cast<const uint4*>(x + (i64)m * K + k);
#pragma unroll
            for (int h = 0; h < W / 4; ++h) {
                const uint4 a = p[h];
                raw[i][4 * h] = a.x; raw[i][4 * h + 1] = a.y; raw[i][4 * h + 2] = a.z; raw[i][4 * h + 3] = a.w;
            }
        } else {
#pragma unroll
            for (int w = 0; w < W; ++w) raw[i][w] = 0u;  // +0.0: changes no amax, never stored
            if (m < M) {
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    if (k + j < K) set_elem_bits<T>(raw[i], j, elem_bits(x, (i64)m * K + k + j));
            }
        }
    }
}

// 8 bytes of one row, packed little-endian in two words.
__device__ __forceinline__ void store_row_words(u8* __restrict__ out, int M, int K, int m, int k, int vec_ok,
                                                u32 w0, u32 w1) {
    if (m >= M) return;
    u8* dst = out + (i64)m * K + k;
    if (vec_ok && k + 8 <= K) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w0, w1);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (k + j < K) dst[j] = (u8)((j < 4 ? w0 : w1) >> (8 * (j & 3)));
    }
}

// 4x4 byte transpose: byte i of c[j] = byte j of r[i] (two PRMT stages).
__device__ __forceinline__ void transpose4x4(u32 r0, u32 r1, u32 r2, u32 r3, u32* c) {
    const u32 t0 = __byte_perm(r0, r1, 0x5140), t1 = __byte_perm(r0, r1, 0x7362);  // r0.b0 r1.b0 r0.b1 r1.b1 | .b2 .b3
    const u32 t2 = __byte_perm(r2, r3, 0x5140), t3 = __byte_perm(r2, r3, 0x7362);
    c[0] = __byte_perm(t0, t2, 0x5410);
    c[1] = __byte_perm(t0, t2, 0x7632);
    c[2] = __byte_perm(t1, t3, 0x5410);
    c[3] = __byte_perm(t1, t3, 0x7632);
}

// Write the transposed tile (column k of x becomes row k of the (K, M) output).
__device__ __forceinline__ void store_transposed(const u32 (*tile)[33], u8* __restrict__ out, int M, int K, int m0,
                                                 int k0, int vec_ok) {
#pragma unroll
    for (int it = 0; it < 2; ++it) {
        const int idx = threadIdx.x + TILE_THREADS * it;
        const int c = idx >> 3, seg = idx & 7;
        const int k = k0 + c;
        if (k >= K) continue;
        uint4 w;
        w.x = tile[c][swizzle(c, 4 * seg + 0)];
        w.y = tile[c][swizzle(c, 4 * seg + 1)];
        w.z = tile[c][swizzle(c, 4 * seg + 2)];
        w.w = tile[c][swizzle(c, 4 * seg + 3)];
        const int m = m0 + 16 * seg;
        u8* dst = out + (i64)k * M + m;
        if (vec_ok && m + 16 <= M) {
            *reinterpret_cast<uint4*>(dst) = w;
        } else {
            const u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int b = 0; b < 16; ++b)
                if (m + b < M) dst[b] = (u8)(words[b >> 2] >> (8 * (b & 3)));
        }
    }
}

// Thread (cg, rg)'s column words (col_words[j]: rows 4*rg..+3 of tile column 8*cg+j) into the shared tile, a
// barrier, then the whole transposed tile out.
__device__ __forceinline__ void store_col_words(u32 (*tile)[33], const u32 (&col_words)[8], int cg, int rg,
                                                u8* __restrict__ out, int M, int K, int m0, int k0, int vec_ok) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int c = 8 * cg + j;
        tile[c][swizzle(c, rg)] = col_words[j];
    }
    __syncthreads();
    store_transposed(tile, out, M, K, m0, k0, vec_ok);
}
