// Tests of the CPU reference model (cpu/model.h) and of core/config.h: whole-model gradients
// against 5-point finite differences in float64 (spec §3), fp32 vs fp64, accumulation
// equivalence, causality, padded vocabulary, init, parameter counts and config validation.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/config.h"
#include "cpu/gradcheck.h"
#include "cpu/infer.h"
#include "cpu/model.h"
#include "cpu/rng.h"
#include "test/helpers.h"

using namespace ldm;
using namespace ldm::cpu;

namespace {

// `tiny` of spec §1 with a small vocabulary (V = 101, Vp = 128) so that finite differences over
// the whole model stay fast; every other dimension is the preset's.
ModelConfig tiny_cfg(bool tied = false, bool qkv_bias = false, bool qk_norm = false) {
    ModelConfig c = preset_config("tiny", 101);
    c.seq_len = 64;
    c.tied = tied;
    c.qkv_bias = qkv_bias;
    c.qk_norm = qk_norm;
    return c;
}

std::vector<int32_t> rand_tokens(int n, int V, uint64_t seed) {
    std::vector<int32_t> t(n);
    uint64_t s0 = init_stream(seed, 5);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(stream_uniform(s0, i) * V);
    return t;
}

// Random non-zero parameters: spec init, then norm weights / biases perturbed away from 1 / 0
// (so their gradients are exercised at generic points), matrices scaled up so activations are O(1).
template <typename R>
void randomize(Model<R>& m, uint64_t seed) {
    m.init(seed);
    uint64_t s0 = init_stream(seed, 12345);
    for (size_t i = 0; i < m.params.size(); i++) {
        double z = stream_normal(s0, i);
        const ParamSpec* sp = nullptr;
        for (const auto& s : m.specs)
            if ((int64_t)i >= s.offset && (int64_t)i < s.offset + s.numel) { sp = &s; break; }
        if (sp->shape.size() == 1) m.params[i] = (R)(m.params[i] + 0.3 * z);
        else m.params[i] = (R)(m.params[i] * 5.0);
    }
}

// Finite-difference step of the 5-point stencil ($LDM_FD_STEP overrides, for experiments).
double fd_step() {
    const char* e = std::getenv("LDM_FD_STEP");
    return e ? std::atof(e) : 1e-4;
}

struct GradReport {
    double worst_entry = 0, worst_dir = 0;
    std::string worst_name;
};

GradReport check_model_grads(const std::string& label, const ModelConfig& c, int B, int T,
                             int per_tensor, uint64_t seed, double h) {
    Model<double> m(c);
    randomize(m, seed);
    auto tok = rand_tokens(B * T, c.vocab_size, seed + 1);
    auto tgt = rand_tokens(B * T, c.vocab_size, seed + 2);
    m.zero_grad();
    m.forward(tok.data(), tgt.data(), B, T);
    m.backward();
    std::vector<double> g = m.grads;
    auto f = [&]() { return m.forward(tok.data(), tgt.data(), B, T); };
    GradReport rep;
    for (const auto& s : m.specs) {
        // Padded vocabulary rows (>= V) have zero gradient and are checked separately.
        int64_t n = s.numel;
        if (s.name == "wte" || s.name == "lm_head") n = (int64_t)c.vocab_size * c.d_model;
        auto r = gradcheck::check(f, m.params.data() + s.offset, g.data() + s.offset, n,
                                  per_tensor, seed + s.offset, h);
        INFO(s.name << ": checked " << r.checked << ", max_err " << r.max_err << " at " << r.worst
                    << " (analytic " << r.worst_a << ", numeric " << r.worst_n << "), dir_err "
                    << r.dir_err << ", stencil noise " << r.noise);
        CHECK_TOL("fd entry/" + label + " " + s.name, r.entry_ratio, 1.0);  // 1e-6 + noise
        CHECK_TOL("fd dir/" + label + " " + s.name, r.dir_ratio, 1.0);
        if (r.max_err > rep.worst_entry) { rep.worst_entry = r.max_err; rep.worst_name = s.name; }
        rep.worst_dir = std::max(rep.worst_dir, r.dir_err);
    }
    return rep;
}

}  // namespace

