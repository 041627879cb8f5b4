// Tests of the CPU reference ops (cpu/ops.h): every backward against 5-point finite
// differences in float64 (spec §3, error definition in cpu/gradcheck.h, bound 1e-6), and
// forwards against independent naive implementations.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "math/elementwise.h"
#include "cpu/gradcheck.h"
#include "cpu/ops.h"
#include "cpu/rng.h"
#include "test/helpers.h"

using namespace ldm;
using namespace ldm::cpu;
using Vec = std::vector<double>;

namespace {

Vec randn(size_t n, uint64_t seed, double sd = 1.0) {
    Vec v(n);
    uint64_t s0 = init_stream(seed, 0);
    for (size_t i = 0; i < n; i++) v[i] = sd * stream_normal(s0, i);
    return v;
}

double dot(const Vec& a, const Vec& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
    return s;
}

// `res` is a gradcheck::check call (tolerance 1e-6 beyond the stencil's rounding, entries and
// direction), evaluated once; label "fd entry|dir/<test case> <name>".
#define CHECK_GRAD(name, res)                                                                  \
    do {                                                                                       \
        const gradcheck::Result r_ = (res);                                                    \
        const std::string where_ = Catch::getResultCapture().getCurrentTestName() + " " + name; \
        INFO(name << ": max_err " << r_.max_err << " at " << r_.worst << " (analytic "         \
                  << r_.worst_a << ", numeric " << r_.worst_n << "), dir_err " << r_.dir_err    \
                  << ", stencil noise " << r_.noise);                                          \
        CHECK_TOL("fd entry/" + where_, r_.entry_ratio, 1.0);                                  \
        CHECK_TOL("fd dir/" + where_, r_.dir_ratio, 1.0);                                      \
    } while (0)

}  // namespace

TEST_CASE("splitmix64 matches the published reference output", "[ops][rng]") {
    // Vigna's splitmix64.c with state 0: first outputs e220a8397b1dcdaf, 6e789e6aa1b965f4.
    CHECK(splitmix64_at(0, 1) == 0xE220A8397B1DCDAFULL);
    CHECK(splitmix64_at(0, 2) == 0x6E789E6AA1B965F4ULL);
    // Box-Muller normals: mean ~0, variance ~1 over 200k draws.
    uint64_t s0 = init_stream(42, 3);
    double m = 0, v = 0;
    const int n = 200000;
    for (int k = 0; k < n; k++) {
        double z = stream_normal(s0, k);
        m += z;
        v += z * z;
    }
    m /= n;
    v = v / n - m * m;
    CHECK(std::fabs(m) < 0.01);
    CHECK(std::fabs(v - 1) < 0.02);
}

TEST_CASE("embedding backward vs finite differences; unused rows get no gradient", "[ops]") {
    const int N = 9, C = 5, Vp = 8;
    std::vector<int32_t> tok = {3, 1, 3, 0, 5, 5, 5, 2, 1};  // rows 4, 6, 7 unused
    Vec wte = randn(Vp * C, 1), w = randn(N * C, 2), out(N * C);
    auto f = [&]() {
        embedding_forward(out.data(), tok.data(), wte.data(), N, C);
        return dot(out, w);
    };
    f();
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) CHECK(out[n * C + c] == wte[tok[n] * C + c]);
    Vec g(Vp * C, 0.0);
    embedding_backward(g.data(), w.data(), tok.data(), N, C);
    for (int c = 0; c < C; c++) {
        CHECK(g[4 * C + c] == 0.0);
        CHECK(g[7 * C + c] == 0.0);
    }
    auto r = gradcheck::check(f, wte.data(), g.data(), Vp * C, 1 << 30, 3);
    CHECK_GRAD("wte", r);
}

