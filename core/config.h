// core/config.h — model configuration, presets, the parameter layout and the dry-run estimate.
//
// Spec: ../shared/spec/model.md §1 (backbone, presets) and §2 (scheme parameters).
//
// Conventions (see doc/cpu_reference.md):
//   * every matrix is stored row-major as [out, in]: a linear layer computes y = x W^T (+ b)
//     with x [N, in], y [N, out];
//   * the embedding and the LM head are [Vp, d]; rows >= V exist (same layout as the GPU and
//     llm.c) but never receive a gradient and never enter the softmax;
//   * param_specs() is THE parameter order used by checkpoints, the optimizer, the debug dump and
//     the GPU trainers: all parameters live in one flat array, tensor after tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ldm {

struct ModelConfig {
    std::string preset = "custom";
    int vocab_size = 50257, padded_vocab = 50304;  // V and Vp (Vp = V rounded up to a multiple of 128)
    int d_model = 64, n_layer = 2, n_head = 4, n_kv_head = 2, head_dim = 16, ffn = 160;
    int seq_len = 1024;                             // max T (RoPE tables are sized by the actual T)
    bool tied = false, qkv_bias = false, qk_norm = false;
    double rope_theta = 1e4, norm_eps = 1e-5;
    std::string scheme = "preln";  // preln | hc | mhc | attnres-full | attnres-block | ldm
    int hc_streams = 4, sinkhorn_iters = 20, attnres_blocks = 8;              // HC/mHC/AttnRes (spec §2.2-2.4)
    std::string ldm_rule = "rls"; bool ldm_residual = true, ldm_forget = true; // LDM (spec §2.5)
    int ldm_heads = 4, ldm_dk = 8; double ldm_delta = 0.1, ldm_lambda_min = 0.95;
    // LDM training options (spec §2.5 "Training implementation modes"). NOT part of the model's
    // identity: a checkpoint trained in one mode loads in another, so config_to_json (and with it
    // the resume compatibility check) leaves these out on purpose.
    //   ldm_mode: store | unwind | window; ldm_window: w (window mode, >= 1);
    //   ldm_checkpoint_every: c > 0 keeps every c-th state and unwinds inside segments (0 = off);
    //   ldm_drift_tol: unwind drift above which the scheme falls back to checkpointed segments.
    std::string ldm_mode = "store"; int ldm_window = 2, ldm_checkpoint_every = 0;
    double ldm_drift_tol = 1e-3;

    int n_sublayers() const { return 2 * n_layer; }  // D (spec §2)
    int q_dim() const { return n_head * head_dim; }   // rows of W_q (need not equal d_model)
    int kv_dim() const { return n_kv_head * head_dim; }

    // Throws ldm::Error naming the offending field when a shape is impossible: non-positive
    // sizes, n_head % n_kv_head != 0, odd head_dim (RoPE rotates pairs), padded_vocab < vocab_size,
    // unknown scheme / ldm rule, ldm_heads not dividing d_model, eps < 0, theta <= 0.
    void validate() const;
};

// Vocabulary size rounded up to a multiple of 128 (spec §1).
int pad_vocab(int vocab_size);

// Names of every preset of spec §1, in table order.
std::vector<std::string> preset_names();

// The preset of spec §1 with vocabulary `vocab_size` (Vp derived by pad_vocab) and
// seq_len 1024 (override afterwards). Throws ldm::Error on an unknown name, listing the valid ones.
ModelConfig preset_config(const std::string& name, int vocab_size);

// One tensor of the flat parameter array. shape is [out, in] for matrices. offset/numel in
// elements. decay: AdamW weight decay applies (2-D matrices and embeddings; never norm weights,
// biases, or scheme gates/scalars — see spec §2 per scheme).
struct ParamSpec {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0, numel = 0;
    bool decay = false;
};

// The ONE documented parameter order (doc/cpu_reference.md): backbone tensors, then the
// scheme's (PreLN has none). Validates the config first (ldm::Error).
std::vector<ParamSpec> param_specs(const ModelConfig& c);

// Only the scheme part of the layout (offsets relative to the start of the scheme block).
std::vector<ParamSpec> scheme_param_specs(const ModelConfig& c);

// Total number of parameters (sum of numel over param_specs, incl. padded vocab rows).
int64_t count_params(const ModelConfig& c);

// Breakdown of the parameter count. "embedding" counts wte (+ lm_head when untied) with their
// padded rows Vp*d; "backbone_nonembed" the blocks and the final norm; "scheme" the scheme's own.
struct ParamCounts {
    int64_t total = 0, embedding = 0, lm_head = 0, backbone_nonembed = 0, scheme = 0;
    int64_t attn_per_layer = 0, mlp_per_layer = 0;
};
ParamCounts count_params_detailed(const ModelConfig& c);

// Activation memory the CPU reference keeps per token for one training step at sequence
// length T (values, not bytes; multiply by sizeof(scalar)). Includes the saved activations of
// every sublayer, the attention probabilities (n_head * T per layer, causal square stored full),
// logits and their gradient (2 * Vp), and the scheme's state. Computed without allocating.
int64_t activation_values_per_token(const ModelConfig& c, int T);

// Multi-line human-readable summary for `--dry-run`: config, parameter counts (total, embedding,
// non-embedding, per scheme part), parameter + gradient + AdamW memory, activation memory per
// token and per sequence of T tokens (fp32). Nothing is allocated.
std::string describe(const ModelConfig& c, int T);

}  // namespace ldm
