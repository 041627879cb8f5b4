// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of the whole GPU
// forward and the GPU inference path: GPT<float> (cuda/gpt.cuh: embedding, RMSNorm, q|k|v GEMM,
// QK-norm + RoPE, attention, SwiGLU, each depth scheme, fused classifier; the cuBLASLt GEMMs are
// the host GEMM of dev/emu/matmul_host.h) on a tiny model, then GpuInference<float>
// (cuda/infer.cuh): prefill of P tokens and one-token decode steps with the KV cache. The logits
// of every prefill and decode position must equal the full forward's at that position (fp32,
// relative 1e-4), for PreLN, mHC, AttnRes-Block and LDM rls (unwind). All kernels run on host
// memory through the emulated launches; nothing here needs a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#define EMU_HOST_mma ::emu::mma_m16n8k16_bf16(c, a, b)
#define EMU_HOST_ldsm ::emu::ldmatrix_x4(r, p, false)
#define EMU_HOST_ldsm_trans ::emu::ldmatrix_x4(r, p, true)
#include "cuda_emu/infer.cuh"
#include "cuda_emu/scheme_attnres.cuh"
#include "cuda_emu/scheme_hc.cuh"
#include "cuda_emu/scheme_ldm.cuh"
#include "cpu/rng.h"
#include "dev/emu/harness.h"

namespace ldm {
namespace gpu {
void check_gpu_scheme(const ModelConfig&) {}
template <typename T>
std::unique_ptr<GpuScheme<T>> make_gpu_scheme(const ModelConfig& cfg) {
    if (cfg.scheme == "preln") return std::make_unique<GpuPreLN<T>>(cfg);
    if (cfg.scheme == "mhc") return std::make_unique<GpuHC<T>>(cfg, true);
    if (cfg.scheme == "attnres-block") return std::make_unique<GpuAttnRes<T>>(cfg, true);
    if (cfg.scheme == "ldm") return std::make_unique<LdmGpuScheme<T>>(cfg);
    throw Error("test: scheme " + cfg.scheme);
}
template std::unique_ptr<GpuScheme<float>> make_gpu_scheme<float>(const ModelConfig&);
}  // namespace gpu
}  // namespace ldm

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
    for (const char* scheme : {"preln", "mhc", "attnres-block", "ldm"}) {
        ModelConfig cfg = preset_config("tiny", 97);
        cfg.n_layer = 2;
        cfg.scheme = scheme;
        cfg.seq_len = 12;
        if (cfg.scheme == "ldm") cfg.ldm_mode = "unwind";
        cfg.validate();
        const int B = 2, T = 12, P = 5, V = cfg.vocab_size, Vp = cfg.padded_vocab;
        GPT<float> model(cfg, B, T, 0, -1);
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
        const float* lp = inf.prefill(pre.data(), P, true);  // [B*P, Vp]
        double worst = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < P; t++)
                worst = std::max(worst, rel_l2(lp + (int64_t)(b * P + t) * Vp, full.data() + (int64_t)(b * T + t) * Vp, V));
        for (int t = P; t < T; t++) {
            std::vector<int32_t> next((size_t)B);
            for (int b = 0; b < B; b++) next[(size_t)b] = tok[(size_t)(b * T + t)];
            const float* ld = inf.decode_step(next.data());  // [B, Vp]
            for (int b = 0; b < B; b++)
                worst = std::max(worst, rel_l2(ld + (int64_t)b * Vp, full.data() + (int64_t)(b * T + t) * Vp, V));
        }
        INFO("scheme " << scheme << ": worst relative L2 difference of the logits " << worst);
        std::printf("emu gpt+infer %s: worst relative L2 difference %.3e\n", scheme, worst);
        CHECK(worst < 1e-4);
        // padded columns are zero
        for (int b = 0; b < B; b++)
            for (int c = V; c < Vp; c++) CHECK(lp[(int64_t)b * Vp + c] == 0.0f);
    }
}
