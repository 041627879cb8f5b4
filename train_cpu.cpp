// train_cpu.cpp — the CPU trainer (build/train_cpu): trains the spec §1 backbone with the CPU
// reference model (cpu/model.h) on token shards. See doc/training.md for the data flow
// (shards -> DataLoader -> forward -> backward -> AdamW), the flags, checkpoints and logs.
//
//   build/train_cpu --preset small --train-data "out/data/train_*.bin" --val-data "out/data/val_*.bin"
//       -B 8 -T 256 --steps 200 --lr 2e-3 --out-dir out/run --log out/run/log.jsonl
//
// Errors (bad flags, bad data, bad checkpoints) print "error: ..." and exit with status 1.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <glob.h>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint.h"
#include "core/cli.h"
#include "core/common.h"
#include "core/config.h"
#include "core/dataloader.h"
#include "core/dist.h"
#include "core/eval.h"
#include "core/logger.h"
#include "core/optim.h"
#include "core/tokenizer.h"
#include "core/train_flags.h"
#include "cpu/model.h"
#include "cpu/ops.h"
#include "cpu/scheme_ldm.h"

using namespace ldm;
using nlohmann::json;

namespace {

struct Options {
    // model
    std::string preset = "tiny";
    int n_layer = 0, d_model = 0, n_head = 0, n_kv_head = 0, head_dim = 0, ffn = 0;
    std::string scheme = "preln";
    int hc_streams = 4, sinkhorn_iters = 20, attnres_blocks = 8;  // HC, mHC, AttnRes (spec §2.2-2.4)
    // LDM (spec §2.5; used with --scheme ldm)
    std::string ldm_rule = "rls", ldm_mode = "store";
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
    std::string out_dir, resume, log;
    int64_t seed = 1337;
    std::string dtype = "fp32";
    int threads = 0;
    bool dry_run = false, unigram_baseline = false, quiet = false;
    int zero = 0;                 // data parallel: 0 = replicated AdamW, 1 = ZeRO-1 sharded AdamW state
    bool dist_selftest = false;   // check the MPI collectives and exit (test/test_dist.cpp)
    std::string dump_debug_state;
    int64_t bench = 0;
};

std::string dirname_of(const std::string& p) {
    size_t s = p.find_last_of('/');
    return s == std::string::npos ? "." : p.substr(0, s);
}

std::string basename_of(const std::string& p) {
    size_t s = p.find_last_of('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

std::vector<std::string> glob_files(const std::string& pattern) {
    glob_t g;
    std::vector<std::string> out;
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) out.push_back(g.gl_pathv[i]);
    globfree(&g);
    return out;
}

// splitmix64: the sampling RNG; its whole state is one uint64 (saved in the training state).
struct Rng {
    uint64_t s = 0;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
};

// Cross-entropy (nats per token) of the val targets under an add-one-smoothed unigram model
// fitted on every token of the training shards: the "knows only token frequencies" baseline.
double unigram_baseline(const std::string& train_glob, const std::vector<int32_t>& val_targets, uint32_t V) {
    std::vector<double> counts(V, 1.0);  // add-one smoothing
    double total = V;
    for (const auto& f : glob_files(train_glob)) {
        std::vector<uint32_t> t = read_shard(f);
        for (uint32_t x : t)
            if (x < V) counts[x] += 1, total += 1;
    }
    double s = 0;
    for (int32_t y : val_targets) s -= std::log(counts[size_t(y)] / total);
    return val_targets.empty() ? NAN : s / double(val_targets.size());
}

json options_json(const Options& o) {
    return json{{"preset", o.preset}, {"scheme", o.scheme}, {"train_data", o.train_data}, {"val_data", o.val_data},
                {"tokenizer", o.tokenizer}, {"B", o.B}, {"T", o.T}, {"total_batch_tokens", o.total_batch_tokens},
                {"steps", o.steps}, {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio}, {"warmup_steps", o.warmup_steps},
                {"schedule", o.schedule}, {"wsd_decay_frac", o.wsd_decay_frac}, {"weight_decay", o.weight_decay},
                {"beta1", o.beta1}, {"beta2", o.beta2}, {"adam_eps", o.adam_eps}, {"grad_clip", o.grad_clip},
                {"val_every", o.val_every}, {"val_batches", o.val_batches}, {"sample_every", o.sample_every},
                {"sample_tokens", o.sample_tokens}, {"ckpt_every", o.ckpt_every}, {"out_dir", o.out_dir},
                {"resume", o.resume}, {"seed", o.seed}, {"dtype", o.dtype}, {"threads", o.threads}};
}

// The settings a resumed run must share with the checkpoint for bit-exact continuation.
json resume_flags(const Options& o, const ModelConfig& cfg) {
    return json{{"config", config_to_json(cfg)}, {"dtype", o.dtype}, {"B", o.B}, {"T", o.T},
                {"total_batch_tokens", o.total_batch_tokens}, {"seed", o.seed}, {"train_data", o.train_data},
                {"steps", o.steps}, {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio},
                {"warmup_steps", o.warmup_steps}, {"schedule", o.schedule}, {"wsd_decay_frac", o.wsd_decay_frac},
                {"weight_decay", o.weight_decay}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"adam_eps", o.adam_eps},
                {"grad_clip", o.grad_clip}};
}

template <typename R>
std::string to_bytes(const std::vector<R>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(R));
}