TEST_CASE("RMSNorm forward and backward (odd sizes, also as QK-norm over head_dim rows)", "[ops]") {
    for (int C : {7, 16}) {
        const int N = 5;
        const double eps = 1e-5;
        Vec x = randn(N * C, 10 + C), wt = randn(C, 11), w = randn(N * C, 12), out(N * C), rstd(N);
        for (auto& v : wt) v += 1.0;
        auto f = [&]() {
            rmsnorm_forward(out.data(), rstd.data(), x.data(), wt.data(), N, C, eps);
            return dot(out, w);
        };
        f();
        for (int n = 0; n < N; n++) {  // independent forward
            double ms = 0;
            for (int c = 0; c < C; c++) ms += x[n * C + c] * x[n * C + c];
            ms /= C;
            for (int c = 0; c < C; c++)
                CHECK(out[n * C + c] == Approx(wt[c] * x[n * C + c] / std::sqrt(ms + eps)).epsilon(1e-13));
        }
        Vec dx(N * C, 0.0), dw(C, 0.0);
        rmsnorm_backward(dx.data(), dw.data(), w.data(), x.data(), wt.data(), rstd.data(), N, C);
        CHECK_GRAD("x", gradcheck::check(f, x.data(), dx.data(), N * C, 1 << 30, 1));
        CHECK_GRAD("w", gradcheck::check(f, wt.data(), dw.data(), C, 1 << 30, 2));
    }
}

TEST_CASE("linear layer with bias (QKV bias) and strided output", "[ops][blas]") {
    const int N = 5, IC = 7, OC = 3, LD = 6;
    Vec x = randn(N * IC, 20), W = randn(OC * IC, 21), b = randn(OC, 22), w = randn(N * LD, 23),
        out(N * LD, 0.0);
    for (int c = 0; c < N; c++)
        for (int o = OC; o < LD; o++) w[c * LD + o] = 0;  // unused columns
    auto f = [&]() {
        matmul_forward(out.data(), x.data(), W.data(), b.data(), N, IC, OC, LD);
        return dot(out, w);
    };
    f();
    // Both sums of IC + 1 terms, in any order (BLAS kernel) or with FMA: each within
    // gamma_{IC+1} ~ (IC + 1) u of sum |terms| of the exact value (Higham, Thm 3.1).
    double worst = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b[o], sabs = std::fabs(b[o]);
            for (int i = 0; i < IC; i++) {
                s += x[n * IC + i] * W[o * IC + i];
                sabs += std::fabs(x[n * IC + i] * W[o * IC + i]);
            }
            const double gamma = (IC + 1) * 0x1p-53 / (1 - (IC + 1) * 0x1p-53);
            worst = std::max(worst, std::fabs(out[n * LD + o] - s) / (2 * gamma * sabs));
        }
    CHECK_TOL("linear vs sum (units of the rounding bound)", worst, 1.0);
    Vec dx(N * IC, 0.0), dW(OC * IC, 0.0), db(OC, 0.0);
    matmul_backward(dx.data(), dW.data(), db.data(), w.data(), x.data(), W.data(), N, IC, OC, LD);
    CHECK_GRAD("x", gradcheck::check(f, x.data(), dx.data(), N * IC, 1 << 30, 1));
    CHECK_GRAD("W", gradcheck::check(f, W.data(), dW.data(), OC * IC, 1 << 30, 2));
    CHECK_GRAD("b", gradcheck::check(f, b.data(), db.data(), OC, 1 << 30, 3));
}

TEST_CASE("RoPE rotate-half: forward vs complex rotation, backward vs finite differences", "[ops]") {
    const int B = 2, T = 5, H = 3, hd = 6, N = B * T, half = hd / 2;
    const double theta = 1e4;
    Vec ct(T * half), st(T * half);
    rope_tables(ct.data(), st.data(), T, hd, theta);
    Vec x = randn(N * H * hd, 30), w = randn(N * H * hd, 31), out(N * H * hd);
    auto f = [&]() {
        rope_forward(out.data(), x.data(), ct.data(), st.data(), N, T, H, hd);
        return dot(out, w);
    };
    f();
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < half; i++) {
                // (x1 + i x2) * exp(i t theta^(-2i/hd)) written independently
                double a = (n % T) * std::exp(-std::log(theta) * (2.0 * i / hd));
                size_t base = (size_t)(n * H + h) * hd;
                double x1 = x[base + i], x2 = x[base + i + half];
                CHECK(out[base + i] == Approx(x1 * std::cos(a) - x2 * std::sin(a)).margin(1e-12));
                CHECK(out[base + i + half] == Approx(x2 * std::cos(a) + x1 * std::sin(a)).margin(1e-12));
            }
    Vec dx(N * H * hd, 0.0);
    rope_backward(dx.data(), w.data(), ct.data(), st.data(), N, T, H, hd);
    CHECK_GRAD("x", gradcheck::check(f, x.data(), dx.data(), N * H * hd, 1 << 30, 1));
}

