// mHC (spec §2.3) in the CPU reference: scheme-level and whole-model gradients (float64), the
// a = 0, eps = 0 equivalence with PreLN (spec §3), fp32 vs float64, finite loss and gradients at
// huge H_res logits. Sinkhorn-Knopp itself (math/sinkhorn.h): test/test_sinkhorn.cpp.
#include "test/test_scheme_util.h"

#include <cfloat>

#include "cpu/scheme_hc.h"

using namespace sch;

TEST_CASE("mHC scheme alone: gradients of every scheme tensor and of e vs finite differences", "[scheme][mhc][grad][blas]") {
    for (int n : {4, 3}) {
        ModelConfig c = tiny("mhc");
        c.d_model = 16;
        c.n_layer = 2;
        c.hc_streams = n;
        INFO("n = " << n);
        Synthetic s(c, 2, 3, 31 + n, 0.1);
        // The 40 Sinkhorn normalisations leave ~1e-15 relative rounding in the loss, so entries of
        // phi_res whose gradient is ~1e-4 of the tensor's largest are finite-difference-noise
        // limited (absolute error ~3e-11): gradcheck's stencil noise bound covers them, the
        // standard h = 1e-4 and 1e-6 apply (before it: h = 1e-3 and 1e-4).
        s.check(80, 4);
    }
}

TEST_CASE("tiny model with mHC: all parameter gradients vs finite differences (float64)", "[scheme][mhc][grad][blas]") {
    // h = 1e-4 and 1e-6 for every tensor (the Sinkhorn rounding: see the scheme-alone test).
    double w = check_model_grads(tiny("mhc"), 2, 5, 30, 8, 0.1);
    WARN("mhc tiny model: worst entry error " << w);
}

TEST_CASE("mHC with a_* = 0 and RMSNorm eps = 0 equals PreLN exactly (float64): loss and gradients", "[scheme][mhc][init][blas]") {
    ModelConfig cp = tiny("preln"), cm = tiny("mhc");
    cp.norm_eps = cm.norm_eps = 0;
    Model<double> mp(cp), mm(cm);
    randomize(mp, 5);
    mm.init(77);
    copy_shared(mp, mm);
    for (int j = 1; j <= cm.n_sublayers(); j++) {
        std::string p = "scheme.mhc." + std::to_string(j) + ".";
        CHECK(*mm.param(p + "a_pre") == 0.01);  // spec init before zeroing
        for (const char* a : {"a_pre", "a_post", "a_res"}) *mm.param(p + a) = 0;
    }
    auto tok = rand_tokens(2 * 8, cp.vocab_size, 4);
    auto tgt = rand_tokens(2 * 8, cp.vocab_size, 5);
    mp.zero_grad();
    mm.zero_grad();
    double lp = mp.forward(tok.data(), tgt.data(), 2, 8);
    double lm = mm.forward(tok.data(), tgt.data(), 2, 8);
    INFO("preln " << lp << " mhc " << lm);
    CHECK_TOL("mhc a=0 == preln loss", std::fabs(lp - lm), 1e-12);
    // and the backbone gradients (every PreLN parameter has its mHC twin)
    mp.backward();
    mm.backward();
    double err = 0, mx = 0;
    for (const auto& s : mp.specs) {
        const auto& t = mm.spec(s.name);
        for (int64_t k = 0; k < s.numel; k++) {
            err = std::max(err, std::fabs(mp.grads[s.offset + k] - mm.grads[t.offset + k]));
            mx = std::max(mx, std::fabs(mp.grads[s.offset + k]));
        }
    }
    INFO("max backbone gradient difference " << err << " (max |g| " << mx << ")");
    CHECK(mx > 0);
    CHECK_TOL("mhc a=0 == preln grads", err, 1e-10 * mx);
    // At the real init (a = 0.01, eps > 0) the loss differs, but only a little.
    ModelConfig cm2 = tiny("mhc"), cp2 = tiny("preln");
    Model<double> mp2(cp2), mm2(cm2);
    randomize(mp2, 5);
    mm2.init(77);
    copy_shared(mp2, mm2);
    double d2 = std::fabs(mp2.forward(tok.data(), tgt.data(), 2, 8) - mm2.forward(tok.data(), tgt.data(), 2, 8));
    WARN("mHC at the real init vs PreLN: |loss difference| = " << d2);
    CHECK(d2 > 0);
    CHECK(d2 < 0.5);
}

TEST_CASE("mHC: fp32 path matches float64 within 1e-4 relative", "[scheme][mhc][blas]") {
    check_fp32_vs_fp64(tiny("mhc"), 22, 1e-4, 0.1);
}

TEST_CASE("mHC: state size per token matches the dry-run estimate", "[scheme][mhc]") {
    ModelConfig c = tiny("mhc");
    Model<float> m(c);
    m.init(1);
    auto tok = rand_tokens(2 * 4, c.vocab_size, 1);
    m.forward(tok.data(), tok.data(), 2, 4);
    CHECK(m.activation_values() == (int64_t)2 * 4 * activation_values_per_token(c, 4));
}

