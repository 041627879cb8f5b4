// cpu/lanes.h — Lane<R>: W values of R in one SIMD register (GCC vector extension; 64 bytes with
// AVX-512: 16 floats or 8 doubles, else 32 bytes: 8 floats or 4 doubles) that can stand in for
// the scalar type R of the per-element templates of math/ldm_math.h. Instantiated with Lane<R>, such a function processes W tokens at once (one
// per lane); every lane performs exactly the scalar function's operations in the same order
// (+, -, *, / and sqrt are lane-wise IEEE operations, like the scalar ones), so the results are
// those of W scalar calls. The operands then live in a tiled layout: element e of W tokens is
// one Lane. Used by cpu/scheme_ldm.cpp; plain host code (never compiled by nvcc).
#pragma once
#include <cmath>
#include <limits>

#define LDM_LANE_INLINE __attribute__((always_inline))

// Bytes per Lane: one register of the widest vector unit the build targets (AVX-512: 64, else 32,
// i.e. two AVX2 registers would otherwise stand for each Lane and spill). Results do not depend on
// it: each lane computes the scalar function.
#ifdef __AVX512F__
#define LDM_LANE_BYTES 64
#else
#define LDM_LANE_BYTES 32
#endif

namespace ldm {
namespace cpu {

template <typename R>
struct Lane {
    static constexpr int W = LDM_LANE_BYTES / (int)sizeof(R);
    typedef R V __attribute__((vector_size(LDM_LANE_BYTES)));
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

// e^x and log x of float lanes: explicit vector code (no libm call), within 1 ulp of the
// correctly rounded value for EVERY float input (checked exhaustively over all 2^32 patterns
// when written; test/test_lanes.cpp sweeps every 61st), like glibc's expf / logf, which this
// replaces on lanes (they agree on ~99.6% of inputs). Special inputs as expf / logf: NaN -> NaN;
// exp: x > 88.73 -> inf, x < -103.98 -> 0, subnormal results rounded once; log: +-0 -> -inf,
// x < 0 -> NaN, inf -> inf, subnormal inputs exact in the exponent.
namespace lanes_detail {
typedef float FV __attribute__((vector_size(LDM_LANE_BYTES)));  // 16 floats on AVX-512, else 8
typedef int IV __attribute__((vector_size(LDM_LANE_BYTES)));
constexpr int kLanesF = LDM_LANE_BYTES / 4;
LDM_LANE_INLINE inline FV splat(float x) {
    FV r;
    for (int i = 0; i < kLanesF; i++) r[i] = x;
    return r;
}
LDM_LANE_INLINE inline IV splat_i(int x) {
    IV r;
    for (int i = 0; i < kLanesF; i++) r[i] = x;
    return r;
}

inline FV exp_v(FV x) {
    x = x < splat(-104.0f) ? splat(-104.0f) : x;  // e^-104 < half the smallest subnormal; NaN stays
    x = x > splat(89.0f) ? splat(89.0f) : x;      // e^89 > FLT_MAX
    // x = n ln2 + r, |r| <= ln2/2: n by the round-to-nearest shift (t's low mantissa bits hold
    // n), r with ln2 in two parts (the first exact in 9 bits, so n * it is exact).
    const FV shift = splat(12582912.0f);  // 1.5 * 2^23
    const FV t = x * splat(1.44269504088896341f) + shift, n = t - shift;
    FV r = x - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    // e^r = 1 + (r + r^2 q(r)), q the Taylor series to r^7 (remainder < 6e-9 relative); the
    // final 1 + small sum carries the only large rounding.
    FV q = splat(1.0f / 5040.0f);
    q = q * r + splat(1.0f / 720.0f);
    q = q * r + splat(1.0f / 120.0f);
    q = q * r + splat(1.0f / 24.0f);
    q = q * r + splat(1.0f / 6.0f);
    q = q * r + splat(0.5f);
    const FV p = splat(1.0f) + (r + (r * r) * q);
    // times 2^n in two exact steps 2^(n-k) 2^k (|n| <= 151 does not fit one float exponent), so
    // a subnormal or overflowing result is rounded once; a NaN in p stays NaN.
    const IV ni = (IV)t - (IV)shift;
    const IV k = ni > splat_i(100) ? splat_i(50) : (ni < splat_i(-100) ? splat_i(-50) : splat_i(0));
    const FV s1 = (FV)((ni - k + splat_i(127)) << 23), s2 = (FV)((k + splat_i(127)) << 23);
    return (p * s1) * s2;
}
inline FV log_v(FV x) {
    // x = m 2^e, m in [sqrt(1/2), sqrt(2)); subnormals first scaled by 2^23.
    const IV sub = ((IV)x & splat_i(0x7f800000)) == splat_i(0);
    const IV b = (IV)(sub ? x * splat(8388608.0f) : x);
    IV e = ((b >> 23) & splat_i(0xff)) - splat_i(127);
    e = sub ? e - splat_i(23) : e;
    FV m = (FV)((b & splat_i(0x007fffff)) | splat_i(0x3f800000));  // [1, 2)
    const IV hi = m > splat(1.41421356f);
    m = hi ? splat(0.5f) * m : m;
    e = hi ? e + splat_i(1) : e;
    // log(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2)), s = f/(2 + f), |s| <= 0.1716, R the atanh
    // series 2 (s^2/3 + s^4/5 + s^6/7 + s^8/9) (remainder < 2e-9); plus e ln2 in two parts.
    const FV f = m - splat(1.0f);
    const FV s = f / (splat(2.0f) + f), s2 = s * s;
    FV R = splat(2.0f / 9.0f);
    R = R * s2 + splat(2.0f / 7.0f);
    R = R * s2 + splat(2.0f / 5.0f);
    R = R * s2 + splat(2.0f / 3.0f);
    R = R * s2;
    const FV hfsq = splat(0.5f) * f * f;
    const FV ef = __builtin_convertvector(e, FV);
    FV y = ef * splat(6.9313812256e-01f) + (f - (hfsq - (s * (hfsq + R) + ef * splat(9.0580006145e-06f))));
    y = x == splat(0.0f) ? splat(-INFINITY) : y;
    y = x == splat(INFINITY) ? splat(INFINITY) : y;
    y = (x < splat(0.0f)) | (x != x) ? splat(NAN) : y;
    return y;
}
}  // namespace lanes_detail

inline Lane<float> ldm_exp(Lane<float> x) { return Lane<float>::of(lanes_detail::exp_v(x.v)); }
inline Lane<float> ldm_log(Lane<float> x) { return Lane<float>::of(lanes_detail::log_v(x.v)); }
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
