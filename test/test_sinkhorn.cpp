// test/test_sinkhorn.cpp — math/sinkhorn.h (mHC's Sinkhorn-Knopp, spec §2.3) at every logit
// magnitude: the forward against the spec's formula evaluated in extended range (long double),
// the exact invariance to shifting a column, stochasticity of the output, finite and
// structurally right outputs and gradients for logits up to ±FLT_MAX, the unrolled backward vs
// finite differences (float64) and the fp32 gradient vs the float64 one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cpu/gradcheck.h"
#include "cpu/rng.h"
#include "math/sinkhorn.h"

namespace {

using ldm::init_stream;
using ldm::stream_normal;
using ldm::stream_uniform;

template <typename R>
std::vector<R> sk(const std::vector<R>& Rt, int n, int it, std::vector<R>* work = nullptr) {
    std::vector<R> out(n * n), w(ldm::sinkhorn_work_size(n, it));
    ldm::sinkhorn_forward(Rt.data(), n, it, out.data(), w.data());
    if (work) *work = w;
    return out;
}

// dRt of the loss sum(W ⊙ SK(Rt)) by sinkhorn_backward.
template <typename R>
std::vector<R> sk_grad(const std::vector<R>& Rt, const std::vector<R>& W, int n, int it) {
    std::vector<R> work, dout = W, dRt(n * n);
    sk(Rt, n, it, &work);
    ldm::sinkhorn_backward(dout.data(), n, it, work.data(), dRt.data());
    return dRt;
}

// The spec's formula verbatim in linear arithmetic: M = exp(Rt - max(Rt)), then `it` times
// divide every column by its sum, then every row. Finite and accurate in type R as long as no
// iterate entry leaves R's normal range (plain_ok).
template <typename R>
std::vector<R> sk_plain(const std::vector<R>& Rt, int n, int it) {
    std::vector<R> X(Rt.size());
    const R mx = *std::max_element(Rt.begin(), Rt.end());
    for (size_t e = 0; e < X.size(); e++) X[e] = std::exp(Rt[e] - mx);
    for (int s = 0; s < 2 * it; s++)
        for (int a = 0; a < n; a++) {
            R t = 0;
            for (int b = 0; b < n; b++) t += s % 2 == 0 ? X[b * n + a] : X[a * n + b];
            for (int b = 0; b < n; b++) (s % 2 == 0 ? X[b * n + a] : X[a * n + b]) /= t;
        }
    return X;
}

template <typename R>
double unit_roundoff() {
    return std::numeric_limits<R>::epsilon() / 2;
}

template <typename R>
double spread(const std::vector<R>& v) {
    return (double)*std::max_element(v.begin(), v.end()) - (double)*std::min_element(v.begin(), v.end());
}

// Every normalised iterate has its entries in [exp(-K), 1], K = S + 2 it ln n (S = spread of
// the logits): a normalisation lowers a log-entry by at most ln n below the previous step's
// (<= 0) values, and the first one starts from entries >= -S.
double log_range(double S, int n, int it) { return S + 2 * it * std::log((double)n); }

// sk_plain in type R stays in the normal range (so it is accurate) when exp(-K) / n is normal.
template <typename R>
bool plain_ok(double S, int n, int it) {
    return log_range(S, n, it) + std::log((double)n) < -(double)std::log(std::numeric_limits<R>::min());
}

// First-order error model of sinkhorn_forward in type R: each of the T = 2 it steps rounds every
// log-domain entry once relative to its magnitude (<= K) and adds the error of its line's log-sum
// (<= ~(n + 2) u); a normalisation subtracts a weighted line average of the errors, which does
// not amplify them, so output entries (<= 1) are off by at most T u (K + n) absolutely.
// S is the spread of the logits after shifting each column by its max (the first step's
// subtraction is then exact or rounds relative to that spread). Measured worst ratio of the
// error to this bound over the draws below: ~0.3 (fp32 and fp64).
template <typename R>
double fwd_bound(double S, int n, int it) {
    return 2 * it * unit_roundoff<R>() * (log_range(S, n, it) + n);
}

// Rt with every column shifted by its max, in long double: SK is exactly invariant to it.
template <typename R>
std::vector<long double> col_shifted(const std::vector<R>& Rt, int n) {
    std::vector<long double> o(Rt.begin(), Rt.end());
    for (int j = 0; j < n; j++) {
        long double m = o[j];
        for (int i = 1; i < n; i++) m = std::max(m, o[i * n + j]);
        for (int i = 0; i < n; i++) o[i * n + j] -= m;
    }
    return o;
}

// Checks an output of sinkhorn_forward in type R: finite, entries in [0, 1], rows sum to 1 up to
// the last step's rounding (n + 2 roundings of values <= 1).
template <typename R>
void check_stochastic_rows(const std::vector<R>& out, int n) {
    for (int a = 0; a < n; a++) {
        double r = 0;
        for (int b = 0; b < n; b++) {
            const R v = out[a * n + b];
            REQUIRE(std::isfinite((double)v));
            CHECK(v >= 0);
            CHECK(v <= 1);
            r += v;
        }
        CHECK(std::fabs(r - 1) <= 2 * (n + 2) * unit_roundoff<R>());
    }
}

}  // namespace

