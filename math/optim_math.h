// math/optim_math.h — the per-element AdamW update (spec model.md §1 "AdamW defaults"), shared
// by core/optim.cpp (CPU, float and double) and cuda/adamw.cuh (GPU, fp32 master weights), so that
// both run literally the same arithmetic. Compiles with g++ (plain C++) and nvcc (LDM_HD =
// __host__ __device__).
//
// Bit-compatibility CPU <-> GPU: every operation of the update is one explicitly rounded IEEE
// operation (rn_mul, rn_add, rn_fma, ... below): on the device the __f*_rn / __d*_rn intrinsics,
// which nvcc never contracts or reorders; on the host the plain operators and fma()/fmaf(), where
// the formula leaves no multiply feeding an add that g++ could still contract. Division and sqrt
// are correctly rounded on both sides. The fused steps are the ones g++ -O2 -march=native chose
// for the original loop of core/optim.cpp (checked on its disassembly), so CPU results did not
// change when that loop moved here. With the scalars of adamw_scalars() (double, then cast to T)
// the GPU update is bit-identical to AdamW<float>::step for the same clip factor.
#pragma once
#include <math.h>
#include <stdint.h>

#include "math/elementwise.h"

namespace ldm {

// Round-to-nearest-even arithmetic, each a single rounding, never fused further (file comment);
// rn_fma(a, b, c) = a*b + c rounded once.
#if defined(__CUDA_ARCH__)
LDM_HD inline float rn_mul(float a, float b) { return __fmul_rn(a, b); }
LDM_HD inline float rn_add(float a, float b) { return __fadd_rn(a, b); }
LDM_HD inline float rn_sub(float a, float b) { return __fsub_rn(a, b); }
LDM_HD inline float rn_div(float a, float b) { return __fdiv_rn(a, b); }
LDM_HD inline float rn_sqrt(float a) { return __fsqrt_rn(a); }
LDM_HD inline float rn_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
LDM_HD inline double rn_mul(double a, double b) { return __dmul_rn(a, b); }
LDM_HD inline double rn_add(double a, double b) { return __dadd_rn(a, b); }
LDM_HD inline double rn_sub(double a, double b) { return __dsub_rn(a, b); }
LDM_HD inline double rn_div(double a, double b) { return __ddiv_rn(a, b); }
LDM_HD inline double rn_sqrt(double a) { return __dsqrt_rn(a); }
LDM_HD inline double rn_fma(double a, double b, double c) { return __fma_rn(a, b, c); }
#else
LDM_HD inline float rn_mul(float a, float b) { return a * b; }
LDM_HD inline float rn_add(float a, float b) { return a + b; }
LDM_HD inline float rn_sub(float a, float b) { return a - b; }
LDM_HD inline float rn_div(float a, float b) { return a / b; }
LDM_HD inline float rn_sqrt(float a) { return sqrtf(a); }
LDM_HD inline float rn_fma(float a, float b, float c) { return fmaf(a, b, c); }
LDM_HD inline double rn_mul(double a, double b) { return a * b; }
LDM_HD inline double rn_add(double a, double b) { return a + b; }
LDM_HD inline double rn_sub(double a, double b) { return a - b; }
LDM_HD inline double rn_div(double a, double b) { return a / b; }
LDM_HD inline double rn_sqrt(double a) { return sqrt(a); }
LDM_HD inline double rn_fma(double a, double b, double c) { return fma(a, b, c); }
#endif

// The scalars of one AdamW update in the parameter dtype T (float or double).
template <typename T>
struct AdamWScalars {
    T b1, b2;               // beta1, beta2
    T one_m_b1, one_m_b2;   // 1 - beta1, 1 - beta2 (computed in double)
    T bc1, bc2;             // bias corrections 1 - beta1^t, 1 - beta2^t
    T clip;                 // gradient multiplier c (global-norm clip factor, 1 = none)
    T lr, eps, wd;          // learning rate, epsilon, decoupled weight decay
};

// Host: the scalars for update t (1-based) from the double-precision hyperparameters. Each value
// is computed in double and then rounded once to T (this is what makes CPU and GPU agree).
template <typename T>
inline AdamWScalars<T> adamw_scalars(double beta1, double beta2, double eps, double weight_decay,
                                     double lr, double clip, int64_t t) {
    AdamWScalars<T> s;
    s.b1 = T(beta1);
    s.b2 = T(beta2);
    s.one_m_b1 = T(1.0 - beta1);
    s.one_m_b2 = T(1.0 - beta2);
    s.bc1 = T(1.0 - pow(beta1, double(t)));
    s.bc2 = T(1.0 - pow(beta2, double(t)));
    s.clip = T(clip);
    s.lr = T(lr);
    s.eps = T(eps);
    s.wd = T(weight_decay);
    return s;
}

// The global-norm clip factor c = min(1, clip / ||g||) of core/optim.cpp: 1 when grad_clip <= 0 or
// the norm is within it (also for a NaN norm; the divergence guard stops such a step). Double,
// correctly rounded on both sides, so a factor computed on the device equals the host's.
LDM_HD inline double adamw_clip_factor(double grad_norm, double grad_clip) {
    return (grad_clip > 0 && grad_norm > grad_clip) ? rn_div(grad_clip, grad_norm) : 1.0;
}

// One element of the update (core/optim.h documents the formula):
//   g' = c g;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
//   p = p - lr * ( (m / bc1) / (sqrt(v / bc2) + eps) + [decay] wd * p )
// with this exact rounding: g' = rn(g c); m = fma(b1, m, rn((1-b1) g')); v = fma(b2, v,
// rn(rn((1-b2) g') g')); u = rn(rn(m/bc1) / rn(sqrt(rn(v/bc2)) + eps)); [decay] u = fma(wd, p, u);
// p = fma(-lr, u, p). p, m, v are updated in place.
template <typename T>
LDM_HD inline void adamw_element(T& p, T& m, T& v, T g, const AdamWScalars<T>& s, bool decay) {
    const T gi = rn_mul(g, s.clip);
    const T mi = rn_fma(s.b1, m, rn_mul(s.one_m_b1, gi));
    const T vi = rn_fma(s.b2, v, rn_mul(rn_mul(s.one_m_b2, gi), gi));
    m = mi;
    v = vi;
    const T mhat = rn_div(mi, s.bc1), vhat = rn_div(vi, s.bc2);
    T upd = rn_div(mhat, rn_add(rn_sqrt(vhat), s.eps));
    if (decay) upd = rn_fma(s.wd, p, upd);
    p = rn_fma(-s.lr, upd, p);
}

}  // namespace ldm