TEST_CASE("tiny model: all parameter gradients vs finite differences (float64)", "[model][grad][blas]") {
    struct Case { const char* what; ModelConfig c; };
    ModelConfig qwenish = tiny_cfg(true, true, true);
    qwenish.d_model = 48;  // n_head * head_dim = 64 != d_model, as in the qwen3 presets
    qwenish.rope_theta = 1e6;
    qwenish.norm_eps = 1e-6;
    for (Case k : {Case{"untied", tiny_cfg()}, Case{"tied", tiny_cfg(true)},
                   Case{"qkv_bias+qk_norm, d != n_head*head_dim, tied", qwenish}}) {
        INFO("config: " << k.what);
        GradReport r = check_model_grads(k.what, k.c, 2, 5, 200, 7, fd_step());
        WARN(k.what << ": worst entry error " << r.worst_entry << " (" << r.worst_name
                    << "), worst directional error " << r.worst_dir);
    }
}

TEST_CASE("the finite-difference check fails on a gradient 1e-5 off in one entry; its noise bound is tiny",
          "[model][grad][blas]") {
    // gradcheck's stencil noise bound (cpu/gradcheck.h) must not hide real errors: on the tiny
    // model one entry of the analytic gradient moved by 1e-5 of its own size (the largest entry)
    // or of the tensor's floor scale (the entry of smallest |gradient|) must fail the 1e-6
    // check, and the bound itself must be far below the gradients.
    ModelConfig c = tiny_cfg(false, true, true);
    Model<double> m(c);
    randomize(m, 7);
    auto tok = rand_tokens(2 * 5, c.vocab_size, 8), tgt = rand_tokens(2 * 5, c.vocab_size, 9);
    m.zero_grad();
    m.forward(tok.data(), tgt.data(), 2, 5);
    m.backward();
    auto f = [&]() { return m.forward(tok.data(), tgt.data(), 2, 5); };
    for (const char* name : {"blocks.0.attn_norm.w", "blocks.1.attn.bq", "blocks.1.mlp_norm.w"}) {
        const ParamSpec& s = m.spec(name);
        std::vector<double> g(m.grads.begin() + s.offset, m.grads.begin() + s.offset + s.numel);
        int64_t big = 0, small = 0;
        for (int64_t i = 0; i < s.numel; i++) {
            if (std::fabs(g[i]) > std::fabs(g[big])) big = i;
            if (std::fabs(g[i]) < std::fabs(g[small])) small = i;
        }
        const double amax = std::fabs(g[big]);
        gradcheck::Result ok = gradcheck::check(f, m.params.data() + s.offset, g.data(), s.numel, 1 << 30, 1);
        INFO(name << ": max_err " << ok.max_err << ", stencil noise " << ok.noise << ", max |g| " << amax);
        CHECK(ok.pass());
        CHECK_TOL(std::string("fd noise bound / max |g|/") + name, gradcheck::kNoise * ok.noise / amax, 1e-7);
        for (int64_t i : {big, small}) {
            std::vector<double> bad = g;
            bad[i] += 1e-5 * std::max(std::fabs(g[i]), 1e-3 * amax);
            gradcheck::Result r = gradcheck::check(f, m.params.data() + s.offset, bad.data(), s.numel, 1 << 30, 1);
            INFO("entry " << i << " (|g| " << std::fabs(g[i]) << ") moved: entry_ratio " << r.entry_ratio);
            CHECK(r.entry_ratio > 1);
            CHECK(r.worst == i);
        }
    }
}