TEST_CASE("Sinkhorn forward equals the spec's formula (extended range), logits of every scale",
          "[sinkhorn]") {
    static_assert(std::numeric_limits<long double>::max_exponent >= 16384 ||
                      std::numeric_limits<long double>::digits == 53,
                  "long double is either x87/quad extended or plain double");
    double worst32 = 0, worst64 = 0, worst_plain = 0;
    int n_plain = 0;
    for (int n = 1; n <= 8; n++)
        for (int it : {1, 2, 3, 20})
            for (double scale : {0.1, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0})
                for (int trial = 0; trial < 20; trial++) {
                    uint64_t s0 = init_stream(trial * 1000 + n * 10 + it, (uint64_t)(scale * 10));
                    std::vector<float> Rf(n * n);
                    for (int e = 0; e < n * n; e++) Rf[e] = (float)(scale * stream_normal(s0, e));
                    std::vector<double> Rd(Rf.begin(), Rf.end());
                    std::vector<long double> Rl(Rf.begin(), Rf.end());
                    const double S = spread(Rf);
                    INFO("n " << n << " iters " << it << " scale " << scale << " trial " << trial << " spread " << S);
                    if (!plain_ok<long double>(S, n, it)) {
                        // only where long double is plain double; x87/quad cover every draw
                        CHECK(std::numeric_limits<long double>::digits == 53);
                        continue;
                    }
                    const auto ref = sk_plain(Rl, n, it);
                    const auto o32 = sk(Rf, n, it);
                    const auto o64 = sk(Rd, n, it);
                    check_stochastic_rows(o32, n);
                    check_stochastic_rows(o64, n);
                    const double Sc = spread(col_shifted(Rf, n));
                    const double b32 = fwd_bound<float>(Sc, n, it), b64 = fwd_bound<double>(Sc, n, it);
                    // The current linear-domain fp32 algorithm (the spec's formula in fp32), where
                    // it stays in float's normal range: the same function, so the same values.
                    const bool plain32 = plain_ok<float>(S, n, it);
                    const auto p32 = plain32 ? sk_plain(Rf, n, it) : std::vector<float>();
                    const double bp32 = 2 * it * (n + 2) * unit_roundoff<float>();
                    n_plain += plain32;
                    for (int e = 0; e < n * n; e++) {
                        const double r = (double)ref[e];
                        CHECK(std::fabs(o32[e] - r) <= b32);
                        CHECK(std::fabs(o64[e] - r) <= b64);
                        worst32 = std::max(worst32, std::fabs(o32[e] - r) / b32);
                        worst64 = std::max(worst64, std::fabs(o64[e] - r) / b64);
                        if (plain32) {
                            CHECK(std::fabs(o32[e] - p32[e]) <= b32 + bp32);
                            worst_plain = std::max(worst_plain, std::fabs(o32[e] - p32[e]) / (b32 + bp32));
                        }
                    }
                }
    WARN("Sinkhorn forward vs the extended-range formula: worst |error| / bound fp32 "
         << worst32 << ", fp64 " << worst64 << "; vs the linear fp32 algorithm (" << n_plain << " draws) "
         << worst_plain);
    CHECK(n_plain > 1000);
}

