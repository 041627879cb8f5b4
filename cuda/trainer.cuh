// cuda/trainer.cuh — the training loop shared by the GPU trainers (train_gpt_baselines.cu,
// train_ldm.cu). It mirrors train_cpu.cpp: same flags (plus --dtype bf16|fp32, --recompute,
// --attn-variant, --gpu-info), same JSONL log (core/logger), same checkpoint files
// (core/checkpoint: LDMMODEL with the fp32 master weights, LDMSTATE with fp32 AdamW m, v, loader and
// RNG state), same data loader (core/dataloader), same debug dump (LDMDEBUG, fp32), same
// in-training evaluation (core/eval through a GPU ScoringModel). A checkpoint written by one
// trainer loads in the other. Flags and data flow: doc/cuda.md "Trainer", doc/training.md.
//
// Exit codes: 0 ok; 1 error (bad flags, data, checkpoint: "error: ..." on stderr); 2 no usable
// CUDA GPU (--help, --dry-run work without one; --gpu-info prints the device or exits 2).
#pragma once
#include <glob.h>
#include <omp.h>
#include <sys/stat.h>

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
#include "core/dataloader.h"
#include "core/dist.h"
#include "core/eval.h"
#include "core/logger.h"
#include "core/optim.h"
#include "core/shard.h"
#include "core/tokenizer.h"
#include "core/train_flags.h"
#include "cuda/adamw.cuh"
#include "cuda/common.cuh"
#include "cuda/gpt.cuh"
#include "cuda/infer_cli.cuh"
#include "cuda/matmul.cuh"
#include "cuda/nccl.cuh"

