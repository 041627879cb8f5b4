// cuda/rope.cuh — optional QK-norm (RMSNorm over head_dim per head, Qwen3) followed by RoPE
// (rotate-half, spec §1) on the packed qkv buffer, forward and backward. Contract: doc/cuda.md
// (rope.cuh). CPU reference: cpu::rmsnorm_forward/backward on the [N·heads, hd] view, then
// cpu::rope_forward/backward (as cpu/model.cpp does); per-element math from
// math/elementwise.h (rms_scale, rope_rotate, rope_rotate_back).
//
// Layout: qkv [N, (nh + 2·nkv)·hd], token n at position n % T_; heads 0..nh-1 are q, nh..nh+nkv-1
// are k (both normed and rotated), the last nkv are v (copied). cos/sin tables [T_, hd/2] fp32.
// Kernels: one warp per (token, head), lanes over the rotation pairs (i, i + hd/2) (the
// workbench's "v2"; its thread-per-head "v1" lives in dev/cuda/rope.cu).
#pragma once
#include "cuda/common.cuh"
#include "cuda/pack16.cuh"

namespace ldm {
namespace gpu {

constexpr int kRopeLanes = 32;   // one warp per (token, head)

// Forward for one (token, head) per warp (the warp shares one head, so early returns are
// warp-uniform).
template <typename T, bool NORM>
__global__ void qknorm_rope_forward_kernel(T* out, float* rstd, const T* in, const T* q_w,
                                           const T* k_w, const float* cos_t, const float* sin_t,
                                           int64_t N, int T_, int nh, int nkv, int hd, float eps,
                                           bool copy_v) {
    constexpr int LANES = kRopeLanes;
    const int Hall = nh + 2 * nkv, Hr = nh + nkv, half = hd / 2;
    const int64_t gid = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / LANES;
    const int lane = (int)(threadIdx.x % LANES);
    if (gid >= N * Hall) return;
    const int64_t n = gid / Hall;
    const int h = (int)(gid - n * Hall);
    const int64_t base = n * Hall * hd + (int64_t)h * hd;
    const T* x = in + base;
    T* y = out + base;
    if (h >= Hr) {  // v head
        if (copy_v)
            for (int c = lane; c < hd; c += LANES) y[c] = x[c];
        return;
    }
    float s = 1.f;
    if (NORM) {
        float ss = 0.f;
        for (int c = lane; c < hd; c += LANES) {
            const float v = to_f(x[c]);
            ss += v * v;
        }
        ss = warp_sum(ss);
        s = rms_scale(ss, hd, eps);
        if (lane == 0 && rstd) rstd[n * Hr + h] = s;
    }
    const T* w = h < nh ? q_w : k_w;
    const int64_t t = n % T_;
    const float* ct = cos_t + t * half;
    const float* st = sin_t + t * half;
    for (int i = lane; i < half; i += LANES) {
        float x1 = to_f(x[i]), x2 = to_f(x[i + half]);
        if (NORM) {
            x1 = to_f(w[i]) * (x1 * s);
            x2 = to_f(w[i + half]) * (x2 * s);
        }
        float y1, y2;
        rope_rotate(x1, x2, ct[i], st[i], &y1, &y2);
        y[i] = from_f<T>(y1);
        y[i + half] = from_f<T>(y2);
    }
}

// out [N, W] = qkv with optional QK-norm (q_w, k_w [hd]; q_w == nullptr = none, then k_w and
// rstd are ignored and may be nullptr; with q_w, k_w is required) and RoPE on the q and k heads;
// v heads copied (skipped when out == in). rstd [N, nh+nkv] fp32 (per token, q heads then k
// heads). out may alias in only without QK-norm (the backward needs the un-normed input).
// Throws ldm::Error on odd hd or a missing k_w.
template <typename T>
void qknorm_rope_forward(T* out, float* rstd, const T* in, const T* q_w, const T* k_w,
                         const float* cos_t, const float* sin_t, int64_t N, int T_, int nh, int nkv,
                         int hd, float eps, cudaStream_t s) {
    if (hd % 2) throw Error(strprintf("qknorm_rope_forward: head_dim %d must be even", hd));
    if (q_w && !k_w) throw Error("qknorm_rope_forward: q_w given without k_w");
    if (N <= 0) return;
    const int64_t heads = N * (nh + 2 * nkv);
    const bool copy_v = out != in;
    const unsigned blocks = (unsigned)ceil_div(heads * kRopeLanes, 256);
    if (q_w)
        qknorm_rope_forward_kernel<T, true><<<blocks, 256, 0, s>>>(
            out, rstd, in, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd, eps, copy_v);
    else
        qknorm_rope_forward_kernel<T, false><<<blocks, 256, 0, s>>>(
            out, rstd, in, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd, eps, copy_v);
    LDM_LAUNCH_CHECK();
}

// Backward of one (token, head): g = Rᵀ dy (gradient w.r.t. the normed value), then the RMSNorm
// backward dx = s w g - (s³/hd) x Σ w g x (or dx = g without norm); v heads: dx = dy.
template <typename T, bool NORM>
__global__ void qknorm_rope_backward_kernel(T* din, const T* dout, const T* in, const float* rstd,
                                            const T* q_w, const T* k_w, const float* cos_t,
                                            const float* sin_t, int64_t N, int T_, int nh, int nkv,
                                            int hd, bool copy_v) {
    constexpr int LANES = kRopeLanes;
    const int Hall = nh + 2 * nkv, Hr = nh + nkv, half = hd / 2;
    const int64_t gid = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / LANES;
    const int lane = (int)(threadIdx.x % LANES);
    if (gid >= N * Hall) return;
    const int64_t n = gid / Hall;
    const int h = (int)(gid - n * Hall);
    const int64_t base = n * Hall * hd + (int64_t)h * hd;
    const T* dy = dout + base;
    T* dx = din + base;
    if (h >= Hr) {  // v head: dx = dy
        if (copy_v)
            for (int c = lane; c < hd; c += LANES) dx[c] = dy[c];
        return;
    }
    const int64_t t = n % T_;
    const float* ct = cos_t + t * half;
    const float* st = sin_t + t * half;
    const T* x = in + base;
    const T* w = h < nh ? q_w : k_w;
    float s = 1.f, kk = 0.f;
    if (NORM) {
        s = rstd[n * Hr + h];
        float dot = 0.f;
        for (int i = lane; i < half; i += LANES) {
            float g1, g2;
            rope_rotate_back(to_f(dy[i]), to_f(dy[i + half]), ct[i], st[i], &g1, &g2);
            dot += to_f(w[i]) * g1 * to_f(x[i]) + to_f(w[i + half]) * g2 * to_f(x[i + half]);
        }
        dot = warp_sum(dot);
        kk = s * s * s * dot / (float)hd;
    }
    for (int i = lane; i < half; i += LANES) {
        float g1, g2;
        rope_rotate_back(to_f(dy[i]), to_f(dy[i + half]), ct[i], st[i], &g1, &g2);
        if (NORM) {
            g1 = s * to_f(w[i]) * g1 - kk * to_f(x[i]);
            g2 = s * to_f(w[i + half]) * g2 - kk * to_f(x[i + half]);
        }
        dx[i] = from_f<T>(g1);
        dx[i + half] = from_f<T>(g2);
    }
}

// Norm-weight gradient term for colsum over the rows r = (n, head) of one head group:
// g_c · x_c · rstd, g = Rᵀ dy at column c.
template <typename T>
struct QkDwOp {
    const T* dout;
    const T* in;
    const float* rstd;
    const float* cos_t;
    const float* sin_t;
    int T_, H, h0, Hall, Hr, hd;
    __device__ float operator()(int64_t r, int c) const {
        const int64_t n = r / H;
        const int h = h0 + (int)(r - n * H);
        const int half = hd / 2;
        const int i = c < half ? c : c - half;
        const int64_t base = n * Hall * hd + (int64_t)h * hd;
        const int64_t t = n % T_;
        float g1, g2;
        rope_rotate_back(to_f(dout[base + i]), to_f(dout[base + i + half]), cos_t[t * half + i],
                         sin_t[t * half + i], &g1, &g2);
        const float g = c < half ? g1 : g2;
        return g * to_f(in[base + c]) * rstd[n * Hr + h];
    }
};

// Scratch floats for qknorm_rope_backward (0 is fine without QK-norm).
inline int64_t qknorm_rope_backward_scratch(int64_t N, int nh, int nkv, int hd) {
    return std::max(colsum_scratch(N * nh, hd), colsum_scratch(N * nkv, hd));
}

// dq_w [hd] += Σ over the q heads' rows, dk_w [hd] += over the k heads' rows, of the QkDwOp
// terms (fp32, deterministic colsum; either may be nullptr). The second half of
// qknorm_rope_backward with QK-norm, after the kernel that writes din.
template <typename T>
void qk_norm_weight_grads(float* dq_w, float* dk_w, float* scratch, const T* dout, const T* in,
                          const float* rstd, const float* cos_t, const float* sin_t, int64_t N,
                          int T_, int nh, int nkv, int hd, cudaStream_t s) {
    const int Hall = nh + 2 * nkv, Hr = nh + nkv;
    if (dq_w)
        colsum(dq_w, scratch, QkDwOp<T>{dout, in, rstd, cos_t, sin_t, T_, nh, 0, Hall, Hr, hd},
               N * nh, hd, s);
    if (dk_w)
        colsum(dk_w, scratch, QkDwOp<T>{dout, in, rstd, cos_t, sin_t, T_, nkv, nh, Hall, Hr, hd},
               N * nkv, hd, s);
}

// din [N, W] = ∂L/∂in (=, all heads; v heads get dout); with QK-norm (q_w != nullptr):
// dq_w, dk_w [hd] += (fp32, deterministic via scratch >= qknorm_rope_backward_scratch floats).
// in and rstd are those of the forward. din may not alias in; it may be dout only without
// QK-norm (then the v heads are left as they are: no copy; with QK-norm the weight gradients
// read dout after din is written, and aliasing throws ldm::Error).
template <typename T>
void qknorm_rope_backward(T* din, float* dq_w, float* dk_w, float* scratch, const T* dout,
                          const T* in, const float* rstd, const T* q_w, const T* k_w,
                          const float* cos_t, const float* sin_t, int64_t N, int T_, int nh, int nkv,
                          int hd, cudaStream_t s) {
    if (hd % 2) throw Error(strprintf("qknorm_rope_backward: head_dim %d must be even", hd));
    if (q_w && !k_w) throw Error("qknorm_rope_backward: q_w given without k_w");
    if (q_w && din == dout) throw Error("qknorm_rope_backward: din may alias dout only without QK-norm");
    if (N <= 0) return;
    const int64_t heads = N * (nh + 2 * nkv);
    const bool copy_v = din != dout;
    const unsigned blocks = (unsigned)ceil_div(heads * kRopeLanes, 256);
    if (q_w)
        qknorm_rope_backward_kernel<T, true><<<blocks, 256, 0, s>>>(
            din, dout, in, rstd, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd, copy_v);
    else
        qknorm_rope_backward_kernel<T, false><<<blocks, 256, 0, s>>>(
            din, dout, in, rstd, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd, copy_v);
    LDM_LAUNCH_CHECK();
    if (q_w)
        qk_norm_weight_grads<T>(dq_w, dk_w, scratch, dout, in, rstd, cos_t, sin_t, N, T_, nh, nkv,
                                hd, s);
}

}  // namespace gpu
}  // namespace ldm