TEST_CASE("Sinkhorn: rows sum to 1, columns close to 1 after 20 iterations (fp32 and fp64)", "[sinkhorn]") {
    // Documented column tolerance after 20 iterations, for logits of the scale mHC sees
    // (|Rt| <~ 2; measured worst over these draws is printed).
    const double col_tol = 1e-3;
    double worst_row32 = 0, worst_col32 = 0, worst_col64 = 0;
    for (int trial = 0; trial < 200; trial++) {
        const int n = 4, it = 20;
        uint64_t s0 = ldm::init_stream(trial, 3);
        std::vector<double> Rd(n * n);
        std::vector<float> Rf(n * n);
        for (int e = 0; e < n * n; e++) Rf[e] = (float)(Rd[e] = stream_normal(s0, e));
        auto Md = sk(Rd, n, it);
        auto Mf = sk(Rf, n, it);
        for (int a = 0; a < n; a++) {
            double r64 = 0, c64 = 0, r32 = 0, c32 = 0;
            for (int b = 0; b < n; b++) {
                r64 += Md[a * n + b];
                c64 += Md[b * n + a];
                r32 += Mf[a * n + b];
                c32 += Mf[b * n + a];
                CHECK(Mf[a * n + b] > 0);
            }
            CHECK(std::fabs(r64 - 1) <= 1e-12);
            worst_row32 = std::max(worst_row32, std::fabs(r32 - 1));
            worst_col32 = std::max(worst_col32, std::fabs(c32 - 1));
            worst_col64 = std::max(worst_col64, std::fabs(c64 - 1));
        }
    }
    WARN("Sinkhorn n=4, 20 iterations, Rt ~ N(0,1): max |row sum - 1| fp32 " << worst_row32
         << ", max |col sum - 1| fp32 " << worst_col32 << " fp64 " << worst_col64);
    CHECK(worst_row32 <= 1e-6);
    CHECK(worst_col32 <= col_tol);
    CHECK(worst_col64 <= col_tol);
    // Converges to a doubly stochastic matrix with more iterations; all-equal logits give 1/n.
    std::vector<double> z(16, 0.3);
    for (double v : sk(z, 4, 20)) CHECK(v == 0.25);
}

namespace {

// One extreme test input: n x n logits, float.
struct Case {
    std::string what;
    std::vector<float> Rt;
};

// base ~ N(0, 1) plus the offsets: row i gets u[i], column j gets v[j] (summed in double, then
// rounded to float, so a huge offset leaves only its own value in the entry).
std::vector<float> offset_logits(int n, uint64_t seed, const std::vector<double>& u, const std::vector<double>& v) {
    std::vector<float> R(n * n);
    uint64_t s0 = init_stream(seed, 41);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) R[i * n + j] = (float)(stream_normal(s0, i * n + j) + (u[i] + v[j]));
    return R;
}

std::string num(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return b;
}

