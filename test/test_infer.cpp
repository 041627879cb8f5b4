// test/test_infer.cpp — CPU inference (cpu/infer.h): prefill + incremental decode with the
// KV cache reproduces the full forward's logits for every scheme; greedy generation is
// deterministic and equals argmax over full forwards; top-k = 1 is greedy; top-p draws only from
// the nucleus; errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/common.h"
#include "cpu/infer.h"
#include "cpu/model.h"
#include "cpu/rng.h"
#include "test/test_scheme_util.h"

using namespace ldm;
using namespace ldm::cpu;

namespace {

struct Variant {
    std::string label;
    ModelConfig cfg;
};

std::vector<Variant> variants() {
    std::vector<Variant> v;
    for (const char* s : {"preln", "hc", "mhc", "attnres-full", "attnres-block"}) v.push_back({s, sch::tiny(s)});
    for (const char* rule : {"rls", "delta", "outer"}) {
        ModelConfig c = sch::tiny("ldm");
        c.ldm_rule = rule;
        v.push_back({std::string("ldm ") + rule, c});
    }
    {
        ModelConfig c = sch::tiny("ldm");
        c.ldm_residual = false;
        v.push_back({"ldm rls --no-residual", c});
    }
    {
        ModelConfig c = sch::tiny("ldm");
        c.ldm_mode = "window";
        c.ldm_window = 3;
        v.push_back({"ldm rls window 3", c});
    }
    {  // Qwen-style backbone: QK-norm, q/k/v biases, tied head; with two schemes
        for (const char* s : {"preln", "ldm"}) {
            ModelConfig c = sch::tiny(s);
            c.qk_norm = true;
            c.qkv_bias = true;
            c.tied = true;
            v.push_back({std::string("qk-norm+bias+tied ") + s, c});
        }
    }
    return v;
}

// Full forward logits vs prefill of P tokens + a 3-token chunk + single-token decode steps.
// Returns max |diff| / max(1, max |logit|). With full_vs_fp64 given, also the full forward's own
// rounding error on that scale: max |logits - logits of a float64 model with the same weights|.
template <typename R>
double kv_cache_error(const ModelConfig& c, int B, int T, int P, uint64_t seed, double* full_vs_fp64 = nullptr) {
    Model<R> m(c);
    sch::randomize(m, seed);
    const int V = c.vocab_size, Vp = c.padded_vocab;
    auto tok = sch::rand_tokens(B * T, V, seed + 1);
    m.forward(tok.data(), nullptr, B, T);
    std::vector<R> full(m.logits(), m.logits() + (size_t)B * T * Vp);
    double amax = 1, err = 0;
    for (R x : full) amax = std::max(amax, (double)std::fabs(x));
    if (full_vs_fp64) {
        Model<double> md(c);
        sch::copy_shared(m, md);
        md.forward(tok.data(), nullptr, B, T);
        double e = 0;
        for (size_t i = 0; i < full.size(); i++) e = std::max(e, std::fabs((double)full[i] - md.logits()[i]));
        *full_vs_fp64 = e / amax;
    }
    auto cmp = [&](const R* lg, int b, int t) {  // one row of Vp vs full[b, t]
        const R* ref = full.data() + ((size_t)b * T + t) * Vp;
        for (int v = 0; v < Vp; v++) err = std::max(err, (double)std::fabs(lg[v] - ref[v]));
    };
    Inference<R> inf(m, B, T);
    auto slice = [&](int t0, int n) {
        std::vector<int32_t> s((size_t)B * n);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < n; t++) s[(size_t)b * n + t] = tok[(size_t)b * T + t0 + t];
        return s;
    };
    std::vector<int32_t> s = slice(0, P);
    const R* lg = inf.prefill(s.data(), P, true);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < P; t++) cmp(lg + ((size_t)b * P + t) * Vp, b, t);
    int t = P;
    if (t + 3 <= T) {  // a multi-token chunk after the prefill (last-row logits only)
        s = slice(t, 3);
        lg = inf.step(s.data(), 3, false);
        for (int b = 0; b < B; b++) cmp(lg + (size_t)b * Vp, b, t + 2);
        t += 3;
    }
    for (; t < T; t++) {
        s = slice(t, 1);
        lg = inf.decode_step(s.data());
        for (int b = 0; b < B; b++) cmp(lg + (size_t)b * Vp, b, t);
    }
    REQUIRE(inf.pos() == T);
    // The model's own activations are untouched by the inference.
    for (size_t i = 0; i < full.size(); i++) REQUIRE(m.logits()[i] == full[i]);
    return err / amax;
}

}  // namespace