namespace ldm {
namespace gpu {

struct TrainOptions {
    // model
    std::string preset = "tiny";
    int n_layer = 0, d_model = 0, n_head = 0, n_kv_head = 0, head_dim = 0, ffn = 0;
    std::string scheme = "preln";
    int hc_streams = 4, sinkhorn_iters = 20, attnres_blocks = 8;
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
    int64_t eval_every = 0, eval_max_examples = 0;
    std::string eval_lambada, eval_wikitext, eval_hellaswag;
    int64_t sample_every = 0;
    int sample_tokens = 64;
    int64_t ckpt_every = 0;
    std::string out_dir, resume, log;
    int64_t seed = 1337;
    std::string dtype = "bf16";
    int threads = 0;
    bool dry_run = false, unigram_baseline = false, quiet = false;
    std::string dump_debug_state;
    int64_t bench = 0;
    // GPU only
    int recompute = 0, attn_variant = -1;
    bool gpu_info = false;
    // data parallel (doc/distributed.md): one process per GPU under mpirun/srun
    int zero = 0;               // 1: ZeRO-1 (AdamW state sharded over the ranks)
    bool nccl = false;          // NCCL path even with one GPU (measures its cost)
    std::string nccl_id_file;   // share the NCCL id through this file (launchers without MPI)
    int nccl_overlap = 0;       // 1: per-bucket reduction overlapped with backward (GpuDataParallel)
    // generation / inference benchmark instead of training (cuda/infer_cli.cuh)
    InferOptions infer;
};

namespace trainer_detail {

inline std::string dirname_of(const std::string& p) {
    size_t s = p.find_last_of('/');
    return s == std::string::npos ? "." : p.substr(0, s);
}

inline std::vector<std::string> glob_files(const std::string& pattern) {
    glob_t g;
    std::vector<std::string> out;
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) out.push_back(g.gl_pathv[i]);
    globfree(&g);
    return out;
}

// The sampling RNG of train_cpu (splitmix64, whole state one uint64 saved in the training state).
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

inline double unigram_baseline(const std::string& train_glob, const std::vector<int32_t>& val_targets, uint32_t V) {
    std::vector<double> counts(V, 1.0);
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

inline nlohmann::json options_json(const TrainOptions& o) {
    return nlohmann::json{
        {"preset", o.preset}, {"scheme", o.scheme}, {"train_data", o.train_data}, {"val_data", o.val_data},
        {"tokenizer", o.tokenizer}, {"B", o.B}, {"T", o.T}, {"total_batch_tokens", o.total_batch_tokens},
        {"steps", o.steps}, {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio}, {"warmup_steps", o.warmup_steps},
        {"schedule", o.schedule}, {"wsd_decay_frac", o.wsd_decay_frac}, {"weight_decay", o.weight_decay},
        {"beta1", o.beta1}, {"beta2", o.beta2}, {"adam_eps", o.adam_eps}, {"grad_clip", o.grad_clip},
        {"val_every", o.val_every}, {"val_batches", o.val_batches}, {"sample_every", o.sample_every},
        {"sample_tokens", o.sample_tokens}, {"ckpt_every", o.ckpt_every}, {"out_dir", o.out_dir},
        {"resume", o.resume}, {"seed", o.seed}, {"dtype", o.dtype}, {"threads", o.threads},
        {"recompute", o.recompute}, {"attn_variant", o.attn_variant}};
}

// Same keys as train_cpu's resume_flags: a CPU fp32 checkpoint resumes on the GPU with
// --dtype fp32 and vice versa; bf16 <-> fp32 is refused (dtype differs).
inline nlohmann::json resume_flags(const TrainOptions& o, const ModelConfig& cfg) {
    return nlohmann::json{{"config", config_to_json(cfg)}, {"dtype", o.dtype}, {"B", o.B}, {"T", o.T},
                          {"total_batch_tokens", o.total_batch_tokens}, {"seed", o.seed},
                          {"train_data", o.train_data}, {"steps", o.steps}, {"lr", o.lr},
                          {"min_lr_ratio", o.min_lr_ratio}, {"warmup_steps", o.warmup_steps},
                          {"schedule", o.schedule}, {"wsd_decay_frac", o.wsd_decay_frac},
                          {"weight_decay", o.weight_decay}, {"beta1", o.beta1}, {"beta2", o.beta2},
                          {"adam_eps", o.adam_eps}, {"grad_clip", o.grad_clip}};
}

inline std::string to_bytes(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
inline void from_bytes(std::vector<float>& v, const std::string& b, const std::string& what) {
    if (b.size() != v.size() * sizeof(float))
        throw Error("resume: " + what + " has the wrong size (the GPU trainer keeps fp32 AdamW moments)");
    std::memcpy(v.data(), b.data(), b.size());
}

// ScoringModel over the GPU model: logits-only forwards in chunks of rows that fit the allocated
// B_max x T_max, then the per-row log-softmax gather on the host (core/eval row_logprob).
template <typename T>
class GpuScoringModel : public ScoringModel {
   public:
    explicit GpuScoringModel(GPT<T>& m) : m_(m) {}
    int max_seq_len() const override { return m_.T_max(); }
    uint32_t vocab_size() const override { return uint32_t(m_.cfg.vocab_size); }
    void forward_logprobs(const int32_t* tokens, const int32_t* targets, int B, int T_, double* logprob,
                          uint8_t* is_argmax) override {
        if (T_ > m_.T_max()) throw Error(strprintf("GPU scoring: T=%d exceeds %d", T_, m_.T_max()));
        const int rows = int(std::max<int64_t>(1, (int64_t)m_.B_max() * m_.T_max() / T_));
        const int V = m_.cfg.vocab_size, Vp = m_.cfg.padded_vocab;
        for (int b0 = 0; b0 < B; b0 += rows) {
            const int nb = std::min(rows, B - b0);
            const int64_t o = int64_t(b0) * T_;
            m_.forward(tokens + o, nullptr, nb, T_, 0.0);
            std::vector<float> lg = m_.logits_host();
            for (int64_t i = 0; i < int64_t(nb) * T_; i++) {
                if (targets[o + i] < 0) continue;
                logprob[o + i] = row_logprob<float>(lg.data() + i * Vp, V, targets[o + i], is_argmax + o + i);
            }
        }
    }

   private:
    GPT<T>& m_;
};

// Sampling exactly as train_cpu: from <|endoftext|>, temperature 1 over the real V, one forward of
// B=1 over a fixed window of Ts tokens per generated token.
template <typename T>
std::string sample_text(GPT<T>& model, const Tokenizer* tok, uint32_t eot, int n_tokens, int Tmax, Rng& rng) {
    const int Ts = std::min(Tmax, n_tokens + 1);
    const int V = model.cfg.vocab_size;
    std::vector<int32_t> ctx((size_t)Ts, (int32_t)eot);
    std::vector<uint32_t> out;
    int len = 1;
    std::vector<double> p((size_t)V);
    for (int i = 0; i < n_tokens && len <= Ts; i++) {
        model.forward(ctx.data(), nullptr, 1, Ts, 0.0);
        std::vector<float> lg = model.logits_row(len - 1);
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

// Model FLOPs per token (spec performance.md; doc/cuda.md "MFU"):
//   6·N_nonembed + 6·N_embed_head + 12·n_layer·d·T
// N_nonembed: backbone blocks + final norm + scheme parameters; N_embed_head = Vp·d (the LM head
// GEMM; the embedding lookup costs no FLOPs); 12·n_layer·d·T: attention scores and values.
inline double model_flops_per_token(const ModelConfig& c, int T) {
    ParamCounts pc = count_params_detailed(c);
    return 6.0 * double(pc.backbone_nonembed + pc.scheme) + 6.0 * double(c.padded_vocab) * c.d_model +
           12.0 * c.n_layer * double(c.d_model) * T;
}

// Peak bf16 TFLOP/s of this device: median of 10 timed 8192^3 bf16 GEMMs (C = A·Bᵀ, fp32
// accumulation) through the same cuBLASLt wrapper, after 3 warm-up calls.
inline double measure_peak_bf16_tflops(cudaStream_t s) {
    const int64_t n = 8192;
    DeviceBuffer<bf16> A(n * n), Bm(n * n), C(n * n);
    fill<bf16>(A.ptr, n * n, 0.01f, s);
    fill<bf16>(Bm.ptr, n * n, 0.02f, s);
    Matmul mm;
    float ms = time_median_ms(
        [&] { mm.gemm<bf16, bf16>(false, true, n, n, n, 1.0f, A.ptr, n, Bm.ptr, n, 0.0f, C.ptr, n, nullptr, s); },
        3, 10, s);
    return 2.0 * double(n) * n * n / (ms / 1e3) / 1e12;
}

inline double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

template <typename T>
int run(const TrainOptions& o, const ModelConfig& cfg, const Tokenizer* tok) {
    using nlohmann::json;
    const int B = o.B, T_ = o.T;
    const int64_t accum = o.total_batch_tokens / (int64_t(B) * T_);  // micro-batches per step, all ranks
    // Data parallel (cuda/nccl.cuh GpuDataParallel): rank r of W runs accum / W micro-batches.
    const dist::Context& dctx = dist::context();
    const int W = dctx.world, rank = dctx.rank;
    if (accum % W != 0)
        throw Error(strprintf("data parallel: the %lld micro-batches of B*T per step are not divisible by the world size %d",
                              (long long)accum, W));
    const int64_t accum_local = accum / W;
    const uint32_t V = uint32_t(cfg.vocab_size);
    const uint32_t eot = tok ? tok->eot_id() : V - 1;

    if (o.train_data.empty()) throw Error("--train-data is required (a glob of token shards)");
    if (glob_files(o.train_data).empty()) throw Error("--train-data: no files match '" + o.train_data + "'");
    DataLoader train(o.train_data, B, T_, rank, W, true, uint64_t(o.seed), V);
    std::unique_ptr<DataLoader> val;
    if (!o.val_data.empty()) {
        if (glob_files(o.val_data).empty()) throw Error("--val-data: no files match '" + o.val_data + "'");
        val.reset(new DataLoader(o.val_data, B, T_, rank, W, false, 0, V));
    }
    // global count; rank r scores the windows with index = r mod W
    const int val_batches =
        val ? int(std::min<uint64_t>(uint64_t(o.val_batches), val->batches_per_epoch() * uint64_t(W))) : 0;
    const int val_batches_local = val_batches > rank ? (val_batches - rank + W - 1) / W : 0;

    const int dev = local_device(dctx);  // the GPU of this rank on its node
    CUDA_CHECK(cudaSetDevice(dev));
    const std::string device = device_description(dev);
    GPT<T> model(cfg, B, T_, o.recompute, o.attn_variant);
    model.init(uint64_t(o.seed));
    const int64_t n = model.n_params;
    GpuDataParallel dp;
    dp.init(dctx, n, o.zero, o.nccl, o.nccl_id_file, o.nccl_overlap != 0);
    dp.plan_overlap(model.specs, cfg.n_layer, model.grads.ptr, kNcclMinBucketElems);
    // first fp32 master element the schemes read (their parameters follow the backbone's); n = none
    int64_t scheme_lo = n;
    for (const auto& s : model.specs)
        if (s.name.rfind("scheme.", 0) == 0) scheme_lo = std::min(scheme_lo, s.offset);

    // AdamW state (fp32) and the per-range weight-decay flags (adjacent tensors merged).
    DeviceBuffer<float> m_buf(dp.state_len()), v_buf(dp.state_len()), nscratch(std::max<int64_t>(global_norm_scratch(), 1)),
        norm_out(1);
    CUDA_CHECK(cudaMemset(m_buf.ptr, 0, (size_t)m_buf.bytes()));
    CUDA_CHECK(cudaMemset(v_buf.ptr, 0, (size_t)v_buf.bytes()));
    std::vector<ParamRange> ranges;
    for (const auto& s : model.specs) {
        if (!ranges.empty() && ranges.back().decay == s.decay &&
            ranges.back().offset + ranges.back().numel == s.offset)
            ranges.back().numel += s.numel;
        else
            ranges.push_back({s.offset, s.numel, s.decay});
    }
    AdamWConfig ac;
    ac.beta1 = o.beta1;
    ac.beta2 = o.beta2;
    ac.eps = o.adam_eps;
    ac.weight_decay = o.weight_decay;
    ac.grad_clip = o.grad_clip;
    ac.validate();
    int64_t adam_t = 0;
    LRSchedule sched;
    sched.kind = o.schedule;
    sched.lr = o.lr;
    sched.min_lr_ratio = o.min_lr_ratio;
    sched.warmup_steps = o.warmup_steps;
    sched.total_steps = o.steps;
    sched.wsd_decay_frac = o.wsd_decay_frac;
    sched.validate();
    cudaStream_t st = model.stream;
    // One AdamW step on the device; returns the global gradient norm before clipping.
    // With W > 1 the gradients are first summed over the ranks (GpuDataParallel::reduce_grads);
    // ZeRO-1 updates only this rank's slice [own_off, own_off + own_count), then all-gathers.
    auto opt_step = [&](double lr) -> double {
        float* g = dp.reduce_grads(model.grads.ptr, st);
        global_norm_squared(norm_out.ptr, nscratch.ptr, g, dp.own_count, st);
        std::vector<float> sq = download(norm_out.ptr, 1);
        const double norm = std::sqrt(dp.zero1 ? dp.sum(double(sq[0]), st) : double(sq[0]));
        double clip = 1.0;
        if (ac.grad_clip > 0 && norm > ac.grad_clip) clip = ac.grad_clip / norm;
        adam_t += 1;
        T* copy = sizeof(T) == sizeof(float) ? nullptr : model.work.ptr;
        for (const auto& r : ranges) {
            const int64_t a = std::max(r.offset, dp.own_off);
            const int64_t b = std::min(r.offset + r.numel, dp.own_off + dp.own_count);
            if (b <= a) continue;
            const int64_t k = a - dp.own_off;  // index in this rank's state and reduced gradients
            // doubles, rounded inside exactly as core/optim.cpp does (bit-identical update formula)
            adamw_update<T>(model.master.ptr + a, copy ? copy + a : nullptr, m_buf.ptr + k, v_buf.ptr + k, g + k,
                            b - a, lr, ac.beta1, ac.beta2, ac.eps, r.decay ? ac.weight_decay : 0.0, clip, adam_t, st);
        }
        if (dp.zero1 && dp.overlap) {
            dp.gather_params<T>(copy, model.master.ptr, scheme_lo, st);  // bf16 working copy (+ scheme fp32)
        } else if (dp.zero1) {
            dp.allgather_master(model.master.ptr, st);
            model.refresh_working_copy();
        }
        CUDA_CHECK(cudaStreamSynchronize(st));
        return norm;
    };

    Rng rng;
    rng.s = uint64_t(o.seed) ^ 0x5eed5a3b1e000000ull;
    int64_t start_step = 0;
    const json rflags = resume_flags(o, cfg);

    if (!o.resume.empty()) {
        // ckpt_<s>.model + .state (one process) or the rank shards + .done marker (doc/distributed.md);
        // any world size resumes from either (the AdamW moments are cut for this rank).
        const std::string base = dist::checkpoint_base(o.resume), mpath = base + ".model";
        ModelCheckpoint mc = load_model(mpath);
        std::string d = config_diff(mc.cfg, cfg);
        if (!d.empty())
            throw Error("--resume " + mpath + ": the checkpoint's model config differs from the command line (" + d + ")");
        const dist::SavedState saved = dist::load_saved_state(base, n, mc.step, rflags);
        for (const TrainState& ts : saved.parts)
            if (!ts.exact_params.empty() || ts.dtype != "fp32")
                throw Error("--resume: " + base + " holds fp64 training state; the GPU trainer resumes fp32 states only");
        model.set_master(mc.params.data());
        const int64_t len = dp.state_len();
        std::vector<float> hm((size_t)len, 0.0f), hv((size_t)len, 0.0f);
        for (size_t p = 0; p < saved.parts.size(); p++) {
            dist::copy_saved_part(hm.data(), dp.own_off, dp.own_count, saved.parts[p].m, saved.shards[p], "adam_m");
            dist::copy_saved_part(hv.data(), dp.own_off, dp.own_count, saved.parts[p].v, saved.shards[p], "adam_v");
        }
        CUDA_CHECK(cudaMemcpy(m_buf.ptr, hm.data(), size_t(len) * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(v_buf.ptr, hv.data(), size_t(len) * 4, cudaMemcpyHostToDevice));
        adam_t = mc.step;
        if (saved.world == W) {
            train.load_state(saved.parts[size_t(rank)].loader_state);
        } else {  // another world size: replay this rank's share of the consumed batches
            std::vector<int32_t> xi(size_t(B) * T_), yi(size_t(B) * T_);
            for (int64_t k = 0; k < mc.step * accum_local; k++) train.next_batch(xi.data(), yi.data());
        }
        rng.s = saved.parts[0].rng_state[0];
        start_step = mc.step;
        std::printf("resumed from %s at step %lld", mpath.c_str(), (long long)start_step);
        if (saved.world != W) std::printf(" (resharded: saved by %d process%s, now %d)", saved.world, saved.world == 1 ? "" : "es", W);
        std::printf("\n");
    }

    std::vector<int32_t> inputs(size_t(B) * T_), targets(size_t(B) * T_);

    if (!o.dump_debug_state.empty()) {
        if (W > 1) throw Error("--dump-debug-state is for a single process (run it without mpirun)");
        // One optimizer step's gradients. With --total-batch-tokens > B*T the `accum` micro-batches
        // are accumulated (grads of the mean over all of them) and the dump holds all of them:
        // inputs/targets/logits [accum*B, T] (header B = accum*B).
        model.zero_grad();
        std::vector<int32_t> all_in, all_tg;
        std::vector<float> all_logits;
        double loss = 0;
        for (int64_t a = 0; a < accum; a++) {
            train.next_batch(inputs.data(), targets.data());
            loss += model.forward(inputs.data(), targets.data(), B, T_, 0.0);
            std::vector<float> lg = model.logits_host();
            all_logits.insert(all_logits.end(), lg.begin(), lg.end());
            all_in.insert(all_in.end(), inputs.begin(), inputs.end());
            all_tg.insert(all_tg.end(), targets.begin(), targets.end());
            model.backward(1.0 / double(accum));
        }
        loss /= double(accum);
        std::vector<float> params = model.get_master(), grads = model.get_grads();
        save_debug_state<float>(o.dump_debug_state, cfg, params.data(), all_in.data(), all_tg.data(),
                                int(B * accum), T_, all_logits.data(), loss, grads.data());
        std::printf("debug state (step %lld, loss %.6f, %s) written to %s\n", (long long)start_step, loss,
                    o.dtype.c_str(), o.dump_debug_state.c_str());
        return 0;
    }

    if (!o.out_dir.empty()) mkdir_p(o.out_dir);
    JsonlLogger logger;
    if (!o.log.empty() && rank == 0) {  // only rank 0 logs
        mkdir_p(dirname_of(o.log));
        logger = JsonlLogger(o.log, start_step > 0);
        if (start_step > 0)
            logger.log({{"type", "resume"}, {"step", start_step}, {"from", o.resume}});
        else
            logger.log({{"type", "config"}, {"config", config_to_json(cfg)}, {"args", options_json(o)},
                        {"param_count", n}, {"accum_steps", accum}, {"threads", omp_get_max_threads()},
                        {"device", device},
                        {"data_parallel", {{"world", W}, {"zero", dp.zero1 ? 1 : 0}, {"nccl", dp.nccl},
                                           {"overlap", dp.overlap}, {"buckets", dp.buckets.size()}}}});
    }

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
    GpuScoringModel<T> scorer(model);
    auto run_evals = [&](int64_t step) {
        if (rank != 0) return;  // evaluations run on rank 0 only
        json r = run_eval_suite(scorer, esuite, esets);
        std::printf("step %6lld | eval\n%s", (long long)step, format_results_table(r).c_str());
        logger.log({{"type", "eval"}, {"step", step}, {"results", r}});
    };

    std::printf("model %s (%s, %s): %lld parameters | B=%d T=%d accum=%lld -> %lld tokens/step | %lld steps | %s\n",
                cfg.preset.c_str(), cfg.scheme.c_str(), o.dtype.c_str(), (long long)n, B, T_, (long long)accum,
                (long long)o.total_batch_tokens, (long long)o.steps, device.c_str());
    if (dp.nccl)
        std::printf("data parallel: %d GPU process%s (%s), %lld micro-batches per rank per step, ZeRO-%d, NCCL %d, %s\n", W,
                    W == 1 ? "" : "es", dctx.launcher.c_str(), (long long)accum_local, dp.zero1 ? 1 : 0,
                    NCCL_VERSION_CODE,
                    dp.overlap ? strprintf("reduction overlapped with backward (%zu buckets)", dp.buckets.size()).c_str()
                               : "reduction after backward");
    {
        GptMemory mem = model.memory();
        const double tok_mb = double(B) * T_;
        std::printf("memory: params %.3f GiB (fp32 master%s) | grads %.3f GiB | AdamW m,v %.3f GiB | activations "
                    "%.1f KiB/token (%.3f GiB) | logits %.1f KiB/token (%.3f GiB) | scheme %s %lld B/token "
                    "(%.3f GiB) | recompute %d | allocated %.3f GiB\n",
                    gib(mem.params), sizeof(T) == 4 ? "" : " + bf16 copy", gib(mem.grads), gib(mem.adamw),
                    mem.act_per_token / 1024.0, gib(mem.act_per_token * tok_mb), mem.logits_per_token / 1024.0,
                    gib(mem.logits_per_token * tok_mb), cfg.scheme.c_str(), (long long)mem.scheme_per_token,
                    gib(mem.scheme_per_token * tok_mb), o.recompute,
                    gib(double(model.allocated_bytes() + m_buf.bytes() + v_buf.bytes())));
    }

    double unigram = NAN;
    if (o.unigram_baseline && val && rank == 0) {
        std::vector<int32_t> vt;
        DataLoader uval(o.val_data, B, T_, 0, 1, false, 0, V);  // all val windows (the ranks' union)
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
            s += model.forward(inputs.data(), targets.data(), B, T_, 0.0);
        }
        return dp.sum(s, st) / val_batches;  // one GPU: s
    };
    auto save_ckpt = [&](int64_t step) {
        if (o.out_dir.empty()) return;
        std::string base = o.out_dir + strprintf("/ckpt_%06lld", (long long)step);
        // ZeRO-1 overlap path: the fp32 master is complete only in this rank's slice (and the scheme
        // range); gather it first (the flat path all-gathers it every step)
        if (dp.zero1 && dp.overlap) dp.allgather_master(model.master.ptr, st);
        std::vector<float> p = model.get_master();  // complete on every rank
        if (rank == 0) save_model<float>(base + ".model", cfg, p.data(), step);
        TrainState ts;
        ts.step = step;
        ts.dtype = "fp32";  // dtype of m, v (always fp32 on the GPU)
        ts.flags = rflags;
        std::vector<float> hm, hv;  // full AdamW moments [n]
        if (dp.zero1) {
            DeviceBuffer<float> full(n);
            dp.allgather_full(full.ptr, st, m_buf.ptr);
            hm = download(full.ptr, n);
            dp.allgather_full(full.ptr, st, v_buf.ptr);
            hv = download(full.ptr, n);
        } else {
            hm = download(m_buf.ptr, n);
            hv = download(v_buf.ptr, n);
        }
        ts.loader_state = train.save_state();
        ts.rng_state = {rng.s};
        const std::string name = base.substr(base.find_last_of('/') + 1);
        std::vector<std::string> states;
        if (W == 1) {
            ts.m = to_bytes(hm);
            ts.v = to_bytes(hv);
            save_train_state(base + ".state", ts);
            states.push_back(name + ".state");
        } else {  // rank r writes its slice dist::shard_range(n, W, r), the layout of train_cpu
            const dist::Shard sh = dist::shard_range(n, W, rank);
            ts.m = std::string(reinterpret_cast<const char*>(hm.data() + sh.offset), size_t(sh.count) * 4);
            ts.v = std::string(reinterpret_cast<const char*>(hv.data() + sh.offset), size_t(sh.count) * 4);
            ts.extra = {{"world", W}, {"rank", rank}, {"zero", dp.zero1 ? 1 : 0}, {"param_count", n},
                        {"shard_offset", sh.offset}, {"shard_count", sh.count}};
            save_train_state(dist::shard_state_path(base, rank, W), ts);
            for (int q = 0; q < W; q++) states.push_back(name + strprintf(".state.rank%dof%d", q, W));
        }
        dp.barrier(st);  // every file is complete before the marker says so
        if (rank == 0) dist::write_checkpoint_marker(base, step, W, dp.zero1 ? 1 : 0, n, "fp32", states);
        std::printf("checkpoint written: %s.model / %s / .done\n", base.c_str(), W == 1 ? ".state" : ".state.rank*");
        logger.log({{"type", "checkpoint"}, {"step", step}, {"path", base}});
    };

    size_t free0 = 0, total0 = 0;
    CUDA_CHECK(cudaMemGetInfo(&free0, &total0));
    int64_t peak_used = int64_t(total0 - free0);
    double last_val = NAN, bench_ms = 0;
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
            std::string s = sample_text(model, tok, eot, o.sample_tokens, T_, rng);
            std::printf("step %6lld | sample: %s\n", (long long)step, s.c_str());
            logger.log({{"type", "sample"}, {"step", step}, {"text", s}});
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        auto t0 = std::chrono::steady_clock::now();
        model.zero_grad();
        double loss = 0;
        for (int64_t a = 0; a < accum_local; a++) {
            train.next_batch(inputs.data(), targets.data());
            loss += model.forward(inputs.data(), targets.data(), B, T_, 1.0 / double(accum));
            // overlap path: the last micro-batch's backward starts each bucket's reduction as soon
            // as its gradients are final (cuda/nccl.cuh GpuDataParallel::on_grads_final)
            const bool hook = dp.overlap && a + 1 == accum_local;
            if (hook) model.grad_hook = [&](int stage) { dp.on_grads_final(stage, st); };
            model.backward(1.0 / double(accum));
            if (hook) model.grad_hook = nullptr;
        }
        dp.finish_reduction(st);                  // the compute stream waits for the reductions
        loss = dp.sum(loss, st) / double(accum);  // one GPU: loss / accum
        if (step == start_step) {
            size_t f = 0, t = 0;
            CUDA_CHECK(cudaMemGetInfo(&f, &t));
            peak_used = std::max<int64_t>(peak_used, int64_t(t - f));
        }
        const double lr = sched.lr_at(step);
        const double gnorm = opt_step(lr);
        auto t1 = std::chrono::steady_clock::now();
        const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        const double tps = double(o.total_batch_tokens) / (ms / 1e3);
        if (!std::isfinite(loss)) throw Error(strprintf("loss is %g at step %lld (diverged)", loss, (long long)step));
        if (!o.quiet || last || step % 10 == 0)
            std::printf("step %6lld/%lld | loss %.6f | lr %.3e | grad norm %.4f | %.1f ms | %.0f tok/s\n",
                        (long long)(step + 1), (long long)o.steps, loss, lr, gnorm, ms, tps);
        json jstep{{"type", "step"}, {"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", gnorm}, {"ms", ms},
                   {"tokens_per_s", tps}, {"tokens", (step + 1) * o.total_batch_tokens}};
        const auto sm = model.scheme().metrics();
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
        if (o.bench > 0 && step - start_step >= 2) {
            bench_ms += ms;
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
        std::string s = sample_text(model, tok, eot, o.sample_tokens, T_, rng);
        std::printf("sample: %s\n", s.c_str());
        logger.log({{"type", "sample"}, {"step", o.steps}, {"text", s}});
    }
    if (o.steps > start_step && o.bench == 0) save_ckpt(o.steps);
    if (o.bench > 0 && bench_n > 0) {
        const double step_s = bench_ms / 1e3 / double(bench_n);
        const double tps = double(o.total_batch_tokens) / step_s;
        const double fpt = model_flops_per_token(cfg, T_);
        const double peak = measure_peak_bf16_tflops(st);
        const double achieved = fpt * tps / 1e12;
        json r{{"type", "bench"}, {"trainer", "gpu"}, {"preset", cfg.preset}, {"scheme", cfg.scheme},
               {"dtype", o.dtype}, {"B", B}, {"T", T_}, {"accum", accum}, {"recompute", o.recompute},
               {"steps_timed", bench_n}, {"tokens_per_s", tps}, {"step_ms", step_s * 1e3},
               {"model_flops_per_token", fpt}, {"achieved_tflops", achieved}, {"peak_bf16_tflops", peak},
               {"mfu", achieved / peak}, {"peak_mem_gib", gib(double(peak_used))},
               {"alloc_gib", gib(double(model.allocated_bytes() + m_buf.bytes() + v_buf.bytes()))},
               {"scheme_bytes_per_token", model.scheme().extra_bytes_per_token()}, {"device", device}};
        std::printf("BENCH %s\n", r.dump().c_str());
        logger.log(r);
    }
    return 0;
}

}  // namespace trainer_detail

// main() of a GPU trainer: parses the flags (train_cpu's, plus the GPU ones), checks for a GPU
// and runs the loop with T = bf16 or float. default_scheme: --scheme's default (shown by --help).
inline int trainer_main_body(int argc, char** argv, const char* program, const char* description,
                             const char* default_scheme) {
    using namespace trainer_detail;
    try {
        TrainOptions o;
        o.scheme = default_scheme;
        ArgParser ap(program, description);
        add_common_train_flags(ap, o);
        ap.add("--dtype", &o.dtype, "bf16 (bf16 activations and working weights, fp32 master/grads/AdamW) | fp32");
        ap.add("--threads", &o.threads, "OpenMP threads of the host-side work (0 = all cores)");
        ap.add("--quiet", &o.quiet, "print only every 10th step line");
        ap.add("--dry-run", &o.dry_run, "print the parameter count and memory estimates, allocate nothing, exit (no GPU needed)");
        ap.add("--dump-debug-state", &o.dump_debug_state,
               "write params, first batch(es), logits, loss and all gradients (fp32) to FILE and exit; with "
               "--total-batch-tokens > B*T all micro-batches are accumulated and dumped");
        ap.add("--bench", &o.bench,
               "benchmark: time N steps (after 2 warm-up), measure the bf16 GEMM peak, print BENCH json "
               "(tokens/s, MFU, peak memory)");
        ap.section("GPU");
        ap.add("--recompute", &o.recompute,
               "activation recompute in backward: 0 off | 1 SwiGLU output | 2 also the RMSNorm outputs");
        ap.add("--attn-variant", &o.attn_variant, "attention kernel variant (-1 = best for the shape)");
        ap.add("--gpu-info", &o.gpu_info, "print the CUDA device and exit (exit code 2 without a GPU)");
        ap.section("Data parallel (one process per GPU under mpirun / srun; doc/distributed.md)");
        ap.add("--zero", &o.zero, "0: gradients all-reduced, full AdamW on every GPU; 1: ZeRO-1 (reduce-scatter, "
                                  "sharded AdamW state, parameter all-gather)");
        ap.add("--nccl", &o.nccl, "use the NCCL path even on one GPU (to measure its cost)");
        ap.add("--nccl-id-file", &o.nccl_id_file,
               "share the NCCL unique id through this file (shared filesystem) when launched without MPI");
        ap.add("--nccl-overlap", &o.nccl_overlap,
               "1: reduce the gradients bucket by bucket (about one block each) on a second stream during the "
               "backward pass, ZeRO-1 gathers the bf16 working copy; 0: one reduction after backward (fp32 gather)");
        add_infer_flags(ap, o.infer);
        if (!ap.parse(argc, argv)) return 0;
        if (o.zero != 0 && o.zero != 1) throw Error(strprintf("--zero must be 0 or 1, got %d", o.zero));
        if (o.nccl_overlap != 0 && o.nccl_overlap != 1)
            throw Error(strprintf("--nccl-overlap must be 0 or 1, got %d", o.nccl_overlap));
        // Only rank 0 prints to stdout (errors still go to every rank's stderr).
        if (dist::rank() != 0 && !std::freopen("/dev/null", "w", stdout)) throw Error("cannot silence stdout");

        if (o.gpu_info) {
            if (!gpu_available()) {
                std::printf("no GPU: no usable CUDA device\n");
                return 2;
            }
            std::printf("%s\n", device_description(0).c_str());
            return 0;
        }
        if (o.B <= 0) throw Error(strprintf("-B/--batch-size must be > 0, got %d", o.B));
        if (o.T <= 0) throw Error(strprintf("-T/--seq-len must be > 0, got %d", o.T));
        if (o.dtype != "fp32" && o.dtype != "bf16") throw Error("--dtype must be bf16 or fp32, got '" + o.dtype + "'");
        if (o.recompute < 0 || o.recompute > 2) throw Error(strprintf("--recompute must be 0, 1 or 2, got %d", o.recompute));
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
        omp_set_num_threads(o.threads > 0 ? o.threads : omp_get_num_procs());
        if (o.infer.active()) check_infer_options(o.infer, o.resume, o.T);  // flag errors even without a GPU

        std::unique_ptr<Tokenizer> tok = load_tokenizer_flag(o.tokenizer);
        if (!tok && !o.dry_run && !o.infer.active())  // inference without one: V = 50257, token ids only
            throw Error("--tokenizer: none given and no gpt2_tokenizer in the data directory");
        const int V = tok ? int(tok->vocab_size()) : 50257;

        ModelConfig cfg = model_config_from_flags(o, V);
        check_gpu_scheme(cfg);
        if (o.attn_variant < -1 || o.attn_variant == 0)
            throw Error(strprintf("--attn-variant must be -1 (auto) or 1, 2, 3, got %d", o.attn_variant));
        if (o.attn_variant > 0) {  // throws when the variant does not support this dtype / head_dim
            if (o.dtype == "bf16") attention_variant<bf16>(cfg.head_dim, o.attn_variant);
            else attention_variant<float>(cfg.head_dim, o.attn_variant);
        }
        check_output_flags(o, false);

        if (o.dry_run) {
            std::printf("%s", describe(cfg, o.T).c_str());
            const int64_t es = o.dtype == "bf16" ? 2 : 4;
            GptMemory m = gpt_memory_estimate(cfg, o.recompute, es, 0);
            const double tk = double(bt);
            std::printf("GPU training memory (%s, recompute %d, B*T = %lld tokens): params %.3f GiB, grads %.3f GiB, "
                        "AdamW %.3f GiB; activations %.1f KiB/token = %.3f GiB; logits %.3f GiB; scheme state not "
                        "included (printed at startup); model FLOPs/token %.3f GFLOP\n",
                        o.dtype.c_str(), o.recompute, (long long)bt, gib(m.params), gib(m.grads), gib(m.adamw),
                        m.act_per_token / 1024.0, gib(m.act_per_token * tk), gib(m.logits_per_token * tk),
                        model_flops_per_token(cfg, o.T) / 1e9);
            return 0;
        }
        // Input errors first, so that they are reported the same with or without a GPU.
        if (!o.infer.active()) {
            if (o.train_data.empty()) throw Error("--train-data is required (a glob of token shards)");
            if (glob_files(o.train_data).empty()) throw Error("--train-data: no files match '" + o.train_data + "'");
            if (!o.val_data.empty() && glob_files(o.val_data).empty())
                throw Error("--val-data: no files match '" + o.val_data + "'");
            check_output_flags(o, o.dump_debug_state.empty());  // creates --out-dir
        }
        if (!gpu_available()) {
            std::fflush(stdout);
            std::fprintf(stderr, "error: no usable CUDA GPU (cudaGetDeviceCount failed or found 0 devices); "
                                 "--help, --dry-run and --gpu-info work without one\n");
            return 2;
        }
        if (o.infer.active())  // generation / inference benchmark (cuda/infer_cli.cuh)
            return o.dtype == "bf16"
                       ? run_infer<bf16>(o.infer, cfg, o.B, o.T, uint64_t(o.seed), o.attn_variant, o.resume, o.dtype, tok.get())
                       : run_infer<float>(o.infer, cfg, o.B, o.T, uint64_t(o.seed), o.attn_variant, o.resume, o.dtype, tok.get());
        return o.dtype == "bf16" ? run<bf16>(o, cfg, tok.get()) : run<float>(o, cfg, tok.get());
    } catch (const std::exception& e) {
        std::fflush(stdout);
        if (dist::world() > 1) std::fprintf(stderr, "error: [rank %d of %d] %s\n", dist::rank(), dist::world(), e.what());
        else std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}

// main() of a GPU trainer: the data-parallel context (core/dist.h: mpirun, srun or none), then the
// trainer; a failing rank aborts the job so the other ranks do not wait forever.
inline int trainer_main(int argc, char** argv, const char* program, const char* description,
                        const char* default_scheme) {
    try {
        dist::init(&argc, &argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    const int rc = trainer_main_body(argc, argv, program, description, default_scheme);
    if (rc != 0) {
        std::fflush(stderr);
        dist::abort_all(rc);
    }
    dist::finalize();
    return rc;
}

}  // namespace gpu
}  // namespace ldm
