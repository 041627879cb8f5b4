// AttnRes Full and Block (spec §2.4) in the CPU reference: scheme-level and whole-model gradients
// vs finite differences (float64), uniform weights at init, the block bookkeeping (sources per
// sublayer, remainder block), Block with N >= D equals Full (spec §3), fp32 vs float64.
#include "test/test_scheme_util.h"

#include "cpu/scheme_attnres.h"

using namespace sch;

TEST_CASE("attnres softmax helpers vs closed form", "[scheme][attnres]") {
    double s[3] = {0.5, -1.0, 2.0};
    ldm::attnres_softmax(s, 3);
    double z = std::exp(0.5) + std::exp(-1.0) + std::exp(2.0);
    CHECK(s[0] == Approx(std::exp(0.5) / z).epsilon(1e-14));
    CHECK(s[2] == Approx(std::exp(2.0) / z).epsilon(1e-14));
    double da[3] = {1.0, 2.0, -1.0};
    ldm::attnres_softmax_backward(da, s, 3);
    double m = s[0] * 1 + s[1] * 2 - s[2];
    CHECK(da[1] == Approx(s[1] * (2 - m)).epsilon(1e-14));
}

TEST_CASE("AttnRes scheme alone: gradients vs finite differences (Full, Block, remainder block)", "[scheme][attnres][grad]") {
    struct K { const char* s; int N; };
    for (K k : {K{"attnres-full", 8}, K{"attnres-block", 2}, K{"attnres-block", 4}, K{"attnres-block", 1}}) {
        ModelConfig c = tiny(k.s);
        c.d_model = 16;
        c.n_layer = 3;  // D = 6: N = 4 gives S = 1 and a last block of 3 sublayers
        c.attnres_blocks = k.N;
        INFO(k.s << " N = " << k.N);
        Synthetic s(c, 2, 3, 41 + k.N);
        s.check(100, 6);
    }
}

TEST_CASE("tiny model with AttnRes: all parameter gradients vs finite differences (float64)", "[scheme][attnres][grad][blas]") {
    double w1 = check_model_grads(tiny("attnres-full"), 2, 5, 30, 9);
    ModelConfig b = tiny("attnres-block");
    b.attnres_blocks = 2;
    double w2 = check_model_grads(b, 2, 5, 30, 10);
    WARN("attnres tiny model: worst entry error full " << w1 << ", block " << w2);
}

TEST_CASE("AttnRes at init averages its sources uniformly; block sources per spec", "[scheme][attnres][init]") {
    // Drive the scheme directly with random e and o_j and compare x_j and y with plain means.
    const int B = 1, T = 3, d = 64;
    for (int N : {0, 2, 3}) {  // 0 = Full
        ModelConfig c = tiny(N == 0 ? "attnres-full" : "attnres-block");
        c.n_layer = 3;  // D = 6
        if (N) c.attnres_blocks = N;
        const int D = c.n_sublayers(), n = B * T * d;
        std::vector<ParamSpec> sp = scheme_param_specs(c);
        std::vector<double> params(sp.back().offset + sp.back().numel), grads(params.size());
        auto S = make_scheme<double>(c);
        S->bind(params.data(), grads.data());
        S->init_params(params.data(), 1, 0);
        std::vector<std::vector<double>> v(D + 1, std::vector<double>(n));
        uint64_t s0 = ldm::init_stream(N, 1);
        for (int j = 0; j <= D; j++)
            for (int k = 0; k < n; k++) v[j][k] = stream_normal(s0, j * n + k);
        // Expected source lists (as sums of v's) per sublayer, from the spec's equations.
        auto mean_of = [&](const std::vector<std::vector<int>>& srcs, int k) {
            double m = 0;
            for (const auto& s : srcs) {
                double u = 0;
                for (int idx : s) u += v[idx][k];
                m += u;
            }
            return m / srcs.size();
        };
        std::vector<std::vector<std::vector<int>>> expect(D + 2);
        if (N == 0) {
            for (int j = 1; j <= D + 1; j++)
                for (int i = 0; i < j; i++) expect[j].push_back({i});
        } else {
            int S_ = D / N;
            std::vector<std::vector<int>> blocks = {{0}};
            std::vector<int> p;
            for (int j = 1; j <= D; j++) {
                int b = std::min((j - 1) / S_ + 1, N);
                expect[j] = blocks;
                if (!p.empty()) expect[j].push_back(p);
                p.push_back(j);
                bool end = (b < N) ? (j == b * S_) : (j == D);
                if (end) { blocks.push_back(p); p.clear(); }
            }
            expect[D + 1] = blocks;
            CHECK((int)blocks.size() == N + 1);
        }
        S->resize(B, T);
        S->begin(v[0].data());
        std::vector<double> x(n);
        double err = 0;
        for (int j = 1; j <= D; j++) {
            S->input(j, x.data());
            for (int k = 0; k < n; k++) err = std::max(err, std::fabs(x[k] - mean_of(expect[j], k)));
            S->output(j, v[j].data());
        }
        S->readout(x.data());
        for (int k = 0; k < n; k++) err = std::max(err, std::fabs(x[k] - mean_of(expect[D + 1], k)));
        INFO("N = " << N);
        CHECK(err <= 1e-12);
    }
}

TEST_CASE("Block AttnRes with N >= D equals Full (loss and gradients, float64)", "[scheme][attnres][blas]") {
    ModelConfig cf = tiny("attnres-full");
    Model<double> mf(cf);
    randomize(mf, 13);
    auto tok = rand_tokens(2 * 6, cf.vocab_size, 4);
    auto tgt = rand_tokens(2 * 6, cf.vocab_size, 5);
    mf.zero_grad();
    double lf = mf.forward(tok.data(), tgt.data(), 2, 6);
    mf.backward();
    for (int N : {4, 100}) {  // D = 4: one sublayer per block; 100 is clamped to D
        ModelConfig cb = tiny("attnres-block");
        cb.attnres_blocks = N;
        Model<double> mb(cb);
        copy_shared(mf, mb);
        mb.zero_grad();
        double lb = mb.forward(tok.data(), tgt.data(), 2, 6);
        mb.backward();
        INFO("N = " << N << ": full " << lf << " block " << lb);
        CHECK_TOL("block N>=D == full loss", std::fabs(lf - lb), 1e-12);
        double err = 0, mx = 0;
        for (size_t k = 0; k < mf.grads.size(); k++) {
            err = std::max(err, std::fabs(mf.grads[k] - mb.grads[k]));
            mx = std::max(mx, std::fabs(mf.grads[k]));
        }
        CHECK_TOL("block N>=D == full grads", err, 1e-12 * mx);
    }
}

TEST_CASE("AttnRes: fp32 path matches float64 within 1e-4 relative", "[scheme][attnres][blas]") {
    check_fp32_vs_fp64(tiny("attnres-full"), 23);
    ModelConfig b = tiny("attnres-block");
    b.attnres_blocks = 3;
    check_fp32_vs_fp64(b, 24);
}

TEST_CASE("AttnRes: state size per token matches the dry-run estimate", "[scheme][attnres]") {
    for (const char* s : {"attnres-full", "attnres-block"}) {
        ModelConfig c = tiny(s);
        c.attnres_blocks = 3;
        Model<float> m(c);
        m.init(1);
        auto tok = rand_tokens(2 * 4, c.vocab_size, 1);
        m.forward(tok.data(), tok.data(), 2, 4);
        CHECK(m.activation_values() == (int64_t)2 * 4 * activation_values_per_token(c, 4));
    }
}
