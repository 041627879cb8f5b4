// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of the whole GPU
// forward and the GPU inference path: Transformer<float> (cuda/transformer.cuh: embedding, RMSNorm, q|k|v GEMM,
// QK-norm + RoPE, attention, SwiGLU, each depth scheme, fused classifier; the cuBLASLt GEMMs are
// the host GEMM of dev/emu/matmul_host.h) on a tiny model, then GpuInference<float>
// (cuda/infer.cuh): prefill of P tokens and one-token decode steps with the KV cache. The logits
// of every prefill and decode position must equal the full forward's at that position (fp32,
// relative 1e-4), for PreLN, mHC and AttnRes-Block (the schemes of train_gpt_baselines.cu,
// included with TESTING; LDM: the emulated train_ldm --infer-check of test_emu_train). All kernels
// run on host memory through the emulated launches; nothing here needs a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "cuda_emu/infer.cuh"
#define TESTING  // the trainer file without its main()
#include "cuda_emu/train_gpt_baselines.cu.h"
#include "cpu/rng.h"
#include "dev/emu/harness.h"

using namespace ldm;
using namespace ldm::gpu;

static double rel_l2(const float* a, const float* b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

TEST_CASE("emu: GPU inference (prefill + KV-cache decode) equals the GPU full forward", "[emu][infer]") {
    for (const char* scheme : {"preln", "mhc", "attnres-block"}) {
        ModelConfig cfg = preset_config("tiny", 97);
        cfg.n_layer = 2;
        cfg.scheme = scheme;
        cfg.seq_len = 12;
        if (cfg.scheme == "ldm") cfg.ldm_mode = "unwind";
        cfg.validate();
        const int B = 2, T = 12, P = 5, V = cfg.vocab_size, Vp = cfg.padded_vocab;
        Transformer<float> model(cfg, B, T, 0);
        model.init(5);
        std::vector<int32_t> tok((size_t)B * T), tgt((size_t)B * T);
        const uint64_t s0 = init_stream(3, 1);
        for (int i = 0; i < B * T; i++) tok[(size_t)i] = int32_t(stream_uniform(s0, (uint64_t)i) * V) % V;
        for (int i = 0; i < B * T; i++) tgt[(size_t)i] = tok[(size_t)((i + 1) % (B * T))];
        model.forward(tok.data(), tgt.data(), B, T, 0.0);
        const std::vector<float> full = model.logits_host();  // [B*T, Vp]
        REQUIRE((int64_t)full.size() == (int64_t)B * T * Vp);

        double fn = 0;
        for (float x : full) fn += double(x) * x;
        REQUIRE(fn > 1e-6);  // real logits (a comparison of zeros would pass trivially)
        // the comparison can fail: neighbouring positions' logits differ by far more than the bound
        REQUIRE(rel_l2(full.data() + Vp, full.data(), V) > 1e-2);

        GpuInference<float> inf(model, B, T);
        std::vector<int32_t> pre((size_t)B * P);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < P; t++) pre[(size_t)(b * P + t)] = tok[(size_t)(b * T + t)];
        const float* lp = inf.prefill(pre.data(), P, true);  // [B*P, Vp], valid until the next call
        // padded columns are zero
        for (int r = 0; r < B * P; r++)
            for (int c = V; c < Vp; c++) CHECK(lp[(int64_t)r * Vp + c] == 0.0f);
        double worst = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < P; t++)
                worst = std::max(worst, rel_l2(lp + (int64_t)(b * P + t) * Vp, full.data() + (int64_t)(b * T + t) * Vp, V));
        for (int t = P; t < T; t++) {
            std::vector<int32_t> next((size_t)B);
            for (int b = 0; b < B; b++) next[(size_t)b] = tok[(size_t)(b * T + t)];
            const float* ld = inf.decode_step(next.data());  // [B, Vp]
            for (int b = 0; b < B; b++) {
                worst = std::max(worst, rel_l2(ld + (int64_t)b * Vp, full.data() + (int64_t)(b * T + t) * Vp, V));
                for (int c = V; c < Vp; c++) CHECK(ld[(int64_t)b * Vp + c] == 0.0f);
            }
        }
        INFO("scheme " << scheme << ": worst relative L2 difference of the logits " << worst);
        std::printf("emu gpt+infer %s: worst relative L2 difference %.3e\n", scheme, worst);
        CHECK(worst < 1e-4);
    }
}
