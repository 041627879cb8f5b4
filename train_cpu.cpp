// train_cpu.cpp — the CPU trainer (build/train_cpu): trains the spec §1 backbone with the CPU
// reference model (cpu/model.h) on token shards, fp32 or fp64, on one process or many (mpirun,
// ZeRO-1). The loop is the one every trainer runs (core/train_loop.h); this file is its CPU
// backend: the model, its gradients, AdamW and the data-parallel reduction. doc/training.md.
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
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint.h"
#include "core/cli.h"
#include "core/common.h"
#include "core/config.h"
#include "core/dist.h"
#include "core/eval.h"
#include "core/optim.h"
#include "core/tokenizer.h"
#include "core/train_flags.h"
#include "core/train_loop.h"
#include "cpu/model.h"
#include "cpu/ops.h"
#include "cpu/scheme_ldm.h"

using namespace ldm;
using nlohmann::json;

namespace {

struct Options : TrainOptions {
    bool dist_selftest = false;  // check the MPI collectives and exit (test/test_dist.cpp)
    Options() { dtype = "fp32"; }
};

template <typename R>
std::string slice_bytes(const std::vector<R>& v, int64_t offset, int64_t count) {
    return std::string(reinterpret_cast<const char*>(v.data() + offset), size_t(count) * sizeof(R));
}

// The CPU backend of core/train_loop.h: cpu::Model<R> (R = float or double), AdamW<R> on the host,
// data parallelism through core/dist.h (MPI). Data parallel update (W > 1): the gradients (each
// rank: the sum over its micro-batches of grad/accum) are reduce-scattered in rank order
// (dist::reduce_scatter_ordered), so the result is the global mean, reproducible run to run.
// ZeRO-0: the reduced shards are all-gathered and every rank runs the same full AdamW. ZeRO-1:
// each rank clips and updates its shard with the global norm (sum of the ranks' shard sums of
// squares, in rank order), then the parameters are all-gathered.
template <typename R>
class CpuBackend {
   public:
    CpuBackend(const ModelConfig& cfg, const Options& o)
        : cfg_(cfg), o_(o), model_(cfg), W_(dist::world()), rank_(dist::rank()) {
        model_.init(uint64_t(o.seed));
        n_ = int64_t(model_.params.size());
        std::vector<ParamRange> ranges;
        for (const auto& s : model_.specs) ranges.push_back({s.offset, s.numel, s.decay});
        const AdamWConfig ac = adamw_config_from_flags(o);
        zero1_ = W_ > 1 && o.zero == 1;
        shard_ = dist::shard_range(n_, W_, rank_);
        std::vector<ParamRange> shard_ranges;
        for (const auto& r : ranges) {
            const int64_t a = std::max(r.offset, shard_.offset), b = std::min(r.offset + r.numel, shard_.offset + shard_.count);
            if (b > a) shard_ranges.push_back({a - shard_.offset, b - a, r.decay});
        }
        AdamWConfig ac_shard = ac;
        ac_shard.grad_clip = 0;  // ZeRO-1 clips its shard with the global norm before the update
        opt_.reset(zero1_ ? new AdamW<R>(shard_.count, ac_shard, shard_ranges) : new AdamW<R>(n_, ac, ranges));
        gshard_.resize(W_ > 1 ? size_t(shard_.count) : 0);
        scorer_ = make_cpu_scoring_model(model_);
        // data parallel: the scheme's host-side decisions (LDM's drift fallback) agree over the ranks
        if (W_ > 1)
            model_.scheme().set_data_parallel([](bool f) { return dist::sum_ordered(f ? 1.0 : 0.0) > 0; }, rank_ == 0);
    }

    int64_t n_params() const { return n_; }
    const char* state_dtype() const { return sizeof(R) == 8 ? "fp64" : "fp32"; }
    void zero_grad() { model_.zero_grad(); }
    double train_batch(const int32_t* in, const int32_t* tg, int B, int T, double scale, bool) {
        const double loss = model_.forward(in, tg, B, T);
        model_.backward(scale);
        return loss;
    }
    double eval_batch(const int32_t* in, const int32_t* tg, int B, int T) { return model_.forward(in, tg, B, T); }

