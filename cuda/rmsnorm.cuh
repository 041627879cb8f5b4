// cuda/rmsnorm.cuh — RMSNorm (spec §1: out = w ⊙ x · rstd, rstd = 1/sqrt(mean(x²) + eps) per
// row of C), the fused residual add + RMSNorm of PreLN, the backward with a deterministic
// weight gradient, and PreLN's fused backward into the fp32 residual gradient
// (rmsnorm_backward_residual). Contract: doc/cuda.md (rmsnorm.cuh). CPU reference:
// cpu::rmsnorm_forward / rmsnorm_backward (cpu/ops.h); per-element math from math/elementwise.h
// (rms_scale, rms_backward_coef, rms_backward_dx).
//
// Kernels: one warp per row, with 16-byte packs when C % Pack<T>::n == 0 and the bases are
// 16-byte aligned, else the same warp kernel with scalar lane-strided accesses (the workbench's
// "v2"; its thread-per-row "v1" lives in dev/cuda/rmsnorm.cu). fp32 accumulation everywhere.
#pragma once
#include "cuda/common.cuh"
#include "cuda/pack16.cuh"

namespace ldm {
namespace gpu {

constexpr int kRmsWarps = 8;  // rows per 256-thread block in the warp kernels

// ---- forward (RESID: h_out = h_in + o first, rounded to T, and the norm is taken of h_out) ---
template <typename T, bool RESID, bool VEC>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, T* h_out, const T* h_in, const T* o,
                                       const T* w, int64_t N, int C, float eps) {
    constexpr int P = Pack<T>::n;
    const int64_t n = blockIdx.x * (int64_t)kRmsWarps + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (n >= N) return;
    const T* x = (RESID ? (const T*)h_out : h_in) + n * C;
    float ss = 0.f;
    if (VEC) {
        for (int c = lane * P; c < C; c += 32 * P) {
            float v[P];
            load_pack(v, h_in + n * C + c);
            if (RESID) {
                float a[P];
                load_pack(a, o + n * C + c);
#pragma unroll
                for (int k = 0; k < P; k++) v[k] = to_f(from_f<T>(v[k] + a[k]));
                store_pack(h_out + n * C + c, v);
            }
#pragma unroll
            for (int k = 0; k < P; k++) ss += v[k] * v[k];
        }
    } else {
        for (int c = lane; c < C; c += 32) {
            float v = to_f(h_in[n * C + c]);
            if (RESID) {
                const T h = from_f<T>(v + to_f(o[n * C + c]));
                h_out[n * C + c] = h;
                v = to_f(h);
            }
            ss += v * v;
        }
    }
    ss = warp_sum(ss);
    const float s = rms_scale(ss, C, eps);
    if (lane == 0) rstd[n] = s;
    // Second pass re-reads x (for RESID the h_out values this lane wrote itself).
    if (VEC) {
        for (int c = lane * P; c < C; c += 32 * P) {
            float v[P], wv[P];
            load_pack(v, x + c);
            load_pack(wv, w + c);
#pragma unroll
            for (int k = 0; k < P; k++) v[k] = wv[k] * (v[k] * s);
            store_pack(out + n * C + c, v);
        }
    } else {
        for (int c = lane; c < C; c += 32) out[n * C + c] = from_f<T>(to_f(w[c]) * (to_f(x[c]) * s));
    }
}

template <typename T, bool RESID>
void rmsnorm_forward_launch(T* out, float* rstd, T* h_out, const T* h_in, const T* o, const T* w,
                            int64_t N, int C, float eps, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    const bool vec = C % Pack<T>::n == 0 && aligned16(out) && aligned16(h_in) && aligned16(w) &&
                     (!RESID || (aligned16(h_out) && aligned16(o)));
    const unsigned blocks = (unsigned)ceil_div(N, kRmsWarps);
    if (vec)
        rmsnorm_forward_kernel<T, RESID, true><<<blocks, kRmsWarps * 32, 0, s>>>(
            out, rstd, h_out, h_in, o, w, N, C, eps);
    else
        rmsnorm_forward_kernel<T, RESID, false><<<blocks, kRmsWarps * 32, 0, s>>>(
            out, rstd, h_out, h_in, o, w, N, C, eps);
    LDM_LAUNCH_CHECK();
}

// out [N, C] = RMSNorm_w(x); rstd [N] fp32 (kept for the backward); w [C]. out may not alias x.
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t N, int C, float eps,
                     cudaStream_t s) {
    rmsnorm_forward_launch<T, false>(out, rstd, nullptr, x, nullptr, w, N, C, eps, s);
}

