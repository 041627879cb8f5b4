// dev/cuda/wgmma.cuh — sm_90a warpgroup MMA (PTX wgmma.mma_async) for the workbench kernels
// (dev/cuda/attention_wgmma.cuh): m64nNk16, bf16 inputs, fp32 accumulators, N = 64 or 128, A and
// B from shared memory through matrix descriptors (mma_ss) or A from registers (mma_rs), plus the
// fences and group waits around them and the 128-byte-swizzled tile layout the descriptors
// describe (doc/cuda.md "The wgmma variant"). wgmma exists only on the arch-specific target
// sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); other targets compile a trap, so a host launches these
// kernels only on compute capability 9.0 from a binary built for sm_90a (Makefile). Under dev/emu
// each instruction is emulated (dev/emu/emu.h "wgmma"), checked by test/test_emu_wgmma.cpp.
#pragma once
#include "cuda/common.cuh"

namespace ldm {
namespace gpu {
namespace wgmma {

// Shared-window address of a shared-memory pointer (cvta.to.shared).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
#if defined(__CUDA_ARCH__)
    return (uint32_t)__cvta_generic_to_shared(p);
#else
    __trap();  // host: smem_u32
    return 0;
#endif
}

// Matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading and stride byte
// offsets (bytes, multiples of 16), swizzle mode; base offset 0.
enum Swizzle : int { kSwizzleNone = 0, kSwizzle128B = 1, kSwizzle64B = 2, kSwizzle32B = 3 };
__host__ __device__ __forceinline__ uint64_t make_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo, int swizzle) {
    return (uint64_t)((saddr >> 4) & 0x3fffu) | (uint64_t)((lbo >> 4) & 0x3fffu) << 16 |
           (uint64_t)((sbo >> 4) & 0x3fffu) << 32 | (uint64_t)(swizzle & 3) << 62;
}

// The 128B-swizzled tile layout used with these descriptors: a tile of R rows (R % 8 == 0) and C
// bf16 columns (C % 64 == 0) is C / 64 panels of R rows x 128 bytes (panel p at byte p·R·128),
// and the 16-byte chunk c (columns 8c..8c+7 of the panel) of row r sits at byte r·128 +
// 16·(c ^ (r % 8)) of its panel. The tile must start at a 1024-byte aligned shared address.
// Byte offset of (row r, 16-byte chunk c of the full row) in such a tile.
__host__ __device__ __forceinline__ uint32_t sw128_offset(int R, int r, int c) {
    return (uint32_t)((c >> 3) * R * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
// Descriptor of the 16-column K-slice k0 .. k0+15 (k0 % 16 == 0) of rows r0.. (r0 % 8 == 0) of
// such a tile, as a K-major operand (rows = M or N, columns = K): 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t tile, int R, int r0, int k0) {
    return make_desc(tile + (uint32_t)((k0 >> 6) * R * 128 + r0 * 128 + (k0 & 63) * 2), 16, 1024, kSwizzle128B);
}
// Descriptor of rows k0 .. k0+15 (k0 % 16 == 0) of such a tile as an MN-major B operand (rows =
// K, columns = N, imm-trans-b = 1): 8-row K groups 1024 bytes apart, 64-column N panels R·128
// bytes apart.
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t tile, int R, int k0) {
    return make_desc(tile + (uint32_t)(k0 * 128), (uint32_t)(R * 128), 1024, kSwizzle128B);
}

// wgmma.fence.sync.aligned: before the first wgmma, and after this thread wrote accumulator or
// A-fragment registers a wgmma then reads.
__device__ __forceinline__ void fence() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();  // host: wgmma_fence
#endif
}
// wgmma.commit_group.sync.aligned: the wgmma issued since the last commit form a group.
__device__ __forceinline__ void commit() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
    __trap();  // host: wgmma_commit
#endif
}
// wgmma.wait_group.sync.aligned N: waits until at most N groups are pending; only then may the
// accumulators (and A registers, and the shared operands) of the completed groups be touched.
template <int N>
__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
    __trap();  // host: wgmma_wait
#endif
}
// fence.proxy.async.shared::cta: makes this thread's generic-proxy writes to shared memory (plain
// stores, cp.async after its wait) visible to the async proxy wgmma reads through; then a barrier.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of an accumulator register across the asm around it.
__device__ __forceinline__ void fence_operand(float& r) {
#if defined(__CUDA_ARCH__)
    asm volatile("" : "+f"(r)::"memory");
#endif
}
// The same for a register A fragment (mma_rs): its packing must be complete before wgmma::fence().
__device__ __forceinline__ void fence_operand(uint32_t& r) {
#if defined(__CUDA_ARCH__)
    asm volatile("" : "+r"(r)::"memory");
#endif
}

// fence_operand over every register of an accumulator or A-fragment array.
template <typename R, int M>
__device__ __forceinline__ void fence_operands(R (&r)[M]) {
#pragma unroll
    for (int i = 0; i < M; i++) fence_operand(r[i]);
}
template <int K>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[K][4]) {
#pragma unroll
    for (int k = 0; k < K; k++) fence_operands(r[k]);
}

// D[64][N] (+)= A[64][16] B[16][N], A and B from shared memory (descriptors); d = this thread's
// N/2 accumulators; scale_d 0: D = A·B, 1: D += A·B; TA / TB: imm-trans-a / -b (1 = MN-major).
template <int N, int TA, int TB>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128, "mma_ss: N = 64 or 128");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 64) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
            "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
            "%27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;"
            "\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
              "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
              "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
              "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
    } else {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
            "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
            "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
            "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
            "%63}, %64, %65, p, 1, 1, %67, %68;"
            "\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
              "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
              "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
              "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
              "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
              "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
              "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
              "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
    }
#else
    __trap();  // host: wgmma_ss
#endif
}
// The same with A from registers (a = the m16n8k16 A fragment of this warp's 16 rows).
template <int N, int TB>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, int scale_d) {
    static_assert(N == 64 || N == 128, "mma_rs: N = 64 or 128");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 64) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
            "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
            "%27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;"
            "\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
              "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
              "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
              "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
    } else {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
            "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
            "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
            "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
            "%63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;"
            "\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
              "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
              "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
              "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
              "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
              "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
              "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
              "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
    }
#else
    __trap();  // host: wgmma_rs
#endif
}

// D[64][N] = A[64][16·KT] · B[16·KT][N] with both operands K-major in 128B-swizzled tiles
// (sw128_offset): A = rows ra0.. of a tile of RA rows, B = a tile of RB rows (= N); KT chained
// m64nNk16 issued (not committed, not waited for).
template <int N, int KT>
__device__ __forceinline__ void mma_chain_kk(float (&d)[N / 2], uint32_t a_tile, int RA, int ra0, uint32_t b_tile, int RB) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++)
        mma_ss<N, 0, 0>(d, desc_kmajor(a_tile, RA, ra0, 16 * kk), desc_kmajor(b_tile, RB, 0, 16 * kk), kk > 0);
}

}  // namespace wgmma
}  // namespace gpu
}  // namespace ldm