// fp32: the cached path (GEMMs of 1..5 rows, attention over the cache) and the full forward
// (GEMMs of B*T rows) round differently, so they differ by about the sum of their errors vs
// exact; the full forward's own error vs a float64 model with the same weights, e_full, measures
// that scale for each scheme (1e-6 for most, 1.3e-5..1.9e-5 for LDM without the residual, whose
// stream is the memory read alone). Bound: 5 e_full (measured worst e32 / e_full 1.5 over 8
// OpenBLAS core types and two -march builds), e_full itself within 1e-4 (spec §3); doc/testing.md.
TEST_CASE("prefill + decode with the KV cache equals the full forward, every scheme (fp64 1e-12, fp32 5x its rounding)",
          "[infer][blas]") {
    for (const Variant& v : variants()) {
        INFO(v.label);
        const double e64 = kv_cache_error<double>(v.cfg, 2, 20, 7, 11);
        CHECK_TOL("kv cache fp64/" + v.label, e64, 1e-12);
        double e_full = 0;
        const double e32 = kv_cache_error<float>(v.cfg, 2, 20, 5, 12, &e_full);
        CHECK_TOL("kv cache fp32 full vs fp64/" + v.label, e_full, 1e-4);
        CHECK_TOL("kv cache fp32/" + v.label, e32, 5 * e_full);
        // prefill of a single token (everything else decoded)
        CHECK_TOL("kv cache fp64 1-token prefill/" + v.label, kv_cache_error<double>(v.cfg, 1, 9, 1, 13), 1e-12);
    }
}

