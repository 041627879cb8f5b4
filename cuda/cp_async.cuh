// cuda/cp_async.cuh — asynchronous global -> shared copies (PTX cp.async, sm_80+): the HC / mHC
// combine kernels' staging (cuda/hc.cuh) and the workbench's pipelined attention
// (dev/cuda/attention_pipelined.cuh, attention_wgmma.cuh). A thread issues copies, groups the ones
// issued so far with cp_async_commit(), and cp_async_wait<N>() blocks it until all but its N most
// recent groups have landed; other threads see the data only after a barrier that follows the
// wait. Until then the destination bytes are undefined (dev/emu poisons them at issue and writes
// them at the wait, so a kernel that reads a stage too early fails its checks under emulation).
// `valid == false` is the zero-fill form (src-size 0: nothing is read, the bytes become zero).
#pragma once
#include "cuda/common.cuh"

namespace ldm {
namespace gpu {

// 16 bytes global -> shared, bypassing L1 (cp.async.cg). dst and src 16-byte aligned; src must
// be a mapped address even when !valid (pass any in-bounds pointer).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
#else
    __trap();  // host: cp_async_16
#endif
}

// 4 bytes global -> shared (cp.async.ca: .cg only takes 16). dst and src 4-byte aligned.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
#else
    __trap();  // host: cp_async_4
#endif
}

// Closes the current group of this thread's copies (an empty group is legal and completes at once).
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    __trap();  // host: cp_async_commit
#endif
}

// Waits until at most N of this thread's committed groups are pending (the N most recent).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
    __trap();  // host: cp_async_wait
#endif
}

// Commits and waits for every copy of this thread (cp.async.wait_all).
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#else
    __trap();  // host: cp_async_wait_all
#endif
}

}  // namespace gpu
}  // namespace ldm
