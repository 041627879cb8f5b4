// Tests of the LDM_HD math that the CUDA kernels share with the CPU reference, run on the CPU:
// the AdamW element update of math/optim_math.h (used by cuda/adamw.cuh) against core/optim.h
// AdamW, called the way the GPU trainer calls it (once per contiguous range of equal decay, with
// the clip factor computed from the global norm), and against the formula written out in double.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/optim.h"
#include "math/optim_math.h"

using namespace ldm;

namespace {

struct State {
    std::vector<float> p, m, v;
};

// The GPU trainer's sequence on the host: clip from the global norm, then one call of the element
// function per element of each range with that range's decay flag (what adamw_update does).
void gpu_style_step(State& s, const std::vector<float>& g, const std::vector<ParamRange>& ranges,
                    const AdamWConfig& cfg, double lr, int64_t t) {
    const int64_t n = (int64_t)g.size();
    const double norm = global_norm(g.data(), n);
    double clip = 1.0;
    if (cfg.grad_clip > 0 && norm > cfg.grad_clip) clip = cfg.grad_clip / norm;
    for (const ParamRange& r : ranges) {
        const double wd = r.decay ? cfg.weight_decay : 0.0;
        const AdamWScalars<float> sc =
            adamw_scalars<float>(cfg.beta1, cfg.beta2, cfg.eps, wd, lr, clip, t);
        for (int64_t i = r.offset; i < r.offset + r.numel; i++)
            adamw_element(s.p[i], s.m[i], s.v[i], g[i], sc, wd != 0.0);
    }
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("adamw_element: per-range GPU-style updates are bit-identical to core/optim AdamW<float>",
          "[cuda_host_math]") {
    const int64_t n = 10007;
    std::mt19937_64 rng(42);
    std::normal_distribution<double> nd(0.0, 1.0);
    State cpu, gpu;
    cpu.p.resize(n);
    for (auto& x : cpu.p) x = (float)(0.05 * nd(rng));
    gpu.p = cpu.p;
    gpu.m.assign(n, 0.0f);
    gpu.v.assign(n, 0.0f);
    const std::vector<ParamRange> ranges = {{0, 3001, true}, {3001, 2000, false}, {5001, 5006, true}};
    AdamWConfig cfg;  // defaults: beta 0.9/0.95, eps 1e-8, wd 0.1, clip 1.0
    AdamW<float> opt(n, cfg, ranges);
    std::vector<float> g(n);
    for (int step = 1; step <= 8; step++) {
        // Alternate large gradients (clip active) and small ones (no clip); some exact zeros.
        const double scale = step % 2 ? 0.1 : 1e-4;
        for (int64_t i = 0; i < n; i++) g[i] = (float)(scale * nd(rng));
        g[17] = 0.0f;
        const double lr = 1e-3 * step;
        opt.step(cpu.p.data(), g.data(), lr);
        gpu_style_step(gpu, g, ranges, cfg, lr, step);
        INFO("step " << step);
        REQUIRE(bit_equal(gpu.p, cpu.p));
        REQUIRE(bit_equal(gpu.m, opt.m()));
        REQUIRE(bit_equal(gpu.v, opt.v()));
    }
}

TEST_CASE("adamw_element: agrees with the documented formula evaluated in double", "[cuda_host_math]") {
    // core/optim.h: g' = c g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
    // p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + [decay] wd p).
    std::mt19937_64 rng(7);
    std::normal_distribution<double> nd(0.0, 1.0);
    const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, lr = 3e-4, c = 0.37;
    for (int64_t t : {1, 2, 10, 1000}) {
        for (int decay = 0; decay < 2; decay++) {
            const AdamWScalars<float> sc = adamw_scalars<float>(b1, b2, eps, decay ? wd : 0.0, lr, c, t);
            for (int k = 0; k < 2000; k++) {
                float p = (float)(0.1 * nd(rng)), m = (float)(1e-3 * nd(rng));
                float v = (float)(1e-6 * std::fabs(nd(rng)));
                const float g = (float)(1e-2 * nd(rng));
                // double evaluation on the same fp32 inputs
                const double gd = c * (double)g;
                const double md = b1 * m + (1 - b1) * gd, vd = b2 * v + (1 - b2) * gd * gd;
                const double upd = (md / (1 - std::pow(b1, (double)t))) /
                                   (std::sqrt(vd / (1 - std::pow(b2, (double)t))) + eps);
                const double pd = p - lr * (upd + (decay ? wd * p : 0.0));
                const double p0 = p;
                adamw_element(p, m, v, g, sc, decay != 0);
                INFO("t=" << t << " decay=" << decay << " k=" << k);
                // m may cancel (terms ~1e-3, fp32 rounding ~1e-10 each); v has no cancellation
                CHECK(m == Approx(md).epsilon(1e-6).margin(3e-10));
                CHECK(v == Approx(vd).epsilon(1e-6).margin(1e-18));
                // the update p - p0 to ~1e-5 relative of its size, plus one fp32 ulp of p
                CHECK((double)p - p0 == Approx(pd - p0).epsilon(1e-5).margin(1.2e-7 * std::fabs(p0) + 1e-12));
            }
        }
    }
}

TEST_CASE("adamw_element: double instantiation matches core/optim AdamW<double>", "[cuda_host_math]") {
    const int64_t n = 513;
    std::mt19937_64 rng(3);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<double> p(n), g(n);
    for (auto& x : p) x = 0.02 * nd(rng);
    std::vector<double> p2 = p, m2(n, 0.0), v2(n, 0.0);
    AdamWConfig cfg;
    cfg.grad_clip = 0;   // no clipping: c = 1
    AdamW<double> opt(n, cfg, {{0, 200, true}, {200, 313, false}});
    for (int step = 1; step <= 3; step++) {
        for (auto& x : g) x = 0.01 * nd(rng);
        opt.step(p.data(), g.data(), 1e-3);
        for (int64_t i = 0; i < n; i++) {
            const bool dk = i < 200;
            const AdamWScalars<double> sc =
                adamw_scalars<double>(cfg.beta1, cfg.beta2, cfg.eps, dk ? cfg.weight_decay : 0.0, 1e-3, 1.0, step);
            adamw_element(p2[i], m2[i], v2[i], g[i], sc, dk);
        }
    }
    CHECK(std::memcmp(p.data(), p2.data(), n * sizeof(double)) == 0);
    CHECK(std::memcmp(opt.m().data(), m2.data(), n * sizeof(double)) == 0);
    CHECK(std::memcmp(opt.v().data(), v2.data(), n * sizeof(double)) == 0);
}

TEST_CASE("adamw_scalars: double hyperparameters rounded once to the parameter dtype", "[cuda_host_math]") {
    const AdamWScalars<float> s = adamw_scalars<float>(0.9, 0.95, 1e-8, 0.1, 6e-4, 0.5, 3);
    CHECK(s.b1 == 0.9f);
    CHECK(s.one_m_b1 == (float)(1.0 - 0.9));   // not 1 - 0.9f
    CHECK(s.one_m_b2 == (float)(1.0 - 0.95));
    CHECK(s.bc1 == (float)(1.0 - std::pow(0.9, 3.0)));
    CHECK(s.bc2 == (float)(1.0 - std::pow(0.95, 3.0)));
    CHECK(s.clip == 0.5f);
    CHECK(s.lr == (float)6e-4);
    CHECK(s.eps == (float)1e-8);
    CHECK(s.wd == (float)0.1);
}