template <typename R>
std::string slice_bytes(const std::vector<R>& v, int64_t offset, int64_t count) {
    return std::string(reinterpret_cast<const char*>(v.data() + offset), size_t(count) * sizeof(R));
}

// Sampling: autoregressive from <|endoftext|>, temperature 1 over the real V. Each token runs one
// forward of B=1 over a fixed window of Ts tokens (unused positions hold eot; causal attention
// makes them irrelevant for the position read), so the model's activation size never changes.
template <typename R>
std::string sample_text(cpu::Model<R>& model, const Tokenizer* tok, uint32_t eot, int n_tokens, int Tmax, Rng& rng) {
    const int Ts = std::min(Tmax, n_tokens + 1);
    const int V = model.cfg.vocab_size, Vp = model.cfg.padded_vocab;
    std::vector<int32_t> ctx(static_cast<size_t>(Ts), static_cast<int32_t>(eot));
    std::vector<uint32_t> out;
    int len = 1;
    std::vector<double> p(static_cast<size_t>(V));
    for (int i = 0; i < n_tokens && len <= Ts; i++) {
        model.forward(ctx.data(), nullptr, 1, Ts);
        const R* lg = model.logits() + size_t(len - 1) * size_t(Vp);
        double mx = -INFINITY;
        for (int v = 0; v < V; v++) mx = std::max(mx, double(lg[v]));
        double z = 0;
        for (int v = 0; v < V; v++) z += (p[size_t(v)] = std::exp(double(lg[v]) - mx));
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

template <typename R>
int run(const Options& o, const ModelConfig& cfg, const Tokenizer* tok) {
    const int B = o.B, T = o.T;
    const int64_t accum = o.total_batch_tokens / (int64_t(B) * T);  // micro-batches per step, all ranks
    // Data parallel (core/dist.h, doc/distributed.md): rank r of W runs accum / W of the global
    // batch's micro-batches (the loader gives it windows r, r+W, ...); W = 1 is the plain run.
    const int W = dist::world(), rank = dist::rank();
    if (accum % W != 0)
        throw Error(strprintf("data parallel: the %lld micro-batches of B*T per step (--total-batch-tokens / (B*T)) "
                              "are not divisible by the world size %d",
                              (long long)accum, W));
    const int64_t accum_local = accum / W;
    const bool zero1 = W > 1 && o.zero == 1;
    const uint32_t V = uint32_t(cfg.vocab_size);
    const uint32_t eot = tok ? tok->eot_id() : V - 1;

    // Data first: bad or missing data fails before the large allocations.
    if (o.train_data.empty()) throw Error("--train-data is required (a glob of token shards)");
    if (glob_files(o.train_data).empty()) throw Error("--train-data: no files match '" + o.train_data + "'");
    DataLoader train(o.train_data, B, T, rank, W, true, uint64_t(o.seed), V);
    std::unique_ptr<DataLoader> val;
    if (!o.val_data.empty()) {
        if (glob_files(o.val_data).empty()) throw Error("--val-data: no files match '" + o.val_data + "'");
        val.reset(new DataLoader(o.val_data, B, T, rank, W, false, 0, V));
    }
    // val_batches: global count (windows 0..val_batches-1); rank r scores those with index = r mod W.
    const int val_batches =
        val ? int(std::min<uint64_t>(uint64_t(o.val_batches), val->batches_per_epoch() * uint64_t(W))) : 0;
    const int val_batches_local = val_batches > rank ? (val_batches - rank + W - 1) / W : 0;

    cpu::Model<R> model(cfg);
    model.init(uint64_t(o.seed));
    const int64_t n = int64_t(model.params.size());

    std::vector<ParamRange> ranges;
    for (const auto& s : model.specs) ranges.push_back({s.offset, s.numel, s.decay});
    AdamWConfig ac;
    ac.beta1 = o.beta1;
    ac.beta2 = o.beta2;
    ac.eps = o.adam_eps;
    ac.weight_decay = o.weight_decay;
    ac.grad_clip = o.grad_clip;
    // ZeRO-1: this rank keeps m, v and updates the parameters of its contiguous shard only; the
    // global-norm clip is applied before (the shard optimizer runs with clipping off).
    const dist::Shard shard = dist::shard_range(n, W, rank);
    std::vector<ParamRange> shard_ranges;
    for (const auto& r : ranges) {
        const int64_t a = std::max(r.offset, shard.offset), b = std::min(r.offset + r.numel, shard.offset + shard.count);
        if (b > a) shard_ranges.push_back({a - shard.offset, b - a, r.decay});
    }
    AdamWConfig ac_shard = ac;
    ac_shard.grad_clip = 0;
    AdamW<R> opt = zero1 ? AdamW<R>(shard.count, ac_shard, shard_ranges) : AdamW<R>(n, ac, ranges);
    std::vector<R> gshard(W > 1 ? size_t(shard.count) : 0);  // this rank's reduced gradient shard
    LRSchedule sched;
    sched.kind = o.schedule;
    sched.lr = o.lr;
    sched.min_lr_ratio = o.min_lr_ratio;
    sched.warmup_steps = o.warmup_steps;
    sched.total_steps = o.steps;
    sched.wsd_decay_frac = o.wsd_decay_frac;
    sched.validate();

    Rng rng;
    rng.s = uint64_t(o.seed) ^ 0x5eed5a3b1e000000ull;
    int64_t start_step = 0;
    const json rflags = resume_flags(o, cfg);

    if (!o.resume.empty()) {
        // A checkpoint is ckpt_<step>.model plus either one .state file (a single-process run) or
        // per-rank shards .state.rank<r>of<W0> completed by the marker .done (doc/distributed.md).
        // Any world size resumes from either: the shards are reassembled and cut for this world.
        const std::string base = dist::checkpoint_base(o.resume), mpath = base + ".model";
        ModelCheckpoint mc = load_model(mpath);
        std::string d = config_diff(mc.cfg, cfg);
        if (!d.empty())
            throw Error("--resume " + mpath + ": the checkpoint's model config differs from the command line (" + d + ")");
        const dist::SavedState saved = dist::load_saved_state(base, n, mc.step, rflags);
        const std::vector<TrainState>& parts = saved.parts;
        const int W0 = saved.world;
        // Parameters: the exact values of the training dtype (fp64 runs), else the fp32 model file.
        if (parts[0].exact_params.empty()) {
            if (sizeof(R) != 4) throw Error("--resume: " + base + " has no exact fp64 parameters");
            for (int64_t i = 0; i < n; i++) model.params[size_t(i)] = R(mc.params[size_t(i)]);
        } else {
            for (size_t p = 0; p < parts.size(); p++)
                dist::copy_saved_part(model.params.data(), 0, n, parts[p].exact_params, saved.shards[p], "exact_params");
        }
        // AdamW moments of what this rank updates: its shard (ZeRO-1) or everything.
        const int64_t lo = zero1 ? shard.offset : 0;
        for (size_t p = 0; p < parts.size(); p++) {
            dist::copy_saved_part(opt.m().data(), lo, int64_t(opt.m().size()), parts[p].m, saved.shards[p], "adam_m");
            dist::copy_saved_part(opt.v().data(), lo, int64_t(opt.v().size()), parts[p].v, saved.shards[p], "adam_v");
        }
        opt.set_step_count(mc.step);
        if (W0 == W) {
            train.load_state(parts[size_t(rank)].loader_state);
        } else {
            // Another world size: replay this rank's share of the batches already consumed.
            std::vector<int32_t> xi(size_t(B) * T), yi(size_t(B) * T);
            for (int64_t k = 0; k < mc.step * accum_local; k++) train.next_batch(xi.data(), yi.data());
        }
        rng.s = parts[0].rng_state[0];
        start_step = mc.step;
        std::printf("resumed from %s at step %lld", mpath.c_str(), (long long)start_step);
        if (W0 != W) std::printf(" (resharded: saved by %d process%s, now %d)", W0, W0 == 1 ? "" : "es", W);
        std::printf("\n");
    }

    std::vector<int32_t> inputs(size_t(B) * T), targets(size_t(B) * T);

    if (!o.dump_debug_state.empty()) {
        if (W > 1) throw Error("--dump-debug-state is for a single process (run it without mpirun)");
        train.next_batch(inputs.data(), targets.data());
        model.zero_grad();
        double loss = model.forward(inputs.data(), targets.data(), B, T);
        model.backward(1.0);
        save_debug_state(o.dump_debug_state, cfg, model.params.data(), inputs.data(), targets.data(), B, T,
                         model.logits(), loss, model.grads.data());
        std::printf("debug state (step %lld, loss %.6f) written to %s\n", (long long)start_step, loss,
                    o.dump_debug_state.c_str());
        return 0;
    }

    if (!o.out_dir.empty()) mkdir_p(o.out_dir);
    JsonlLogger logger;
    if (!o.log.empty() && rank == 0) {  // only rank 0 logs
        mkdir_p(dirname_of(o.log));
        logger = JsonlLogger(o.log, start_step > 0);
        if (start_step > 0) logger.log({{"type", "resume"}, {"step", start_step}, {"from", o.resume}});
        else {
            json c{{"type", "config"}, {"config", config_to_json(cfg)}, {"args", options_json(o)},
                   {"param_count", n}, {"accum_steps", accum}, {"threads", omp_get_max_threads()}};
            if (W > 1) c["data_parallel"] = {{"world", W}, {"zero", o.zero}, {"accum_per_rank", accum_local}};
            logger.log(c);
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
    LoadedEvalSets esets;
    if (do_evals) esets = load_eval_sets(esuite, V);
    std::unique_ptr<ScoringModel> scorer = make_cpu_scoring_model(model);
    auto run_evals = [&](int64_t step) {
        if (rank != 0) return;  // evaluations run on rank 0 only
        json r = run_eval_suite(*scorer, esuite, esets);
        std::printf("step %6lld | eval\n%s", (long long)step, format_results_table(r).c_str());
        logger.log({{"type", "eval"}, {"step", step}, {"results", r}});
    };

    std::printf("model %s (%s, %s): %lld parameters | B=%d T=%d accum=%lld -> %lld tokens/step | %lld steps | %d threads\n",
                cfg.preset.c_str(), cfg.scheme.c_str(), o.dtype.c_str(), (long long)n, B, T, (long long)accum,
                (long long)o.total_batch_tokens, (long long)o.steps, omp_get_max_threads());
    if (W > 1)
        std::printf("data parallel: %d processes (%s), %lld micro-batches per rank per step, ZeRO-%d (AdamW shard of "
                    "rank 0: %lld of %lld parameters)\n",
                    W, dist::context().launcher.c_str(), (long long)accum_local, zero1 ? 1 : 0,
                    (long long)(zero1 ? shard.count : n), (long long)n);
    if (cfg.scheme == "hc" || cfg.scheme == "mhc" || cfg.scheme == "attnres-full" || cfg.scheme == "attnres-block") {
        // Live cross-layer state per token, and what the CPU reference keeps for backward.
        const int64_t d = cfg.d_model, D = cfg.n_sublayers();
        int64_t live = (int64_t)cfg.hc_streams * d;  // HC / mHC: n streams
        if (cfg.scheme == "attnres-full") live = (D + 1) * d;  // all sources v_0..v_D
        if (cfg.scheme == "attnres-block") live = (std::min<int64_t>(cfg.attnres_blocks, D) + 2) * d;  // b_0..b_N, p
        std::printf("scheme %s (n=%d, sinkhorn_iters=%d, attnres_blocks=%d): %lld extra parameters | cross-layer "
                    "state %lld B/token, kept for backward %lld B/token\n",
                    cfg.scheme.c_str(), cfg.hc_streams, cfg.sinkhorn_iters, cfg.attnres_blocks,
                    (long long)count_params_detailed(cfg).scheme, (long long)(live * (int64_t)sizeof(R)),
                    (long long)(cpu::make_scheme<R>(cfg)->state_values_per_token() * (int64_t)sizeof(R)));
    }

    if (cfg.scheme == "ldm") {
        const int64_t sp = count_params_detailed(cfg).scheme;
        const double es = sizeof(R);
        std::printf("ldm: rule %s, residual %d, forget %d, H_m %d, d_k %d, delta %g, lambda_min %g: %lld extra "
                    "parameters | mode %s, checkpoint every %d: state %.0f B/token, kept for backward %.0f B/token "
                    "(store %.0f, unwind %.0f)\n",
                    cfg.ldm_rule.c_str(), (int)cfg.ldm_residual, (int)cfg.ldm_forget, cfg.ldm_heads, cfg.ldm_dk,
                    cfg.ldm_delta, cfg.ldm_lambda_min, (long long)sp, cfg.ldm_mode.c_str(), cfg.ldm_checkpoint_every,
                    es * double(cpu::ldm_state_size(cfg)), es * double(cpu::ldm_backward_state_values(cfg)),
                    es * double(cfg.n_sublayers() + 2) * double(cpu::ldm_state_size(cfg)),
                    es * double(cpu::ldm_state_size(cfg)));
    }

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
            s += model.forward(inputs.data(), targets.data(), B, T);
        }
        return dist::sum_ordered(s) / val_batches;  // W = 1: s
    };
    auto save_ckpt = [&](int64_t step) {
        if (o.out_dir.empty()) return;
        std::string base = o.out_dir + strprintf("/ckpt_%06lld", (long long)step);
        if (rank == 0) save_model(base + ".model", cfg, model.params.data(), step);
        TrainState st;
        st.step = step;
        st.dtype = o.dtype;
        st.flags = rflags;
        st.loader_state = train.save_state();
        st.rng_state = {rng.s};
        std::vector<std::string> states;
        if (W == 1) {
            st.m = to_bytes(opt.m());
            st.v = to_bytes(opt.v());
            if (sizeof(R) == 8) st.exact_params = to_bytes(model.params);
            save_train_state(base + ".state", st);
            states.push_back(basename_of(base) + ".state");
        } else {
            // Every rank writes its shard of the AdamW moments (and of the exact fp64 parameters).
            const int64_t lo = zero1 ? 0 : shard.offset;  // where the shard starts inside opt.m()
            st.m = slice_bytes(opt.m(), lo, shard.count);
            st.v = slice_bytes(opt.v(), lo, shard.count);
            if (sizeof(R) == 8) st.exact_params = slice_bytes(model.params, shard.offset, shard.count);
            st.extra = {{"world", W}, {"rank", rank}, {"zero", o.zero}, {"param_count", n},
                        {"shard_offset", shard.offset}, {"shard_count", shard.count}};
            save_train_state(dist::shard_state_path(base, rank, W), st);
            for (int p = 0; p < W; p++) states.push_back(basename_of(dist::shard_state_path(base, p, W)));
        }
        dist::barrier();  // every file is complete before the marker says so
        if (rank == 0) dist::write_checkpoint_marker(base, step, W, o.zero, n, o.dtype, states);
        std::printf("checkpoint written: %s.model / %s / .done\n", base.c_str(), W == 1 ? ".state" : ".state.rank*");
        logger.log({{"type", "checkpoint"}, {"step", step}, {"path", base}});
    };

    // Data-parallel update (W > 1). Gradients (each rank: the sum over its micro-batches of
    // grad/accum) are reduce-scattered in rank order (dist::reduce_scatter_ordered), so the result
    // is the global mean, reproducible run to run. ZeRO-0: the reduced shards are all-gathered
    // and every rank runs the same full AdamW. ZeRO-1: each rank clips and updates its shard with
    // the global norm (sum of the ranks' shard sums of squares, in rank order), then the
    // parameters are all-gathered.
    auto dp_update = [&](double lr) -> double {
        dist::reduce_scatter_ordered<R>(dist::Span<const R>(model.grads), dist::Span<R>(gshard));
        if (!zero1) {
            std::copy(gshard.begin(), gshard.end(), model.grads.begin() + shard.offset);
            dist::allgather_shards<R>(dist::Span<R>(model.grads));
            return opt.step(model.params.data(), model.grads.data(), lr);
        }
        double ss = 0;
        for (R g : gshard) ss += double(g) * double(g);
        const double norm = std::sqrt(dist::sum_ordered(ss));
        if (o.grad_clip > 0 && norm > o.grad_clip) {
            const R c = R(o.grad_clip / norm);  // the same scale AdamW::step would apply
            for (R& g : gshard) g *= c;
        }
        opt.step(model.params.data() + shard.offset, gshard.data(), lr);
        dist::allgather_shards<R>(dist::Span<R>(model.params));
        return norm;
    };

    double last_val = NAN;
    double bench_ms = 0, bench_gemm_s = 0, bench_gemm_flops = 0;
    int64_t bench_n = 0;
    for (int64_t step = start_step; step < o.steps; step++) {
        const bool last = step + 1 == o.steps;
        if (val && o.val_every > 0 && step % o.val_every == 0) {
            last_val = eval_val();
            std::printf("step %6lld | val loss %.4f\n", (long long)step, last_val);
            logger.log({{"type", "val"}, {"step", step}, {"val_loss", last_val}});
        }
        if (do_evals && o.eval_every > 0 && step > 0 && step % o.eval_every == 0) run_evals(step);
        if (o.sample_every > 0 && step > 0 && step % o.sample_every == 0 && rank == 0) {
            std::string s = sample_text(model, tok, eot, o.sample_tokens, T, rng);
            std::printf("step %6lld | sample: %s\n", (long long)step, s.c_str());
            logger.log({{"type", "sample"}, {"step", step}, {"text", s}});
        }
        cpu::reset_gemm_stats();
        auto t0 = std::chrono::steady_clock::now();
        model.zero_grad();
        double loss = 0;
        for (int64_t a = 0; a < accum_local; a++) {
            train.next_batch(inputs.data(), targets.data());
            loss += model.forward(inputs.data(), targets.data(), B, T);
            model.backward(1.0 / double(accum));
        }
        loss = dist::sum_ordered(loss) / double(accum);  // W = 1: loss / accum
        const double lr = sched.lr_at(step);
        const double gnorm = W == 1 ? opt.step(model.params.data(), model.grads.data(), lr) : dp_update(lr);
        auto t1 = std::chrono::steady_clock::now();
        const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        const double tps = double(o.total_batch_tokens) / (ms / 1e3);
        if (!std::isfinite(loss)) throw Error(strprintf("loss is %g at step %lld (diverged)", loss, (long long)step));
        if (!o.quiet || last || step % 10 == 0)
            std::printf("step %6lld/%lld | loss %.6f | lr %.3e | grad norm %.4f | %.1f ms | %.0f tok/s\n",
                        (long long)(step + 1), (long long)o.steps, loss, lr, gnorm, ms, tps);
        json jstep{{"type", "step"}, {"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", gnorm}, {"ms", ms},
                   {"tokens_per_s", tps}, {"tokens", (step + 1) * o.total_batch_tokens}};
        const auto sm = model.scheme_metrics();  // LDM unwind drift, every step
        if (!sm.empty()) {
            std::string line;
            for (const auto& kv : sm) {
                jstep[kv.first] = kv.second;
                line += strprintf(" %s %.3g", kv.first.c_str(), kv.second);
            }
            std::printf("step %6lld | scheme:%s\n", (long long)(step + 1), line.c_str());
        }
        std::fflush(stdout);
        logger.log(jstep);
        if (o.bench > 0 && step - start_step >= 2) {  // skip 2 warm-up steps
            const cpu::GemmStats gs = cpu::gemm_stats();
            bench_ms += ms;
            bench_gemm_s += gs.seconds;
            bench_gemm_flops += gs.flops;
            bench_n++;
        }
        if (o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0 && !last) save_ckpt(step + 1);
    }
    if (val && o.steps > start_step) {
        last_val = eval_val();
        std::printf("final val loss %.4f", last_val);
        if (std::isfinite(unigram)) std::printf(" | unigram baseline %.4f | difference %.4f nats", unigram, unigram - last_val);
        std::printf("\n");
        logger.log({{"type", "val"}, {"step", o.steps}, {"val_loss", last_val}, {"unigram_loss", unigram}});
    }
    if (do_evals && o.steps > start_step) run_evals(o.steps);
    if (o.sample_every >= 0 && o.sample_tokens > 0 && tok && o.steps > start_step && o.bench == 0 && rank == 0) {
        std::string s = sample_text(model, tok, eot, o.sample_tokens, T, rng);
        std::printf("sample: %s\n", s.c_str());
        logger.log({{"type", "sample"}, {"step", o.steps}, {"text", s}});
    }
    if (o.steps > start_step) save_ckpt(o.steps);
    if (o.bench > 0 && bench_n > 0) {
        const double step_s = bench_ms / 1e3 / double(bench_n);
        const double gemm_s = bench_gemm_s / double(bench_n);
        const double gemm_gflops = bench_gemm_flops / double(bench_n) / gemm_s / 1e9;
        // Peak of the same BLAS in the same run: a large square GEMM of the training dtype.
        const int Np = 2048;
        std::vector<R> a(size_t(Np) * Np, R(0.5)), b(size_t(Np) * Np, R(0.25)), c(size_t(Np) * Np);
        cpu::gemm<R>(false, false, Np, Np, Np, R(1), a.data(), Np, b.data(), Np, R(0), c.data(), Np);  // warm-up
        auto p0 = std::chrono::steady_clock::now();
        const int reps = 5;
        for (int r = 0; r < reps; r++)
            cpu::gemm<R>(false, false, Np, Np, Np, R(1), a.data(), Np, b.data(), Np, R(0), c.data(), Np);
        const double ps = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
        const double peak = 2.0 * Np * Np * double(Np) * reps / ps / 1e9;
        json r{{"type", "bench"}, {"steps_timed", bench_n}, {"tokens_per_s", double(o.total_batch_tokens) / step_s},
               {"step_ms", step_s * 1e3}, {"gemm_ms", gemm_s * 1e3}, {"gemm_fraction", gemm_s / step_s},
               {"gemm_gflops", gemm_gflops}, {"blas_peak_gflops", peak}, {"gemm_vs_peak", gemm_gflops / peak},
               {"threads", omp_get_max_threads()}, {"B", B}, {"T", T}, {"dtype", o.dtype}};
        std::printf("BENCH %s\n", r.dump().c_str());
        logger.log(r);
    }
    return 0;
}

}  // namespace

// Checks the typed MPI collectives under mpirun (test/test_dist.cpp): chunked transfers (chunks of
// 7 elements), uneven shards, the ordered reduce-scatter against a serial sum, all-gather, broadcast,
// allreduce of integers and sum_ordered. Prints "dist selftest: OK rank r of W" or throws.
int dist_selftest() {
    const int W = dist::world(), r = dist::rank();
    dist::set_max_chunk_elems(7);
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(5), int64_t(W), int64_t(103), int64_t(1000)}) {
        // Every rank's input, computed once (so the expected sums use the very same values).
        std::vector<std::vector<double>> all(static_cast<size_t>(W), std::vector<double>(static_cast<size_t>(n)));
        for (int p = 0; p < W; p++)
            for (int64_t i = 0; i < n; i++)
                all[size_t(p)][size_t(i)] = 0.1 * double(p + 1) + 1e-3 * double(i) + 1.0 / double(7 + i + p);
        auto val = [&](int p, int64_t i) { return all[size_t(p)][size_t(i)]; };
        std::vector<double> in = all[size_t(r)];
        const dist::Shard sh = dist::shard_range(n, W, r);
        std::vector<double> out(static_cast<size_t>(sh.count));
        dist::reduce_scatter_ordered<double>(dist::Span<const double>(in), dist::Span<double>(out));
        for (int64_t i = 0; i < sh.count; i++) {
            double want = val(0, sh.offset + i);
            for (int p = 1; p < W; p++) want += val(p, sh.offset + i);
            if (out[size_t(i)] != want) throw Error(strprintf("selftest: reduce_scatter n=%lld i=%lld", (long long)n, (long long)i));
        }
        std::vector<float> g(size_t(n), -1.0f);
        for (int64_t i = 0; i < sh.count; i++) g[size_t(sh.offset + i)] = float(1000 * r + i);
        dist::allgather_shards<float>(dist::Span<float>(g));
        for (int p = 0; p < W; p++) {
            const dist::Shard sp = dist::shard_range(n, W, p);
            for (int64_t i = 0; i < sp.count; i++)
                if (g[size_t(sp.offset + i)] != float(1000 * p + i)) throw Error("selftest: allgather_shards");
        }
        std::vector<int64_t> c(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; i++) c[size_t(i)] = i * (r + 1);
        dist::allreduce_sum<int64_t>(dist::Span<int64_t>(c));
        for (int64_t i = 0; i < n; i++)
            if (c[size_t(i)] != i * int64_t(W) * (W + 1) / 2) throw Error("selftest: allreduce_sum");
        std::vector<uint8_t> b(static_cast<size_t>(n), static_cast<uint8_t>(r));
        if (r == W - 1)
            for (int64_t i = 0; i < n; i++) b[size_t(i)] = uint8_t(i * 7);
        dist::broadcast<uint8_t>(dist::Span<uint8_t>(b), W - 1);
        for (int64_t i = 0; i < n; i++)
            if (b[size_t(i)] != uint8_t(i * 7)) throw Error("selftest: broadcast");
    }
    double s = dist::sum_ordered(0.1 * (r + 1)), want = 0.1;
    for (int p = 1; p < W; p++) want += 0.1 * (p + 1);
    if (s != want) throw Error("selftest: sum_ordered");
    dist::barrier();
    std::fprintf(stderr, "dist selftest: OK rank %d of %d (local rank %d of %d, launcher %s)\n", r, W,
                 dist::context().local_rank, dist::context().local_world, dist::context().launcher.c_str());
    return 0;
}

