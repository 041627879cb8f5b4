// HC (spec §2.2) in the CPU reference: scheme-level and whole-model gradients vs finite
// differences (float64), init equivalence with PreLN (spec §3), fp32 vs float64.
#include "test/test_scheme_util.h"

#include "cpu/scheme_hc.h"

using namespace sch;

TEST_CASE("hc_coef helpers: value and derivative vs closed form", "[scheme][hc]") {
    double ds = 0;
    double s = 0.7, u = 0.3, t = std::tanh(u);
    CHECK(ldm::hc_coef(s, t, 2.0) == Approx(s * std::tanh(u) + 2.0).epsilon(1e-15));
    double du = ldm::hc_coef_backward(1.5, s, t, &ds);
    CHECK(ds == Approx(1.5 * t).epsilon(1e-15));
    CHECK(du == Approx(1.5 * s / (std::cosh(u) * std::cosh(u))).epsilon(1e-13));
}

TEST_CASE("HC scheme alone: gradients of every scheme tensor and of e vs finite differences", "[scheme][hc][grad][blas]") {
    for (int n : {4, 3}) {
        ModelConfig c = tiny("hc");
        c.d_model = 16;
        c.n_layer = 3;  // D = 6 > n: A_m0 = e_{(j-1) mod n} wraps around
        c.hc_streams = n;
        INFO("n = " << n);
        Synthetic s(c, 2, 3, 11 + n);
        s.check(100, 3);
    }
}

TEST_CASE("tiny model with HC: all parameter gradients vs finite differences (float64)", "[scheme][hc][grad][blas]") {
    double w = check_model_grads(tiny("hc"), 2, 5, 30, 7);
    WARN("hc tiny model: worst entry error " << w);
}

TEST_CASE("HC at init equals PreLN exactly (loss and backbone gradients, float64)", "[scheme][hc][init][blas]") {
    ModelConfig cp = tiny("preln"), ch = tiny("hc");
    Model<double> mp(cp), mh(ch);
    randomize(mp, 3);
    mh.init(99);           // the scheme's own spec init
    copy_shared(mp, mh);   // same backbone weights
    auto tok = rand_tokens(2 * 8, cp.vocab_size, 4);
    auto tgt = rand_tokens(2 * 8, cp.vocab_size, 5);
    mp.zero_grad();
    mh.zero_grad();
    double lp = mp.forward(tok.data(), tgt.data(), 2, 8);
    double lh = mh.forward(tok.data(), tgt.data(), 2, 8);
    CHECK_TOL("hc init == preln loss", std::fabs(lp - lh), 1e-12);
    mp.backward();
    mh.backward();
    double err = 0, mx = 0;
    for (const auto& s : mp.specs) {
        const auto& t = mh.spec(s.name);
        for (int64_t k = 0; k < s.numel; k++) {
            err = std::max(err, std::fabs(mp.grads[s.offset + k] - mh.grads[t.offset + k]));
            mx = std::max(mx, std::fabs(mp.grads[s.offset + k]));
        }
    }
    INFO("max backbone gradient difference " << err << " (max |g| " << mx << ")");
    CHECK_TOL("hc init == preln grads", err, 1e-10 * mx);
    // The spec init itself.
    const double* am0 = mh.param("scheme.hc.2.a_m0");
    CHECK(am0[0] == 0.0);
    CHECK(am0[1] == 1.0);
    CHECK(*mh.param("scheme.hc.1.s_a") == 0.01);
    CHECK(*mh.param("scheme.hc.1.s_b") == 0.01);
}

TEST_CASE("HC: fp32 path matches float64 within 1e-4 relative", "[scheme][hc][blas]") {
    check_fp32_vs_fp64(tiny("hc"), 21);
}

TEST_CASE("HC: state size per token matches the dry-run estimate", "[scheme][hc]") {
    ModelConfig c = tiny("hc");
    Model<float> m(c);
    m.init(1);
    auto tok = rand_tokens(2 * 4, c.vocab_size, 1);
    m.forward(tok.data(), tok.data(), 2, 4);
    CHECK(m.activation_values() == (int64_t)2 * 4 * activation_values_per_token(c, 4));
}
