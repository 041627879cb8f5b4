// cpu/lanes.h — Lane<R>: W values of R in one SIMD register (GCC vector extension, 64 bytes:
// 16 floats or 8 doubles) that can stand in for the scalar type R of the per-element templates
// of math/ldm_math.h. Instantiated with Lane<R>, such a function processes W tokens at once (one
// per lane); every lane performs exactly the scalar function's operations in the same order
// (+, -, *, / and sqrt are lane-wise IEEE operations, like the scalar ones), so the results are
// those of W scalar calls. The operands then live in a tiled layout: element e of W tokens is
// one Lane. Used by cpu/scheme_ldm.cpp; plain host code (never compiled by nvcc).
#pragma once
#include <cmath>
#include <limits>

#define LDM_LANE_INLINE __attribute__((always_inline))

namespace ldm {
namespace cpu {

template <typename R>
struct Lane {
    static constexpr int W = 64 / (int)sizeof(R);
    typedef R V __attribute__((vector_size(64)));
    V v;

    Lane() = default;
    // Broadcast (implicit, like the scalar literals R(0), R(1) of the templates). Lane by lane,
    // so the sign of a zero is kept.
    Lane(R x) {
        for (int i = 0; i < W; i++) v[i] = x;
    }
    static Lane of(V x) {
        Lane l;
        l.v = x;
        return l;
    }
    R get(int i) const { return v[i]; }
    void set(int i, R x) { v[i] = x; }

