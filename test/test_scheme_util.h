// test/test_scheme_util.h — shared helpers of the scheme tests (test_scheme_*.cpp, owner
// baselines): tiny configs, randomised parameters, a synthetic backbone that drives a Scheme
// directly (scheme-level gradient checks), whole-model finite-difference checks and model
// comparisons.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/config.h"
#include "cpu/gradcheck.h"
#include "cpu/model.h"
#include "cpu/rng.h"
#include "test/helpers.h"

namespace sch {

using namespace ldm;
using namespace ldm::cpu;

// `tiny` of spec §1 with V = 101 (Vp = 128) so finite differences over the model stay fast.
inline ModelConfig tiny(const std::string& scheme) {
    ModelConfig c = preset_config("tiny", 101);
    c.seq_len = 64;
    c.scheme = scheme;
    return c;
}

inline std::vector<int32_t> rand_tokens(int n, int V, uint64_t seed) {
    std::vector<int32_t> t(n);
    uint64_t s0 = init_stream(seed, 5);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(stream_uniform(s0, i) * V);
    return t;
}

// Spec init, then every parameter moved to a generic point: scheme tensors get + scale_scheme
// * N(0,1) (so zero-initialised W, w and the gates are exercised away from 0), backbone 1-D
// tensors + 0.3 N(0,1), backbone matrices x5 (activations O(1)).
template <typename R>
void randomize(Model<R>& m, uint64_t seed, double scale_scheme = 0.3) {
    m.init(seed);
    uint64_t s0 = init_stream(seed, 12345);
    for (const auto& s : m.specs) {
        bool sch = s.name.rfind("scheme.", 0) == 0;
        for (int64_t k = 0; k < s.numel; k++) {
            double z = stream_normal(s0, (uint64_t)(s.offset + k));
            R& p = m.params[s.offset + k];
            if (sch) p = (R)(p + scale_scheme * z);
            else if (s.shape.size() == 1) p = (R)(p + 0.3 * z);
            else p = (R)(p * 5.0);
        }
    }
}

// For a tensor of n values at p whose analytic gradient is zero: the central-difference
// derivative along one random unit direction over the whole tensor, and at `entries` entries
// spread evenly across it, must be at the noise level (< 1e-8): a backward that drops a tensor's
// gradient cannot hide behind a few unused entries.
template <class F>
inline void check_zero_gradient(F& f, double* p, int64_t n, double h, uint64_t seed, int entries,
                                const std::string& label) {
    const uint64_t s0 = ldm::init_stream(seed, 11);
    std::vector<double> u((size_t)n), p0(p, p + n);
    double norm = 0;
    for (int64_t k = 0; k < n; k++) norm += (u[(size_t)k] = ldm::stream_normal(s0, (uint64_t)k)) * u[(size_t)k];
    norm = std::sqrt(norm);
    auto at = [&](double t) {
        for (int64_t k = 0; k < n; k++) p[k] = p0[(size_t)k] + t * u[(size_t)k] / norm;
        return f();
    };
    const double dir = (at(h) - at(-h)) / (2 * h);
    for (int64_t k = 0; k < n; k++) p[k] = p0[(size_t)k];
    INFO(label << ": analytic ~0, numeric along a random direction " << dir);
    CHECK_TOL(label + " (direction)", std::fabs(dir), 1e-8);
    const int64_t m = std::min<int64_t>(n, entries);
    for (int64_t j = 0; j < m; j++) {
        const int64_t k = j * n / m;
        const double num = gradcheck::fd_entry(f, p + k, h);
        INFO(label << "[" << k << "]: analytic ~0, numeric " << num);
        CHECK_TOL(label, std::fabs(num), 1e-8);
    }
}

// Whole-model gradients vs the 5-point stencil in float64 (spec §3), every tensor, up to
// `per_tensor` sampled entries each plus one random direction. Returns the worst entry error.
// Tensors whose analytic gradient is zero up to rounding (max < 1e-12: AttnRes sublayer 1 has a
// single source, so its softmax is constant; mHC's H_res of sublayer 1 mixes n equal streams)
// are checked to have numeric derivatives at the noise level (< 1e-8) instead.
inline double check_model_grads(const ModelConfig& c, int B, int T, int per_tensor, uint64_t seed,
                                double scale_scheme = 0.3, double h_scheme = 1e-4,
                                double entry_tol = 1e-6) {
    const double h = 1e-4;  // backbone tensors; scheme tensors use h_scheme
    Model<double> m(c);
    randomize(m, seed, scale_scheme);
    auto tok = rand_tokens(B * T, c.vocab_size, seed + 1);
    auto tgt = rand_tokens(B * T, c.vocab_size, seed + 2);
    m.zero_grad();
    m.forward(tok.data(), tgt.data(), B, T);
    m.backward();
    std::vector<double> g = m.grads;
    auto f = [&]() { return m.forward(tok.data(), tgt.data(), B, T); };
    double worst = 0;
    for (const auto& s : m.specs) {
        int64_t n = s.numel;
        if (s.name == "wte" || s.name == "lm_head") n = (int64_t)c.vocab_size * c.d_model;
        const bool is_scheme = s.name.rfind("scheme.", 0) == 0;
        const double hs = is_scheme ? h_scheme : h;
        double amax = 0;
        for (int64_t k = 0; k < n; k++) amax = std::max(amax, std::fabs(g[s.offset + k]));
        if (amax < 1e-12) {
            INFO(c.scheme << " " << s.name << ": analytic gradient zero");
            CHECK(is_scheme);  // every backbone tensor reaches the loss here
            check_zero_gradient(f, m.params.data() + s.offset, n, hs, seed + s.offset, 8,
                                "model fd zero/" + c.scheme + " " + s.name);
            continue;
        }
        gradcheck::Options o;
        o.h = hs;
        o.tol = is_scheme ? entry_tol : 1e-6;
        auto r = gradcheck::check(f, m.params.data() + s.offset, g.data() + s.offset, n, per_tensor,
                                  seed + s.offset, o);
        INFO(c.scheme << " " << s.name << ": checked " << r.checked << ", max_err " << r.max_err
                      << " at " << r.worst << " (analytic " << r.worst_a << ", numeric "
                      << r.worst_n << "), dir_err " << r.dir_err << ", stencil noise " << r.noise);
        CHECK_TOL("model fd entry/" + c.scheme + " " + s.name, r.entry_ratio, 1.0);
        CHECK_TOL("model fd dir/" + c.scheme + " " + s.name, r.dir_ratio, 1.0);
        worst = std::max(worst, r.max_err);
    }
    return worst;
}

// Synthetic backbone driving a scheme alone: o_j = tanh(c_j ⊙ x_j), loss = Σ r ⊙ y over N
// tokens. Exercises every Scheme call in the model's order; its gradient wrt the scheme's
// parameters and e is checked against finite differences.
struct Synthetic {
    ModelConfig cfg;
    int B, T, N, d, D;
    std::vector<double> params, grads, e, de, c, r;
    std::unique_ptr<Scheme<double>> S;
    std::vector<ParamSpec> specs;
    std::vector<std::vector<double>> xs, os;
    Synthetic(const ModelConfig& cf, int B_, int T_, uint64_t seed, double scale_scheme = 0.3)
        : cfg(cf), B(B_), T(T_), N(B_ * T_), d(cf.d_model), D(cf.n_sublayers()) {
        specs = scheme_param_specs(cfg);
        int64_t np = specs.empty() ? 0 : specs.back().offset + specs.back().numel;
        params.assign(np, 0.0);
        grads.assign(np, 0.0);
        S = make_scheme<double>(cfg);
        S->bind(params.data(), grads.data());
        S->init_params(params.data(), seed, 100);
        uint64_t s0 = init_stream(seed, 777);
        for (int64_t k = 0; k < np; k++) params[k] += scale_scheme * stream_normal(s0, k);
        e.resize((size_t)N * d);
        c.resize((size_t)D * d);
        r.resize((size_t)N * d);
        uint64_t s1 = init_stream(seed, 778);
        for (size_t k = 0; k < e.size(); k++) e[k] = stream_normal(s1, k);
        for (size_t k = 0; k < c.size(); k++) c[k] = 0.5 + stream_normal(s1, 100000 + k);
        for (size_t k = 0; k < r.size(); k++) r[k] = stream_normal(s1, 200000 + k);
        xs.assign(D, std::vector<double>((size_t)N * d));
        os.assign(D, std::vector<double>((size_t)N * d));
    }
    double forward() {
        S->resize(B, T);
        S->begin(e.data());
        for (int j = 1; j <= D; j++) {
            S->input(j, xs[j - 1].data());
            for (size_t k = 0; k < xs[j - 1].size(); k++)
                os[j - 1][k] = std::tanh(c[(size_t)(j - 1) * d + k % d] * xs[j - 1][k]);
            S->output(j, os[j - 1].data());
        }
        std::vector<double> y((size_t)N * d);
        S->readout(y.data());
        double L = 0;
        for (size_t k = 0; k < y.size(); k++) L += r[k] * y[k];
        return L;
    }
    void backward() {
        std::fill(grads.begin(), grads.end(), 0.0);
        S->readout_backward(r.data());
        std::vector<double> d_o((size_t)N * d), dx((size_t)N * d);
        for (int j = D; j >= 1; j--) {
            S->output_backward(j, d_o.data());
            for (size_t k = 0; k < dx.size(); k++) {
                double o = os[j - 1][k];
                dx[k] = d_o[k] * (1 - o * o) * c[(size_t)(j - 1) * d + k % d];
            }
            S->input_backward(j, dx.data());
        }
        de.resize((size_t)N * d);
        S->begin_backward(de.data());
    }
    // FD check of every scheme tensor (all entries up to `per_tensor`) and of e.
    // A tensor whose analytic gradient is zero up to rounding (max < 1e-12, e.g. mHC's H_res of
    // sublayer 1, where all n streams are still equal so any row-stochastic mix gives the same
    // state) is instead checked to have a numeric derivative at the finite-difference noise
    // level (< 1e-8) on its sampled entries.
    void check(int per_tensor, uint64_t seed, double h = 1e-4, double entry_tol = 1e-6) {
        forward();
        backward();
        std::vector<double> g = grads, ge = de;
        auto f = [&]() { return forward(); };
        gradcheck::Options o;
        o.h = h;
        o.tol = entry_tol;
        for (const auto& s : specs) {
            double amax = 0;
            for (int64_t k = 0; k < s.numel; k++) amax = std::max(amax, std::fabs(g[s.offset + k]));
            if (amax < 1e-12) {
                check_zero_gradient(f, params.data() + s.offset, s.numel, h, seed + s.offset, 16,
                                    "synthetic fd zero/" + cfg.scheme + " " + s.name);
                continue;
            }
            auto res = gradcheck::check(f, params.data() + s.offset, g.data() + s.offset, s.numel,
                                        per_tensor, seed + s.offset, o);
            INFO(cfg.scheme << " (synthetic backbone) " << s.name << ": max_err " << res.max_err
                            << " (analytic " << res.worst_a << ", numeric " << res.worst_n
                            << "), dir_err " << res.dir_err << ", stencil noise " << res.noise);
            CHECK_TOL("synthetic fd entry/" + cfg.scheme + " " + s.name, res.entry_ratio, 1.0);
            CHECK_TOL("synthetic fd dir/" + cfg.scheme + " " + s.name, res.dir_ratio, 1.0);
        }
        auto res = gradcheck::check(f, e.data(), ge.data(), (int64_t)e.size(), per_tensor, seed + 5, o);
        INFO(cfg.scheme << " (synthetic backbone) e: max_err " << res.max_err << " dir_err " << res.dir_err
                        << ", stencil noise " << res.noise);
        CHECK_TOL("synthetic fd entry/" + cfg.scheme + " e", res.entry_ratio, 1.0);
        CHECK_TOL("synthetic fd dir/" + cfg.scheme + " e", res.dir_ratio, 1.0);
    }
};

// Copies the parameters two models share by name (backbone, and scheme tensors of equal name).
template <typename R1, typename R2>
void copy_shared(const Model<R1>& from, Model<R2>& to) {
    for (const auto& s : to.specs)
        for (const auto& f : from.specs)
            if (f.name == s.name && f.numel == s.numel)
                for (int64_t k = 0; k < s.numel; k++) to.params[s.offset + k] = (R2)from.params[f.offset + k];
}

// fp32 model vs float64 model on the same (fp32-representable) weights: loss within `tol`
// relative; every gradient tensor within `tol` relative to its max-norm (spec §3) plus the fp32
// rounding floor kFp32Floor * u32 * max |g| over the whole model (u32 = 2^-24): every fp32
// gradient entry carries an absolute rounding error of a few u32 times the gradients it is
// accumulated with, whatever its own size, which decides for the tensors whose gradients are
// far below the model's largest (measured worst on those: 2.0 u32 max|g|; doc/testing.md).
constexpr double kFp32Floor = 16;
inline void check_fp32_vs_fp64(const ModelConfig& c, uint64_t seed, double tol = 1e-4,
                               double scale_scheme = 0.3) {
    const int B = 2, T = 16;
    Model<double> md(c);
    randomize(md, seed, scale_scheme);
    Model<float> mf(c);
    copy_shared(md, mf);
    copy_shared(mf, md);
    auto tok = rand_tokens(B * T, c.vocab_size, seed + 1);
    auto tgt = rand_tokens(B * T, c.vocab_size, seed + 2);
    md.zero_grad();
    mf.zero_grad();
    double ld = md.forward(tok.data(), tgt.data(), B, T);
    double lf = mf.forward(tok.data(), tgt.data(), B, T);
    md.backward();
    mf.backward();
    INFO(c.scheme << ": loss fp64 " << ld << " fp32 " << lf);
    CHECK_TOL("fp32 vs fp64 loss/" + c.scheme, std::fabs(ld - lf), tol * std::fabs(ld));
    const double u32 = std::numeric_limits<float>::epsilon() / 2;
    double gmax = 0;
    for (double v : md.grads) gmax = std::max(gmax, std::fabs(v));
    for (const auto& s : md.specs) {
        double mx = 0, err = 0;
        for (int64_t k = 0; k < s.numel; k++) {
            mx = std::max(mx, std::fabs(md.grads[s.offset + k]));
            err = std::max(err, std::fabs(md.grads[s.offset + k] - (double)mf.grads[s.offset + k]));
        }
        INFO(c.scheme << " " << s.name << ": max |g64 - g32| " << err << ", max |g64| " << mx);
        CHECK_TOL("fp32 vs fp64 grad/" + c.scheme + " " + s.name, err,
                  tol * mx + kFp32Floor * u32 * gmax);
    }
}

}  // namespace sch