namespace {
// Naive causal GQA attention, written independently of ops.cpp.
Vec naive_attention(const Vec& q, const Vec& k, const Vec& v, int B, int T, int nh, int nkv, int hd) {
    Vec out((size_t)B * T * nh * hd, 0.0);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv);
            for (int t = 0; t < T; t++) {
                std::vector<double> s(t + 1);
                double mx = -1e300;
                for (int u = 0; u <= t; u++) {
                    double acc = 0;
                    for (int i = 0; i < hd; i++)
                        acc += q[((size_t)(b * T + t) * nh + h) * hd + i] *
                               k[((size_t)(b * T + u) * nkv + kh) * hd + i];
                    s[u] = acc / std::sqrt((double)hd);
                    mx = std::max(mx, s[u]);
                }
                double z = 0;
                for (int u = 0; u <= t; u++) z += std::exp(s[u] - mx);
                for (int u = 0; u <= t; u++)
                    for (int i = 0; i < hd; i++)
                        out[((size_t)(b * T + t) * nh + h) * hd + i] +=
                            std::exp(s[u] - mx) / z * v[((size_t)(b * T + u) * nkv + kh) * hd + i];
            }
        }
    return out;
}
}  // namespace

TEST_CASE("causal GQA attention: forward vs naive, backward vs finite differences", "[ops][blas]") {
    struct Shape { int B, T, nh, nkv, hd; };
    // GQA (nkv < nh), MQA (nkv = 1), MHA, odd T and a T spanning several 64-row blocks.
    for (Shape s : {Shape{2, 7, 4, 2, 6}, Shape{1, 5, 3, 1, 4}, Shape{1, 6, 2, 2, 8}, Shape{1, 70, 2, 1, 4}}) {
        const int N = s.B * s.T, qd = s.nh * s.hd, kvd = s.nkv * s.hd;
        Vec q = randn(N * qd, 40), k = randn(N * kvd, 41), v = randn(N * kvd, 42),
            w = randn(N * qd, 43), out(N * qd), att((size_t)s.B * s.nh * s.T * s.T);
        auto f = [&]() {
            attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.nh,
                              s.nkv, s.hd);
            return dot(out, w);
        };
        f();
        Vec ref = naive_attention(q, k, v, s.B, s.T, s.nh, s.nkv, s.hd);
        double maxd = 0;
        for (size_t i = 0; i < ref.size(); i++) maxd = std::max(maxd, std::fabs(ref[i] - out[i]));
        INFO("shape B=" << s.B << " T=" << s.T << " nh=" << s.nh << " nkv=" << s.nkv << " hd=" << s.hd);
        CHECK_TOL("attention vs naive", maxd, 1e-12);
        Vec dq(N * qd, 0.0), dk(N * kvd, 0.0), dv(N * kvd, 0.0);
        attention_backward(dq.data(), dk.data(), dv.data(), w.data(), att.data(), q.data(), k.data(),
                           v.data(), s.B, s.T, s.nh, s.nkv, s.hd);
        const int64_t cnt = s.T > 20 ? 150 : (1 << 30);
        CHECK_GRAD("q", gradcheck::check(f, q.data(), dq.data(), N * qd, cnt, 1));
        CHECK_GRAD("k", gradcheck::check(f, k.data(), dk.data(), N * kvd, cnt, 2));
        CHECK_GRAD("v", gradcheck::check(f, v.data(), dv.data(), N * kvd, cnt, 3));
    }
}

TEST_CASE("SwiGLU gate backward (packed h13)", "[ops]") {
    const int N = 3, F = 13, n = N * F;
    Vec h13 = randn(2 * n, 50, 2.0), w = randn(n, 52), a(n);
    auto f = [&]() {
        swiglu_forward(a.data(), h13.data(), N, F);
        return dot(a, w);
    };
    f();
    for (int r = 0; r < N; r++)
        for (int c = 0; c < F; c++) {
            const double h1 = h13[r * 2 * F + c], h3 = h13[r * 2 * F + F + c];
            CHECK(a[r * F + c] == Approx(h1 / (1 + std::exp(-h1)) * h3).epsilon(1e-13));
        }
    Vec d13(2 * n, 7.0);  // written, not accumulated
    swiglu_backward(d13.data(), w.data(), h13.data(), N, F);
    CHECK_GRAD("h13", gradcheck::check(f, h13.data(), d13.data(), 2 * n, 1 << 30, 1));
}