std::vector<Case> extreme_cases(int n, uint64_t seed) {
    std::vector<Case> cs;
    const std::vector<double> offs = {-90, -1e3, -1e30, -(double)FLT_MAX, 1e3, 1e30, (double)FLT_MAX};
    const std::vector<double> zero(n, 0.0);
    for (double o : offs) {
        std::vector<double> u = zero, v = zero;
        v[n / 2] = o;
        cs.push_back({"column " + std::to_string(n / 2) + " at " + num(o), offset_logits(n, seed, zero, v)});
        u[n - 1] = o;
        cs.push_back({"row " + std::to_string(n - 1) + " at " + num(o), offset_logits(n, seed, u, zero)});
        if (n > 1) {
            v.assign(n, 0.0);
            v[0] = -o;
            cs.push_back({"row at " + num(o) + " and column at " + num(-o), offset_logits(n, seed, u, v)});
        }
    }
    // Mixed signs: rows alternately +-o, columns -+o or -+2o (the entries where the two cancel
    // keep their base), o = 1e3 and 1e30.
    for (double o : {1e3, 1e30}) {
        std::vector<double> u(n), v(n);
        for (int i = 0; i < n; i++) u[i] = (i % 2 ? o : -o), v[i] = (i % 2 ? -o : o) * (i % 3 == 2 ? 2 : 1);
        cs.push_back({"mixed rows/columns at +-" + num(o), offset_logits(n, seed, u, v)});
    }
    // Every entry a random +-1e30 or +-1e38 (spreads beyond FLT_MAX reach the floor).
    for (double o : {1e30, 1e38}) {
        std::vector<float> R(n * n);
        uint64_t s0 = init_stream(seed, 43);
        for (int e = 0; e < n * n; e++) R[e] = (float)(o * stream_normal(s0, e));
        cs.push_back({"entries ~ N(0, 1) x " + num(o), R});
    }
    for (double c : {0.0, -1e30, 1e30, -(double)FLT_MAX, (double)FLT_MAX})
        cs.push_back({"all equal to " + num(c), std::vector<float>(n * n, (float)c)});
    return cs;
}

}  // namespace

