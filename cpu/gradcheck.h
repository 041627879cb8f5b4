// cpu/gradcheck.h — finite-difference gradient checking (spec §3), header-only, float64.
//
// Derivative: 5-point stencil  f'(x) ~ (-f(x+2h) + 8 f(x+h) - 8 f(x-h) + f(x-2h)) / (12 h),
// default step h = 1e-4: truncation error h^4 |f^(5)| / 30 (~1e-16 relative), rounding error
// (e(x-2h) - 8 e(x-h) + 8 e(x+h) - e(x+2h)) / (12 h) with e the rounding error of one evaluation
// of f, which depends on the BLAS kernel and the summation order. Its scale is measured from
// the same evaluations plus f(x): the fourth difference
//   D4 = f(x+2h) - 4 f(x+h) + 6 f(x) - 4 f(x-h) + f(x-2h) = h^4 f^(4) + rounding
// is rounding noise at these steps, and the stencil's rounding bound is
//   noise = kNoise * rms(D4) / h     (rms over the checked entries and the direction),
// kNoise = 4: the suite's worst max|a - n| is 0.75 rms(D4) / h (doc/testing.md).
// An entry passes when |a_i - n_i| <= tol * max(|a_i|, |n_i|, floor) + noise, floor = 1e-3
// max_k |a_k| over the tensor (a = analytic, n = numeric): entries near zero are judged against
// the tensor's scale, and no entry against less than the stencil's own rounding. Reported:
//   max_err     = max_i |a_i - n_i| / max(|a_i|, |n_i|, floor)  (relative error, as printed)
//   entry_ratio = max_i |a_i - n_i| / (tol * max(|a_i|, |n_i|, floor) + noise)  (pass: <= 1)
// and for one random direction u ~ N(0, I) over the whole tensor (n_u = the stencil derivative
// of f(x + s u) at s = 0, step h_dir): dir_err = |a.u - n_u| / max(|a.u|, |n_u|) and
// dir_ratio = |a.u - n_u| / (tol_dir * max(|a.u|, |n_u|) + kNoise rms(D4) / h_dir).
// A wrong or missing term is orders of magnitude above the noise (~1e-11 absolute for the
// model losses of the tests).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "cpu/rng.h"

namespace ldm {
namespace gradcheck {

// Multiple of rms(D4) / h allowed for the stencil's rounding (see the header).
constexpr double kNoise = 4.0;

// Stencil derivative of f at x[i] (x is modified and restored). With f0 = f(x) given, *d4
// receives the fourth difference D4 of the same evaluations (a sample of f's rounding error).
inline double fd_entry(const std::function<double()>& f, double* x, double h, double f0 = 0,
                       double* d4 = nullptr) {
    const double x0 = *x;
    *x = x0 + 2 * h; double f2 = f();
    *x = x0 + h;     double f1 = f();
    *x = x0 - h;     double fm1 = f();
    *x = x0 - 2 * h; double fm2 = f();
    *x = x0;
    if (d4) *d4 = f2 - 4 * f1 + 6 * f0 - 4 * fm1 + fm2;
    return (-f2 + 8 * f1 - 8 * fm1 + fm2) / (12 * h);
}

struct Options {
    double h = 1e-4;        // entry step
    double tol = 1e-6;      // entry relative tolerance
    double tol_dir = 1e-6;  // directional relative tolerance
    double h_dir = 0;       // step along the direction (0: h)
};

struct Result {
    double max_err = 0;      // max relative entry error (nothing subtracted)
    double dir_err = 0;      // relative directional error
    double entry_ratio = 0;  // max entry |a - n| / (tol * scale + noise): passes when <= 1
    double dir_ratio = 0;    // the same for the direction
    double noise = 0;        // rms(D4) / h: the stencil's rounding scale (absolute, df/dx units)
    int64_t worst = -1;      // index of the entry with the largest entry_ratio
    double worst_a = 0, worst_n = 0;
    int64_t checked = 0;
    bool pass() const { return entry_ratio <= 1 && dir_ratio <= 1; }
};

// Checks `n` entries of x (all of them when count >= n, else `count` sampled by `seed`) and one
// random direction over the whole tensor. `analytic` holds df/dx for all n entries.
inline Result check(const std::function<double()>& f, double* x, const double* analytic, int64_t n,
                    int64_t count, uint64_t seed, const Options& o) {
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
    const double f0 = f();
    std::vector<double> num(idx.size()), d4(idx.size() + 1);
    for (size_t k = 0; k < idx.size(); k++) num[k] = fd_entry(f, x + idx[k], o.h, f0, &d4[k]);
    // Directional derivative along u ~ N(0,1)^n.
    const double h_dir = o.h_dir > 0 ? o.h_dir : o.h;
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
    const double nu = fd_entry(g, &s, h_dir, f0, &d4.back());
    for (int64_t i = 0; i < n; i++) x[i] = x0[i];
    double ss = 0;
    for (double v : d4) ss += v * v;
    const double d4_rms = std::sqrt(ss / (double)d4.size());
    r.noise = d4_rms / o.h;
    for (size_t k = 0; k < idx.size(); k++) {
        const double a = analytic[idx[k]];
        const double scale = std::max({std::fabs(a), std::fabs(num[k]), floor});
        const double diff = std::fabs(a - num[k]);
        const double ratio = diff / (o.tol * scale + kNoise * r.noise);
        r.max_err = std::max(r.max_err, diff / scale);
        if (r.worst < 0 || ratio > r.entry_ratio) {
            r.entry_ratio = ratio;
            r.worst = idx[k];
            r.worst_a = a;
            r.worst_n = num[k];
        }
        r.checked++;
    }
    const double dscale = std::max({std::fabs(au), std::fabs(nu), 1e-300});
    r.dir_err = std::fabs(au - nu) / dscale;
    r.dir_ratio = std::fabs(au - nu) / (o.tol_dir * dscale + kNoise * d4_rms / h_dir);
    return r;
}

// The same with step h and tolerance 1e-6 for entries and the direction.
inline Result check(const std::function<double()>& f, double* x, const double* analytic, int64_t n,
                    int64_t count, uint64_t seed, double h = 1e-4) {
    Options o;
    o.h = h;
    return check(f, x, analytic, n, count, seed, o);
}

}  // namespace gradcheck
}  // namespace ldm