    double reduce_gradients() {
        if (W_ == 1) return global_norm(model_.grads.data(), n_);
        dist::reduce_scatter_ordered<R>(dist::Span<const R>(model_.grads), dist::Span<R>(gshard_));
        if (!zero1_) {
            std::copy(gshard_.begin(), gshard_.end(), model_.grads.begin() + shard_.offset);
            dist::allgather_shards<R>(dist::Span<R>(model_.grads));
            return global_norm(model_.grads.data(), n_);
        }
        double ss = 0;
        for (R g : gshard_) ss += double(g) * double(g);
        return std::sqrt(dist::sum_ordered(ss));
    }
    void optimizer_step(double lr, double norm) {
        if (!zero1_) {
            opt_->update(model_.params.data(), model_.grads.data(), lr, norm);
            return;
        }
        if (o_.grad_clip > 0 && norm > o_.grad_clip) {
            const R c = R(o_.grad_clip / norm);  // the scale AdamW::update would apply
            for (R& g : gshard_) g *= c;
        }
        opt_->update(model_.params.data() + shard_.offset, gshard_.data(), lr, norm);
        dist::allgather_shards<R>(dist::Span<R>(model_.params));
    }
    void set_step_count(int64_t t) { opt_->set_step_count(t); }
    double sum_over_ranks(double x) { return dist::sum_ordered(x); }
    void barrier() { dist::barrier(); }

    std::vector<float> next_logits(const int32_t* ctx, int Ts, int pos) {
        model_.forward(ctx, nullptr, 1, Ts);
        const R* lg = model_.logits() + size_t(pos) * size_t(cfg_.padded_vocab);
        return std::vector<float>(lg, lg + cfg_.vocab_size);
    }
    ScoringModel& scorer() { return *scorer_; }
    std::vector<std::pair<std::string, double>> metrics() { return model_.scheme_metrics(); }
    std::vector<std::pair<std::string, double>> scheme_state() { return model_.scheme().saved_state(); }
    std::string restore_scheme_state(const std::vector<std::pair<std::string, double>>& s) {
        return model_.scheme().restore_state(s);
    }

    std::vector<float> checkpoint_params() { return std::vector<float>(model_.params.begin(), model_.params.end()); }
    bool params_finite() { return train::all_finite(model_.params.data(), n_); }
    void checkpoint_state(TrainState& ts, int64_t off, int64_t count) {
        ts.dtype = state_dtype();
        const int64_t lo = zero1_ ? off - shard_.offset : off;  // where [off, off+count) starts in m, v
        ts.m = slice_bytes(opt_->m(), lo, count);
        ts.v = slice_bytes(opt_->v(), lo, count);
        if (sizeof(R) == 8) ts.exact_params = slice_bytes(model_.params, off, count);
    }
    void restore(const ModelCheckpoint& mc, const dist::SavedState& saved) {
        const std::vector<TrainState>& parts = saved.parts;
        // Parameters: the exact values of the training dtype (fp64 runs), else the fp32 model file.
        if (parts[0].exact_params.empty()) {
            if (sizeof(R) != 4) throw Error("--resume: the checkpoint has no exact fp64 parameters");
            for (int64_t i = 0; i < n_; i++) model_.params[size_t(i)] = R(mc.params[size_t(i)]);
        } else {
            for (size_t p = 0; p < parts.size(); p++)
                dist::copy_saved_part(model_.params.data(), 0, n_, parts[p].exact_params, saved.shards[p], "exact_params");
        }
        // AdamW moments of what this rank updates: its shard (ZeRO-1) or everything.
        const int64_t lo = zero1_ ? shard_.offset : 0;
        for (size_t p = 0; p < parts.size(); p++) {
            dist::copy_saved_part(opt_->m().data(), lo, int64_t(opt_->m().size()), parts[p].m, saved.shards[p], "adam_m");
            dist::copy_saved_part(opt_->v().data(), lo, int64_t(opt_->v().size()), parts[p].v, saved.shards[p], "adam_v");
        }
    }
    // One optimizer step's gradients: with --total-batch-tokens > B*T all `accum` micro-batches are
    // accumulated (grads of the mean over all of them) and dumped ([accum*B, T], header B = accum*B).
    void dump_debug_state(const std::string& path, DataLoader& train, int64_t accum, int B, int T) {
        std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T), all_in, all_tg;
        std::vector<R> all_logits;
        const size_t NV = size_t(B) * T * size_t(cfg_.padded_vocab);
        model_.zero_grad();
        double loss = 0;
        for (int64_t a = 0; a < accum; a++) {
            train.next_batch(in.data(), tg.data());
            loss += model_.forward(in.data(), tg.data(), B, T);
            all_logits.insert(all_logits.end(), model_.logits(), model_.logits() + NV);
            all_in.insert(all_in.end(), in.begin(), in.end());
            all_tg.insert(all_tg.end(), tg.begin(), tg.end());
            model_.backward(1.0 / double(accum));
        }
        loss /= double(accum);
        save_debug_state(path, cfg_, model_.params.data(), all_in.data(), all_tg.data(), int(B * accum), T,
                         all_logits.data(), loss, model_.grads.data());
        std::printf("debug state (loss %.6f, %s) written to %s\n", loss, o_.dtype.c_str(), path.c_str());
    }