int main_body(int argc, char** argv) {
    {
        Options o;
        ArgParser ap("train_cpu", "Train the spec §1 backbone on the CPU (reference model). See doc/training.md.");
        add_common_train_flags(ap, o);
        ap.add("--dtype", &o.dtype, "fp32|fp64");
        ap.add("--threads", &o.threads, "OpenMP and BLAS threads (0 = all cores)");
        ap.add("--quiet", &o.quiet, "print only every 10th step line");
        ap.add("--dry-run", &o.dry_run, "print the parameter count and memory per token, allocate nothing, exit");
        ap.add("--dump-debug-state", &o.dump_debug_state,
               "write params, first batch, logits, loss and all gradients to FILE (doc/formats.md) and exit");
        ap.add("--bench", &o.bench, "benchmark: time N steps (after 2 warm-up) and a peak sgemm; print BENCH json");
        ap.section("Data parallel (run under mpirun -np N; doc/distributed.md)");
        ap.add("--zero", &o.zero, "0: every rank keeps the full AdamW state; 1: ZeRO-1, each rank keeps and updates a shard");
        ap.add("--dist-selftest", &o.dist_selftest, "check the MPI collectives and exit");
        if (!ap.parse(argc, argv)) return 0;
        if (o.zero != 0 && o.zero != 1) throw Error(strprintf("--zero must be 0 or 1, got %d", o.zero));
        if (dist::world() > 1 && !dist::context().mpi)
            throw Error(strprintf("%d processes launched by '%s' without MPI: the CPU trainer needs MPI for its "
                                  "collectives (mpirun, or srun --mpi=pmix)",
                                  dist::world(), dist::context().launcher.c_str()));
        if (o.dist_selftest) return dist_selftest();
        // Only rank 0 prints to stdout (errors still go to every rank's stderr).
        if (dist::rank() != 0 && !std::freopen("/dev/null", "w", stdout)) throw Error("cannot silence stdout");

        if (o.B <= 0) throw Error(strprintf("-B/--batch-size must be > 0, got %d", o.B));
        if (o.T <= 0) throw Error(strprintf("-T/--seq-len must be > 0, got %d", o.T));
        if (o.dtype != "fp32" && o.dtype != "fp64") throw Error("--dtype must be fp32 or fp64, got '" + o.dtype + "'");
        const int64_t bt = int64_t(o.B) * o.T;
        if (o.total_batch_tokens == 0) o.total_batch_tokens = bt;
        if (o.total_batch_tokens < 0 || o.total_batch_tokens % bt != 0)
            throw Error(strprintf("--total-batch-tokens %lld is not divisible by B*T = %d*%d = %lld",
                                  (long long)o.total_batch_tokens, o.B, o.T, (long long)bt));
        if (o.bench > 0) o.steps = o.bench + 2;
        if (o.steps < 1) throw Error("--steps must be >= 1");
        if (o.val_batches < 1) throw Error("--val-batches must be >= 1");
        if (o.eval_every < 0 || o.eval_max_examples < 0) throw Error("--eval-every and --eval-max-examples must be >= 0");
        if (o.eval_every > 0 && o.eval_lambada.empty() && o.eval_wikitext.empty() && o.eval_hellaswag.empty())
            throw Error("--eval-every needs at least one of --eval-lambada, --eval-wikitext, --eval-hellaswag");

        if (o.threads < 0) throw Error("--threads must be >= 0");
        check_output_flags(o, !o.dry_run && o.dump_debug_state.empty());  // before any training
        // Default: all cores, shared among the ranks on this node.
        const int threads =
            o.threads > 0 ? o.threads : std::max(1, omp_get_num_procs() / std::max(1, dist::context().local_world));
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);

        // Tokenizer: gives V, eot and the decoder for samples.
        std::unique_ptr<Tokenizer> tok = load_tokenizer_flag(o.tokenizer);
        if (!tok && !o.dry_run) throw Error("--tokenizer: none given and no gpt2_tokenizer in the data directory");
        const int V = tok ? int(tok->vocab_size()) : 50257;

        ModelConfig cfg = model_config_from_flags(o, V);

        if (o.dry_run) {
            std::printf("%s", describe(cfg, o.T).c_str());
            const int64_t np = count_params(cfg);
            const double es = o.dtype == "fp64" ? 8 : 4;
            const double act = double(activation_values_per_token(cfg, o.T)) * es;
            std::printf("training memory (%s): params+grads+AdamW m,v = %.3f GiB; activations %.1f KiB/token "
                        "= %.3f GiB per micro-batch of B*T = %lld tokens\n",
                        o.dtype.c_str(), 4.0 * double(np) * es / (1 << 30), act / 1024, act * double(bt) / (1 << 30),
                        (long long)bt);
            return 0;
        }
        return o.dtype == "fp64" ? run<double>(o, cfg, tok.get()) : run<float>(o, cfg, tok.get());
    }
}

int main(int argc, char** argv) {
    int rc = 1;
    try {
        dist::init(&argc, &argv);
        rc = main_body(argc, argv);
    } catch (const std::exception& e) {
        std::fflush(stdout);
        if (dist::world() > 1) std::fprintf(stderr, "error: [rank %d of %d] %s\n", dist::rank(), dist::world(), e.what());
        else std::fprintf(stderr, "error: %s\n", e.what());
        std::fflush(stderr);
        dist::abort_all(1);  // the other ranks would wait forever in the next collective
        return 1;
    }
    dist::finalize();
    return rc;
}
