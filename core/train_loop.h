// core/train_loop.h — the training loop every trainer runs (train_cpu.cpp on the CPU reference,
// the GPU trainers through cuda/trainer.cuh), written once over a Backend that owns the model,
// its gradients and optimizer state: data loaders, resume, debug dump, JSONL log, in-training
// validation / evaluations / samples, the step loop (accumulation, divergence guard, progress
// with throughput and ETA), checkpoints (rotation, never non-finite) and the benchmark report.
// Flags and semantics: doc/training.md; the Backend contract: doc/architecture.md "One loop".
//
// Steps are counted from 1 in every message, log record and checkpoint name: "step k" is the
// k-th optimizer update; ckpt_<k> holds the state after it.
#pragma once
#include <glob.h>
#include <omp.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint.h"
#include "core/common.h"
#include "core/config.h"
#include "core/dataloader.h"
#include "core/dist.h"
#include "core/eval.h"
#include "core/logger.h"
#include "core/optim.h"
#include "core/shard.h"
#include "core/tokenizer.h"
#include "core/train_flags.h"

namespace ldm {

// The options every trainer shares (bound to flags by core/train_flags.h add_common_train_flags
// and add_loop_flags). A trainer extends it with its own fields.
struct TrainOptions {
    // model
    std::string preset = "tiny";
    int n_layer = 0, d_model = 0, n_head = 0, n_kv_head = 0, head_dim = 0, ffn = 0;
    std::string scheme = "preln";
    int hc_streams = 4, sinkhorn_iters = 20, attnres_blocks = 8;  // HC, mHC, AttnRes (spec §2.2-2.4)
    std::string ldm_rule = "rls", ldm_mode = "store";             // LDM (spec §2.5)
    bool ldm_no_residual = false, ldm_no_forget = false;
    int ldm_heads = 4, ldm_dk = 8, ldm_window = 2, ldm_checkpoint_every = 0;
    double ldm_delta = 0.1, ldm_lambda_min = 0.95, ldm_drift_tol = 1e-3;
    // data
    std::string train_data, val_data, tokenizer;
    int B = 4, T = 64;
    int64_t total_batch_tokens = 0;
    // optimisation
    int64_t steps = 100;
    double lr = 1e-3, min_lr_ratio = 0.1;
    int64_t warmup_steps = 0;
    std::string schedule = "cosine";
    double wsd_decay_frac = 0.2;
    double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8, grad_clip = 1.0;
    // evaluation, sampling, output
    int64_t val_every = 0;
    int val_batches = 20;
    int64_t eval_every = 0, eval_max_examples = 0;  // in-training evals (core/eval.h)
    std::string eval_lambada, eval_wikitext, eval_hellaswag;
    int64_t sample_every = 0;
    int sample_tokens = 64;
    int64_t ckpt_every = 0;
    int keep_checkpoints = 0;  // keep the newest K checkpoints of this run (0 = all)
    int64_t stop_after = 0;    // stop (with a checkpoint) after this many steps of this invocation
    std::string out_dir, resume, log;
    int64_t seed = 1337;
    std::string dtype;  // the trainer's default (train_cpu fp32, GPU bf16)
    int threads = 0;
    bool dry_run = false, unigram_baseline = false, quiet = false;
    std::string dump_debug_state;
    int64_t bench = 0;
    int zero = 0;  // data parallel: 1 = ZeRO-1 (AdamW state sharded over the ranks)
};

namespace train {

std::vector<std::string> glob_files(const std::string& pattern);

// splitmix64: the sampling RNG; its whole state is one uint64 (saved in the training state).
struct SampleRng {
    uint64_t s = 0;
    uint64_t next();
    double uniform();  // [0, 1), 53 bits
};

// Cross-entropy (nats per token) of the val targets under an add-one-smoothed unigram model
// fitted on every token of the training shards: the "knows only token frequencies" baseline.
double unigram_baseline(const std::string& train_glob, const std::vector<int32_t>& val_targets, uint32_t V);

// The run's settings for the log's config line; the subset a resumed run must share with its
// checkpoint (model, dtype, batch, seed: the data order; the data itself is checked by the
// loader's shard fingerprint); and the optimizer settings, which a resumed run may change (a
// longer --steps, a lower lr after a divergence): saved in the training state, and a resume that
// changes them says which (doc/training.md "Resuming with other settings").
nlohmann::json options_json(const TrainOptions& o);
nlohmann::json resume_flags(const TrainOptions& o, const ModelConfig& cfg);
nlohmann::json optimizer_settings(const TrainOptions& o);
// "lr 0.01 -> 0.001, steps 100 -> 200" for the keys of now whose value differs in saved; "" if none.
std::string changed_settings(const nlohmann::json& saved, const nlohmann::json& now);

// extra.scheme_state of a training state (an object of numbers, doc/formats.md) as name -> value
// pairs; ldm::Error naming `base` when it is not such an object.
std::vector<std::pair<std::string, double>> scheme_state_pairs(const nlohmann::json& j, const std::string& base);

// Model FLOPs per token (spec performance.md; doc/cuda.md "MFU"):
//   6·N_nonembed + 6·N_embed_head + 12·n_layer·d·T
double model_flops_per_token(const ModelConfig& c, int T);

// Samples n_tokens from <|endoftext|> at temperature 1 over the real V: each token runs
// logits(ctx, Ts, pos) — the fp32 logits [V] at position pos of one forward of the window ctx
// [Ts] (unused positions hold eot; causal attention makes them irrelevant).
template <class LogitsFn>
std::string sample_text(LogitsFn&& logits, const Tokenizer* tok, uint32_t eot, int V, int n_tokens, int Tmax,
                        SampleRng& rng) {
    const int Ts = std::min(Tmax, n_tokens + 1);
    std::vector<int32_t> ctx(static_cast<size_t>(Ts), static_cast<int32_t>(eot));
    std::vector<uint32_t> out;
    int len = 1;
    std::vector<double> p(static_cast<size_t>(V));
    for (int i = 0; i < n_tokens && len <= Ts; i++) {
        const std::vector<float> lg = logits(ctx.data(), Ts, len - 1);
        double mx = -INFINITY;
        for (int v = 0; v < V; v++) mx = std::max(mx, double(lg[size_t(v)]));
        double z = 0;
        for (int v = 0; v < V; v++) z += (p[size_t(v)] = std::exp(double(lg[size_t(v)]) - mx));
        double u = rng.uniform() * z, c = 0;
        int pick = V - 1;
        for (int v = 0; v < V; v++) {
            c += p[size_t(v)];
            if (u < c) {
                pick = v;
                break;
            }
        }
        out.push_back(uint32_t(pick));
        if (len < Ts) ctx[size_t(len)] = pick;
        len++;
    }
    return tok ? tok->decode(out) : std::string("<no tokenizer>");
}

// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);

// Checkpoints in `dir`: the bases (dir/ckpt_<step>) of the complete ones (a .model and its .state,
// or its .done marker), ascending by step.
std::vector<std::string> complete_checkpoints(const std::string& dir);
// The complete checkpoints in `dir` of a step above `step` (bases, ascending): what a run resumed
// from an earlier checkpoint into the same directory finds there.
std::vector<std::string> checkpoints_after(const std::string& dir, int64_t step);
// What SIGINT or SIGTERM prints on stderr before the process dies of the signal, as without a
// handler (rank 0 of a trainer; a signal the launcher set to be ignored stays ignored). Each call
// replaces the note; the first installs the handlers. With `once_exists`, the note is `then_msg`
// from the moment that file exists (the handler checks): a checkpoint's note for the window
// between its marker's rename and the next call. Throws Error for a path of PATH_MAX bytes or more.
void set_interrupt_note(const std::string& msg, const std::string& once_exists = "",
                        const std::string& then_msg = "");
// Removes dir/ckpt_*.tmp.<pid> files left by a writer that died (its pid no longer runs on this
// host, or the file is older than a day). Returns how many were removed.
int remove_stale_temp_files(const std::string& dir);
// Deletes every file of checkpoint `base` (.model, .state, .state.rank*, .done).
void remove_checkpoint(const std::string& base);
// The checkpoint --resume names: a path as given; "latest" = the newest complete checkpoint in
// out_dir (ldm::Error when there is none); "auto" = the same, or "" (start fresh) when there is none.
std::string resolve_resume(const std::string& resume, const std::string& out_dir);
// A run started without --resume must not overwrite another run's files: ldm::Error when out_dir
// holds a complete checkpoint (the new run would overwrite some, and --resume latest would then
// mix the two runs) or when the file `log` exists and is not empty (the new run would replace
// it). Either may be "" (not checked).
void check_fresh_start(const std::string& out_dir, const std::string& log);

// True when every value is finite.
template <typename R>
bool all_finite(const R* x, int64_t n) {
    bool ok = true;
#pragma omp parallel for reduction(&& : ok)
    for (int64_t i = 0; i < n; i++) ok = ok && std::isfinite(x[i]);
    return ok;
}

// True when the AdamW moments and exact parameters of `s` (raw values of s.dtype, fp32 or fp64)
// are all finite.
bool train_state_finite(const TrainState& s);

// What Backend::train_step returns: each micro-batch's mean loss (in order) and the global
// gradient norm before clipping (as reduce_gradients returns it).
struct StepResult {
    std::vector<double> losses;
    double grad_norm = 0;
};

template <class B, class = void>
struct has_fused_step : std::false_type {};
template <class B>
struct has_fused_step<B, std::void_t<decltype(std::declval<B&>().fuses_step(int64_t(1)))>> : std::true_type {};

}  // namespace train

// The Backend a trainer passes to train_loop (duck-typed; cpu: train_cpu.cpp CpuBackend, gpu:
// cuda/trainer.cuh GpuBackend). All calls are made by every rank in the same order; the ones
// marked "collective" communicate.
//   int64_t n_params() const;
//   const char* state_dtype() const;                 // dtype of the AdamW moments: fp32 | fp64
//   void zero_grad();
//   double train_batch(in, tg, B, T, grad_scale, bool last_micro);  // loss; grads += scale·dL/dθ
//   double eval_batch(in, tg, B, T);                 // mean loss, no gradients
//   double reduce_gradients();                       // collective: sum over ranks; global norm
//   void optimizer_step(double lr, double grad_norm);// AdamW (clip by grad_norm); collective
//   void set_step_count(int64_t t);                  // AdamW's update count (resume)
//   double sum_over_ranks(double x);                 // collective, fixed order
//   void barrier();                                  // collective
//   std::vector<float> next_logits(const int32_t* ctx, int Ts, int pos);  // sampling (rank 0)
//   ScoringModel& scorer();                          // in-training evaluations (rank 0)
//   std::vector<std::pair<std::string, double>> metrics();  // scheme metrics of the last step
//   std::vector<std::pair<std::string, double>> scheme_state();  // the scheme's decisions later
//       steps depend on (LDM's drift fallback; equal on every rank), saved as extra.scheme_state
//   std::string restore_scheme_state(const std::vector<std::pair<std::string, double>>&);  // on
//       resume, after restore(); returns a line to print ("" = none)
//   std::vector<float> checkpoint_params();          // collective: fp32 parameters, full on rank 0
//   bool params_finite();                            // every parameter finite (this rank's view)
//   void checkpoint_state(TrainState& ts, int64_t off, int64_t count);  // collective: m, v
//       (+ exact_params for fp64) of the flat range [off, off+count), ts.dtype
//   void restore(const ModelCheckpoint& mc, const dist::SavedState& saved);  // params + moments
//   void dump_debug_state(path, DataLoader& train, int64_t accum, int B, int T);
//   nlohmann::json log_fields();                     // extra fields of the log's config line
//   std::string device() const;                      // "... threads" / the GPU, for the model line
//   void print_startup();                            // memory / scheme lines after the model line
//   void step_begin();  void step_end();             // around one timed step (stats, sync)
// Optional (detected; the GPU backend has them, the CPU backend not):
//   bool fuses_step(int64_t accum);                   // this step runs as one train_step call
//   StepResult train_step(in, tg, accum, B, T, grad_scale, lr);  // in/tg [accum*B*T]: zero_grad,
//       every micro-batch's forward + backward, reduction, norm, divergence guard and AdamW at
//       once (the GPU's whole-step CUDA graph); on a non-finite loss or norm nothing is applied
//   nlohmann::json bench_fields(double mean_step_ms, double tokens_per_s);  // --bench report
//       extras; tokens_per_s from the median step, mean_step_ms the mean (what per-step means of
//       stage timers add up to)

// Runs the training loop of o (validated flags) for cfg. Returns the process exit code (0; errors
// throw ldm::Error). rank 0 prints and logs; every rank trains its share of each step's
// micro-batches.
template <class Backend>
int train_loop(const TrainOptions& o, const ModelConfig& cfg, const Tokenizer* tok, Backend& be) {
    using nlohmann::json;
    using namespace train;
    const int B = o.B, T = o.T;
    const int64_t accum = o.total_batch_tokens / (int64_t(B) * T);  // micro-batches per step, all ranks
    // Data parallel (core/dist.h, doc/distributed.md): rank r of W runs accum / W of the step's
    // micro-batches (the loader gives it windows r, r+W, ...); W = 1 is the plain run.
    const int W = dist::world(), rank = dist::rank();
    if (accum % W != 0)
        throw Error(strprintf("data parallel: the %lld micro-batches of B*T per step (--total-batch-tokens / (B*T)) "
                              "are not divisible by the world size %d",
                              (long long)accum, W));
    const int64_t accum_local = accum / W;
    const uint32_t V = uint32_t(cfg.vocab_size);
    const uint32_t eot = tok ? tok->eot_id() : V - 1;
    const int64_t n = be.n_params();

    // Runs f on every rank, then agrees over the ranks (sum_over_ranks is a collective): when f
    // threw on any rank, every rank throws (that rank its own error, the others `others`), so no
    // rank goes on alone or is left waiting in a later collective.
    auto on_all_ranks = [&](const std::function<void()>& f, const std::string& others) {
        std::string why;
        try {
            f();
        } catch (const std::exception& e) {
            why = e.what();
        }
        if (be.sum_over_ranks(why.empty() ? 0.0 : 1.0) > 0) throw Error(!why.empty() ? why : others);
    };

    // A fresh run must not overwrite another run's checkpoints or log (the dump writes neither; a
    // --bench run no checkpoint). Every rank checks before any goes on (rank 0 to write the log).
    if (o.resume.empty() && o.dump_debug_state.empty())
        on_all_ranks([&] { check_fresh_start(o.bench == 0 ? o.out_dir : "", o.log); },
                     "another rank found the files of an earlier run in --out-dir or --log");

    // Data: every shard is validated by the loaders (ids < V) before any step.
    if (o.train_data.empty()) throw Error("--train-data is required (a glob of token shards)");
    if (glob_files(o.train_data).empty()) throw Error("--train-data: no files match '" + o.train_data + "'");
    DataLoader train(o.train_data, B, T, rank, W, true, uint64_t(o.seed), V);
    if (uint64_t(accum_local) > train.batches_per_epoch() && rank == 0)
        std::fprintf(stderr,
                     "note: one optimizer step takes %lld micro-batches of B x T = %d x %d per rank, but the train "
                     "shards hold %llu per rank: every step sees some windows more than once\n",
                     (long long)accum_local, B, T, (unsigned long long)train.batches_per_epoch());
    std::unique_ptr<DataLoader> val;
    if (!o.val_data.empty()) {
        if (glob_files(o.val_data).empty()) throw Error("--val-data: no files match '" + o.val_data + "'");
        val.reset(new DataLoader(o.val_data, B, T, rank, W, false, 0, V));
    }
    // val_batches: global count (windows 0..val_batches-1); rank r scores those with index = r mod W.
    const int val_batches =
        val ? int(std::min<uint64_t>(uint64_t(o.val_batches), val->batches_per_epoch() * uint64_t(W))) : 0;
    const int val_batches_local = val_batches > rank ? (val_batches - rank + W - 1) / W : 0;
    if (val && val_batches < o.val_batches && rank == 0)
        std::fprintf(stderr, "note: --val-batches %d: the val shards hold %d batches of B x T = %d x %d tokens%s; "
                     "validation uses those %d\n", o.val_batches, val_batches, B, T,
                     W > 1 ? " on all ranks together" : "", val_batches);

    const LRSchedule sched = lr_schedule_from_flags(o);
    sched.validate();
    if (o.warmup_steps > o.steps && rank == 0)
        std::fprintf(stderr,
                     "warning: --warmup-steps %lld is larger than --steps %lld: the learning rate never reaches "
                     "its peak %g (last step at %g)\n",
                     (long long)o.warmup_steps, (long long)o.steps, o.lr, sched.lr_at(o.steps - 1));

    SampleRng rng;
    rng.s = uint64_t(o.seed) ^ 0x5eed5a3b1e000000ull;
    int64_t start_step = 0;
    const json rflags = resume_flags(o, cfg);

    if (!o.out_dir.empty() && rank == 0) {
        const int removed = remove_stale_temp_files(o.out_dir);
        if (removed > 0)
            std::printf("removed %d stale temporary file%s of an interrupted checkpoint write in %s\n", removed,
                        removed == 1 ? "" : "s", o.out_dir.c_str());
    }
    std::string resumed_from;
    const std::string resume_path = o.resume.empty() ? "" : resolve_resume(o.resume, o.out_dir);
    if (!resume_path.empty()) {
        // A checkpoint is ckpt_<step>.model plus either one .state file (a single-process run) or
        // per-rank shards .state.rank<r>of<W0> completed by the marker .done (doc/distributed.md).
        // Any world size resumes from either: the shards are reassembled and cut for this world.
        const std::string base = dist::checkpoint_base(resume_path), mpath = base + ".model";
        ModelCheckpoint mc;
        dist::SavedState saved;
        try {
            mc = load_model(mpath);
            std::string d = config_diff(mc.cfg, cfg);
            if (!d.empty())
                throw Error("--resume " + mpath + ": the checkpoint's model config differs from the command line (" +
                            d + ")");
            saved = dist::load_saved_state(base, n, mc.step, rflags);
        } catch (const Error& e) {
            std::string msg = e.what();
            const std::vector<std::string> good = complete_checkpoints(dirname_of(base));
            if (!good.empty() && good.back() != base)
                msg += "\n  the newest complete checkpoint in " + dirname_of(base) + " is " + good.back();
            throw Error(msg);
        }
        if (o.steps <= mc.step) {
            std::printf("%s is at step %lld of --steps %lld: the run is complete, nothing to train (pass a larger "
                        "--steps to extend it; doc/training.md \"Extending a run\")\n",
                        base.c_str(), (long long)mc.step, (long long)o.steps);
            return 0;
        }
        be.restore(mc, saved);
        be.set_step_count(mc.step);
        if (saved.world == W) {
            train.load_state(saved.parts[size_t(rank)].loader_state);
        } else {
            // Another world size: the same data (shards, seed, B, T), then this rank's share of
            // the batches already consumed is replayed.
            try {
                train.check_same_data(saved.parts[0].loader_state);
            } catch (const Error& e) {
                throw Error("--resume " + base + ": " + e.what());
            }
            std::vector<int32_t> xi(size_t(B) * T), yi(size_t(B) * T);
            for (int64_t k = 0; k < mc.step * accum_local; k++) train.next_batch(xi.data(), yi.data());
        }
        rng.s = saved.parts[0].rng_state[0];
        // the scheme's decisions before the checkpoint (LDM: the drift fallback's interval)
        if (saved.parts[0].extra.contains("scheme_state")) {
            std::string line;
            try {
                line = be.restore_scheme_state(scheme_state_pairs(saved.parts[0].extra["scheme_state"], base));
            } catch (const Error& e) {
                const std::string m = e.what();
                throw Error(m.rfind("--resume", 0) == 0 ? m : "--resume " + base + ": " + m);
            }
            if (!line.empty() && rank == 0) std::printf("%s\n", line.c_str());
        }
        start_step = mc.step;
        resumed_from = base;
        if (!o.out_dir.empty() && rank == 0) {
            const std::vector<std::string> later = checkpoints_after(o.out_dir, start_step);
            if (!later.empty())
                std::fprintf(stderr,
                             "warning: %s holds %zu checkpoint%s after step %lld (the newest: %s) from the run "
                             "this one leaves: they stay unless this run saves the same steps, and --resume "
                             "latest picks the newest of them (another --out-dir keeps the runs apart)\n",
                             o.out_dir.c_str(), later.size(), later.size() == 1 ? "" : "s", (long long)start_step,
                             basename_of(later.back()).c_str());
        }
        std::printf("resumed from %s at step %lld", mpath.c_str(), (long long)start_step);
        if (saved.world != W)
            std::printf(" (resharded: saved by %d process%s, now %d)", saved.world, saved.world == 1 ? "" : "es", W);
        std::printf("\n");
        const json& ex = saved.parts[0].extra;
        if (ex.contains("optimizer")) {
            const json& sv = ex["optimizer"];
            if (sv.contains("steps") && sv["steps"] != o.steps)
                std::printf("the run was planned for %lld steps, now --steps %lld: the schedule continues with the new "
                            "total\n",
                            (long long)sv["steps"].get<int64_t>(), (long long)o.steps);
            const std::string ch = changed_settings(sv, optimizer_settings(o));
            if (!ch.empty())
                std::printf("resuming with other optimizer settings than the checkpoint's (%s): the continuation "
                            "differs from the original run's\n",
                            ch.c_str());
        }
    }

    std::vector<int32_t> inputs(size_t(B) * T), targets(size_t(B) * T);
    std::vector<int32_t> step_inputs, step_targets;  // all micro-batches of a fused step

    if (!o.dump_debug_state.empty()) {
        if (W > 1) throw Error("--dump-debug-state is for a single process (run it without mpirun)");
        be.dump_debug_state(o.dump_debug_state, train, accum, B, T);
        return 0;
    }

    if (!o.out_dir.empty()) mkdir_p(o.out_dir);
    JsonlLogger logger;
    if (!o.log.empty() && rank == 0) {  // only rank 0 logs
        mkdir_p(dirname_of(o.log));
        // A resumed run appends to its log; a log that is new (or empty) gets the config line first.
        const bool continues_log = start_step > 0 && std::ifstream(o.log, std::ios::ate).tellg() > 0;
        logger = JsonlLogger(o.log, start_step > 0);
        if (!continues_log) {
            json c{{"type", "config"}, {"config", config_to_json(cfg)}, {"args", options_json(o)},
                   {"param_count", n}, {"accum_steps", accum}, {"threads", omp_get_max_threads()}};
            const json extra = be.log_fields();
            for (auto it = extra.begin(); it != extra.end(); ++it) c[it.key()] = it.value();
            logger.log(c);
        }
        // the resume record holds this invocation's flags (a resume may change e.g. --steps, --lr)
        if (start_step > 0) {
            json r{{"type", "resume"}, {"step", start_step}, {"from", resumed_from}, {"args", options_json(o)},
                   {"threads", omp_get_max_threads()}};
            const json extra = be.log_fields();  // world size, device, ... (may differ from the first run's)
            for (auto it = extra.begin(); it != extra.end(); ++it) r[it.key()] = it.value();
            logger.log(r);
        }
    }

    // In-training evaluation (core/eval.h, doc/evaluation.md): binaries loaded and checked once.
    EvalSuite esuite;
    esuite.lambada = o.eval_lambada;
    esuite.wikitext = o.eval_wikitext;
    esuite.hellaswag = o.eval_hellaswag;
    esuite.max_examples = esuite.max_docs = o.eval_max_examples;
    esuite.expected_eot = tok ? int64_t(tok->eot_id()) : -1;
    esuite.print_progress = !o.quiet;
    const bool do_evals = !(o.eval_lambada.empty() && o.eval_wikitext.empty() && o.eval_hellaswag.empty());
    esuite.expected_fingerprint = tok && do_evals ? tokenizer_fingerprint(*tok) : 0;
    LoadedEvalSets esets;
    if (do_evals) esets = load_eval_sets(esuite, V);
    auto run_evals = [&](int64_t step) {
        if (rank != 0) return;  // evaluations run on rank 0 only
        json r = run_eval_suite(be.scorer(), esuite, esets);
        std::printf("step %6lld | eval\n%s", (long long)step, format_results_table(r).c_str());
        logger.log({{"type", "eval"}, {"step", step}, {"results", r}});
    };
    auto sample = [&]() {
        return sample_text([&](const int32_t* ctx, int Ts, int pos) { return be.next_logits(ctx, Ts, pos); }, tok, eot,
                           int(V), o.sample_tokens, T, rng);
    };

    std::printf("model %s (%s, %s): %lld parameters | B=%d T=%d accum=%lld -> %lld tokens/step | %lld steps | %s\n",
                cfg.preset.c_str(), cfg.scheme.c_str(), o.dtype.c_str(), (long long)n, B, T, (long long)accum,
                (long long)o.total_batch_tokens, (long long)o.steps, be.device().c_str());
    be.print_startup();

    // Unigram baseline over exactly the val targets the validation loss uses.
    double unigram = NAN;
    if (o.unigram_baseline && val && rank == 0) {
        std::vector<int32_t> vt;
        DataLoader uval(o.val_data, B, T, 0, 1, false, 0, V);  // all val windows (the ranks' union)
        for (int b = 0; b < val_batches; b++) {
            uval.next_batch(inputs.data(), targets.data());
            vt.insert(vt.end(), targets.begin(), targets.end());
        }
        unigram = unigram_baseline(o.train_data, vt, V);
        std::printf("unigram baseline (add-one unigram fitted on the train shards, on %zu val tokens): %.4f nats/token\n",
                    vt.size(), unigram);
        logger.log({{"type", "unigram"}, {"val_tokens", vt.size()}, {"unigram_loss", unigram}});
    }

    auto eval_val = [&]() -> double {
        val->reset();
        double s = 0;
        for (int b = 0; b < val_batches_local; b++) {
            val->next_batch(inputs.data(), targets.data());
            s += be.eval_batch(inputs.data(), targets.data(), B, T);
        }
        return be.sum_over_ranks(s) / val_batches;  // W = 1: s
    };

    std::vector<std::string> written;  // this run's checkpoints, oldest first (rotation)
    std::string last_good = resumed_from;
    // What Ctrl-C (SIGINT) or SIGTERM prints (rank 0): the step, the last checkpoint, how to go on.
    auto note_text = [&](int64_t k, const std::string& ckpt) {
        const std::string s = strprintf("interrupted at step %lld of %lld: ", (long long)k, (long long)o.steps);
        if (!ckpt.empty())
            return s + "the last checkpoint is " + ckpt + " (the same command with --resume latest continues it)";
        if (o.out_dir.empty()) return s + "nothing of this run is saved (no --out-dir)";
        return s + "no checkpoint written yet (" +
               (o.ckpt_every > 0 ? "--ckpt-every " + std::to_string(o.ckpt_every) : std::string("only at the end")) +
               ")";
    };
    auto note_interrupt = [&](int64_t k) {
        if (rank == 0 && o.bench == 0) set_interrupt_note(note_text(k, last_good));
    };
    auto save_ckpt = [&](int64_t step) {
        if (o.out_dir.empty()) return;
        const std::string base = o.out_dir + strprintf("/ckpt_%06lld", (long long)step);
        const std::vector<float> p = be.checkpoint_params();
        TrainState st;
        st.step = step;
        st.flags = rflags;
        st.loader_state = train.save_state();
        st.rng_state = {rng.s};
        st.extra = {{"optimizer", optimizer_settings(o)}};
        // Each rank keeps the shard dist::shard_range(n, W, rank) of the AdamW moments (and of
        // the exact fp64 parameters): the layout every trainer reads. One rank: all of them.
        const dist::Shard sh = W == 1 ? dist::Shard{0, n} : dist::shard_range(n, W, rank);
        be.checkpoint_state(st, sh.offset, sh.count);  // collective
        if (W > 1)
            st.extra = {{"optimizer", optimizer_settings(o)}, {"world", W}, {"rank", rank}, {"zero", o.zero},
                        {"param_count", n}, {"shard_offset", sh.offset}, {"shard_count", sh.count}};
        const std::vector<std::pair<std::string, double>> ss = be.scheme_state();
        if (!ss.empty()) {
            st.extra["scheme_state"] = json::object();
            for (const auto& kv : ss) st.extra["scheme_state"][kv.first] = kv.second;
        }
        // Never write a non-finite checkpoint: the divergence guard stops before an update with a
        // non-finite gradient; this also catches a finite gradient that overflowed a parameter or
        // an AdamW moment (e.g. g^2 above the fp32 range with --grad-clip 0).
        const bool finite = be.params_finite() && (rank != 0 || all_finite(p.data(), int64_t(p.size()))) &&
                            train_state_finite(st);
        if (be.sum_over_ranks(finite ? 0.0 : 1.0) > 0)
            throw Error(strprintf("the parameters or AdamW moments after step %lld are not finite (diverged): no "
                                  "checkpoint written%s",
                                  (long long)step,
                                  last_good.empty() ? "" : ("; the last good checkpoint is " + last_good).c_str()));
        // A write that fails on one rank stops every rank (on_all_ranks).
        const std::string others = "checkpoint " + base + ": another rank failed to write its part";
        // A checkpoint of this step written before (a run resumed from an earlier step, perhaps
        // with another world size) goes first, so that its marker or state files are never read
        // with this save's files. The collective in on_all_ranks orders it before every write.
        on_all_ranks([&] { if (rank == 0) remove_checkpoint(base); }, others);
        std::vector<std::string> states;
        on_all_ranks([&] {
            if (rank == 0) save_model<float>(base + ".model", cfg, p.data(), step);
            if (W == 1) {
                save_train_state(base + ".state", st);
                states.push_back(basename_of(base) + ".state");
            } else {
                save_train_state(dist::shard_state_path(base, rank, W), st);
                for (int q = 0; q < W; q++) states.push_back(basename_of(dist::shard_state_path(base, q, W)));
            }
        }, others);  // every file is complete before the marker says so
        on_all_ranks([&] {
            if (rank != 0) return;
            // from the marker's rename on, Ctrl-C names this checkpoint (the handler looks for it)
            if (o.bench == 0) set_interrupt_note(note_text(step, last_good), base + ".done", note_text(step, base));
            dist::write_checkpoint_marker(base, step, W, o.zero, n, st.dtype, states);
        }, others);
        std::printf("checkpoint written: %s.model / %s / .done\n", base.c_str(), W == 1 ? ".state" : ".state.rank*");
        logger.log({{"type", "checkpoint"}, {"step", step}, {"path", base}});
        last_good = base;
        note_interrupt(step);
        written.push_back(base);
        if (o.keep_checkpoints > 0 && rank == 0)
            while ((int)written.size() > o.keep_checkpoints) {
                remove_checkpoint(written.front());
                written.erase(written.begin());
            }
    };
    auto diverged = [&](const char* what, double x, int64_t step) {
        return Error(strprintf("%s is %g at step %lld (diverged): the step's update was not applied and no checkpoint "
                               "of it was written%s",
                               what, x, (long long)step,
                               last_good.empty() ? " (no earlier checkpoint of this run)"
                                                 : ("; the last good checkpoint is " + last_good).c_str()));
    };

    const int64_t end_step = o.stop_after > 0 ? std::min(o.steps, start_step + o.stop_after) : o.steps;
    double last_val = NAN;
    std::vector<double> bench_ms;  // --bench: wall time of each timed step
    double ema_ms = 0;  // smoothed step time for the ETA
    const auto t_start = std::chrono::steady_clock::now();
    for (int64_t step = start_step; step < end_step; step++) {
        const int64_t k = step + 1;  // this step's number
        note_interrupt(k);
        const bool last = k == o.steps;
        if (val && o.val_every > 0 && step % o.val_every == 0) {
            last_val = eval_val();
            std::printf("step %6lld | val loss %.4f\n", (long long)step, last_val);
            logger.log({{"type", "val"}, {"step", step}, {"val_loss", last_val}});
        }
        if (do_evals && o.eval_every > 0 && step > 0 && step % o.eval_every == 0) run_evals(step);
        if (o.sample_every > 0 && o.sample_tokens > 0 && step > 0 && step % o.sample_every == 0 && rank == 0) {
            std::string s = sample();
            std::printf("step %6lld | sample: %s\n", (long long)step, s.c_str());
            logger.log({{"type", "sample"}, {"step", step}, {"text", s}});
        }
        be.step_begin();
        auto t0 = std::chrono::steady_clock::now();
        const double lr = sched.lr_at(step);
        double loss = 0, gnorm = 0;
        bool fused = false;  // the whole step in one backend call (the GPU's step graph)
        if constexpr (train::has_fused_step<Backend>::value) {
            fused = be.fuses_step(accum_local);
            if (fused) {
                const size_t bt = size_t(B) * T;
                step_inputs.resize(size_t(accum_local) * bt);
                step_targets.resize(size_t(accum_local) * bt);
                for (int64_t a = 0; a < accum_local; a++)
                    train.next_batch(step_inputs.data() + size_t(a) * bt, step_targets.data() + size_t(a) * bt);
                const train::StepResult r = be.train_step(step_inputs.data(), step_targets.data(), accum_local, B, T,
                                                          1.0 / double(accum), lr);
                for (double l : r.losses) loss += l;  // the order of the per-micro-batch loop below
                loss = be.sum_over_ranks(loss) / double(accum);
                gnorm = r.grad_norm;
                // the divergence guard ran on the device: a non-finite loss or norm left the parameters as they were
                if (!std::isfinite(loss)) throw diverged("loss", loss, k);
                if (!std::isfinite(gnorm)) throw diverged("gradient norm", gnorm, k);
            }
        }
        if (!fused) {
            be.zero_grad();
            for (int64_t a = 0; a < accum_local; a++) {
                train.next_batch(inputs.data(), targets.data());
                loss += be.train_batch(inputs.data(), targets.data(), B, T, 1.0 / double(accum), a + 1 == accum_local);
            }
            loss = be.sum_over_ranks(loss) / double(accum);  // W = 1: loss / accum
            gnorm = be.reduce_gradients();
            // divergence guard: nothing non-finite reaches the parameters or a checkpoint
            if (!std::isfinite(loss)) throw diverged("loss", loss, k);
            if (!std::isfinite(gnorm)) throw diverged("gradient norm", gnorm, k);
            be.optimizer_step(lr, gnorm);
        }
        be.step_end();
        auto t1 = std::chrono::steady_clock::now();
        const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        const double tps = double(o.total_batch_tokens) / (ms / 1e3);
        ema_ms = step == start_step ? ms : 0.9 * ema_ms + 0.1 * ms;
        const auto sm = be.metrics();  // e.g. the LDM unwind drift, every step
        if (!o.quiet || last || k % 10 == 0 || k == end_step) {
            std::string line = strprintf("step %6lld/%lld | loss %.6f | lr %.3e | grad norm %.4f | %.1f ms | %.0f tok/s",
                                         (long long)k, (long long)o.steps, loss, lr, gnorm, ms, tps);
            if (k < end_step) line += " | ETA " + format_duration(ema_ms / 1e3 * double(end_step - k));
            for (const auto& kv : sm) line += strprintf(" | %s %.3g", kv.first.c_str(), kv.second);
            std::printf("%s\n", line.c_str());
        }
        json jstep{{"type", "step"}, {"step", k}, {"loss", loss}, {"lr", lr}, {"grad_norm", gnorm}, {"ms", ms},
                   {"tokens_per_s", tps}, {"tokens", k * o.total_batch_tokens}};
        for (const auto& kv : sm) jstep[kv.first] = kv.second;
        std::fflush(stdout);
        logger.log(jstep);
        if (o.bench > 0 && step - start_step >= 2) {  // skip 2 warm-up steps
            bench_ms.push_back(ms);
        }
        if (o.ckpt_every > 0 && k % o.ckpt_every == 0 && k != end_step && o.bench == 0) save_ckpt(k);
    }
    const bool finished = end_step == o.steps, trained = end_step > start_step;
    if (!finished && trained) {
        std::printf("stopped after %lld steps at step %lld of %lld (--stop-after); resume with --resume %s\n",
                    (long long)(end_step - start_step), (long long)end_step, (long long)o.steps,
                    o.out_dir.empty() ? "<no --out-dir: nothing saved>" : "latest");
        if (o.bench == 0) save_ckpt(end_step);
        return 0;
    }
    if (val && trained) {
        last_val = eval_val();
        std::printf("final val loss %.4f", last_val);
        if (std::isfinite(unigram)) std::printf(" | unigram baseline %.4f | difference %.4f nats", unigram, unigram - last_val);
        std::printf("\n");
        logger.log({{"type", "val"}, {"step", o.steps}, {"val_loss", last_val}, {"unigram_loss", unigram}});
    }
    if (do_evals && trained) run_evals(o.steps);
    if (o.sample_every >= 0 && o.sample_tokens > 0 && tok && trained && o.bench == 0 && rank == 0) {
        std::string s = sample();
        std::printf("sample: %s\n", s.c_str());
        logger.log({{"type", "sample"}, {"step", o.steps}, {"text", s}});
    }
    if (trained && o.bench == 0) save_ckpt(o.steps);
    if (o.bench > 0 && !bench_ms.empty()) {
        // the median step (the spec's measure; core/common.h median()) and the mean
        const double step_ms = median(bench_ms);
        const double mean_ms = std::accumulate(bench_ms.begin(), bench_ms.end(), 0.0) / double(bench_ms.size());
        const double tps = double(o.total_batch_tokens) / (step_ms / 1e3);
        json r{{"type", "bench"}, {"steps_timed", (int64_t)bench_ms.size()}, {"tokens_per_s", tps}, {"step_ms", step_ms},
               {"step_ms_mean", mean_ms}, {"step_ms_min", *std::min_element(bench_ms.begin(), bench_ms.end())},
               {"step_ms_max", *std::max_element(bench_ms.begin(), bench_ms.end())},
               {"B", B}, {"T", T}, {"dtype", o.dtype}, {"preset", cfg.preset}, {"scheme", cfg.scheme},
               {"accum", accum}, {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count()}};
        const json extra = be.bench_fields(mean_ms, tps);
        for (auto it = extra.begin(); it != extra.end(); ++it) r[it.key()] = it.value();
        std::printf("BENCH %s\n", r.dump().c_str());
        logger.log(r);
    }
    return 0;
}

}  // namespace ldm
