// Tests of the CPU reference model (dev/cpu/model.h) and of core/config.h: whole-model gradients
// against 5-point finite differences in float64 (spec §3), fp32 vs fp64, accumulation
// equivalence, causality, padded vocabulary, init, parameter counts and config validation.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/config.h"
#include "dev/cpu/gradcheck.h"
#include "dev/cpu/model.h"
#include "dev/cpu/rng.h"

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

GradReport check_model_grads(const ModelConfig& c, int B, int T, int per_tensor, uint64_t seed,
                             double h) {
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
                    << r.dir_err);
        CHECK(r.max_err <= 1e-6);
        CHECK(r.dir_err <= 1e-6);
        if (r.max_err > rep.worst_entry) { rep.worst_entry = r.max_err; rep.worst_name = s.name; }
        rep.worst_dir = std::max(rep.worst_dir, r.dir_err);
    }
    return rep;
}

}  // namespace

TEST_CASE("tiny model: all parameter gradients vs finite differences (float64)", "[model][grad]") {
    struct Case { const char* what; ModelConfig c; };
    ModelConfig qwenish = tiny_cfg(true, true, true);
    qwenish.d_model = 48;  // n_head * head_dim = 64 != d_model, as in the qwen3 presets
    qwenish.rope_theta = 1e6;
    qwenish.norm_eps = 1e-6;
    for (Case k : {Case{"untied", tiny_cfg()}, Case{"tied", tiny_cfg(true)},
                   Case{"qkv_bias+qk_norm, d != n_head*head_dim, tied", qwenish}}) {
        INFO("config: " << k.what);
        GradReport r = check_model_grads(k.c, 2, 5, 200, 7, fd_step());
        WARN(k.what << ": worst entry error " << r.worst_entry << " (" << r.worst_name
                    << "), worst directional error " << r.worst_dir);
    }
}
