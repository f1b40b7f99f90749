// Storage types and vector access of the element-wise and norm kernels (activation.cu, norm.cu): each
// dtype's exact widening to fp32 and its one RNE rounding back, and Io<type, V>, V values moved by one
// memory access (16 bytes for the vector forms) and kept packed in registers until unpacked.
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once

// ------------------------------------------------------------ storage types
// `raw` is the stored bit pattern; load() is exact, store() rounds once (RNE).
// lo/hi widen the two 16-bit values of a 32-bit word (lo: lower address) and
// pack2 rounds two floats into one word, each exactly as store() would.
struct F32 {
  typedef float raw;
  static __device__ __forceinline__ float load(raw v) { return v; }
  static __device__ __forceinline__ raw store(float v) { return v; }
};
struct F16 {
  typedef unsigned short raw;
  static __device__ __forceinline__ float load(raw v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ raw store(float v) { return __half_as_ushort(__float2half_rn(v)); }
  static __device__ __forceinline__ float lo(unsigned w) { return load((raw)(w & 0xffffu)); }
  static __device__ __forceinline__ float hi(unsigned w) { return load((raw)(w >> 16)); }
  static __device__ __forceinline__ unsigned pack2(float a, float b) {
    union {
      __half2 h;
      unsigned u;
    } w;
    w.h = __floats2half2_rn(a, b);  // .x = a (lower address), .y = b; each RNE
    return w.u;
  }
};
struct BF16 {
  typedef unsigned short raw;
  static __device__ __forceinline__ float load(raw v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  static __device__ __forceinline__ raw store(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
  // A bf16 value is the upper half of its fp32 value.
  static __device__ __forceinline__ float lo(unsigned w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
  static __device__ __forceinline__ unsigned pack2(float a, float b) {
    union {
      __nv_bfloat162 h;
      unsigned u;
    } w;
    w.h = __floats2bfloat162_rn(a, b);  // .x = a (lower address), .y = b; each RNE
    return w.u;
  }
};

// V values of one storage type between a memory access and their use: Raw is what
// one access moves (16 bytes for the vector forms, kept packed in registers).
// reload(p): load(p) again, as a volatile access the compiler cannot merge with an
// earlier load of p (so the earlier value need not stay in a register); read-only data.
__device__ __forceinline__ float reload_one(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned short reload_one(const unsigned short* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

template <class Tr, int V>
struct Io {  // V == 1: one element, any alignment
  typedef typename Tr::raw R;
  typedef R Raw;
  static __device__ __forceinline__ Raw load(const R* p) { return *p; }
  static __device__ __forceinline__ Raw reload(const R* p) { return reload_one(p); }
  static __device__ __forceinline__ void store(R* p, const Raw& v) { *p = v; }
  static __device__ __forceinline__ void unpack(const Raw& v, float (&f)[1]) { f[0] = Tr::load(v); }
  static __device__ __forceinline__ Raw pack(const float (&f)[1]) { return Tr::store(f[0]); }
};

template <>
struct Io<F32, 4> {
  typedef float R;
  typedef float4 Raw;
  static __device__ __forceinline__ Raw load(const R* p) { return *reinterpret_cast<const float4*>(p); }
  static __device__ __forceinline__ Raw reload(const R* p) {
    float4 v;
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
  }
  static __device__ __forceinline__ void store(R* p, const Raw& v) { *reinterpret_cast<float4*>(p) = v; }
  static __device__ __forceinline__ void unpack(const Raw& v, float (&f)[4]) {
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  }
  static __device__ __forceinline__ Raw pack(const float (&f)[4]) { return make_float4(f[0], f[1], f[2], f[3]); }
};

template <class Tr>
struct Io16x8 {  // eight 16-bit values as four 32-bit words
  typedef typename Tr::raw R;
  typedef uint4 Raw;
  static __device__ __forceinline__ Raw load(const R* p) { return *reinterpret_cast<const uint4*>(p); }
  static __device__ __forceinline__ Raw reload(const R* p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
  }
  static __device__ __forceinline__ void store(R* p, const Raw& v) { *reinterpret_cast<uint4*>(p) = v; }
  static __device__ __forceinline__ void unpack(const Raw& v, float (&f)[8]) {
    f[0] = Tr::lo(v.x);
    f[1] = Tr::hi(v.x);
    f[2] = Tr::lo(v.y);
    f[3] = Tr::hi(v.y);
    f[4] = Tr::lo(v.z);
    f[5] = Tr::hi(v.z);
    f[6] = Tr::lo(v.w);
    f[7] = Tr::hi(v.w);
  }
  static __device__ __forceinline__ Raw pack(const float (&f)[8]) {
    return make_uint4(Tr::pack2(f[0], f[1]), Tr::pack2(f[2], f[3]), Tr::pack2(f[4], f[5]), Tr::pack2(f[6], f[7]));
  }
};
template <>
struct Io<F16, 8> : Io16x8<F16> {};
template <>
struct Io<BF16, 8> : Io16x8<BF16> {};
