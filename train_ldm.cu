// train_ldm.cu — the GPU trainer for Linear Depth Memory (build/cuda/train_ldm): the spec §1
// backbone (cuda/gpt.cuh) with the LDM scheme (spec §2.5, cuda/scheme_ldm.cuh). Same flags, logs,
// checkpoints and data as build/train_cpu and train_gpt_baselines (cuda/trainer.cuh); --scheme
// defaults to ldm here and any other scheme is refused. The LDM flags are those of train_cpu:
// --ldm-rule rls|delta|outer, --no-residual, --ldm-heads, --ldm-dk, --ldm-delta, --ldm-lambda-min,
// --ldm-no-forget, --ldm-mode store|unwind|window, --ldm-window, --ldm-checkpoint-every,
// --ldm-drift-tol. Window mode = deferred (Woodbury) writes in the forward and unwinding in the
// backward by default; LDM_LDM_WINDOW=0|1|2 picks the window path (cuda/scheme_ldm.cuh). At startup it prints the LDM state's memory per token and what backward keeps
// in the chosen mode; every step logs the unwind drift (ldm_drift_S, ldm_drift_P, ldm_fallback,
// ldm_ckpt in the JSONL step record, as train_cpu does).
//
//   build/cuda/train_ldm --preset llama-400m --ldm-rule rls --ldm-mode unwind -B 8 -T 2048
//       --steps 1000 --lr 1e-3 --train-data 'data/fineweb/fineweb_train_*.bin' --out-dir runs/ldm
//
// Exit codes: 0 ok, 1 error, 2 no usable CUDA GPU.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/scheme.cuh"
#include "cuda/scheme_ldm.cuh"
#include "cuda/trainer.cuh"

namespace ldm {
namespace gpu {

// Memory per token of the LDM scheme in the configured mode (printed once at startup).
inline void print_ldm_memory(const ModelConfig& c, int64_t act_bytes) {
    const int64_t W = c.n_sublayers() + 1, HK = (int64_t)c.ldm_heads * c.ldm_dk;
    int wimpl = ldm_gpu_window_impl_env();  // window path (env LDM_LDM_WINDOW)
    if (wimpl == 2 && (c.ldm_window > ldmk::kWinMaxV2 || c.ldm_dk > ldmk::kV2MaxDk)) wimpl = 1;  // as the scheme
    const int64_t st = ldm_gpu_state_bytes(c), kept = ldm_gpu_kept_states(c, c.ldm_checkpoint_every, wimpl);
    const int64_t saved = W * c.d_model * act_bytes            // v of every write (o_j, e)
                          + 2 * W * (HK + c.ldm_heads) * 4      // normalised q, k and their norms
                          + (c.ldm_rule == "delta" ? W * c.ldm_heads * 4 : 0);
    std::string mode = c.ldm_mode;
    if (c.ldm_mode == "window") {
        mode += " w=" + std::to_string(c.ldm_window);
        mode += wimpl == 0 ? " (sequential writes, window-start states; LDM_LDM_WINDOW=0)"
                           : std::string(" (Woodbury ") + (wimpl == 1 ? "v1" : "v2") +
                                 " forward, " + (c.ldm_checkpoint_every > 0 ? "window-start states" : "unwinding") +
                                 " backward; LDM_LDM_WINDOW=" + std::to_string(wimpl) + ")";
    }
    if (c.ldm_mode != "window" && c.ldm_checkpoint_every > 0)
        mode += " checkpoint-every " + std::to_string(c.ldm_checkpoint_every);
    std::printf("LDM: rule %s%s%s, H_m %d, d_k %d, delta %g, lambda_min %g, D+1 = %lld writes, mode %s\n",
                c.ldm_rule.c_str(), c.ldm_residual ? "" : " (no residual)", c.ldm_forget ? "" : " (no forget)",
                c.ldm_heads, c.ldm_dk, c.ldm_delta, c.ldm_lambda_min, (long long)W, mode.c_str());
    std::printf("LDM memory per token: state S,P %.1f KiB (fp32); backward keeps %lld state(s) + the live one "
                "= %.1f KiB, plus saved v/q/k %.1f KiB (store mode would keep %.1f KiB of states)\n",
                st / 1024.0, (long long)kept, (kept + 1) * st / 1024.0, saved / 1024.0, (W + 1) * st / 1024.0);
    std::fflush(stdout);
}

void check_gpu_scheme(const ModelConfig& cfg) {
    if (cfg.scheme != "ldm")
        throw Error("train_ldm trains --scheme ldm only (got '" + cfg.scheme +
                    "'); use train_gpt_baselines for preln / hc / mhc / attnres-*");
}

template <typename T>
std::unique_ptr<GpuScheme<T>> make_gpu_scheme(const ModelConfig& cfg) {
    check_gpu_scheme(cfg);
    static bool printed = false;
    if (!printed) {
        print_ldm_memory(cfg, (int64_t)sizeof(T));
        printed = true;
    }
    return std::make_unique<LdmGpuScheme<T>>(cfg);
}

}  // namespace gpu
}  // namespace ldm

int main(int argc, char** argv) {
    // --scheme defaults to ldm; any other scheme is refused (check_gpu_scheme) before GPU work.
    return ldm::gpu::trainer_main(argc, argv, "train_ldm",
                                  "Train the spec §1 backbone with Linear Depth Memory (spec §2.5) on one "
                                  "or many GPUs (mpirun; doc/distributed.md). See doc/cuda.md \"LDM kernels\".",
                                  "ldm");
}
