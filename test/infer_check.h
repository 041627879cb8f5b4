// test/infer_check.h — the check of one --infer-check run of a GPU trainer (cuda/infer_cli.cuh),
// shared by test/test_gpu_infer.cpp (the real trainers on a GPU) and test/test_emu_train.cpp (the
// trainers under CPU emulation, build/emu/): the trainer writes the full forward's logits, the
// prefill and decode logits of B x T random tokens and its weights (LDMINFCK); here they are
// compared (relative L2 over the real V columns) with the full forward (prefill, each decode step)
// and with the CPU reference's Inference on the same weights; greedy tokens with the CPU's
// (fp32; a difference only at a near-tie). fp32 1e-4, bf16 3e-2.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/config.h"
#include "cpu/infer.h"
#include "cpu/model.h"
#include "test/gpu_compare.h"

namespace infer_check {

inline std::vector<float> f32(const ldm::CkptTensor& t) { return debug_tensor_f32(t); }
inline std::vector<int32_t> i32(const ldm::CkptTensor& t) {
    std::vector<int32_t> out(t.bytes.size() / 4);
    std::memcpy(out.data(), t.bytes.data(), out.size() * 4);
    return out;
}

// Relative L2 of rows [r0, r0 + n) of a and b (row strides Vp, first V columns).
inline Diff rows_diff(const float* a, const float* b, int64_t nrows, int V, int Vp) {
    std::vector<float> x, y;
    for (int64_t r = 0; r < nrows; r++)
        for (int v = 0; v < V; v++) {
            x.push_back(a[r * Vp + v]);
            y.push_back(b[r * Vp + v]);
        }
    return diff(x.data(), y.data(), (int64_t)x.size());
}

// Runs `trainer` (a GPU trainer binary) with model flags `flags` and --infer-check for B x T
// tokens, prefill P, dtype; checks the file it wrote (Catch2 CHECKs). `dir`: scratch directory.
inline void run(const std::string& trainer, const std::string& flags, const std::string& label, const std::string& dtype,
                int B, int T, int P, const std::string& dir) {
    using namespace ldm;
    const std::string& gpu = trainer;
    const std::string file = dir + "/check_" + dtype + ".bin";
    const std::string cmd = "'" + gpu + "'" + flags + strprintf(" -B %d -T %d --prompt-len %d --seed 5", B, T, P) +
                            " --dtype " + dtype + " --infer-check '" + file + "'";
    RunResult r = run_cmd(cmd);
    INFO(label << " " << dtype << "\ncommand: " << cmd << "\noutput:\n" << r.out);
    REQUIRE(r.status == 0);
    Container k = read_container(file, "LDMINFCK", "inference check");
    std::remove(file.c_str());
    ModelConfig cfg = config_from_json(k.header.at("config"));
    cfg.ldm_mode = k.header.at("config").at("ldm_mode").get<std::string>();
    cfg.ldm_window = k.header.at("config").at("ldm_window").get<int>();
    REQUIRE(k.header.at("P").get<int>() == P);
    const int G = k.header.at("G").get<int>(), V = cfg.vocab_size, Vp = cfg.padded_vocab;
    REQUIRE(G == T - P);
    CHECK(k.header.at("forward_unchanged").get<bool>());
    const std::vector<float> params = f32(k.tensor("params", file)), full = f32(k.tensor("full_logits", file)),
                             pre = f32(k.tensor("prefill_logits", file)),
                             dec = f32(k.tensor("decode_logits", file));
    const std::vector<int32_t> tokens = i32(k.tensor("tokens", file)), greedy = i32(k.tensor("greedy", file));
    REQUIRE(tokens.size() == size_t(B) * T);
    REQUIRE(pre.size() == size_t(B) * P * Vp);
    REQUIRE(dec.size() == size_t(G) * B * Vp);
    const double tol = dtype == "fp32" ? 1e-4 : 3e-2;

    // GPU inference vs the GPU full forward
    for (int b = 0; b < B; b++) {
        Diff d = rows_diff(pre.data() + size_t(b) * P * Vp, full.data() + size_t(b) * T * Vp, P, V, Vp);
        INFO("prefill vs full forward, sequence " << b << ": rel " << d.rel);
        CHECK((d.finite && d.rel <= tol));
        for (int g = 0; g < G; g++) {
            Diff e = rows_diff(dec.data() + (size_t(g) * B + b) * Vp, full.data() + (size_t(b) * T + P + g) * Vp,
                               1, V, Vp);
            INFO("decode step " << g << " vs full forward, sequence " << b << ": rel " << e.rel);
            CHECK((e.finite && e.rel <= tol));
        }
    }
    // GPU inference vs CPU inference (fp32, the same weights)
    cpu::Model<float> model(cfg);
    REQUIRE(model.params.size() == params.size());
    model.params = params;
    cpu::Inference<float> inf(model, B, T);
    std::vector<int32_t> prompt((size_t)B * P), col((size_t)B);
    for (int b = 0; b < B; b++)
        std::copy(tokens.begin() + size_t(b) * T, tokens.begin() + size_t(b) * T + P, prompt.begin() + size_t(b) * P);
    const float* lg = inf.prefill(prompt.data(), P, true);
    Diff dp = rows_diff(pre.data(), lg, int64_t(B) * P, V, Vp);
    INFO("prefill GPU vs CPU: rel " << dp.rel);
    CHECK((dp.finite && dp.rel <= tol));
    double worst = dp.rel;
    for (int g = 0; g < G; g++) {
        for (int b = 0; b < B; b++) col[size_t(b)] = tokens[size_t(b) * T + P + g];
        lg = inf.decode_step(col.data());
        Diff dd = rows_diff(dec.data() + size_t(g) * B * Vp, lg, B, V, Vp);
        INFO("decode step " << g << " GPU vs CPU: rel " << dd.rel);
        CHECK((dd.finite && dd.rel <= tol));
        worst = std::max(worst, dd.rel);
    }
    // greedy generation vs the CPU's
    cpu::Inference<float> inf1(model, 1, T);
    cpu::SamplingParams sp;
    sp.greedy = true;
    std::vector<int32_t> p0(tokens.begin(), tokens.begin() + P);
    const std::vector<int32_t> ref = cpu::generate(inf1, p0, G, sp, 5);
    bool same = ref == greedy;
    if (!same && dtype == "fp32") {  // allowed only where the CPU's top two logits nearly tie
        size_t i = 0;
        while (i < ref.size() && i < greedy.size() && ref[i] == greedy[i]) i++;
        REQUIRE(i < ref.size());
        REQUIRE(i < greedy.size());
        std::vector<int32_t> ctx(p0);
        ctx.insert(ctx.end(), ref.begin(), ref.begin() + i);
        const float* l2 = inf1.prefill(ctx.data(), (int)ctx.size(), false);
        const float a = l2[ref[i]], bgap = l2[greedy[i]];
        INFO("greedy differs at token " << i << ": cpu " << ref[i] << " (" << a << ") gpu " << greedy[i] << " (" << bgap
                                        << ")");
        CHECK(std::fabs(a - bgap) <= 1e-4 * std::max(1.0f, std::fabs(a)));
    }
    WARN(label << " " << dtype << ": worst GPU-vs-CPU logits rel " << worst << ", greedy "
                 << (same ? "equal" : "differs") << " (" << greedy.size() << " tokens)");
}

}  // namespace infer_check
