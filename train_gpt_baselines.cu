// train_gpt_baselines.cu — the GPU trainer for the baseline schemes (build/cuda/train_gpt_baselines):
// the spec §1 backbone (cuda/gpt.cuh) with PreLN (spec §2.1), HC / mHC (§2.2-2.3) or AttnRes Full /
// Block (§2.4), chosen by --scheme at make_gpu_scheme below. Same flags, logs, checkpoints and data as build/train_cpu, plus
// --dtype bf16|fp32, --recompute, --attn-variant, --gpu-info (doc/cuda.md "Trainer").
//
//   build/cuda/train_gpt_baselines --preset llama-400m -B 8 -T 2048 --steps 1000 --lr 3e-4
//       --warmup-steps 100 --train-data 'data/fineweb/fineweb_train_*.bin' --out-dir runs/gpu --log runs/gpu/log.jsonl
//
// Exit codes: 0 ok, 1 error, 2 no usable CUDA GPU.
#include "cuda/scheme.cuh"
#include "cuda/trainer.cuh"

// ==== schemes of this trainer (preln in cuda/scheme.cuh; hc / mhc / attnres-full / attnres-block) ====
#include "cuda/scheme_attnres.cuh"
#include "cuda/scheme_hc.cuh"

namespace ldm {
namespace gpu {

void check_gpu_scheme(const ModelConfig& cfg) {
    if (cfg.scheme == "hc" || cfg.scheme == "mhc") {
        const int n = cfg.hc_streams;
        if (n != 1 && n != 2 && n != 3 && n != 4 && n != 8)
            throw Error(strprintf("hc/mhc on the GPU: --hc-streams %d is not supported (1, 2, 3, 4, 8)", n));
        return;
    }
    for (const char* k : {"preln", "attnres-full", "attnres-block"})
        if (cfg.scheme == k) return;
    if (cfg.scheme == "ldm") throw Error("scheme 'ldm' runs on the GPU in train_ldm, not train_gpt_baselines");
    throw Error("unknown scheme '" + cfg.scheme + "' (train_gpt_baselines supports: preln, hc, mhc, attnres-full, attnres-block)");
}

template <typename T>
std::unique_ptr<GpuScheme<T>> make_gpu_scheme(const ModelConfig& cfg) {
    check_gpu_scheme(cfg);
    if (cfg.scheme == "preln") return std::make_unique<GpuPreLN<T>>(cfg);
    if (cfg.scheme == "hc") return std::make_unique<GpuHC<T>>(cfg, false);          // spec §2.2
    if (cfg.scheme == "mhc") return std::make_unique<GpuHC<T>>(cfg, true);          // spec §2.3
    if (cfg.scheme == "attnres-full") return std::make_unique<GpuAttnRes<T>>(cfg, false);  // spec §2.4
    if (cfg.scheme == "attnres-block") return std::make_unique<GpuAttnRes<T>>(cfg, true);
    throw Error("unknown scheme '" + cfg.scheme + "'");  // not reached: check_gpu_scheme
}

}  // namespace gpu
}  // namespace ldm

int main(int argc, char** argv) {
    return ldm::gpu::trainer_main(argc, argv, "train_gpt_baselines",
                                  "Train the spec §1 backbone with a baseline depth scheme (PreLN, HC, mHC, "
                                  "AttnRes Full and Block) on one or many GPUs (mpirun; doc/distributed.md). "
                                  "See doc/cuda.md.",
                                  "preln");
}
