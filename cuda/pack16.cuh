// cuda/pack16.cuh — small device helpers shared by the row/element kernels of matmul, embedding,
// rmsnorm, rope and swiglu: 16-byte packed loads/stores with fp32 conversion, warp sums, and a
// deterministic two-pass column reduction (used for bias, RMSNorm-weight and QK-norm-weight
// gradients). Conventions: doc/cuda.md.
#pragma once
#include "cuda/common.cuh"

namespace ldm {
namespace gpu {

// Elements of T in one 16-byte pack: 4 floats or 8 bf16.
template <typename T>
struct Pack {
    static constexpr int n = 16 / (int)sizeof(T);
};

// True when p is 16-byte aligned (nullptr counts as aligned).
inline bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

// f[0..Pack<T>::n) = p[0..n) in fp32; p must be 16-byte aligned.
template <typename T>
__device__ inline void load_pack(float* f, const T* p) {
    int4 r = *reinterpret_cast<const int4*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < Pack<T>::n; i++) f[i] = to_f(e[i]);
}
// p[0..n) = round(f[0..n)); p must be 16-byte aligned.
template <typename T>
__device__ inline void store_pack(T* p, const float* f) {
    int4 r;
    T* e = reinterpret_cast<T*>(&r);
#pragma unroll
    for (int i = 0; i < Pack<T>::n; i++) e[i] = from_f<T>(f[i]);
    *reinterpret_cast<int4*>(p) = r;
}

// Sum over the 32 lanes of a warp (butterfly; every lane gets the same, deterministic result).
__device__ inline float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- deterministic column reduction --------------------------------------------------------
// out[c] += Σ_{r=0}^{R-1} f(r, c) for c in [0, C), in fp32, with a fixed summation tree that
// depends only on (R, C): pass 1 splits the rows into P = colsum_chunks(R) contiguous chunks and
// writes per-chunk partials to scratch [P, C]; pass 2 adds the P partials in order. No atomics.
// F is a copyable functor with `__device__ float operator()(int64_t r, int c) const`.
inline int64_t colsum_chunks(int64_t R) {
    int64_t p = ceil_div(R, 64);
    return std::max<int64_t>(1, std::min<int64_t>(p, 256));
}
// Scratch floats needed by colsum for R rows and C columns.
inline int64_t colsum_scratch(int64_t R, int C) { return colsum_chunks(R) * (int64_t)C; }

constexpr int kColsumTx = 32, kColsumTy = 8;

template <typename F>
__global__ void colsum_partial_kernel(float* part, F f, int64_t R, int C, int64_t rows_per_chunk) {
    __shared__ float sh[kColsumTy][kColsumTx + 1];
    const int c = blockIdx.x * kColsumTx + threadIdx.x;
    const int64_t p = blockIdx.y;
    const int64_t r0 = p * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    float acc = 0.f;
    if (c < C)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kColsumTy) acc += f(r, c);
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.f;
#pragma unroll
        for (int y = 0; y < kColsumTy; y++) s += sh[y][threadIdx.x];
        part[p * C + c] = s;
    }
}

template <int Unused = 0>
__global__ void colsum_finish_kernel(float* out, const float* part, int64_t P, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.f;
    for (int64_t p = 0; p < P; p++) s += part[p * C + c];
    out[c] += s;
}

// Enqueues the two passes on s. scratch >= colsum_scratch(R, C) floats. R == 0 adds nothing.
template <typename F>
void colsum(float* out, float* scratch, const F& f, int64_t R, int C, cudaStream_t s) {
    if (C <= 0 || R <= 0) return;
    const int64_t P = colsum_chunks(R);
    const int64_t rows = ceil_div(R, P);
    dim3 grid((unsigned)ceil_div(C, kColsumTx), (unsigned)P);
    colsum_partial_kernel<F><<<grid, dim3(kColsumTx, kColsumTy), 0, s>>>(scratch, f, R, C, rows);
    LDM_LAUNCH_CHECK();
    colsum_finish_kernel<0><<<(unsigned)ceil_div(C, 256), 256, 0, s>>>(out, scratch, P, C);
    LDM_LAUNCH_CHECK();
}

}  // namespace gpu
}  // namespace ldm
