// cpu/lanes.h — Lane<R>: W values of R in one SIMD register (GCC vector extension, 64 bytes:
// 16 floats or 8 doubles) that can stand in for the scalar type R of the per-element templates
// of math/ldm_math.h. Instantiated with Lane<R>, such a function processes W tokens at once (one
// per lane); every lane performs exactly the scalar function's operations in the same order
// (+, -, *, / and sqrt are lane-wise IEEE operations, like the scalar ones), so the results are
// those of W scalar calls. The operands then live in a tiled layout: element e of W tokens is
// one Lane. Used by cpu/scheme_ldm.cpp; plain host code (never compiled by nvcc).
#pragma once
#include <cmath>

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

// Lane-wise square root (found by argument-dependent lookup from math/*.h's ldm_sqrt calls).
template <typename R>
inline Lane<R> ldm_sqrt(Lane<R> x) {
    for (int i = 0; i < Lane<R>::W; i++) x.v[i] = std::sqrt(x.v[i]);
    return x;
}

}  // namespace cpu
}  // namespace ldm
