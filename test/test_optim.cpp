// Tests for core/optim: AdamW against closed forms and hand-computed values, LR schedules at
// chosen steps, determinism of the gradient norm across thread counts.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <random>

#include "core/common.h"
#include "core/optim.h"

using namespace ldm;

TEST_CASE("AdamW: constant gradient gives closed-form trajectory", "[optim]") {
    // With a constant gradient g, m^ = g and v^ = g^2 at every step (bias correction is exact),
    // so each update is lr * g / (|g| + eps); with decoupled decay wd:
    //   p_{k+1} = p_k (1 - lr wd) - lr s,  s = g / (|g| + eps)
    // closed form: p_k = a^k p_0 - lr s (1 - a^k) / (1 - a),  a = 1 - lr wd.
    const double lr = 0.01, wd = 0.1, eps = 1e-8;
    std::vector<double> p = {0.5, -1.25, 2.0, 0.3};
    const std::vector<double> g = {0.2, -3.0, 1e-3, 0.7};
    const std::vector<double> p0 = p;
    AdamWConfig cfg;
    cfg.weight_decay = wd;
    cfg.eps = eps;
    cfg.grad_clip = 0;  // no clipping
    // decay on elements 0..1 only
    AdamW<double> opt(4, cfg, {{0, 2, true}, {2, 2, false}});
    const int K = 7;
    for (int k = 0; k < K; k++) opt.step(p.data(), g.data(), lr);
    const double a = 1 - lr * wd;
    for (int i = 0; i < 4; i++) {
        double s = g[i] / (std::fabs(g[i]) + eps);
        double expect = (i < 2) ? std::pow(a, K) * p0[i] - lr * s * (1 - std::pow(a, K)) / (1 - a)
                                : p0[i] - K * lr * s;
        CHECK(p[i] == Approx(expect).epsilon(1e-12));
    }
    CHECK(opt.step_count() == K);
}

TEST_CASE("AdamW: hand-computed two steps with sign change, and moments", "[optim]") {
    // g1 = +1, g2 = -1, b1 = 0.9, b2 = 0.95, no decay:
    // t=1: m = 0.1, v = 0.05, m^ = 1, v^ = 1 -> update 1/(1+eps)
    // t=2: m = 0.09 - 0.1 = -0.01, v = 0.0475 + 0.05 = 0.0975,
    //      m^ = -0.01 / 0.19 = -0.052631578947..., v^ = 0.0975 / 0.0975 = 1 -> update m^/(1+eps)
    AdamWConfig cfg;
    cfg.weight_decay = 0.0;
    cfg.grad_clip = 0;
    for (int rep = 0; rep < 2; rep++) {
        std::vector<float> pf = {1.0f};
        std::vector<double> pd = {1.0};
        AdamW<float> of(1, cfg, {});
        AdamW<double> od(1, cfg, {});
        float gf = 1.0f;
        double gd = 1.0;
        of.step(pf.data(), &gf, 0.1);
        od.step(pd.data(), &gd, 0.1);
        CHECK(pd[0] == Approx(1.0 - 0.1 / (1 + 1e-8)).epsilon(1e-14));
        CHECK(od.m()[0] == Approx(0.1).epsilon(1e-14));
        CHECK(od.v()[0] == Approx(0.05).epsilon(1e-14));
        gf = -1.0f;
        gd = -1.0;
        of.step(pf.data(), &gf, 0.1);
        od.step(pd.data(), &gd, 0.1);
        const double mhat = -0.01 / 0.19;
        CHECK(od.m()[0] == Approx(-0.01).epsilon(1e-12));
        CHECK(od.v()[0] == Approx(0.0975).epsilon(1e-12));
        CHECK(pd[0] == Approx(1.0 - 0.1 / (1 + 1e-8) - 0.1 * mhat / (1 + 1e-8)).epsilon(1e-13));
        CHECK(pf[0] == Approx(0.9 - 0.1 * mhat).epsilon(1e-6));
    }
}

TEST_CASE("AdamW: global-norm clipping scales the gradient and returns the raw norm", "[optim]") {
    AdamWConfig cfg;
    cfg.grad_clip = 1.0;
    cfg.weight_decay = 0;
    std::vector<double> p = {0, 0};
    std::vector<double> g = {3, 4};  // norm 5 -> scale 0.2 -> effective (0.6, 0.8)
    AdamW<double> opt(2, cfg, {});
    double n = opt.step(p.data(), g.data(), 1e-3);
    CHECK(n == Approx(5.0).epsilon(1e-15));
    CHECK(opt.m()[0] == Approx(0.1 * 0.6).epsilon(1e-14));
    CHECK(opt.m()[1] == Approx(0.1 * 0.8).epsilon(1e-14));
    CHECK(opt.v()[1] == Approx(0.05 * 0.64).epsilon(1e-14));
    CHECK(g[0] == 3.0);  // grads untouched
    // below the threshold nothing is scaled
    std::vector<double> g2 = {0.3, 0.4};
    AdamW<double> opt2(2, cfg, {});
    std::vector<double> p2 = {0, 0};
    CHECK(opt2.step(p2.data(), g2.data(), 1e-3) == Approx(0.5).epsilon(1e-15));
    CHECK(opt2.m()[1] == Approx(0.04).epsilon(1e-14));
}

