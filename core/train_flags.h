// core/train_flags.h — the command-line flags every trainer shares (train_cpu and the GPU
// trainers build/cuda/train_gpt_baselines, build/cuda/train_ldm): the sections "Model", "Data",
// "Optimisation" and the common part of "Evaluation, sampling, output" (through --seed), and the
// ModelConfig they describe. Each trainer keeps its own options struct (its own defaults, e.g.
// --dtype) and adds its own flags after these; the fields are bound by name, so a struct that
// lacks one does not compile. Spec: ../shared/spec/model.md §1-§2 (presets, schemes, LDM flags).
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>

#include "core/cli.h"
#include "core/config.h"
#include "core/dist.h"
#include "core/optim.h"

namespace ldm {

// Registers the shared flags on ap, bound to o's fields (o: a trainer's options struct).
template <class O>
void add_common_train_flags(ArgParser& ap, O& o) {
    ap.section("Model");
    ap.add("--preset", &o.preset, "model preset: " + [] {
        std::string s;
        for (const auto& p : preset_names()) s += (s.empty() ? "" : "|") + p;
        return s;
    }());
    ap.add("--n-layer", &o.n_layer, "override: number of Transformer blocks (0 = preset)");
    ap.add("--d-model", &o.d_model, "override: model width d (0 = preset)");
    ap.add("--n-head", &o.n_head, "override: query heads (0 = preset)");
    ap.add("--n-kv-head", &o.n_kv_head, "override: key/value heads, must divide n_head (0 = preset)");
    ap.add("--head-dim", &o.head_dim, "override: head dimension (0 = preset)");
    ap.add("--ffn", &o.ffn, "override: SwiGLU hidden size (0 = preset)");
    ap.add("--scheme", &o.scheme, "depth-aggregation scheme (spec §2): preln | hc | mhc | attnres-full | attnres-block | ldm");
    ap.add("--hc-streams", &o.hc_streams, "HC/mHC: number of residual streams n");
    ap.add("--sinkhorn-iters", &o.sinkhorn_iters, "mHC: Sinkhorn-Knopp iterations t_max");
    ap.add("--attnres-blocks", &o.attnres_blocks, "Block AttnRes: number of blocks N (N >= D is Full)");
    ap.add("--ldm-rule", &o.ldm_rule, "LDM write rule: rls | delta | outer");
    ap.add("--no-residual", &o.ldm_no_residual, "LDM without the residual stream h (x_j = r_j)");
    ap.add("--ldm-heads", &o.ldm_heads, "LDM memory heads H_m (must divide d)");
    ap.add("--ldm-dk", &o.ldm_dk, "LDM key size d_k");
    ap.add("--ldm-delta", &o.ldm_delta, "LDM ridge delta (> 0; initial P = I/delta)");
    ap.add("--ldm-lambda-min", &o.ldm_lambda_min, "LDM forgetting floor lambda_min in (0, 1]");
    ap.add("--ldm-no-forget", &o.ldm_no_forget, "LDM with fixed lambda = 1 (no theta)");
    ap.add("--ldm-mode", &o.ldm_mode,
           "LDM training mode: store | unwind | window (not part of the model identity)");
    ap.add("--ldm-window", &o.ldm_window, "LDM window w for --ldm-mode window (>= 1): the forward defers writes and applies w at once (Woodbury, spec 2.5); the backward unwinds like --ldm-mode unwind (drift check; on drift, or with --ldm-checkpoint-every > 0, keeps the window-start states instead)");
    ap.add("--ldm-checkpoint-every", &o.ldm_checkpoint_every,
           "LDM: keep every c-th state and unwind inside segments (0 = off)");
    ap.add("--ldm-drift-tol", &o.ldm_drift_tol,
           "LDM unwind drift above which training falls back to checkpointed segments");
    ap.section("Data");
    ap.add("--train-data", &o.train_data, "glob of training token shards (required)");
    ap.add("--val-data", &o.val_data, "glob of validation token shards (optional)");
    ap.add("--tokenizer", &o.tokenizer,
           "bytes (256 byte ids + EOT), tokenizer dir (encoder.json + vocab.bpe) or tokenizer.json: vocab "
           "size, eot, sampling (\"\" = <data dir>/gpt2_tokenizer)");
    ap.add("-B,--batch-size", &o.B, "sequences per micro-batch");
    ap.add("-T,--seq-len", &o.T, "tokens per sequence (also the model's max sequence length)");
    ap.add("--total-batch-tokens", &o.total_batch_tokens,
           "tokens per optimizer step; a multiple of B*T (gradient accumulation); 0 = B*T");
    ap.section("Optimisation");
    ap.add("--steps", &o.steps, "optimizer steps");
    ap.add("--lr", &o.lr, "peak learning rate");
    ap.add("--min-lr-ratio", &o.min_lr_ratio, "final lr as a fraction of the peak");
    ap.add("--warmup-steps", &o.warmup_steps, "linear warmup steps");
    ap.add("--schedule", &o.schedule, "lr schedule after warmup: cosine|linear|wsd|constant");
    ap.add("--wsd-decay-frac", &o.wsd_decay_frac, "wsd: fraction of the steps spent in the final decay");
    ap.add("--weight-decay", &o.weight_decay, "AdamW decoupled weight decay (matrices and embeddings only)");
    ap.add("--beta1", &o.beta1, "AdamW beta1");
    ap.add("--beta2", &o.beta2, "AdamW beta2");
    ap.add("--adam-eps", &o.adam_eps, "AdamW epsilon");
    ap.add("--grad-clip", &o.grad_clip, "global gradient-norm clip (0 = off)");
    ap.section("Evaluation, sampling, output");
    ap.add("--val-every", &o.val_every, "validation loss every N steps (0 = only at the end)");
    ap.add("--val-batches", &o.val_batches, "batches of B x T per validation");
    ap.add("--eval-every", &o.eval_every, "run the --eval-* evaluations every N steps (0 = only at the end)");
    ap.add("--eval-lambada", &o.eval_lambada, "LAMBADA eval binary: ppl and acc logged as {\"type\":\"eval\"}");
    ap.add("--eval-wikitext", &o.eval_wikitext, "WikiText-2 eval binary: word/byte ppl, bits per byte (window T)");
    ap.add("--eval-hellaswag", &o.eval_hellaswag, "HellaSwag eval binary: acc and acc_norm");
    ap.add("--eval-max-examples", &o.eval_max_examples,
           "cap on LAMBADA examples / HellaSwag items / WikiText documents per evaluation (0 = all)");
    ap.add("--unigram-baseline", &o.unigram_baseline,
           "print the val cross-entropy of an add-one unigram model fitted on the train shards");
    ap.add("--sample-every", &o.sample_every, "print a text sample every N steps (0 = only at the end; -1 never)");
    ap.add("--sample-tokens", &o.sample_tokens, "tokens per sample");
    ap.add("--ckpt-every", &o.ckpt_every, "checkpoint every N steps into --out-dir (0 = only at the end)");
    ap.add("--keep-checkpoints", &o.keep_checkpoints,
           "keep only the newest K checkpoints this run wrote (0 = keep all)");
    ap.add("--stop-after", &o.stop_after,
           "stop after K steps of this invocation (checkpoint written; the schedule stays that of --steps; "
           "continue with --resume latest)");
    ap.add("--out-dir", &o.out_dir, "directory for checkpoints ckpt_<step>.model/.state (\"\" = none)");
    ap.add("--resume", &o.resume,
           "resume from a checkpoint: out/ckpt_000100 (or its .model/.state path); 'latest' = the newest complete "
           "checkpoint in --out-dir; 'auto' = the same, or start fresh when there is none");
    ap.add("--log", &o.log, "JSONL log file (config line, one line per step/val/sample)");
    ap.add("--seed", &o.seed, "seed of the init, data shuffling and sampling");
}

// Block AttnRes with N >= D = 2 n_layer blocks is AttnRes-Full (the schemes clamp N to D: every
// sublayer is its own block), e.g. the default N = 8 on the 4-layer `small`: says so on stderr
// (once per job: only the launcher's rank 0, read from the environment without starting MPI).
inline void note_attnres_block_is_full(const ModelConfig& cfg) {
    const int D = 2 * cfg.n_layer;
    if (cfg.scheme != "attnres-block" || cfg.attnres_blocks < D || dist::context_from_env().rank != 0) return;
    std::fprintf(stderr,
                 "note: attnres-block with --attnres-blocks %d >= D = %d sublayers (%d layers) is AttnRes-Full: every "
                 "sublayer is its own block; pass --attnres-blocks N < %d (e.g. %d) for a block variant\n",
                 cfg.attnres_blocks, D, cfg.n_layer, D, std::max(1, D / 4));
}

// LDM with a ridge δ below the spec's 0.1 in a mode that unwinds (unwind, window, rls or outer):
// the unwinding drift grows fast as δ shrinks (spec §2.5: 1e-4 at δ = 0.1, 0.9 at 0.001), so the
// run falls back to kept states; says so on stderr (rank 0 of the launch), the run goes on.
inline void note_small_ldm_delta(const ModelConfig& cfg) {
    if (cfg.scheme != "ldm" || cfg.ldm_rule == "delta" || cfg.ldm_mode == "store" || !(cfg.ldm_delta < 0.1) ||
        dist::context_from_env().rank != 0)
        return;
    std::fprintf(stderr,
                 "note: --ldm-delta %g is below 0.1: the %s mode's unwound states drift far more (spec: keep "
                 "delta >= 0.1); expect the drift fallback to kept states, or use --ldm-mode store\n",
                 cfg.ldm_delta, cfg.ldm_mode.c_str());
}

// Scheme options given for a scheme that does not read them (e.g. --ldm-mode with --scheme
// preln): named in one note on stderr (rank 0 of the launch), the run goes on. "Given" = differs
// from the option's default, so a default spelled out is not reported.
template <class O>
void note_ignored_scheme_flags(const O& o) {
    const O d{};
    const std::string& s = o.scheme;
    std::string names;
    auto check = [&](bool differs, bool used, const char* flag) {
        if (differs && !used) names += std::string(names.empty() ? "" : ", ") + flag;
    };
    const bool ldm = s == "ldm", hc = s == "hc" || s == "mhc";
    check(o.hc_streams != d.hc_streams, hc, "--hc-streams");
    check(o.sinkhorn_iters != d.sinkhorn_iters, s == "mhc", "--sinkhorn-iters");
    check(o.attnres_blocks != d.attnres_blocks, s == "attnres-block", "--attnres-blocks");
    check(o.ldm_rule != d.ldm_rule, ldm, "--ldm-rule");
    check(o.ldm_no_residual != d.ldm_no_residual, ldm, "--no-residual");
    check(o.ldm_no_forget != d.ldm_no_forget, ldm, "--ldm-no-forget");
    check(o.ldm_heads != d.ldm_heads, ldm, "--ldm-heads");
    check(o.ldm_dk != d.ldm_dk, ldm, "--ldm-dk");
    check(o.ldm_delta != d.ldm_delta, ldm, "--ldm-delta");
    check(o.ldm_lambda_min != d.ldm_lambda_min, ldm, "--ldm-lambda-min");
    check(o.ldm_mode != d.ldm_mode, ldm, "--ldm-mode");
    check(o.ldm_window != d.ldm_window, ldm, "--ldm-window");
    check(o.ldm_checkpoint_every != d.ldm_checkpoint_every, ldm, "--ldm-checkpoint-every");
    check(o.ldm_drift_tol != d.ldm_drift_tol, ldm, "--ldm-drift-tol");
    if (!names.empty() && dist::context_from_env().rank == 0)
        std::fprintf(stderr, "note: --scheme %s does not use %s: ignored\n", s.c_str(), names.c_str());
    // LDM options of another mode: --ldm-window is read by window mode only; the drift check
    // (--ldm-drift-tol) runs only when the backward unwinds without checkpoints.
    if (!ldm) return;
    std::string mode_names;
    const bool unwinds = (o.ldm_mode == "unwind" || o.ldm_mode == "window") && o.ldm_checkpoint_every == 0;
    if (o.ldm_window != d.ldm_window && o.ldm_mode != "window") mode_names = "--ldm-window";
    if (o.ldm_drift_tol != d.ldm_drift_tol && !unwinds)
        mode_names += std::string(mode_names.empty() ? "" : ", ") + "--ldm-drift-tol";
    if (!mode_names.empty() && dist::context_from_env().rank == 0)
        std::fprintf(stderr, "note: --ldm-mode %s%s does not use %s: ignored\n", o.ldm_mode.c_str(),
                     o.ldm_checkpoint_every > 0 ? " with --ldm-checkpoint-every" : "", mode_names.c_str());
}

// The model of the flags: the preset (with vocab_size), then the overrides (0 = keep the preset's
// value), the scheme and LDM options, seq_len = T. ldm::Error (from validate) on an impossible
// shape or option.
template <class O>
ModelConfig model_config_from_flags(const O& o, int vocab_size) {
    ModelConfig cfg = preset_config(o.preset, vocab_size);
    if (o.n_layer) cfg.n_layer = o.n_layer;
    if (o.d_model) cfg.d_model = o.d_model;
    if (o.n_head) cfg.n_head = o.n_head;
    if (o.n_kv_head) cfg.n_kv_head = o.n_kv_head;
    if (o.head_dim) cfg.head_dim = o.head_dim;
    if (o.ffn) cfg.ffn = o.ffn;
    cfg.seq_len = o.T;
    cfg.scheme = o.scheme;
    cfg.hc_streams = o.hc_streams;
    cfg.sinkhorn_iters = o.sinkhorn_iters;
    cfg.attnres_blocks = o.attnres_blocks;
    cfg.ldm_rule = o.ldm_rule;
    cfg.ldm_residual = !o.ldm_no_residual;
    cfg.ldm_forget = !o.ldm_no_forget;
    cfg.ldm_heads = o.ldm_heads;
    cfg.ldm_dk = o.ldm_dk;
    cfg.ldm_delta = o.ldm_delta;
    cfg.ldm_lambda_min = o.ldm_lambda_min;
    cfg.ldm_mode = o.ldm_mode;
    cfg.ldm_window = o.ldm_window;
    cfg.ldm_checkpoint_every = o.ldm_checkpoint_every;
    cfg.ldm_drift_tol = o.ldm_drift_tol;
    cfg.validate();
    note_attnres_block_is_full(cfg);
    note_small_ldm_delta(cfg);
    note_ignored_scheme_flags(o);
    return cfg;
}

// The AdamW settings of the flags (--beta1 --beta2 --adam-eps --weight-decay --grad-clip), not
// validated.
template <class O>
AdamWConfig adamw_config_from_flags(const O& o) {
    AdamWConfig ac;
    ac.beta1 = o.beta1;
    ac.beta2 = o.beta2;
    ac.eps = o.adam_eps;
    ac.weight_decay = o.weight_decay;
    ac.grad_clip = o.grad_clip;
    return ac;
}

// The learning-rate schedule of the flags (--schedule --lr --min-lr-ratio --warmup-steps --steps
// --wsd-decay-frac), not validated.
template <class O>
LRSchedule lr_schedule_from_flags(const O& o) {
    LRSchedule sc;
    sc.kind = o.schedule;
    sc.lr = o.lr;
    sc.min_lr_ratio = o.min_lr_ratio;
    sc.warmup_steps = o.warmup_steps;
    sc.total_steps = o.steps;
    sc.wsd_decay_frac = o.wsd_decay_frac;
    return sc;
}

// Checks and completes the flags every trainer shares (before anything is loaded): -B, -T > 0;
// --total-batch-tokens a multiple of B*T (0 = B*T); --bench N sets --steps N + 2; --steps >= 1;
// --val-batches >= 1; --val-every >= 0 and only with --val-data; --sample-every >= -1,
// --sample-tokens >= 0; --eval-every / --eval-max-examples >= 0 and --eval-every with an eval
// binary; --threads in [0, kMaxThreads]; --zero 0 or 1; the AdamW and LR schedule flags
// (AdamWConfig / LRSchedule validate). Throws ldm::Error naming the flag.
template <class O>
void check_train_flags(O& o) {
    if (o.B <= 0) throw Error(strprintf("-B/--batch-size must be > 0, got %d", o.B));
    if (o.T <= 0) throw Error(strprintf("-T/--seq-len must be > 0, got %d", o.T));
    const int64_t bt = int64_t(o.B) * o.T;
    if (o.total_batch_tokens == 0) o.total_batch_tokens = bt;
    if (o.total_batch_tokens < 0)
        throw Error(strprintf("--total-batch-tokens must be >= 0 (0 = B*T), got %lld", (long long)o.total_batch_tokens));
    if (o.total_batch_tokens % bt != 0)
        throw Error(strprintf("--total-batch-tokens %lld is not divisible by B*T = %d*%d = %lld",
                              (long long)o.total_batch_tokens, o.B, o.T, (long long)bt));
    if (o.bench > 0) o.steps = o.bench + 2;
    if (o.steps < 1) throw Error("--steps must be >= 1");
    if (o.val_batches < 1) throw Error("--val-batches must be >= 1");
    if (o.val_every < 0)
        throw Error(strprintf("--val-every must be >= 0 (0 = only at the end), got %lld", (long long)o.val_every));
    if (o.val_every > 0 && o.val_data.empty()) throw Error("--val-every needs --val-data (the validation shards)");
    if (o.sample_every < -1)
        throw Error(strprintf("--sample-every must be >= -1 (0 = only at the end, -1 = never), got %lld",
                              (long long)o.sample_every));
    if (o.sample_tokens < 0) throw Error(strprintf("--sample-tokens must be >= 0, got %d", o.sample_tokens));
    if (o.eval_every < 0 || o.eval_max_examples < 0) throw Error("--eval-every and --eval-max-examples must be >= 0");
    if (o.eval_every > 0 && o.eval_lambada.empty() && o.eval_wikitext.empty() && o.eval_hellaswag.empty())
        throw Error("--eval-every needs at least one of --eval-lambada, --eval-wikitext, --eval-hellaswag");
    check_threads_flag(o.threads);
    if (o.zero != 0 && o.zero != 1) throw Error(strprintf("--zero must be 0 or 1, got %d", o.zero));
    // the optimizer and schedule flags, before a model is built (also under --dry-run)
    adamw_config_from_flags(o).validate();
    lr_schedule_from_flags(o).validate();
}

// Checks the checkpoint and optimizer flags that are checked nowhere else: --ckpt-every >= 0 and
// only with --out-dir, --grad-clip >= 0. With prepare_dirs, creates --out-dir and checks that it
// is writable (core/common.h prepare_output_dir), so a bad path fails before any training, not
// at the first checkpoint. Throws ldm::Error naming the flag.
template <class O>
void check_output_flags(const O& o, bool prepare_dirs) {
    if (o.ckpt_every < 0) throw Error(strprintf("--ckpt-every must be >= 0, got %lld", (long long)o.ckpt_every));
    if (o.ckpt_every > 0 && o.out_dir.empty())
        throw Error("--ckpt-every needs --out-dir (the directory the checkpoints are written to)");
    if (!(o.grad_clip >= 0)) throw Error(strprintf("--grad-clip must be >= 0 (0 = off), got %g", o.grad_clip));
    if (o.keep_checkpoints < 0) throw Error(strprintf("--keep-checkpoints must be >= 0, got %d", o.keep_checkpoints));
    if (o.stop_after < 0) throw Error(strprintf("--stop-after must be >= 0, got %lld", (long long)o.stop_after));
    if (o.stop_after > 0 && o.out_dir.empty())
        throw Error("--stop-after needs --out-dir (the run stops with a checkpoint to continue from)");
    if ((o.resume == "latest" || o.resume == "auto") && o.out_dir.empty())
        throw Error("--resume " + o.resume + " needs --out-dir (the directory whose newest checkpoint to use)");
    if (prepare_dirs && !o.out_dir.empty()) prepare_output_dir(o.out_dir, "--out-dir");
}

}  // namespace ldm
