// dev/cpu/elementwise.h — scalar per-element math shared by the CPU reference and (later) the
// CUDA kernels. Every function is a small inline template marked LDM_HD, which expands to
// `__host__ __device__` under nvcc and to nothing otherwise. No allocation, no exceptions.
#pragma once
#include <math.h>

#if defined(__CUDACC__)
#define LDM_HD __host__ __device__
#else
#define LDM_HD
#endif

namespace ldm {

LDM_HD inline float ldm_exp(float x) { return expf(x); }
LDM_HD inline double ldm_exp(double x) { return exp(x); }
LDM_HD inline float ldm_sqrt(float x) { return sqrtf(x); }
LDM_HD inline double ldm_sqrt(double x) { return sqrt(x); }

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