    json log_fields() {
        json j = json::object();
        if (W_ > 1) j["data_parallel"] = {{"world", W_}, {"zero", o_.zero}, {"accum_per_rank", 0}};
        return j;
    }
    std::string device() const { return strprintf("%d threads", omp_get_max_threads()); }
    void print_startup() {
        const ModelConfig& cfg = cfg_;
        if (W_ > 1)
            std::printf("data parallel: %d processes (%s), ZeRO-%d (AdamW shard of rank 0: %lld of %lld parameters)\n",
                        W_, dist::context().launcher.c_str(), zero1_ ? 1 : 0, (long long)(zero1_ ? shard_.count : n_),
                        (long long)n_);
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
                        cfg.ldm_delta, cfg.ldm_lambda_min, (long long)sp, cfg.ldm_mode.c_str(),
                        cfg.ldm_checkpoint_every, es * double(cpu::ldm_state_size(cfg)),
                        es * double(cpu::ldm_backward_state_values(cfg)),
                        es * double(cfg.n_sublayers() + 2) * double(cpu::ldm_state_size(cfg)),
                        es * double(cpu::ldm_state_size(cfg)));
        }
    }
    void step_begin() { cpu::reset_gemm_stats(); }
    void step_end() {
        if (steps_++ < 2) return;  // the loop's bench skips 2 warm-up steps too
        const cpu::GemmStats gs = cpu::gemm_stats();
        gemm_s_ += gs.seconds;
        gemm_flops_ += gs.flops;
    }
    // GEMM share of the step and the peak of the same BLAS in the same run (a square GEMM of R).
    json bench_fields(double step_ms, double) {
        const int64_t timed = std::max<int64_t>(1, steps_ - 2);
        const double gemm_s = gemm_s_ / double(timed), gemm_gflops = gemm_flops_ / double(timed) / gemm_s / 1e9;
        const int Np = 2048;
        std::vector<R> a(size_t(Np) * Np, R(0.5)), b(size_t(Np) * Np, R(0.25)), c(size_t(Np) * Np);
        cpu::gemm<R>(false, false, Np, Np, Np, R(1), a.data(), Np, b.data(), Np, R(0), c.data(), Np);  // warm-up
        auto p0 = std::chrono::steady_clock::now();
        const int reps = 5;
        for (int r = 0; r < reps; r++)
            cpu::gemm<R>(false, false, Np, Np, Np, R(1), a.data(), Np, b.data(), Np, R(0), c.data(), Np);
        const double ps = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
        const double peak = 2.0 * Np * Np * double(Np) * reps / ps / 1e9;
        return json{{"trainer", "cpu"}, {"gemm_ms", gemm_s * 1e3}, {"gemm_fraction", gemm_s / (step_ms / 1e3)},
                    {"gemm_gflops", gemm_gflops}, {"blas_peak_gflops", peak}, {"gemm_vs_peak", gemm_gflops / peak},
                    {"threads", omp_get_max_threads()}};
    }

   private:
    ModelConfig cfg_;
    const Options& o_;
    cpu::Model<R> model_;
    int W_, rank_;
    int64_t n_ = 0;
    bool zero1_ = false;
    dist::Shard shard_;
    std::unique_ptr<AdamW<R>> opt_;
    std::vector<R> gshard_;  // this rank's reduced gradient shard (W > 1)
    std::unique_ptr<ScoringModel> scorer_;
    int64_t steps_ = 0;
    double gemm_s_ = 0, gemm_flops_ = 0;
};