// h_out = h_in + o (rounded to T; h_out may alias h_in), then out = RMSNorm_w(h_out), rstd [N].
template <typename T>
void residual_rmsnorm_forward(T* h_out, T* out, float* rstd, const T* h_in, const T* o, const T* w,
                              int64_t N, int C, float eps, cudaStream_t s) {
    rmsnorm_forward_launch<T, true>(out, rstd, h_out, h_in, o, w, N, C, eps, s);
}

// ---- backward ------------------------------------------------------------------------------
// y_c = w_c x_c s:  dx_c = s w_c g_c - (s³/C) x_c Σ_k w_k g_k x_k ;  dw_c = Σ_n g_c x_c s
// (math/elementwise.h rms_backward_coef / rms_backward_dx). One warp per row of C, fp32.
// RESID = false (rmsnorm_backward): dx [N, C] (T) = dx, or += when accumulate.
// RESID = true (rmsnorm_backward_residual, PreLN): dx is not stored; each value is rounded to T
// (as the unfused path stores it), then dh [N, C] (fp32) += it and, when d_next != nullptr,
// d_next [N, C] (T) = the new dh. Same loops and dot reduction as RESID = false, so dh and d_next
// are bit-identical to rmsnorm_backward + accumulate_f32 + convert_f32 on the same VEC path.
template <typename T, bool VEC, bool RESID>
__global__ void rmsnorm_backward_dx_kernel(T* dx, float* dh, T* d_next, const T* dout, const T* x,
                                           const T* w, const float* rstd, int64_t N, int C,
                                           bool accumulate) {
    constexpr int P = Pack<T>::n;
    constexpr int PF = Pack<float>::n;  // dh is loaded / stored as P / PF fp32 packs
    const int64_t n = blockIdx.x * (int64_t)kRmsWarps + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (n >= N) return;
    const T* xr = x + n * C;
    const T* g = dout + n * C;
    const float s = rstd[n];
    float dot = 0.f;
    if (VEC) {
        for (int c = lane * P; c < C; c += 32 * P) {
            float xv[P], gv[P], wv[P];
            load_pack(xv, xr + c);
            load_pack(gv, g + c);
            load_pack(wv, w + c);
#pragma unroll
            for (int k = 0; k < P; k++) dot += wv[k] * gv[k] * xv[k];
        }
    } else {
        for (int c = lane; c < C; c += 32) dot += to_f(w[c]) * to_f(g[c]) * to_f(xr[c]);
    }
    dot = warp_sum(dot);
    const float kk = rms_backward_coef(s, dot, C);
    if (VEC) {
        for (int c = lane * P; c < C; c += 32 * P) {
            float xv[P], gv[P], wv[P], dv[P];
            load_pack(xv, xr + c);
            load_pack(gv, g + c);
            load_pack(wv, w + c);
            if (RESID) {
#pragma unroll
                for (int q = 0; q < P; q += PF) load_pack(dv + q, dh + n * C + c + q);
            } else if (accumulate) {
                load_pack(dv, dx + n * C + c);
            }
#pragma unroll
            for (int k = 0; k < P; k++) {
                const float v = rms_backward_dx(s, wv[k], gv[k], kk, xv[k]);
                if (RESID)
                    dv[k] += to_f(from_f<T>(v));
                else
                    dv[k] = accumulate ? dv[k] + v : v;
            }
            if (RESID) {
#pragma unroll
                for (int q = 0; q < P; q += PF) store_pack(dh + n * C + c + q, dv + q);
                if (d_next) store_pack(d_next + n * C + c, dv);
            } else {
                store_pack(dx + n * C + c, dv);
            }
        }
    } else {
        for (int c = lane; c < C; c += 32) {
            float v = rms_backward_dx(s, to_f(w[c]), to_f(g[c]), kk, to_f(xr[c]));
            if (RESID) {
                const float h = dh[n * C + c] + to_f(from_f<T>(v));
                dh[n * C + c] = h;
                if (d_next) d_next[n * C + c] = from_f<T>(h);
            } else {
                if (accumulate) v += to_f(dx[n * C + c]);
                dx[n * C + c] = from_f<T>(v);
            }
        }
    }
}