TEST_CASE("SwiGLU float path (exp_fast sigmoid) matches the float64 gate", "[ops]") {
    // exp_fast is ~2 ulp; each output then carries a few float roundings (< 8 ulp ~ 5e-7 of
    // the terms' magnitude): 1e-6 of it is the bound, at random z in about [-20, 20] plus the
    // saturated tails (z = +-95) and z = 0.
    const int N = 4, F = 257, n = N * F;
    Vec h13d = randn(2 * n, 53, 6.0), wd = randn(n, 54);
    h13d[0] = 95.0;
    h13d[1] = -95.0;
    h13d[2] = 0.0;
    std::vector<float> h13(h13d.begin(), h13d.end()), w(wd.begin(), wd.end()), a(n), d13(2 * n);
    swiglu_forward(a.data(), h13.data(), N, F);
    swiglu_backward(d13.data(), w.data(), h13.data(), N, F);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < F; c++) {
            const double z = h13[r * 2 * F + c], h3 = h13[r * 2 * F + F + c], g = w[r * F + c];
            const double s = 1 / (1 + std::exp(-z));
            const double ra = z * s * h3, rd1 = g * h3 * s * (1 + z * (1 - s)), rd3 = g * z * s;
            CHECK(std::abs(a[r * F + c] - ra) <= 1e-6 * std::abs(ra) + 1e-30);
            // 1 + z (1 - s) cancels near z = -1.28: bound by the terms' magnitudes instead
            const double mag1 = std::abs(g * h3) * s * (1 + std::abs(z) * (1 - s));
            CHECK(std::abs(d13[r * 2 * F + c] - rd1) <= 1e-6 * mag1 + 1e-30);
            CHECK(std::abs(d13[r * 2 * F + F + c] - rd3) <= 1e-6 * std::abs(rd3) + 1e-30);
        }
}

TEST_CASE("cross-entropy over the real V of padded logits", "[ops]") {
    const int N = 4, V = 11, Vp = 16;
    Vec logits = randn(N * Vp, 60, 3.0), lse(N);
    std::vector<int32_t> tgt = {0, 10, 5, 5};
    auto f = [&]() { return cross_entropy_forward(lse.data(), logits.data(), tgt.data(), N, V, Vp); };
    double loss = f();
    double ref = 0;  // independent: -log softmax over the first V columns
    for (int n = 0; n < N; n++) {
        double z = 0;
        for (int v = 0; v < V; v++) z += std::exp(logits[n * Vp + v]);
        ref += -(logits[n * Vp + tgt[n]] - std::log(z));
    }
    CHECK(loss == Approx(ref / N).epsilon(1e-13));
    // Padded columns do not matter.
    for (int n = 0; n < N; n++)
        for (int v = V; v < Vp; v++) logits[n * Vp + v] = 1e3;
    CHECK(f() == loss);
    Vec d(N * Vp, 0.0);
    cross_entropy_backward(d.data(), logits.data(), lse.data(), tgt.data(), N, V, Vp, 1.0 / N);
    for (int n = 0; n < N; n++)
        for (int v = V; v < Vp; v++) CHECK(d[n * Vp + v] == 0.0);
    CHECK_GRAD("logits", gradcheck::check(f, logits.data(), d.data(), N * Vp, 1 << 30, 1));
    // Fused path of the model: probs from the forward, turned into dlogits in place.
    Vec probs(N * Vp, 0.0);
    CHECK(cross_entropy_forward(lse.data(), logits.data(), tgt.data(), N, V, Vp, probs.data()) == loss);
    for (int n = 0; n < N; n++) {
        double z = 0;
        for (int v = 0; v < V; v++) z += probs[n * Vp + v];
        CHECK(z == Approx(1.0).epsilon(1e-14));
    }
    cross_entropy_backward_inplace(probs.data(), tgt.data(), N, V, Vp, 1.0 / N);
    for (int i = 0; i < N * Vp; i++) CHECK(probs[i] == Approx(d[i]).margin(1e-16).epsilon(1e-13));
}