TEST_CASE("greedy generation is deterministic and equals argmax over full forwards", "[infer][generate][blas]") {
    for (const char* scheme : {"preln", "ldm", "mhc"}) {
        INFO(scheme);
        ModelConfig c = sch::tiny(scheme);
        Model<double> m(c);
        sch::randomize(m, 21);
        std::vector<int32_t> prompt = sch::rand_tokens(5, c.vocab_size, 22);
        Inference<double> inf(m, 1, 32);
        SamplingParams g;
        g.greedy = true;
        GenerateStats st;
        std::vector<int32_t> a = generate(inf, prompt, 12, g, 1, -1, &st);
        std::vector<int32_t> b = generate(inf, prompt, 12, g, 999, -1, nullptr);  // seed irrelevant
        REQUIRE(a.size() == 12);
        CHECK(a == b);
        CHECK(st.prompt_tokens == 5);
        CHECK(st.new_tokens == 12);
        CHECK(st.decode_ms.size() == 11);
        CHECK(st.prefill_s > 0);
        // Reference: a full forward over the growing context, argmax of the last row.
        std::vector<int32_t> ctx = prompt, ref;
        for (int i = 0; i < 12; i++) {
            const int T = (int)ctx.size();
            m.forward(ctx.data(), nullptr, 1, T);
            int32_t t = argmax_token(m.logits() + (size_t)(T - 1) * c.padded_vocab, c.vocab_size);
            ref.push_back(t);
            ctx.push_back(t);
        }
        CHECK(a == ref);
        // top-k = 1 and temperature 0 are greedy whatever the seed
        SamplingParams k1;
        k1.top_k = 1;
        CHECK(generate(inf, prompt, 12, k1, 5, -1) == a);
        SamplingParams t0;
        t0.temperature = 0;
        CHECK(generate(inf, prompt, 12, t0, 6, -1) == a);
        // stop token: generation ends right after it (included)
        std::vector<int32_t> s = generate(inf, prompt, 12, g, 1, a[3]);
        const size_t first = std::find(a.begin(), a.end(), a[3]) - a.begin();
        CHECK(s.size() == first + 1);
        // a full cache slides the context: 30 prompt tokens + 3 new fill the 32 positions; each
        // later token is the argmax of a full forward over the last 32 tokens (positions from 0)
        std::vector<int32_t> longp = sch::rand_tokens(30, c.vocab_size, 23);
        GenerateStats wst;
        std::vector<int32_t> w = generate(inf, longp, 10, g, 1, -1, &wst);
        REQUIRE(w.size() == 10);
        CHECK(wst.new_tokens == 10);
        CHECK(wst.decode_ms.size() == 2);  // tokens 2 and 3 by decode steps, then 7 by the window
        CHECK(wst.window_steps == 7);
        std::vector<int32_t> wctx = longp, wref;
        for (int i = 0; i < 10; i++) {
            const int n = std::min<int>(32, (int)wctx.size());
            m.forward(wctx.data() + wctx.size() - n, nullptr, 1, n);
            int32_t t = argmax_token(m.logits() + (size_t)(n - 1) * c.padded_vocab, c.vocab_size);
            wref.push_back(t);
            wctx.push_back(t);
        }
        CHECK(w == wref);
    }
}