TEST_CASE("fp32 path matches float64 within 1e-4 relative (loss and every gradient tensor)", "[model][blas]") {
    ModelConfig c = tiny_cfg(false, true, true);
    const int B = 2, T = 16;
    Model<double> md(c);
    randomize(md, 21);
    Model<float> mf(c);
    for (size_t i = 0; i < md.params.size(); i++) mf.params[i] = (float)md.params[i];
    for (size_t i = 0; i < md.params.size(); i++) md.params[i] = (double)mf.params[i];  // same weights
    auto tok = rand_tokens(B * T, c.vocab_size, 22), tgt = rand_tokens(B * T, c.vocab_size, 23);
    md.zero_grad();
    mf.zero_grad();
    double ld = md.forward(tok.data(), tgt.data(), B, T);
    double lf = mf.forward(tok.data(), tgt.data(), B, T);
    md.backward();
    mf.backward();
    CHECK_TOL("fp32 vs fp64 loss", std::fabs(lf - ld) / std::fabs(ld), 1e-4);
    // Per tensor: ||g32 - g64||_2 / ||g64||_2 <= 1e-4.
    for (const auto& s : md.specs) {
        double num = 0, den = 0;
        for (int64_t i = s.offset; i < s.offset + s.numel; i++) {
            double d = (double)mf.grads[i] - md.grads[i];
            num += d * d;
            den += md.grads[i] * md.grads[i];
        }
        INFO(s.name << ": relative difference " << std::sqrt(num / den));
        CHECK(den > 0);
        CHECK_TOL("fp32 vs fp64 grad/" + s.name, std::sqrt(num / den), 1e-4);
    }
}

TEST_CASE("gradient accumulation: one batch of 4 == two batches of 2 with scale 0.5", "[model][blas]") {
    ModelConfig c = tiny_cfg(true, true, false);
    const int T = 12;
    Model<double> m(c);
    randomize(m, 31);
    auto tok = rand_tokens(4 * T, c.vocab_size, 32), tgt = rand_tokens(4 * T, c.vocab_size, 33);
    m.zero_grad();
    double l4 = m.forward(tok.data(), tgt.data(), 4, T);
    m.backward(1.0);
    std::vector<double> g4 = m.grads;
    m.zero_grad();
    double la = m.forward(tok.data(), tgt.data(), 2, T);
    m.backward(0.5);
    double lb = m.forward(tok.data() + 2 * T, tgt.data() + 2 * T, 2, T);
    m.backward(0.5);
    CHECK_TOL("grad accumulation loss", std::fabs(0.5 * (la + lb) - l4), 1e-12 * std::fabs(l4));
    double gmax = 0, dmax = 0;
    for (size_t i = 0; i < g4.size(); i++) {
        gmax = std::max(gmax, std::fabs(g4[i]));
        dmax = std::max(dmax, std::fabs(g4[i] - m.grads[i]));
    }
    INFO("max |diff| " << dmax << ", max |g| " << gmax);
    CHECK(gmax > 0);
    CHECK_TOL("grad accumulation grads", dmax, 1e-12 * gmax);
}

TEST_CASE("forward/backward are bit-reproducible (fp32, two runs)", "[model][blas]") {
    ModelConfig c = tiny_cfg();
    c.d_model = 128;  // large enough for the OpenMP paths to engage
    c.seq_len = 128;
    const int B = 4, T = 128;
    auto tok = rand_tokens(B * T, c.vocab_size, 81), tgt = rand_tokens(B * T, c.vocab_size, 82);
    std::vector<float> g[2];
    double loss[2];
    for (int r = 0; r < 2; r++) {
        Model<float> m(c);
        m.init(9);
        m.zero_grad();
        loss[r] = m.forward(tok.data(), tgt.data(), B, T);
        m.backward();
        g[r] = m.grads;
    }
    CHECK(loss[0] == loss[1]);
    CHECK(g[0] == g[1]);
}

TEST_CASE("changing (B, T) between calls gives the same results as a fresh model", "[model][blas]") {
    ModelConfig c = tiny_cfg(false, true, true);
    auto tok = rand_tokens(3 * 20, c.vocab_size, 91), tgt = rand_tokens(3 * 20, c.vocab_size, 92);
    Model<double> a(c), b(c);
    a.init(5);
    b.init(5);
    a.forward(tok.data(), tgt.data(), 3, 20);  // larger shape first
    a.backward();
    a.forward(tok.data(), tgt.data(), 1, 7);   // then a smaller one
    a.zero_grad();
    double la = a.forward(tok.data(), tgt.data(), 2, 9);
    a.backward();
    double lb = b.forward(tok.data(), tgt.data(), 2, 9);
    b.backward();
    CHECK(la == lb);
    CHECK(a.grads == b.grads);
    CHECK(std::equal(a.logits(), a.logits() + 2 * 9 * c.padded_vocab, b.logits()));
}