// The model's tiled LM head + cross-entropy against a direct float64 computation, on a shape with
// a partial second row tile and a partial third column tile, targets on tile edges.
TEST_CASE("LM head + cross-entropy, tiled (lm_head_ce_*), vs direct float64", "[ops][blas]") {
    const int N = kLmRowTile + 37, V = 2 * kLmColTile + 77, Vp = V + 11, d = 8;
    const Vec x = randn((size_t)N * d, 71), W = randn((size_t)V * d, 72, 0.7);
    std::vector<int32_t> tgt(N);
    for (int n = 0; n < N; n++) tgt[n] = int32_t((n * 7919) % V);
    tgt[0] = 0, tgt[1] = kLmColTile - 1, tgt[2] = kLmColTile, tgt[3] = V - 1, tgt[N - 1] = 2 * kLmColTile;
    // direct: logits, lse, loss, G = softmax - onehot, dx = s G W, dW = s G^T x
    const double s = 0.37 / N;
    Vec ref_logits((size_t)N * V), ref_lse(N), G((size_t)N * V), ref_dx((size_t)N * d, 0.0), ref_dW((size_t)V * d, 0.0);
    double ref_loss = 0;
    for (int n = 0; n < N; n++) {
        double mx = -1e300;
        for (int v = 0; v < V; v++) {
            double z = 0;
            for (int k = 0; k < d; k++) z += x[(size_t)n * d + k] * W[(size_t)v * d + k];
            ref_logits[(size_t)n * V + v] = z;
            mx = std::max(mx, z);
        }
        double sum = 0;
        for (int v = 0; v < V; v++) sum += std::exp(ref_logits[(size_t)n * V + v] - mx);
        ref_lse[n] = mx + std::log(sum);
        ref_loss += ref_lse[n] - ref_logits[(size_t)n * V + tgt[n]];
        for (int v = 0; v < V; v++)
            G[(size_t)n * V + v] = std::exp(ref_logits[(size_t)n * V + v] - ref_lse[n]) - (v == tgt[n] ? 1.0 : 0.0);
    }
    ref_loss /= N;
    for (int n = 0; n < N; n++)
        for (int v = 0; v < V; v++) {
            const double g = s * G[(size_t)n * V + v];
            for (int k = 0; k < d; k++) {
                ref_dx[(size_t)n * d + k] += g * W[(size_t)v * d + k];
                ref_dW[(size_t)v * d + k] += g * x[(size_t)n * d + k];
            }
        }
    auto rel_l2 = [](const auto& a, const Vec& b) {
        double e = 0, n2 = 0;
        for (size_t i = 0; i < b.size(); i++) e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), n2 += b[i] * b[i];
        return std::sqrt(e / n2);
    };
    auto run = [&](auto zero, double tol_fwd, double tol_bwd) {
        using R = decltype(zero);
        std::vector<R> xr(x.begin(), x.end()), Wr(W.begin(), W.end()), logits((size_t)N * Vp, R(7)), lse(N), mx(N), inv(N);
        std::vector<R> dx((size_t)N * d, R(0.25 * s)), dW((size_t)V * d, R(-0.5 * s)), tile((size_t)kLmRowTile * kLmColTile);
        const double loss = lm_head_ce_forward(logits.data(), lse.data(), mx.data(), inv.data(), xr.data(), Wr.data(),
                                               tgt.data(), N, d, V, Vp);
        CHECK(std::abs(loss - ref_loss) <= tol_fwd * std::abs(ref_loss));
        std::vector<R> lg((size_t)N * V);
        for (int n = 0; n < N; n++)
            for (int v = 0; v < Vp; v++) {
                if (v < V) lg[(size_t)n * V + v] = logits[(size_t)n * Vp + v];
                else CHECK(logits[(size_t)n * Vp + v] == R(7));  // padding columns untouched
            }
        CHECK(rel_l2(lg, ref_logits) <= tol_fwd);
        CHECK(rel_l2(lse, ref_lse) <= tol_fwd);
        lm_head_ce_backward(dx.data(), dW.data(), logits.data(), mx.data(), inv.data(), xr.data(), Wr.data(), tgt.data(),
                            N, d, V, Vp, R(s), tile.data());
        for (auto& v : dx) v -= R(0.25 * s);  // accumulates (+=) into what was there
        for (auto& v : dW) v += R(0.5 * s);
        INFO("dx " << rel_l2(dx, ref_dx) << " dW " << rel_l2(dW, ref_dW));
        CHECK(rel_l2(dx, ref_dx) <= tol_bwd);
        CHECK(rel_l2(dW, ref_dW) <= tol_bwd);
    };
    run(0.0, 1e-13, 1e-13);
    // fp32: u = 6e-8 per rounding, sums of up to V terms (measured 3e-7 on the gradients)
    run(0.0f, 1e-6, 1e-5);
}

