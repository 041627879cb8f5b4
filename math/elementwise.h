// math/elementwise.h — scalar per-element math shared by the CPU reference and the
// CUDA kernels. Every function is a small inline template marked LDM_HD, which expands to
// `__host__ __device__` under nvcc and to nothing otherwise. No allocation, no exceptions.
#pragma once
#include <math.h>
#include <string.h>

#if defined(__CUDACC__)
#define LDM_HD __host__ __device__
#else
#define LDM_HD
#endif

namespace ldm {

LDM_HD inline float ldm_exp(float x) { return expf(x); }
LDM_HD inline double ldm_exp(double x) { return exp(x); }
LDM_HD inline float ldm_log(float x) { return logf(x); }
LDM_HD inline double ldm_log(double x) { return log(x); }
LDM_HD inline float ldm_sqrt(float x) { return sqrtf(x); }
LDM_HD inline double ldm_sqrt(double x) { return sqrt(x); }

// exp for softmax-style arguments x <= 88 (larger x are clamped to 88), written so that loops
// vectorise (no libm call): x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), e^r by
// the Cephes expf minimax polynomial, times 2^n built from the exponent bits. x < -87.33 gives
// FLT_MIN (~1.2e-38) instead of a denormal or 0. Max relative error ~2 ulp (tested).
// The double overload is plain exp (the float64 path is the accuracy reference).
LDM_HD inline float exp_fast(float x) {
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.33654f ? -87.33654f : x;
    const float n = rintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    const int bits = ((int)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}
LDM_HD inline double exp_fast(double x) { return exp(x); }

// sigmoid(z) = 1 / (1 + exp(-z)).
template <typename R>
LDM_HD inline R sigmoid(R z) { return R(1) / (R(1) + ldm_exp(-z)); }

// silu(z) = z * sigmoid(z)  (the "swish" of SwiGLU, spec §1).
template <typename R>
LDM_HD inline R silu(R z) { return z * sigmoid(z); }

// d silu / dz = s * (1 + z * (1 - s)), s = sigmoid(z).
template <typename R>
LDM_HD inline R silu_grad(R z) {
    R s = sigmoid(z);
    return s * (R(1) + z * (R(1) - s));
}

// RMSNorm scale: 1 / sqrt(sum_sq / C + eps)   (spec §1 RMSNorm_w(x) = w * x * rms_scale).
template <typename R>
LDM_HD inline R rms_scale(R sum_sq, int C, R eps) { return R(1) / ldm_sqrt(sum_sq / R(C) + eps); }

// RMSNorm backward per row (y_c = w_c x_c s, s = rms_scale, g = dL/dy): the row coefficient
// k = s³/C · Σ_c w_c g_c x_c (dot = that sum), then dx_c = s w_c g_c - k x_c.
template <typename R>
LDM_HD inline R rms_backward_coef(R s, R dot, int C) { return s * s * s * dot / R(C); }
template <typename R>
LDM_HD inline R rms_backward_dx(R s, R w, R g, R k, R x) { return s * w * g - k * x; }

// RoPE, rotate-half convention: for the pair (x1, x2) = (x[i], x[i + hd/2]) at angle a,
//   y1 = x1 cos a - x2 sin a,   y2 = x2 cos a + x1 sin a.
template <typename R>
LDM_HD inline void rope_rotate(R x1, R x2, R c, R s, R* y1, R* y2) {
    *y1 = x1 * c - x2 * s;
    *y2 = x2 * c + x1 * s;
}
// Its transpose (the backward; also the inverse rotation): dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s.
template <typename R>
LDM_HD inline void rope_rotate_back(R dy1, R dy2, R c, R s, R* dx1, R* dx2) {
    *dx1 = dy1 * c + dy2 * s;
    *dx2 = dy2 * c - dy1 * s;
}

}  // namespace ldm
