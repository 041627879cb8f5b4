// cuda/swiglu.cuh — SwiGLU gate (spec §1: a = silu(h1) ⊙ h3) on the packed h13 buffer, forward
// and backward. Contract: doc/cuda.md (swiglu.cuh). CPU reference: cpu::swiglu_forward /
// swiglu_backward (cpu/ops.h) on the split h1 / h3; per-element math from
// math/elementwise.h (silu, silu_grad).
//
// Layout: h13 [N, 2F] with h1 in columns [0, F) and h3 in [F, 2F); a, da [N, F].
// Kernels (by shape, not a choice): one thread per 16-byte pack of Pack<T>::n consecutive
// columns when F % Pack<T>::n == 0 and the bases are 16-byte aligned (the workbench's "v2"),
// else one thread per element ("v1", the fallback for any F and alignment).
#pragma once
#include "cuda/common.cuh"
#include "cuda/pack16.cuh"

namespace ldm {
namespace gpu {
namespace swiglu_detail {

template <typename T>
__global__ void forward_scalar_kernel(T* a, const T* h13, int64_t N, int F) {
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
__global__ void forward_packed_kernel(T* a, const T* h13, int64_t N, int F) {
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
__global__ void backward_scalar_kernel(T* dh13, const T* da, const T* h13, int64_t N, int F) {
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
__global__ void backward_packed_kernel(T* dh13, const T* da, const T* h13, int64_t N, int F) {
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

inline unsigned blocks(int64_t work) {
    return (unsigned)std::max<int64_t>(1, std::min<int64_t>(ceil_div(work, 256), 65535LL * 16));
}

// Whether the packed kernels apply: F a multiple of the pack and every base 16-byte aligned.
template <typename T>
inline bool packed_ok(int F, const void* p0, const void* p1, const void* p2 = nullptr) {
    return F % Pack<T>::n == 0 && aligned16(p0) && aligned16(p1) && aligned16(p2);
}

// The launchers of one kernel each (N, F >= 1; the _packed ones throw ldm::Error unless
// packed_ok). swiglu_forward / swiglu_backward pick packed whenever it applies; the workbench
// also runs the scalar kernels where packed would apply.
template <typename T>
void forward_scalar(T* a, const T* h13, int64_t N, int F, cudaStream_t s) {
    forward_scalar_kernel<T><<<blocks(N * F), 256, 0, s>>>(a, h13, N, F);
    LDM_LAUNCH_CHECK();
}
template <typename T>
void forward_packed(T* a, const T* h13, int64_t N, int F, cudaStream_t s) {
    if (!packed_ok<T>(F, a, h13))
        throw Error(strprintf("swiglu_forward: the packed kernel needs F %% %d == 0 (F = %d) and "
                              "16-byte aligned buffers", Pack<T>::n, F));
    forward_packed_kernel<T><<<blocks(N * F / Pack<T>::n), 256, 0, s>>>(a, h13, N, F);
    LDM_LAUNCH_CHECK();
}
template <typename T>
void backward_scalar(T* dh13, const T* da, const T* h13, int64_t N, int F, cudaStream_t s) {
    backward_scalar_kernel<T><<<blocks(N * F), 256, 0, s>>>(dh13, da, h13, N, F);
    LDM_LAUNCH_CHECK();
}
template <typename T>
void backward_packed(T* dh13, const T* da, const T* h13, int64_t N, int F, cudaStream_t s) {
    if (!packed_ok<T>(F, dh13, da, h13))
        throw Error(strprintf("swiglu_backward: the packed kernel needs F %% %d == 0 (F = %d) and "
                              "16-byte aligned buffers", Pack<T>::n, F));
    backward_packed_kernel<T><<<blocks(N * F / Pack<T>::n), 256, 0, s>>>(dh13, da, h13, N, F);
    LDM_LAUNCH_CHECK();
}

}  // namespace swiglu_detail

// a [N, F] = silu(h1) ⊙ h3 from h13 [N, 2F].
template <typename T>
void swiglu_forward(T* a, const T* h13, int64_t N, int F, cudaStream_t s) {
    using namespace swiglu_detail;
    if (N <= 0 || F <= 0) return;
    if (packed_ok<T>(F, a, h13)) forward_packed<T>(a, h13, N, F, s);
    else forward_scalar<T>(a, h13, N, F, s);
}

// dh13 [N, 2F] (=): columns [0, F) get da·h3·silu'(h1), [F, 2F) get da·silu(h1). dh13 may not
// alias h13 or da.
template <typename T>
void swiglu_backward(T* dh13, const T* da, const T* h13, int64_t N, int F, cudaStream_t s) {
    using namespace swiglu_detail;
    if (N <= 0 || F <= 0) return;
    if (packed_ok<T>(F, dh13, da, h13)) backward_packed<T>(dh13, da, h13, N, F, s);
    else backward_scalar<T>(dh13, da, h13, N, F, s);
}

}  // namespace gpu
}  // namespace ldm