    LDM_LANE_INLINE friend Lane operator+(Lane a, Lane b) { return of(a.v + b.v); }
    LDM_LANE_INLINE friend Lane operator-(Lane a, Lane b) { return of(a.v - b.v); }
    LDM_LANE_INLINE friend Lane operator*(Lane a, Lane b) { return of(a.v * b.v); }
    LDM_LANE_INLINE friend Lane operator/(Lane a, Lane b) { return of(a.v / b.v); }
    LDM_LANE_INLINE friend Lane operator-(Lane a) { return of(-a.v); }
    LDM_LANE_INLINE Lane& operator+=(Lane b) { v += b.v; return *this; }
    LDM_LANE_INLINE Lane& operator-=(Lane b) { v -= b.v; return *this; }
    LDM_LANE_INLINE Lane& operator*=(Lane b) { v *= b.v; return *this; }
    LDM_LANE_INLINE Lane& operator/=(Lane b) { v /= b.v; return *this; }
};

// Lane-wise functions for the math/*.h templates (found by argument-dependent lookup from their
// ldm_sqrt / ldm_exp / ldm_log / sinkhorn_* calls).
template <typename R>
inline Lane<R> ldm_sqrt(Lane<R> x) {
    for (int i = 0; i < Lane<R>::W; i++) x.v[i] = std::sqrt(x.v[i]);
    return x;
}

// e^x and log x of float lanes, evaluated in double on 8-wide double vectors (explicit vector
// code, no libm call): the double value has relative error < 1e-10 (< 2^-33), so the float
// result is the correctly rounded one except in rare near-halfway cases (<= 1 ulp; tested on
// every 7th float by test/test_lanes.cpp). Every input is handled like expf / logf: NaN -> NaN;
// exp: x > 88.73 -> inf, x < -103.98 -> 0 (subnormal results rounded correctly in between);
// log: +-0 -> -inf, x < 0 -> NaN, inf -> inf.
namespace lanes_detail {
typedef double D8 __attribute__((vector_size(64)));
typedef long long I8 __attribute__((vector_size(64)));
typedef float F8 __attribute__((vector_size(32)));
inline D8 splat(double x) { return D8{x, x, x, x, x, x, x, x}; }
inline I8 splat_i(long long x) { return I8{x, x, x, x, x, x, x, x}; }

inline D8 exp8(D8 x) {
    const I8 nan = x != x;
    x = x < splat(-150.0) ? splat(-150.0) : x;  // e^-150 < 2^-216: 0 in float
    x = x > splat(100.0) ? splat(100.0) : x;    // e^100 > FLT_MAX: inf in float
    // x = n ln2 + r, |r| <= ln2/2: n by the round-to-nearest shift, r by a two-part ln2.
    const D8 shift = splat(6755399441055744.0);  // 1.5 * 2^52: t's low mantissa bits hold n
    const D8 t = x * splat(1.4426950408889634) + shift, n = t - shift;
    const D8 r = (x - n * splat(6.93147180369123816490e-01)) - n * splat(1.90821492927058770002e-10);
    // e^r: Taylor to r^10 (remainder < 2e-13 relative for |r| <= 0.347).
    D8 p = splat(1.0 / 3628800.0);
    p = p * r + splat(1.0 / 362880.0);
    p = p * r + splat(1.0 / 40320.0);
    p = p * r + splat(1.0 / 5040.0);
    p = p * r + splat(1.0 / 720.0);
    p = p * r + splat(1.0 / 120.0);
    p = p * r + splat(1.0 / 24.0);
    p = p * r + splat(1.0 / 6.0);
    p = p * r + splat(0.5);
    p = p * r + splat(1.0);
    p = p * r + splat(1.0);
    const I8 ni = (I8)t - (I8)shift;  // n in [-217, 145]
    const D8 y = p * (D8)((ni + splat_i(1023)) << 52);
    return nan ? x : y;
}
inline D8 log8(D8 x) {  // x: float values (float subnormals are normal doubles)
    const I8 b = (I8)x;
    I8 e = ((b >> 52) & splat_i(0x7ff)) - splat_i(1023);
    D8 m = (D8)((b & splat_i(0x000fffffffffffffLL)) | splat_i(0x3ff0000000000000LL));  // [1, 2)
    const I8 hi = m > splat(1.4142135623730951);
    m = hi ? splat(0.5) * m : m;  // [sqrt(1/2), sqrt(2))
    e = hi ? e + splat_i(1) : e;
    // log m = 2 atanh(s), s = (m - 1)/(m + 1), |s| <= 0.1716: series to s^13 (remainder < 3e-12).
    const D8 s = (m - splat(1.0)) / (m + splat(1.0)), s2 = s * s;
    D8 p = splat(1.0 / 13.0);
    p = p * s2 + splat(1.0 / 11.0);
    p = p * s2 + splat(1.0 / 9.0);
    p = p * s2 + splat(1.0 / 7.0);
    p = p * s2 + splat(1.0 / 5.0);
    p = p * s2 + splat(1.0 / 3.0);
    p = p * s2 + splat(1.0);
    D8 y = __builtin_convertvector(e, D8) * splat(0.6931471805599453) + splat(2.0) * s * p;
    y = x == splat(0.0) ? splat(-HUGE_VAL) : y;
    y = x == splat(HUGE_VAL) ? splat(HUGE_VAL) : y;
    y = (x < splat(0.0)) | (x != x) ? splat((double)NAN) : y;
    return y;
}
template <class F>
inline Lane<float> via_double(Lane<float> x, F f) {
    F8 h[2];
    __builtin_memcpy(h, &x.v, sizeof h);
    for (int k = 0; k < 2; k++) h[k] = __builtin_convertvector(f(__builtin_convertvector(h[k], D8)), F8);
    __builtin_memcpy(&x.v, h, sizeof h);
    return x;
}
}  // namespace lanes_detail

inline Lane<float> ldm_exp(Lane<float> x) { return lanes_detail::via_double(x, lanes_detail::exp8); }
inline Lane<float> ldm_log(Lane<float> x) { return lanes_detail::via_double(x, lanes_detail::log8); }
// Scalar forms (tests): the value in lane 0.
inline float lane_expf(float x) { return ldm_exp(Lane<float>(x)).get(0); }
inline float lane_logf(float x) { return ldm_log(Lane<float>(x)).get(0); }

// math/sinkhorn.h's selections and floor value, lane by lane (same NaN behaviour as the scalar).
template <typename R>
inline Lane<R> sinkhorn_max(Lane<R> a, Lane<R> b) { return Lane<R>::of(a.v > b.v ? a.v : b.v); }
template <typename R>
inline Lane<R> sinkhorn_floor(Lane<R> d, Lane<R> lo) { return Lane<R>::of(d.v < lo.v ? lo.v : d.v); }
template <typename R>
inline Lane<R> sinkhorn_lowest(Lane<R>) { return Lane<R>(std::numeric_limits<R>::lowest()); }

// double lanes: libm per lane (the float64 build is the accuracy reference, not a fast path).
inline Lane<double> ldm_exp(Lane<double> x) {
    for (int i = 0; i < Lane<double>::W; i++) x.v[i] = std::exp(x.v[i]);
    return x;
}
inline Lane<double> ldm_log(Lane<double> x) {
    for (int i = 0; i < Lane<double>::W; i++) x.v[i] = std::log(x.v[i]);
    return x;
}

}  // namespace cpu
}  // namespace ldm
