// cp.async: 16-byte copies from global to shared memory that do not pass through registers (nvfp4.cu, norm.cu).
// A thread's copies are complete, and visible to it, after it waits for their group (cp_async_wait<N>: all but
// the N most recent groups); other threads see them only after a barrier that follows that wait.
// fastpath._cuda inlines this file into each kernel source before NVRTC sees it.
#pragma once

#ifdef __CUDA_ARCH__
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  for (int i = 0; i < 16; ++i)
    ((unsigned char*)smem)[i] = i < src_bytes ? ((const unsigned char*)gmem)[i] : (unsigned char)0;
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
#endif