TEST_CASE("causality: logits at position t depend only on tokens <= t", "[model][blas]") {
    ModelConfig c = tiny_cfg(false, false, true);
    c.seq_len = 128;
    const int B = 2, T = 70;  // spans two 64-row attention blocks
    Model<double> m(c);
    randomize(m, 41);
    auto tok = rand_tokens(B * T, c.vocab_size, 42);
    m.forward(tok.data(), nullptr, B, T);
    std::vector<double> ref(m.logits(), m.logits() + (size_t)B * T * c.padded_vocab);
    const int t_change = 37;
    for (int t = t_change; t < T; t++) tok[T + t] = (tok[T + t] + 1 + t) % c.vocab_size;  // sequence 1
    m.forward(tok.data(), nullptr, B, T);
    const double* lg = m.logits();
    const int Vp = c.padded_vocab;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double maxd = 0;
            for (int v = 0; v < Vp; v++)
                maxd = std::max(maxd, std::fabs(lg[((size_t)b * T + t) * Vp + v] - ref[((size_t)b * T + t) * Vp + v]));
            if (b == 0 || t < t_change) {
                INFO("b=" << b << " t=" << t);
                CHECK(maxd == 0.0);
            } else {
                INFO("b=" << b << " t=" << t);
                CHECK(maxd > 1e-6);  // positions at/after the change do see it
            }
        }
}

TEST_CASE("padded vocabulary rows: zero gradient, no effect on the loss, zero logits", "[model]") {
    for (bool tied : {false, true}) {
        ModelConfig c = tiny_cfg(tied);
        const int B = 2, T = 8, V = c.vocab_size, Vp = c.padded_vocab, d = c.d_model;
        REQUIRE(Vp > V);
        Model<double> m(c);
        randomize(m, 51);
        auto tok = rand_tokens(B * T, V, 52), tgt = rand_tokens(B * T, V, 53);
        m.zero_grad();
        double l0 = m.forward(tok.data(), tgt.data(), B, T);
        m.backward();
        for (const char* name : {"wte", "lm_head"}) {
            if (tied && std::string(name) == "lm_head") continue;
            const double* g = m.grad(name);
            for (int64_t i = (int64_t)V * d; i < (int64_t)Vp * d; i++) REQUIRE(g[i] == 0.0);
            double* p = m.param(name);
            for (int64_t i = (int64_t)V * d; i < (int64_t)Vp * d; i++) p[i] = 7.0 + i % 3;
        }
        double l1 = m.forward(tok.data(), tgt.data(), B, T);
        CHECK(l1 == l0);
        for (int n = 0; n < B * T; n++)
            for (int v = V; v < Vp; v++) REQUIRE(m.logits()[(size_t)n * Vp + v] == 0.0);
    }
}

TEST_CASE("init: spec §1 distributions, deterministic from the seed; loss at init ~ ln V", "[model]") {
    ModelConfig c = preset_config("small", 50257);
    c.seq_len = 32;
    Model<float> m(c);
    m.init(1234);
    auto stats = [&](const std::string& name, double& mean, double& sd) {
        const ParamSpec& s = m.spec(name);
        double s1 = 0, s2 = 0;
        for (int64_t i = 0; i < s.numel; i++) {
            double x = m.params[s.offset + i];
            s1 += x;
            s2 += x * x;
        }
        mean = s1 / s.numel;
        sd = std::sqrt(s2 / s.numel - mean * mean);
    };
    double mean, sd;
    stats("wte", mean, sd);
    CHECK(std::fabs(mean) < 1e-3);
    CHECK(sd == Approx(0.02).epsilon(0.01));
    stats("blocks.2.attn.wq", mean, sd);
    CHECK(sd == Approx(0.02).epsilon(0.02));
    stats("blocks.1.attn.wo", mean, sd);
    CHECK(sd == Approx(0.02 / std::sqrt(8.0)).epsilon(0.02));
    stats("blocks.3.mlp.w2", mean, sd);
    CHECK(sd == Approx(0.02 / std::sqrt(8.0)).epsilon(0.02));
    stats("lm_head", mean, sd);
    CHECK(sd == Approx(0.02).epsilon(0.01));
    const float* nw = m.param("blocks.0.attn_norm.w");
    for (int i = 0; i < c.d_model; i++) REQUIRE(nw[i] == 1.0f);
    // Element k of tensor i is the k-th normal of stream init_stream(seed, i) times its std.
    const ParamSpec& s = m.spec("blocks.1.mlp.w3");
    size_t idx = 0;
    while (m.specs[idx].name != s.name) idx++;
    CHECK(m.params[s.offset + 17] == (float)(0.02 * stream_normal(init_stream(1234, idx), 17)));
    // Deterministic; another seed differs.
    Model<float> m2(c);
    m2.init(1234);
    CHECK(m2.params == m.params);
    m2.init(1235);
    CHECK(m2.params != m.params);
    // Loss at init is close to the uniform ln V (logits are ~0).
    const int B = 2, T = 32;
    auto tok = rand_tokens(B * T, c.vocab_size, 61), tgt = rand_tokens(B * T, c.vocab_size, 62);
    double loss = m.forward(tok.data(), tgt.data(), B, T);
    CHECK(std::fabs(loss - std::log(50257.0)) < 0.05);
}