TEST_CASE("AdamW: random multi-step matches an independent scalar implementation", "[optim]") {
    const int n = 1000, steps = 5;
    std::mt19937_64 rng(7);
    std::normal_distribution<double> nd(0, 1);
    std::vector<double> p(n), pref;
    for (auto& x : p) x = nd(rng);
    pref = p;
    AdamWConfig cfg;  // defaults: 0.9, 0.95, 1e-8, wd 0.1, clip 1
    AdamW<double> opt(n, cfg, {{0, 600, true}, {600, 400, false}});
    std::vector<double> m(n, 0), v(n, 0);
    for (int t = 1; t <= steps; t++) {
        std::vector<double> g(n);
        for (auto& x : g) x = nd(rng) * 0.1;
        double lr = 1e-3 * t;
        double nn = 0;
        for (double x : g) nn += x * x;
        nn = std::sqrt(nn);
        double c = std::min(1.0, 1.0 / nn);
        for (int i = 0; i < n; i++) {
            double gi = g[i] * c;
            m[i] = 0.9 * m[i] + 0.1 * gi;
            v[i] = 0.95 * v[i] + 0.05 * gi * gi;
            double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.95, t));
            pref[i] -= lr * (mh / (std::sqrt(vh) + 1e-8) + (i < 600 ? 0.1 * pref[i] : 0.0));
        }
        double got = opt.step(p.data(), g.data(), lr);
        CHECK(got == Approx(nn).epsilon(1e-12));
    }
    double maxrel = 0;
    for (int i = 0; i < n; i++) maxrel = std::max(maxrel, std::fabs(p[i] - pref[i]) / (std::fabs(pref[i]) + 1e-12));
    CHECK(maxrel < 1e-12);
}

TEST_CASE("global_norm is bit-identical across thread counts", "[optim]") {
    const int64_t n = 300001;
    std::vector<float> g(static_cast<size_t>(n));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : g) x = u(rng);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    double a = global_norm(g.data(), n);
    omp_set_num_threads(2);
    double b = global_norm(g.data(), n);
    omp_set_num_threads(saved);
    CHECK(a == b);
    double ref = 0;
    for (float x : g) ref += double(x) * x;
    CHECK(a == Approx(std::sqrt(ref)).epsilon(1e-12));
}

TEST_CASE("LR schedules: values at chosen steps", "[optim]") {
    LRSchedule s;
    s.lr = 1.0;
    s.min_lr_ratio = 0.1;
    s.warmup_steps = 10;
    s.total_steps = 110;
    s.kind = "cosine";
    s.validate();
    CHECK(s.lr_at(0) == Approx(0.1));
    CHECK(s.lr_at(4) == Approx(0.5));
    CHECK(s.lr_at(9) == Approx(1.0));
    CHECK(s.lr_at(10) == Approx(1.0));
    CHECK(s.lr_at(35) == Approx(0.1 + 0.45 * (1 + std::sqrt(0.5))));  // p = 1/4
    CHECK(s.lr_at(60) == Approx(0.55));                                 // p = 1/2
    CHECK(s.lr_at(85) == Approx(0.1 + 0.45 * (1 - std::sqrt(0.5))));  // p = 3/4
    CHECK(s.lr_at(110) == Approx(0.1));
    CHECK(s.lr_at(500) == Approx(0.1));
    s.kind = "linear";
    CHECK(s.lr_at(3) == Approx(0.4));
    CHECK(s.lr_at(10) == Approx(1.0));
    CHECK(s.lr_at(35) == Approx(0.775));
    CHECK(s.lr_at(60) == Approx(0.55));
    CHECK(s.lr_at(110) == Approx(0.1));
    s.kind = "wsd";
    s.wsd_decay_frac = 0.2;  // decay over the last 22 steps: D = 88
    CHECK(s.lr_at(5) == Approx(0.6));
    CHECK(s.lr_at(50) == Approx(1.0));
    CHECK(s.lr_at(88) == Approx(1.0));
    CHECK(s.lr_at(99) == Approx(0.55));
    CHECK(s.lr_at(110) == Approx(0.1));
    s.kind = "constant";
    CHECK(s.lr_at(0) == Approx(0.1));
    CHECK(s.lr_at(9) == Approx(1.0));
    CHECK(s.lr_at(100) == Approx(1.0));
    // no warmup: first step is the peak
    s.kind = "cosine";
    s.warmup_steps = 0;
    s.total_steps = 100;
    CHECK(s.lr_at(0) == Approx(1.0));
    CHECK(s.lr_at(50) == Approx(0.55));
}

TEST_CASE("LR schedule and AdamW reject bad values with the flag name", "[optim]") {
    LRSchedule s;
    s.kind = "step";
    CHECK_THROWS_WITH(s.validate(), Catch::Contains("--schedule"));
    s.kind = "cosine";
    s.min_lr_ratio = 2;
    CHECK_THROWS_WITH(s.validate(), Catch::Contains("--min-lr-ratio"));
    AdamWConfig c;
    c.beta2 = 1.0;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("--beta2"));
    AdamWConfig ok;
    CHECK_THROWS_AS(AdamW<float>(10, ok, {{5, 10, true}}), Error);
}