template <typename R>
int run(const Options& o, const ModelConfig& cfg, const Tokenizer* tok) {
    CpuBackend<R> be(cfg, o);
    return train_loop(o, cfg, tok, be);
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
    Options o;
    ArgParser ap("train_cpu", "Train the spec §1 backbone on the CPU (reference model). See doc/training.md.");
    add_common_train_flags(ap, o);
    ap.add("--dtype", &o.dtype, "fp32|fp64");
    ap.add("--threads", &o.threads, "OpenMP and BLAS threads (0 = all cores)");
    ap.add("--quiet", &o.quiet, "print only every 10th step line");
    ap.add("--dry-run", &o.dry_run, "print the parameter count and memory per token, allocate nothing, exit");
    ap.add("--dump-debug-state", &o.dump_debug_state,
           "write params, the first step's batch(es), logits, loss and all gradients to FILE (doc/formats.md) and "
           "exit; with --total-batch-tokens > B*T all micro-batches are accumulated and dumped");
    ap.add("--bench", &o.bench, "benchmark: time N steps (after 2 warm-up) and a peak sgemm; print BENCH json");
    ap.section("Data parallel (run under mpirun -np N; doc/distributed.md)");
    ap.add("--zero", &o.zero, "0: every rank keeps the full AdamW state; 1: ZeRO-1, each rank keeps and updates a shard");
    ap.add("--dist-selftest", &o.dist_selftest, "check the MPI collectives and exit");
    if (!ap.parse(argc, argv)) return 0;
    if (dist::world() > 1 && !dist::context().mpi)
        throw Error(strprintf("%d processes launched by '%s' without MPI: the CPU trainer needs MPI for its "
                              "collectives (mpirun, or srun --mpi=pmix)",
                              dist::world(), dist::context().launcher.c_str()));
    if (o.dist_selftest) return dist_selftest();
    // Only rank 0 prints to stdout (errors still go to every rank's stderr).
    if (dist::rank() != 0 && !std::freopen("/dev/null", "w", stdout)) throw Error("cannot silence stdout");

    check_train_flags(o);
    if (o.dtype != "fp32" && o.dtype != "fp64") throw Error("--dtype must be fp32 or fp64, got '" + o.dtype + "'");
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
    const int64_t bt = int64_t(o.B) * o.T, np = count_params(cfg);
    const double es = o.dtype == "fp64" ? 8 : 4;
    // activations per token, plus the LM head's fixed gradient tile (cpu/ops.h lm_head_ce_backward)
    const double state = 4.0 * double(np) * es,
                 act = double(activation_values_per_token(cfg, o.T)) * es * double(bt) +
                       double(cpu::lm_head_ce_scratch_values(bt, V)) * es;
    if (o.dry_run) {
        std::printf("%s", describe(cfg, o.T).c_str());
        std::printf("training memory (%s): params+grads+AdamW m,v = %.3f GiB; activations %.1f KiB/token "
                    "= %.3f GiB per micro-batch of B*T = %lld tokens\n",
                    o.dtype.c_str(), state / (1 << 30), act / double(bt) / 1024, act / (1 << 30), (long long)bt);
        return 0;
    }
    // Refuse before allocating (and before a minute of initialisation) what this machine cannot hold.
    check_memory_fits(int64_t(state + act), "training " + cfg.preset + " (" + o.dtype + ", B*T = " +
                                                std::to_string(bt) + ")",
                      strprintf("params+grads+AdamW %.2f GiB, activations %.2f GiB", state / (1 << 30), act / (1 << 30)));
    return o.dtype == "fp64" ? run<double>(o, cfg, tok.get()) : run<float>(o, cfg, tok.get());
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
