// mHC (spec §2.3) in the CPU reference: Sinkhorn-Knopp (marginals, unrolled backward vs finite
// differences), scheme-level and whole-model gradients (float64), the a = 0, eps = 0 equivalence
// with PreLN (spec §3), fp32 vs float64.
#include "test/test_scheme_util.h"

#include "cpu/scheme_hc.h"
#include "math/sinkhorn.h"

using namespace sch;

namespace {
template <typename R>
std::vector<R> sk(const std::vector<R>& Rt, int n, int it, std::vector<R>* work = nullptr) {
    std::vector<R> out(n * n), w(ldm::sinkhorn_work_size(n, it));
    ldm::sinkhorn_forward(Rt.data(), n, it, out.data(), w.data());
    if (work) *work = w;
    return out;
}
}  // namespace

TEST_CASE("Sinkhorn: rows sum to 1, columns close to 1 after 20 iterations (fp32 and fp64)", "[scheme][mhc][sinkhorn]") {
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

TEST_CASE("Sinkhorn backward (unrolled) vs finite differences, float64", "[scheme][mhc][sinkhorn][grad]") {
    for (int n : {2, 4, 5})
        for (int it : {1, 3, 20}) {
            uint64_t s0 = ldm::init_stream(n * 100 + it, 9);
            std::vector<double> Rt(n * n), W(n * n);
            for (int e = 0; e < n * n; e++) {
                Rt[e] = 1.5 * stream_normal(s0, e);
                W[e] = stream_normal(s0, 1000 + e);
            }
            auto f = [&]() {
                auto M = sk(Rt, n, it);
                double L = 0;
                for (int e = 0; e < n * n; e++) L += W[e] * M[e];
                return L;
            };
            std::vector<double> work;
            sk(Rt, n, it, &work);
            std::vector<double> dout = W, dRt(n * n);
            ldm::sinkhorn_backward(dout.data(), n, it, work.data(), dRt.data());
            gradcheck::Options o;
            o.tol = o.tol_dir = 1e-8;
            auto r = gradcheck::check(f, Rt.data(), dRt.data(), n * n, n * n, 5, o);
            INFO("n " << n << " iters " << it << ": max_err " << r.max_err << " dir " << r.dir_err
                      << ", stencil noise " << r.noise);
            CHECK_TOL("sinkhorn backward fd", std::max(r.entry_ratio, r.dir_ratio), 1.0);
        }
}

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

TEST_CASE("mHC with a_* = 0 and RMSNorm eps = 0 equals PreLN exactly (float64)", "[scheme][mhc][init][blas]") {
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
    double lp = mp.forward(tok.data(), tgt.data(), 2, 8);
    double lm = mm.forward(tok.data(), tgt.data(), 2, 8);
    INFO("preln " << lp << " mhc " << lm);
    CHECK_TOL("mhc a=0 == preln loss", std::fabs(lp - lm), 1e-12);
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