namespace {
// Closed-form parameter count, written independently of param_specs.
int64_t closed_form_params(int64_t V, int64_t d, int64_t L, int64_t nh, int64_t nkv, int64_t hd,
                           int64_t F, bool tied, bool bias, bool qkn) {
    int64_t Vp = (V + 127) / 128 * 128;
    int64_t attn = d /*norm*/ + d * nh * hd + 2 * d * nkv * hd + nh * hd * d +
                   (bias ? nh * hd + 2 * nkv * hd : 0) + (qkn ? 2 * hd : 0);
    int64_t mlp = d /*norm*/ + 3 * d * F;
    return Vp * d * (tied ? 1 : 2) + L * (attn + mlp) + d;
}
}  // namespace

TEST_CASE("parameter counts of every preset against a closed form; dry-run without allocating", "[config]") {
    struct P { const char* n; int64_t d, L, nh, nkv, hd, F; bool tied, bias, qkn; };
    const P table[] = {  // spec §1 table, typed in again
        {"tiny", 64, 2, 4, 2, 16, 160, false, false, false},
        {"small", 256, 4, 4, 4, 64, 688, false, false, false},
        {"llama-400m", 1024, 24, 16, 16, 64, 2816, false, false, false},
        {"qwen-1.5b", 1536, 28, 12, 2, 128, 8960, true, true, false},
        {"qwen3-1.7b", 2048, 28, 16, 8, 128, 6144, true, false, true},
        {"qwen3-4b", 2560, 36, 32, 8, 128, 9728, true, false, true},
        {"qwen3-8b", 4096, 36, 32, 8, 128, 12288, false, false, true},
        {"qwen3-14b", 5120, 40, 40, 8, 128, 17408, false, false, true},
    };
    for (const P& p : table) {
        for (int V : {50257, 151936}) {
            ModelConfig c = preset_config(p.n, V);
            INFO(p.n << " V=" << V);
            CHECK(c.padded_vocab % 128 == 0);
            CHECK(c.padded_vocab >= V);
            CHECK(c.padded_vocab - V < 128);
            CHECK(count_params(c) ==
                  closed_form_params(V, p.d, p.L, p.nh, p.nkv, p.hd, p.F, p.tied, p.bias, p.qkn));
            std::string desc = describe(c, 2048);
            CHECK(desc.find("total " + std::to_string(count_params(c))) != std::string::npos);
            CHECK(activation_values_per_token(c, 2048) > 0);
        }
    }
    CHECK(preset_config("small", 50257).padded_vocab == 50304);
    // Sanity against published sizes: llama-400m-class ~ 0.4 B with GPT-2 vocab.
    CHECK(count_params(preset_config("llama-400m", 50257)) == Approx(4.11e8).epsilon(0.01));
    // Offsets are contiguous and decay is set on matrices/embeddings only.
    ModelConfig q = preset_config("qwen-1.5b", 50257);
    int64_t off = 0;
    for (const auto& s : param_specs(q)) {
        CHECK(s.offset == off);
        off += s.numel;
        CHECK(s.decay == (s.shape.size() == 2));
    }
}

