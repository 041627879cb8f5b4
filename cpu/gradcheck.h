// cpu/gradcheck.h — finite-difference gradient checking (spec §3), header-only, float64.
//
// Derivative: 5-point stencil  f'(x) ~ (-f(x+2h) + 8 f(x+h) - 8 f(x-h) + f(x-2h)) / (12 h),
// default step h = 1e-4. Its truncation error is O(h^4) (~1e-16 relative); its roundoff is
// ~eps*|f|/h. With spec §3's h ~ 1e-6 the roundoff (~1e-9 for |f| ~ 5) alone gives entry
// errors ~1e-5 on the `tiny` model; measured worst entry errors there: h=1e-6: 2e-5,
// h=1e-5: 2e-6, h=1e-4: 3e-7, h=1e-3: 5e-8 (but directional 3e-5). See doc/cpu_reference.md.
// Relative error of one entry (the definition used by every gradient test):
//   err_i = |a_i - n_i| / max(|a_i|, |n_i|, floor),  floor = 1e-3 * max_k |a_k| over the tensor
// (a = analytic, n = numeric), so entries near zero are judged against the tensor's scale
// instead of dividing roundoff by ~0. Directional check along a random direction u over a whole
// tensor: |a.u - n_u| / max(|a.u|, |n_u|) with n_u the stencil derivative of f(x + s u).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "cpu/rng.h"

namespace ldm {
namespace gradcheck {

// Stencil derivative of f at x[i] (x is modified and restored).
inline double fd_entry(const std::function<double()>& f, double* x, double h) {
    const double x0 = *x;
    *x = x0 + 2 * h; double f2 = f();
    *x = x0 + h;     double f1 = f();
    *x = x0 - h;     double fm1 = f();
    *x = x0 - 2 * h; double fm2 = f();
    *x = x0;
    return (-f2 + 8 * f1 - 8 * fm1 + fm2) / (12 * h);
}

struct Result {
    double max_err = 0;   // max err_i over the checked entries
    double dir_err = 0;   // directional check error
    int64_t worst = -1;   // index of the worst entry
    double worst_a = 0, worst_n = 0;
    int64_t checked = 0;
};

// Checks `n` entries of x (all of them when count >= n, else `count` sampled by `seed`) and one
// random direction over the whole tensor. `analytic` holds df/dx for all n entries.
inline Result check(const std::function<double()>& f, double* x, const double* analytic, int64_t n,
                    int64_t count, uint64_t seed, double h = 1e-4) {
    Result r;
    double amax = 0;
    for (int64_t i = 0; i < n; i++) amax = std::max(amax, std::fabs(analytic[i]));
    const double floor = std::max(1e-3 * amax, 1e-300);
    std::vector<int64_t> idx;
    if (count >= n) {
        for (int64_t i = 0; i < n; i++) idx.push_back(i);
    } else {
        uint64_t s0 = init_stream(seed, 777);
        for (int64_t k = 0; k < count; k++)
            idx.push_back((int64_t)(stream_uniform(s0, (uint64_t)k) * (double)n));
    }
    for (int64_t i : idx) {
        double num = fd_entry(f, x + i, h);
        double a = analytic[i];
        double e = std::fabs(a - num) / std::max({std::fabs(a), std::fabs(num), floor});
        if (r.worst < 0 || e > r.max_err) {
            r.max_err = e;
            r.worst = i;
            r.worst_a = a;
            r.worst_n = num;
        }
        r.checked++;
    }
    // Directional derivative along u ~ N(0,1)^n.
    std::vector<double> u(n), x0(x, x + n);
    uint64_t su = init_stream(seed, 991);
    double au = 0;
    for (int64_t i = 0; i < n; i++) {
        u[i] = stream_normal(su, (uint64_t)i);
        au += analytic[i] * u[i];
    }
    double s = 0;
    auto g = [&]() {
        for (int64_t i = 0; i < n; i++) x[i] = x0[i] + s * u[i];
        return f();
    };
    double num = fd_entry(g, &s, h);
    for (int64_t i = 0; i < n; i++) x[i] = x0[i];
    r.dir_err = std::fabs(au - num) / std::max({std::fabs(au), std::fabs(num), 1e-300});
    return r;
}

}  // namespace gradcheck
}  // namespace ldm