TEST_CASE("sampling: top-k, top-p nucleus, temperature, determinism by seed", "[infer][sample]") {
    // Logits with known softmax: p ∝ (8, 4, 2, 1, 1) (ids 0..4), padding of 3 more ids.
    const int V = 5;
    std::vector<double> lg = {std::log(8.0), std::log(4.0), std::log(2.0), 0.0, 0.0};
    std::vector<int32_t> ids;
    std::vector<double> pr;
    SamplingParams sp;
    sp.top_p = 0.7;  // 8/16 = 0.5 < 0.7 <= 12/16 = 0.75: nucleus {0, 1}
    sampling_distribution(lg.data(), V, sp, &ids, &pr);
    REQUIRE(ids == std::vector<int32_t>({0, 1}));
    CHECK(pr[0] == Approx(8.0 / 12));
    CHECK(pr[1] == Approx(4.0 / 12));
    sp.top_p = 0.9;  // 14/16 = 0.875 < 0.9 <= 15/16: {0, 1, 2, 3} (tie 3 vs 4: lower id)
    sampling_distribution(lg.data(), V, sp, &ids, &pr);
    CHECK(ids == std::vector<int32_t>({0, 1, 2, 3}));
    sp.top_p = 1;
    sp.top_k = 2;
    sampling_distribution(lg.data(), V, sp, &ids, &pr);
    CHECK(ids == std::vector<int32_t>({0, 1}));
    sp.top_k = 0;
    sp.temperature = 2;  // p ∝ sqrt(8, 4, 2, 1, 1)
    sampling_distribution(lg.data(), V, sp, &ids, &pr);
    REQUIRE(ids.size() == 5);
    const double z = std::sqrt(8.0) + 2 + std::sqrt(2.0) + 2;
    CHECK(pr[0] == Approx(std::sqrt(8.0) / z));
    CHECK(pr[4] == Approx(1 / z));

    // top-p draws only from the nucleus, across many u and on real model logits
    ModelConfig c = sch::tiny("ldm");
    Model<float> m(c);
    sch::randomize(m, 31);
    Inference<float> inf(m, 1, 40);
    std::vector<int32_t> prompt = sch::rand_tokens(6, c.vocab_size, 32);
    const float* l = inf.prefill(prompt.data(), 6);
    SamplingParams np;
    np.top_p = 0.3;
    np.temperature = 0.8;
    sampling_distribution(l, c.vocab_size, np, &ids, &pr);
    REQUIRE(!ids.empty());
    REQUIRE((int)ids.size() < c.vocab_size);
    // minimality: without its last member the nucleus has less than top_p of the mass
    {
        SamplingParams full;
        full.temperature = 0.8;
        std::vector<int32_t> fi;
        std::vector<double> fp;
        sampling_distribution(l, c.vocab_size, full, &fi, &fp);
        double mass = 0, last = 0;
        for (int32_t id : ids) {
            last = fp[(size_t)id];  // full distribution is in id order (no restriction)
            mass += last;
        }
        CHECK(mass >= 0.3 - 1e-9);
        CHECK(mass - last < 0.3);
        // every nucleus member is at least as probable as every non-member
        double min_in = 1, max_out = 0;
        std::set<int32_t> in(ids.begin(), ids.end());
        for (int v = 0; v < c.vocab_size; v++) {
            if (in.count(v)) min_in = std::min(min_in, fp[(size_t)v]);
            else max_out = std::max(max_out, fp[(size_t)v]);
        }
        CHECK(min_in >= max_out);
    }
    std::set<int32_t> nucleus(ids.begin(), ids.end());
    const uint64_t s0 = init_stream(77, 0);
    for (int i = 0; i < 2000; i++) CHECK(nucleus.count(sample_token(l, c.vocab_size, np, stream_uniform(s0, i))) == 1);
    // during generation: every drawn token lies in the nucleus of the logits it came from
    {
        std::vector<int32_t> ctx = prompt;
        const float* lg = inf.prefill(ctx.data(), (int)ctx.size());
        for (int i = 0; i < 20; i++) {
            sampling_distribution(lg, c.vocab_size, np, &ids, &pr);
            std::set<int32_t> nuc(ids.begin(), ids.end());
            int32_t t = sample_token(lg, c.vocab_size, np, stream_uniform(s0, 5000 + i));
            CHECK(nuc.count(t) == 1);
            lg = inf.decode_step(&t);
        }
    }
    // same seed -> same sample; the draws follow the seed
    SamplingParams hot;
    hot.temperature = 1.5;
    std::vector<int32_t> a = generate(inf, prompt, 15, hot, 3), b = generate(inf, prompt, 15, hot, 3),
                         d = generate(inf, prompt, 15, hot, 4);
    CHECK(a == b);
    CHECK(a != d);
}

TEST_CASE("inference errors", "[infer]") {
    ModelConfig c = sch::tiny("preln");
    Model<double> m(c);
    m.init(1);
    CHECK_THROWS_AS(Inference<double>(m, 1, c.seq_len + 1), Error);
    CHECK_THROWS_AS(Inference<double>(m, 0, 8), Error);
    Inference<double> inf(m, 1, 4);
    std::vector<int32_t> t = {1, 2, 3, 4, 5};
    CHECK_THROWS_AS(inf.prefill(t.data(), 5), Error);  // > max_T
    inf.prefill(t.data(), 4);
    CHECK_THROWS_AS(inf.decode_step(t.data()), Error);  // cache full
    std::vector<int32_t> bad = {c.vocab_size};
    CHECK_THROWS_AS(inf.prefill(bad.data(), 1), Error);
    SamplingParams sp;
    sp.top_p = 0;
    std::vector<double> lg(5, 0.0);
    CHECK_THROWS_AS(sample_token(lg.data(), 5, sp, 0.5), Error);
    sp.top_p = 1;
    sp.top_k = -1;
    CHECK_THROWS_AS(sample_token(lg.data(), 5, sp, 0.5), Error);
    CHECK_THROWS_AS(generate(inf, std::vector<int32_t>{}, 3, SamplingParams{}, 1), Error);
}