TEST_CASE("dry-run activation estimate equals what the model allocates", "[config][model]") {
    for (bool qkn : {false, true}) {
        ModelConfig c = tiny_cfg(false, qkn, qkn);
        const int B = 3, T = 20;
        Model<float> m(c);
        m.init(1);
        auto tok = rand_tokens(B * T, c.vocab_size, 71);
        m.forward(tok.data(), tok.data(), B, T);
        CHECK(m.activation_values() == (int64_t)B * T * activation_values_per_token(c, T));
    }
}

TEST_CASE("config validation and bad input give clear errors", "[config]") {
    CHECK_THROWS_WITH(preset_config("gpt-9", 50257), Catch::Contains("unknown preset 'gpt-9'"));
    ModelConfig c = preset_config("tiny", 50257);
    c.n_kv_head = 3;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("not divisible by n_kv_head"));
    c = preset_config("tiny", 50257);
    c.head_dim = 15;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("head_dim"));
    c = preset_config("tiny", 50257);
    c.d_model = 0;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("d_model"));
    c = preset_config("tiny", 50257);
    c.padded_vocab = 100;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("padded_vocab"));
    c = preset_config("tiny", 50257);
    c.scheme = "magic";
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("unknown scheme"));
    c.scheme = "ldm";
    c.ldm_heads = 3;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("ldm_heads"));
    // n_head * head_dim != d_model is legal (qwen3-4b: 32 x 128 = 4096 != 2560).
    ModelConfig q = preset_config("qwen3-4b", 151936);
    CHECK_NOTHROW(q.validate());
    CHECK(q.q_dim() == 4096);
    // The other schemes are valid configs whose parameters come after the backbone's.
    for (const char* s : {"hc", "mhc", "attnres-full", "attnres-block", "ldm"}) {
        ModelConfig k = tiny_cfg();
        k.scheme = s;
        INFO(s);
        CHECK(count_params(k) > count_params(tiny_cfg()));
        auto a = param_specs(tiny_cfg()), b = param_specs(k);
        for (size_t i = 0; i < a.size(); i++) CHECK((a[i].name == b[i].name && a[i].offset == b[i].offset));
        for (size_t i = a.size(); i < b.size(); i++) CHECK(b[i].name.rfind("scheme.", 0) == 0);
    }
    // Model input errors.
    Model<double> m(tiny_cfg());
    m.init(1);
    std::vector<int32_t> tok(8, 1), bad(8, 1);
    bad[5] = 101;
    CHECK_THROWS_WITH(m.backward(), Catch::Contains("forward"));
    CHECK_THROWS_WITH(m.forward(bad.data(), tok.data(), 2, 4), Catch::Contains("token id 101 at position 5"));
    CHECK_THROWS_WITH(m.forward(tok.data(), bad.data(), 2, 4), Catch::Contains("target id 101"));
    bad[5] = -1;
    CHECK_THROWS_WITH(m.forward(bad.data(), tok.data(), 2, 4), Catch::Contains("token id -1"));
    std::vector<int32_t> longer(65, 1);
    CHECK_THROWS_WITH(m.forward(longer.data(), longer.data(), 1, 65), Catch::Contains("seq_len"));
    // B*T beyond int: refused before any token is read (the pointer stands for a batch never built)
    CHECK_THROWS_WITH(m.forward(tok.data(), tok.data(), 1 << 26, 64), Catch::Contains("B*T = 4294967296 tokens"));
    CHECK_THROWS_WITH(Inference<double>(m, 1 << 26, 64), Catch::Contains("B*max_T = 4294967296"));
    m.forward(tok.data(), nullptr, 2, 4);
    CHECK(std::isnan(m.forward(tok.data(), nullptr, 2, 4)));
    CHECK_THROWS_WITH(m.backward(), Catch::Contains("targets"));
    CHECK_THROWS_WITH(m.param("nope"), Catch::Contains("no parameter named 'nope'"));
}