TEST_CASE("mHC with huge H_res logits (b_res, a_res up to +-1e30): finite loss and gradients",
          "[scheme][mhc][extreme]") {
    // Spec §2.3 Sinkhorn at logits bf16 training can reach (and far beyond: a_res = 1e30 makes
    // every logit ~1e30; the logits must stay finite, so a_res * projection must not overflow).
    // A column shift of b_res shifts a column of every token's Rt, which leaves H_res, hence the
    // loss, unchanged (up to the rounding of the shifted logits); the gradient of b_res sums to 0
    // over every column (each token's dRt does).
    const ModelConfig c = tiny("mhc");
    const int B = 2, T = 8, n = c.hc_streams, j = 2;
    Model<double> md(c);
    randomize(md, 13, 0.1);
    Model<float> mf(c);
    copy_shared(md, mf);
    copy_shared(mf, md);
    const auto tok = rand_tokens(B * T, c.vocab_size, 14), tgt = rand_tokens(B * T, c.vocab_size, 15);
    const std::string p = "scheme.mhc." + std::to_string(j) + ".";
    const std::vector<float> b0(mf.param(p + "b_res"), mf.param(p + "b_res") + n * n);
    const float a0 = *mf.param(p + "a_res");
    auto run = [&](auto& m, double* loss) {
        m.zero_grad();
        *loss = m.forward(tok.data(), tgt.data(), B, T);
        m.backward();
        std::string bad;
        for (const auto& s : m.specs)
            for (int64_t k = 0; k < s.numel && bad.empty(); k++)
                if (!std::isfinite((double)m.grads[s.offset + k])) bad = s.name + "[" + std::to_string(k) + "]";
        INFO("first non-finite gradient: " << bad);
        REQUIRE(bad.empty());
    };
    double l0d, l0f;
    run(md, &l0d);
    run(mf, &l0f);
    struct Shift {
        const char* what;
        double off;
        int line;  // 0: a column of b_res, 1: a row, 2: every entry +-off, 3: a_res = off
    };
    for (const Shift& sh : {Shift{"column", -90, 0}, Shift{"column", -1e3, 0}, Shift{"column", 1e3, 0},
                            Shift{"column", -1e30, 0}, Shift{"row", -90, 1}, Shift{"row", -1e3, 1},
                            Shift{"row", 1e30, 1}, Shift{"row", -1e30, 1}, Shift{"entries +-", 1e30, 2},
                            Shift{"a_res =", 1e30, 3}, Shift{"a_res =", -1e30, 3}}) {
        INFO(sh.what << " " << sh.off);
        for (int e = 0; e < n * n; e++) {
            const int row = e / n, col = e % n;
            double b = b0[e];
            if ((sh.line == 0 && col == 1) || (sh.line == 1 && row == 2)) b += sh.off;
            if (sh.line == 2) b += (e % 3 == 0 ? -sh.off : sh.off);
            md.param(p + "b_res")[e] = b;  // an exact column shift in float64
            mf.param(p + "b_res")[e] = (float)b;
        }
        *md.param(p + "a_res") = *mf.param(p + "a_res") = sh.line == 3 ? (float)sh.off : a0;
        double ld, lf;
        run(md, &ld);
        run(mf, &lf);
        REQUIRE(std::isfinite(ld));
        REQUIRE(std::isfinite(lf));
        if (sh.line == 0 && std::fabs(sh.off) <= 1e3) {
            // The shifted logits carry |off| u of rounding (float64: ~1e-13; fp32 ~6e-5 at 1e3).
            INFO("loss fp64 " << ld << " (unshifted " << l0d << "), fp32 " << lf << " (unshifted " << l0f << ")");
            CHECK(std::fabs(ld - l0d) <= 1e-12 * std::fabs(l0d));
            CHECK(std::fabs(lf - l0f) <= 1e-4 * std::fabs(l0f));  // mHC's fp32 tolerance (above)
            for (int i = 0; i < n; i++) {
                double s64 = 0, s32 = 0, m64 = 0, m32 = 0;
                for (int k = 0; k < n; k++) {
                    s64 += md.grad(p + "b_res")[k * n + i], s32 += mf.grad(p + "b_res")[k * n + i];
                    m64 = std::max(m64, std::fabs(md.grad(p + "b_res")[k * n + i]));
                    m32 = std::max(m32, (double)std::fabs(mf.grad(p + "b_res")[k * n + i]));
                }
                // each token's column sum is 0 within (n + 2) u of its values (test_sinkhorn)
                const double k = (double)B * T * (n + 2);
                CHECK(std::fabs(s64) <= k * (DBL_EPSILON / 2) * m64);
                CHECK(std::fabs(s32) <= k * (FLT_EPSILON / 2) * m32);
            }
        }
    }
}