TEST_CASE("Sinkhorn at extreme logits: finite, stochastic rows, exact where the answer is known",
          "[sinkhorn][extreme]") {
    double worst_ref = 0, worst_cs32 = 0, worst_cs64 = 0;
    int n_ref = 0;
    for (int n = 1; n <= 8; n++)
        for (int it : {1, 3, 20})
            for (const Case& c : extreme_cases(n, 100 + n)) {
                INFO("n " << n << " iters " << it << ": " << c.what);
                std::vector<double> Rd(c.Rt.begin(), c.Rt.end()), Wd(n * n);
                uint64_t s0 = init_stream(n * 7 + it, 44);
                for (int e = 0; e < n * n; e++) Wd[e] = stream_normal(s0, e);
                std::vector<float> Wf(Wd.begin(), Wd.end());
                const auto o32 = sk(c.Rt, n, it);
                const auto o64 = sk(Rd, n, it);
                check_stochastic_rows(o32, n);
                check_stochastic_rows(o64, n);
                const auto g32 = sk_grad(c.Rt, Wf, n, it);
                const auto g64 = sk_grad(Rd, Wd, n, it);
                // SK(Rt + 1 v^T) = SK(Rt): the gradient sums to 0 over every column, at any
                // magnitude, up to the rounding of the first backward step's ~n + 2 operations on
                // values of size ~max(|dRt|, |W|).
                double gm32 = 0, gm64 = 0;
                for (int e = 0; e < n * n; e++) {
                    REQUIRE(std::isfinite(g32[e]));
                    REQUIRE(std::isfinite(g64[e]));
                    gm32 = std::max(gm32, (double)std::fabs(g32[e]));
                    gm64 = std::max(gm64, std::fabs(g64[e]));
                }
                double wm = 0;
                for (double w : Wd) wm = std::max(wm, std::fabs(w));
                const double G32 = (n + 2) * unit_roundoff<float>() * std::max(gm32, wm);
                const double G64 = (n + 2) * unit_roundoff<double>() * std::max(gm64, wm);
                for (int j = 0; j < n; j++) {
                    double c32 = 0, c64 = 0;
                    for (int i = 0; i < n; i++) c32 += g32[i * n + j], c64 += g64[i * n + j];
                    CHECK(std::fabs(c32) <= G32);
                    CHECK(std::fabs(c64) <= G64);
                    worst_cs32 = std::max(worst_cs32, std::fabs(c32) / G32);
                    worst_cs64 = std::max(worst_cs64, std::fabs(c64) / G64);
                }
                // Where every column's own spread is moderate, the answer is the spec's formula on
                // the column-shifted logits (exact invariance) in long double.
                const auto sh = col_shifted(c.Rt, n);
                const double S = spread(sh);
                if (plain_ok<long double>(S, n, it)) {
                    n_ref++;
                    const auto ref = sk_plain(sh, n, it);
                    for (int e = 0; e < n * n; e++) {
                        CHECK(std::fabs(o32[e] - (double)ref[e]) <= fwd_bound<float>(S, n, it));
                        CHECK(std::fabs(o64[e] - (double)ref[e]) <= fwd_bound<double>(S, n, it));
                        worst_ref = std::max(worst_ref, std::fabs(o32[e] - (double)ref[e]) /
                                                            fwd_bound<float>(S, n, it));
                    }
                }
                if (c.what.rfind("all equal", 0) == 0) {
                    // Every iterate is 1/n, each backward step centres its lines, so dRt is W / n
                    // double-centred: (W_ij - mean_i. - mean_.j + mean) / n, whatever the iters.
                    double mean = 0;
                    std::vector<double> rm(n, 0.0), cm(n, 0.0);
                    for (int i = 0; i < n; i++)
                        for (int j = 0; j < n; j++) {
                            rm[i] += Wd[i * n + j] / n;
                            cm[j] += Wd[i * n + j] / n;
                            mean += Wd[i * n + j] / (n * n);
                        }
                    for (int i = 0; i < n; i++)
                        for (int j = 0; j < n; j++) {
                            const int e = i * n + j;
                            CHECK(o32[e] == 1.0f / (float)n);
                            CHECK(o64[e] == 1.0 / n);
                            const double g = (Wd[e] - rm[i] - cm[j] + mean) / n;
                            // 2 it steps, each n + 2 roundings of values <= 4 max|W|
                            CHECK(std::fabs(g32[e] - g) <= 2 * it * (n + 2) * unit_roundoff<float>() * 4 * wm);
                            CHECK(std::fabs(g64[e] - g) <= 2 * it * (n + 2) * unit_roundoff<double>() * 4 * wm);
                        }
                }
            }
    WARN("extreme logits: " << n_ref << " cases with a reference, worst |error| / bound " << worst_ref
         << "; worst |column sum of dRt| / ((n + 2) u max(|dRt|, |W|)): fp32 " << worst_cs32 << " fp64 "
         << worst_cs64);
}