TEST_CASE("gemm stats count FLOPs", "[ops]") {
    reset_gemm_stats();
    Vec a = randn(6 * 4, 1), b = randn(4 * 5, 2), c(6 * 5, 0.0);
    gemm<double>(false, false, 6, 5, 4, 1.0, a.data(), 4, b.data(), 5, 0.0, c.data(), 5);
    GemmStats s = gemm_stats();
    CHECK(s.calls == 1);
    CHECK(s.flops == 2.0 * 6 * 5 * 4);
    CHECK(s.seconds >= 0);
    CHECK(c[0] == Approx(a[0] * b[0] + a[1] * b[5] + a[2] * b[10] + a[3] * b[15]).epsilon(1e-14));
}

TEST_CASE("gemm: all transpose combinations, split across threads, strided, vs naive", "[ops][blas]") {
    // 2*M*N*K = 6.4e6 FLOPs: above the threshold where gemm() splits the product over threads.
    const int M = 200, N = 160, K = 100;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int mbig = 0; mbig < 2; mbig++) {
                const int m = mbig ? M : N, n = mbig ? N : M;  // split along M, then along N
                const int lda = (ta ? m : K) + 3, ldb = (tb ? K : n) + 5, ldc = n + 7;
                Vec A = randn((size_t)(ta ? K : m) * lda, 100 + ta), B = randn((size_t)(tb ? n : K) * ldb, 200 + tb),
                    C = randn((size_t)m * ldc, 300), C0 = C;
                const double alpha = 0.7, beta = -0.4;
                gemm<double>(ta, tb, m, n, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
                // Any summation order (kernel, split) and the naive loop are each within
                // gamma_{K+2} (|alpha| sum_k |a_ik b_kj| + |beta c_ij|) of the exact value.
                const double gamma = (K + 2) * 0x1p-53 / (1 - (K + 2) * 0x1p-53);
                double worst = 0;
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) {
                        double s = 0, sabs = 0;
                        for (int k = 0; k < K; k++) {
                            const double p = (ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                                             (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                            s += p;
                            sabs += std::fabs(p);
                        }
                        double ref = alpha * s + beta * C0[(size_t)i * ldc + j];
                        const double bound = 2 * gamma * (std::fabs(alpha) * sabs + std::fabs(beta * C0[(size_t)i * ldc + j]));
                        worst = std::max(worst, std::fabs(ref - C[(size_t)i * ldc + j]) / bound);
                    }
                INFO("trans_a=" << ta << " trans_b=" << tb << " m=" << m << " n=" << n);
                CHECK_TOL("gemm vs naive (units of the rounding bound)", worst, 1.0);
                // Padding columns of C untouched.
                for (int i = 0; i < m; i++)
                    for (int j = n; j < ldc; j++) REQUIRE(C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
            }
}

TEST_CASE("exp_fast (float) against libm exp in double", "[ops]") {
    double worst = 0, at = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + 175.0f * (float)i / 2000000.0f;  // [-87, 88]
        double ref = std::exp((double)x);
        double e = std::fabs((double)exp_fast(x) - ref) / ref;
        if (e > worst) { worst = e; at = x; }
    }
    INFO("worst relative error " << worst << " at x = " << at);
    CHECK(worst < 2.5e-7);  // ~2 ulp of float
    CHECK(exp_fast(0.0f) == 1.0f);
    CHECK(exp_fast(-1000.0f) > 0.0f);          // clamped to ~FLT_MIN, never 0/NaN
    CHECK(exp_fast(-1000.0f) < 1.2e-38f);
    CHECK(std::isfinite(exp_fast(1000.0f)));
    CHECK(exp_fast(1.5) == std::exp(1.5));     // double overload is libm
}
