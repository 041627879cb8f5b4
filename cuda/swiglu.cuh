// cuda/swiglu.cuh — SwiGLU gate (spec §1: a = silu(h1) ⊙ h3) on the packed h13 buffer, forward
// and backward. Contract: doc/cuda.md (swiglu.cuh). CPU reference: cpu::swiglu_forward /
// swiglu_backward (cpu/ops.h) on the split h1 / h3; per-element math from
// math/elementwise.h (silu, silu_grad).
//
// Layout: h13 [N, 2F] with h1 in columns [0, F) and h3 in [F, 2F); a, da [N, F].
// Variants (optional last argument): 1 = one thread per element, 2 = one thread per 16-byte
// pack of Pack<T>::n consecutive columns (needs F % Pack<T>::n == 0 and 16-byte aligned bases;
// otherwise falls back to 1); -1 = best (2 when possible).
#pragma once
#include "cuda/common.cuh"
#include "cuda/pack16.cuh"

namespace ldm {
namespace gpu {

template <typename T>
__global__ void swiglu_forward_v1_kernel(T* a, const T* h13, int64_t N, int F) {
    const int64_t total = N * F;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / F;
        const int64_t c = i - n * F;
        const float h1 = to_f(h13[n * 2 * F + c]), h3 = to_f(h13[n * 2 * F + F + c]);
        a[i] = from_f<T>(silu(h1) * h3);
    }
}

template <typename T>
__global__ void swiglu_forward_v2_kernel(T* a, const T* h13, int64_t N, int F) {
    constexpr int P = Pack<T>::n;
    const int64_t packs_per_row = F / P, total = N * packs_per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / packs_per_row;
        const int64_t c = (i - n * packs_per_row) * P;
        float h1[P], h3[P], y[P];
        load_pack(h1, h13 + n * 2 * F + c);
        load_pack(h3, h13 + n * 2 * F + F + c);
#pragma unroll
        for (int k = 0; k < P; k++) y[k] = silu(h1[k]) * h3[k];
        store_pack(a + n * F + c, y);
    }
}

template <typename T>
__global__ void swiglu_backward_v1_kernel(T* dh13, const T* da, const T* h13, int64_t N, int F) {
    const int64_t total = N * F;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / F;
        const int64_t c = i - n * F;
        const float h1 = to_f(h13[n * 2 * F + c]), h3 = to_f(h13[n * 2 * F + F + c]);
        const float g = to_f(da[i]);
        dh13[n * 2 * F + c] = from_f<T>(g * h3 * silu_grad(h1));
        dh13[n * 2 * F + F + c] = from_f<T>(g * silu(h1));
    }
}

template <typename T>
__global__ void swiglu_backward_v2_kernel(T* dh13, const T* da, const T* h13, int64_t N, int F) {
    constexpr int P = Pack<T>::n;
    const int64_t packs_per_row = F / P, total = N * packs_per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / packs_per_row;
        const int64_t c = (i - n * packs_per_row) * P;
        float h1[P], h3[P], g[P], d1[P], d3[P];
        load_pack(h1, h13 + n * 2 * F + c);
        load_pack(h3, h13 + n * 2 * F + F + c);
        load_pack(g, da + n * F + c);
#pragma unroll
        for (int k = 0; k < P; k++) {
            d1[k] = g[k] * h3[k] * silu_grad(h1[k]);
            d3[k] = g[k] * silu(h1[k]);
        }
        store_pack(dh13 + n * 2 * F + c, d1);
        store_pack(dh13 + n * 2 * F + F + c, d3);
    }
}

inline unsigned swiglu_blocks(int64_t work) {
    return (unsigned)std::max<int64_t>(1, std::min<int64_t>(ceil_div(work, 256), 65535LL * 16));
}

// a [N, F] = silu(h1) ⊙ h3 from h13 [N, 2F].
template <typename T>
void swiglu_forward(T* a, const T* h13, int64_t N, int F, cudaStream_t s, int variant = -1) {
    if (N <= 0 || F <= 0) return;
    const bool vec = F % Pack<T>::n == 0 && aligned16(a) && aligned16(h13);
    if (variant != 1 && vec)
        swiglu_forward_v2_kernel<T><<<swiglu_blocks(N * F / Pack<T>::n), 256, 0, s>>>(a, h13, N, F);
    else
        swiglu_forward_v1_kernel<T><<<swiglu_blocks(N * F), 256, 0, s>>>(a, h13, N, F);
    LDM_LAUNCH_CHECK();
}

// dh13 [N, 2F] (=): columns [0, F) get da·h3·silu'(h1), [F, 2F) get da·silu(h1). dh13 may not
// alias h13 or da.
template <typename T>
void swiglu_backward(T* dh13, const T* da, const T* h13, int64_t N, int F, cudaStream_t s,
                     int variant = -1) {
    if (N <= 0 || F <= 0) return;
    const bool vec = F % Pack<T>::n == 0 && aligned16(dh13) && aligned16(da) && aligned16(h13);
    if (variant != 1 && vec)
        swiglu_backward_v2_kernel<T><<<swiglu_blocks(N * F / Pack<T>::n), 256, 0, s>>>(dh13, da,
                                                                                       h13, N, F);
    else
        swiglu_backward_v1_kernel<T><<<swiglu_blocks(N * F), 256, 0, s>>>(dh13, da, h13, N, F);
    LDM_LAUNCH_CHECK();
}

}  // namespace gpu
}  // namespace ldm