TEST_CASE("Sinkhorn backward (unrolled) vs finite differences, float64, random and extreme logits",
          "[sinkhorn][grad]") {
    // Loss sum(W ⊙ SK(Rt)), 5-point stencil with h = 1e-4 per entry and along one random
    // direction. Its error: truncation O(h^4) (the 1e-8 relative term) plus the stencil's
    // roundoff 1.5 eps_f / h, eps_f = sum|W| x fwd_bound<double> the error of one evaluation.
    const double h = 1e-4;
    double worst = 0;
    auto run = [&](const std::vector<double>& Rt0, int n, int it, uint64_t seed, const std::string& what) {
        std::vector<double> Rt = Rt0, W(n * n);
        uint64_t s0 = init_stream(seed, 9);
        double wsum = 0;
        for (int e = 0; e < n * n; e++) wsum += std::fabs(W[e] = stream_normal(s0, 1000 + e));
        auto f = [&]() {
            auto M = sk(Rt, n, it);
            double L = 0;
            for (int e = 0; e < n * n; e++) L += W[e] * M[e];
            return L;
        };
        const auto dRt = sk_grad(Rt, W, n, it);
        INFO(what << " n " << n << " iters " << it);
        if (n == 1) {  // SK = 1 whatever the logit
            CHECK(dRt[0] == 0);
            return;
        }
        const double noise = 1.5 * wsum * fwd_bound<double>(spread(col_shifted(Rt, n)), n, it) / h;
        auto judge = [&](double a, double num) {
            const double err = std::fabs(a - num), tol = 1e-8 * std::max(std::fabs(a), std::fabs(num)) + noise;
            INFO("analytic " << a << " numeric " << num << " tolerance " << tol);
            CHECK(err <= tol);
            worst = std::max(worst, err / tol);
        };
        for (int e = 0; e < n * n; e++) judge(dRt[e], ldm::gradcheck::fd_entry(f, Rt.data() + e, h));
        std::vector<double> u(n * n);
        double au = 0, t = 0;
        for (int e = 0; e < n * n; e++) au += dRt[e] * (u[e] = stream_normal(s0, 2000 + e));
        auto g = [&]() {
            for (int e = 0; e < n * n; e++) Rt[e] = Rt0[e] + t * u[e];
            return f();
        };
        judge(au, ldm::gradcheck::fd_entry(g, &t, h));
    };
    for (int n = 1; n <= 8; n++)
        for (int it : {1, 2, 3, 20}) {
            for (double scale : {1.5, 5.0}) {
                uint64_t s0 = init_stream(n * 100 + it, (uint64_t)scale);
                std::vector<double> Rt(n * n);
                for (int e = 0; e < n * n; e++) Rt[e] = scale * stream_normal(s0, e);
                run(Rt, n, it, n * 100 + it, "N(0,1) x " + num(scale));
            }
            for (const Case& c : extreme_cases(n, 200 + n)) {
                std::vector<double> Rt(c.Rt.begin(), c.Rt.end());
                // finite differences need logits that resolve the step h in float64 (and a
                // noise bound below the gradient): up to |Rt| ~ 1e4
                const double mx = *std::max_element(Rt.begin(), Rt.end()), mn = *std::min_element(Rt.begin(), Rt.end());
                if (mx > 1e4 || mn < -1e4) continue;
                run(Rt, n, it, n * 100 + it + 7, c.what);
            }
        }
    WARN("Sinkhorn backward vs finite differences: worst error / tolerance " << worst);
}

TEST_CASE("Sinkhorn backward: fp32 vs float64, random and extreme logits", "[sinkhorn][grad]") {
    double worst = 0;
    auto run = [&](const std::vector<float>& Rf, int n, int it, uint64_t seed) {
        std::vector<double> Rd(Rf.begin(), Rf.end()), Wd(n * n);
        uint64_t s0 = init_stream(seed, 19);
        double wm = 0;
        for (int e = 0; e < n * n; e++) wm = std::max(wm, std::fabs(Wd[e] = stream_normal(s0, e)));
        std::vector<float> Wf(Wd.begin(), Wd.end());
        const auto g32 = sk_grad(Rf, Wf, n, it);
        const auto g64 = sk_grad(Rd, Wd, n, it);
        const double S = spread(col_shifted(Rf, n));
        const double tol = wm * fwd_bound<float>(S, n, it);
        for (int e = 0; e < n * n; e++) {
            CHECK(std::fabs(g32[e] - g64[e]) <= tol);
            worst = std::max(worst, std::fabs(g32[e] - g64[e]) / tol);
        }
    };
    for (int n = 1; n <= 8; n++)
        for (int it : {1, 2, 3, 20}) {
            for (double scale : {1.5, 5.0, 30.0, 100.0})
                for (int trial = 0; trial < 10; trial++) {
                    uint64_t s0 = init_stream(n * 100 + it + trial * 7, (uint64_t)scale);
                    std::vector<float> Rt(n * n);
                    for (int e = 0; e < n * n; e++) Rt[e] = (float)(scale * stream_normal(s0, e));
                    INFO("N(0,1) x " << scale << " n " << n << " iters " << it << " trial " << trial);
                    run(Rt, n, it, n * 100 + it + trial);
                }
            for (const Case& c : extreme_cases(n, 300 + n)) {
                INFO(c.what << " n " << n << " iters " << it);
                if (spread(col_shifted(c.Rt, n)) <= 1e4) run(c.Rt, n, it, n * 100 + it + 3);
            }
        }
    WARN("Sinkhorn backward fp32 vs float64: worst |difference| / bound " << worst);
}