// dw partial term g_c x_c s for colsum.
template <typename T>
struct RmsDwOp {
    const T* dout;
    const T* x;
    const float* rstd;
    int C;
    __device__ float operator()(int64_t r, int c) const {
        return to_f(dout[r * C + c]) * to_f(x[r * C + c]) * rstd[r];
    }
};

// Scratch floats needed by rmsnorm_backward.
inline int64_t rmsnorm_backward_scratch(int64_t N, int C) { return colsum_scratch(N, C); }

template <typename T, bool RESID>
void rmsnorm_backward_launch(T* dx, float* dh, T* d_next, float* dw, float* scratch, const T* dout,
                             const T* x, const T* w, const float* rstd, int64_t N, int C,
                             bool accumulate, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    const bool vec = C % Pack<T>::n == 0 && aligned16(dout) && aligned16(x) && aligned16(w) &&
                     (RESID ? aligned16(dh) && aligned16(d_next) : aligned16(dx));
    const unsigned blocks = (unsigned)ceil_div(N, kRmsWarps);
    if (vec)
        rmsnorm_backward_dx_kernel<T, true, RESID><<<blocks, kRmsWarps * 32, 0, s>>>(
            dx, dh, d_next, dout, x, w, rstd, N, C, accumulate);
    else
        rmsnorm_backward_dx_kernel<T, false, RESID><<<blocks, kRmsWarps * 32, 0, s>>>(
            dx, dh, d_next, dout, x, w, rstd, N, C, accumulate);
    LDM_LAUNCH_CHECK();
    if (dw) colsum(dw, scratch, RmsDwOp<T>{dout, x, rstd, C}, N, C, s);
}

// dx [N, C] = (or += when accumulate) ∂L/∂x ; dw [C] += Σ_n dout·x·rstd (fp32, deterministic:
// per-chunk partials in scratch >= rmsnorm_backward_scratch(N, C) floats). x, rstd from the
// forward. dx may not alias dout or x. dw may be nullptr (then scratch may be nullptr too).
template <typename T>
void rmsnorm_backward(T* dx, float* dw, float* scratch, const T* dout, const T* x, const T* w,
                      const float* rstd, int64_t N, int C, bool accumulate, cudaStream_t s) {
    rmsnorm_backward_launch<T, false>(dx, nullptr, nullptr, dw, scratch, dout, x, w, rstd, N, C,
                                      accumulate, s);
}

// PreLN's input-norm backward into the residual-stream gradient (spec §2.1: dL/dh_{j-1} =
// dL/dh_j + dL/dx_j), one pass instead of rmsnorm_backward + accumulate_f32 + convert_f32:
//   dh [N, C] (fp32) += (T) ∂L/∂x ;  d_next [N, C] (T) = dh (the next sublayer's dL/do;
//   nullptr: not written) ;  dw [C] += as rmsnorm_backward (same colsum, bit-identical).
// ∂L/∂x is rounded to T before the add on purpose: the unfused sequence stores it as T, and the
// rounding keeps dh and d_next bit-identical to it (when C % Pack<T>::n == 0 and every base is
// 16-byte aligned, or on both sides not, the two take the same path). No aliasing among dh,
// d_next, dout, x.
template <typename T>
void rmsnorm_backward_residual(float* dh, T* d_next, float* dw, float* scratch, const T* dout,
                               const T* x, const T* w, const float* rstd, int64_t N, int C,
                               cudaStream_t s) {
    rmsnorm_backward_launch<T, true>(nullptr, dh, d_next, dw, scratch, dout, x, w, rstd, N, C,
                                     false, s);
}

}  // namespace gpu
}  // namespace ldm