TEST_CASE("Sinkhorn with many iterations: doubly stochastic, and the limit ignores row and column offsets",
          "[sinkhorn]") {
    // Sinkhorn's theorem: for a positive matrix the iterates converge to the unique doubly
    // stochastic D1 M D2, the same for every diagonal rescaling of M, i.e. for Rt + u 1^T + 1 v^T.
    // With logits ~ N(0, 1) 100 iterations reach it to ~1e-15 (measured); what remains is
    // rounding: the column sums' (the last step is a row normalisation) and the offsets'
    // rounding of the logits, u (2 |offset| + 5) per logit.
    const int it = 100;
    double worst32 = 0, worst64 = 0;
    for (int n = 2; n <= 8; n++)
        for (double off : {0.0, 90.0, 1e3})
            for (int trial = 0; trial < 10; trial++) {
                uint64_t s0 = init_stream(trial * 10 + n, 51);
                std::vector<double> u(n), v(n), base(n * n), Rd(n * n);
                for (int i = 0; i < n; i++) {
                    const double zu = stream_uniform(s0, 500 + i), zv = stream_uniform(s0, 600 + i);
                    u[i] = zu < 0.3 ? -off : (zu > 0.7 ? off : 0);
                    v[i] = zv < 0.3 ? -off : (zv > 0.7 ? off : 0);
                }
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < n; j++) {
                        base[i * n + j] = (float)stream_normal(s0, i * n + j);
                        Rd[i * n + j] = base[i * n + j] + u[i] + v[j];
                    }
                std::vector<float> Rf(Rd.begin(), Rd.end()), bf(base.begin(), base.end());
                INFO("n " << n << " offsets +-" << off << " trial " << trial);
                const auto o32 = sk(Rf, n, it), l32 = sk(bf, n, it);
                const auto o64 = sk(Rd, n, it), l64 = sk(base, n, it);
                check_stochastic_rows(o32, n);
                check_stochastic_rows(o64, n);
                for (int j = 0; j < n; j++) {
                    double c32 = 0, c64 = 0;
                    for (int i = 0; i < n; i++) c32 += o32[i * n + j], c64 += o64[i * n + j];
                    CHECK(std::fabs(c32 - 1) <= 4 * (n + 2) * unit_roundoff<float>());
                    CHECK(std::fabs(c64 - 1) <= 1e-13);
                }
                const double t32 = 4 * (n + 2) * unit_roundoff<float>() + 4 * n * unit_roundoff<float>() * (2 * off + 5);
                const double t64 = 1e-13 + 4 * n * unit_roundoff<double>() * (2 * off + 5);
                for (int e = 0; e < n * n; e++) {
                    CHECK(std::fabs(o32[e] - l32[e]) <= t32);
                    CHECK(std::fabs(o64[e] - l64[e]) <= t64);
                    worst32 = std::max(worst32, std::fabs(o32[e] - l32[e]) / t32);
                    worst64 = std::max(worst64, std::fabs(o64[e] - l64[e]) / t64);
                }
            }
    WARN("Sinkhorn limit with and without offsets: worst |difference| / tolerance fp32 " << worst32
         << " fp64 " << worst64);
}
