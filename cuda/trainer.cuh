// cuda/trainer.cuh — the GPU backend of the training loop every trainer shares (core/train_loop.h)
// and the main() of the GPU trainers (train_gpt_baselines.cu, train_ldm.cu): Transformer<T>
// (cuda/transformer.cuh) with the trainer's scheme, fp32 master weights and AdamW moments on the
// device (cuda/adamw.cuh), data parallelism over NCCL (cuda/nccl.cuh), evaluation through a GPU
// ScoringModel. Same flags as build/train_cpu plus --dtype bf16|fp32, --recompute, --gpu-info
// and the NCCL flags; same logs and checkpoint files (a checkpoint written by one trainer loads in
// the other). Flags and data flow: doc/cuda.md "Trainer", doc/training.md.
//
// Exit codes: 0 ok; 1 error (bad flags, data, checkpoint: "error: ..." on stderr); 2 no usable
// CUDA GPU (--help, --dry-run work without one; --gpu-info prints the device or exits 2).
#pragma once
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
#include "core/dataloader.h"
#include "core/dist.h"
#include "core/eval.h"
#include "core/optim.h"
#include "core/shard.h"
#include "core/tokenizer.h"
#include "core/train_flags.h"
#include "core/train_loop.h"
#include "cuda/adamw.cuh"
#include "cuda/common.cuh"
#include "cuda/infer_cli.cuh"
#include "cuda/matmul.cuh"
#include "cuda/nccl.cuh"
#include "cuda/transformer.cuh"

namespace ldm {
namespace gpu {

// The GPU trainers' options: the shared ones plus the GPU and NCCL flags and inference.
struct GpuTrainOptions : TrainOptions {
    int recompute = 0;          // activation recompute in backward (0, 1, 2)
    bool gpu_info = false;
    bool nccl = false;          // NCCL path even with one GPU (measures its cost)
    std::string nccl_id_file;   // share the NCCL id through this file (launchers without MPI)
    int nccl_overlap = 0;       // 1: per-bucket reduction overlapped with backward (GpuDataParallel)
    int cuda_graph = 0;         // 1: CUDA graphs (the whole step where possible, else each micro-batch)
    bool profile_stages = false;  // with --bench: CUDA-event time per stage of the timed steps
    InferOptions infer;         // generation / inference benchmark instead of training (cuda/infer_cli.cuh)
    GpuTrainOptions() { dtype = "bf16"; }
};

namespace trainer_detail {

// ScoringModel over the GPU model: logits-only forwards in chunks of rows that fit the allocated
// B_max x T_max, then the per-row log-softmax gather on the host (core/eval row_logprob).
template <typename T>
class GpuScoringModel : public ScoringModel {
   public:
    explicit GpuScoringModel(Transformer<T>& m) : m_(m) {}
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
    Transformer<T>& m_;
};

// Peak bf16 TFLOP/s of this device: median of 10 timed 8192^3 bf16 GEMMs (C = A·Bᵀ, fp32
// accumulation) through the same cuBLASLt wrapper, after 3 warm-up calls. The inputs are
// constants (A = 0.01, B = 0.02; the MFU denominator, spec performance.md's "885 measured" on the
// H200) or, with random_inputs, values uniform in [-1, 1) from a fixed host generator, as in
// training: the tensor cores then draw more power and run slower (doc/cuda.md "MFU"). 0 under
// the host emulation of dev/emu (no device peak; the host GEMMs would take hours): MFU is then null.
inline double measure_peak_bf16_tflops(cudaStream_t s, bool random_inputs = false) {
#ifdef LDM_EMULATED
    (void)s;
    (void)random_inputs;
    return 0.0;
#endif
    const int64_t n = 8192;
    DeviceBuffer<bf16> A(n * n), Bm(n * n), C(n * n);
    if (random_inputs) {
        std::vector<bf16> h(size_t(n * n));
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (bf16* dst : {A.ptr, Bm.ptr}) {
            for (bf16& v : h) {  // splitmix64; the top 24 bits as a uniform value in [-1, 1)
                uint64_t z = (x += 0x9e3779b97f4a7c15ull);
                z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
                z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
                z ^= z >> 31;
                v = from_f<bf16>(float(int64_t(z >> 40) - (int64_t(1) << 23)) * (1.0f / float(1 << 23)));
            }
            CUDA_CHECK(cudaMemcpy(dst, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice));
        }
    } else {
        fill<bf16>(A.ptr, n * n, 0.01f, s);
        fill<bf16>(Bm.ptr, n * n, 0.02f, s);
    }
    Matmul mm;
    float ms = time_median_ms(
        [&] { mm.gemm<bf16, bf16>(false, true, n, n, n, 1.0f, A.ptr, n, Bm.ptr, n, 0.0f, C.ptr, n, nullptr, s); },
        3, 10, s);
    return 2.0 * double(n) * n * n / (ms / 1e3) / 1e12;
}

// Sustained device-memory bandwidth in TB/s (10^12 bytes/s): median of 10 timed device-to-device
// copies of 256 MiB (bytes read + bytes written per copy), after 3 warm-up copies; each buffer is
// about 5x the 50-60 MB L2 of an H100/H200, so the copy streams from HBM. The traffic floors of
// scripts/gpu_targets.py (doc/results_gpu.md) divide counted bytes by it. 0 under the host
// emulation of dev/emu, like the peak above.
inline double measure_copy_tbs(cudaStream_t s) {
#ifdef LDM_EMULATED
    (void)s;
    return 0.0;
#endif
    const int64_t bytes = int64_t(256) << 20;
    DeviceBuffer<uint8_t> src(bytes), dst(bytes);
    CUDA_CHECK(cudaMemsetAsync(src.ptr, 1, size_t(bytes), s));
    float ms = time_median_ms([&] { CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, size_t(bytes), cudaMemcpyDeviceToDevice, s)); },
                              3, 10, s);
    return 2.0 * double(bytes) / (ms / 1e3) / 1e12;
}

inline double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// The AdamW bytes of one rank in m.adamw: the 2n fp32 moments, or under ZeRO-1 with W > 1 the
// padded shard S of each (dist::padded_shard_size) plus, on the flat path (--nccl-overlap 0),
// its [W*S] fp32 staging buffer (cuda/nccl.cuh GpuDataParallel::pad).
inline void shard_adamw_memory(TransformerMemory& m, int64_t n, int W, int zero, int nccl_overlap) {
    if (W <= 1 || zero != 1) return;
    const int64_t S = dist::padded_shard_size(n, W);
    m.adamw = 2 * S * 4 + (nccl_overlap == 0 ? int64_t(W) * S * 4 : 0);
}

}  // namespace trainer_detail

// The GPU backend of core/train_loop.h. Gradients fp32 on the device; AdamW moments fp32 on the
// device (this rank's ZeRO-1 slice [dp.own_off, +dp.own_count), or all); the update is the
// element formula of math/optim_math.h (bit-identical to core/optim.cpp's), per weight-decay range.
template <typename T>
class GpuBackend {
   public:
    GpuBackend(const ModelConfig& cfg, const GpuTrainOptions& o)
        : cfg_(cfg), o_(o), dctx_(dist::context()), dev_(local_device(dctx_)), set_dev_(dev_),
          device_(device_description(dev_)), model_(cfg, o.B, o.T, o.recompute) {
        // a CUDA graph is captured on a created stream (blocking: ordered with the legacy stream's
        // copies as stream 0 is); without one everything runs on stream 0
        if (o.cuda_graph) {
            CUDA_CHECK(cudaStreamCreate(&stream_));
            model_.stream = stream_;
        }
        model_.init(uint64_t(o.seed));
        n_ = model_.n_params;
        dp_.init(dctx_, n_, o.zero, o.nccl, o.nccl_id_file, o.nccl_overlap != 0);
        dp_.plan_overlap(model_.specs, cfg.n_layer, model_.grads.ptr, kNcclMinBucketElems);
        // data parallel: the scheme's host-side decisions (LDM's drift fallback) agree over the ranks
        // (without MPI an NCCL sum: on the overlap path on the communication stream, after the bucket
        // reductions that the last micro-batch's backward enqueued on the same communicator)
        if (dp_.world > 1)
            model_.scheme().set_data_parallel(
                [this](bool f) {
                    cudaStream_t s = dp_.overlap && dp_.comm_stream ? dp_.comm_stream : model_.stream;
                    return dp_.sum(f ? 1.0 : 0.0, s) > 0;
                },
                dctx_.rank == 0);
        // first fp32 master element the schemes read (their parameters follow the backbone's); n = none
        scheme_lo_ = n_;
        for (const auto& s : model_.specs)
            if (s.name.rfind("scheme.", 0) == 0) scheme_lo_ = std::min(scheme_lo_, s.offset);
        m_.alloc(dp_.state_len());
        v_.alloc(dp_.state_len());
        nscratch_.alloc(std::max<int64_t>(global_norm_scratch(), 1));
        norm_out_.alloc(1);
        step_d_.alloc(1);
        loss_flag_.alloc(1);
        step_h_.alloc(1);
        norm_h_.alloc(1);
        CUDA_CHECK(cudaMemset(m_.ptr, 0, (size_t)m_.bytes()));
        CUDA_CHECK(cudaMemset(v_.ptr, 0, (size_t)v_.bytes()));
        for (const auto& s : model_.specs) {  // weight-decay ranges, adjacent tensors merged
            if (!ranges_.empty() && ranges_.back().decay == s.decay &&
                ranges_.back().offset + ranges_.back().numel == s.offset)
                ranges_.back().numel += s.numel;
            else
                ranges_.push_back({s.offset, s.numel, s.decay});
        }
        ac_ = adamw_config_from_flags(o);
        ac_.validate();
        scorer_.reset(new trainer_detail::GpuScoringModel<T>(model_));
        size_t f = 0, t = 0;
        CUDA_CHECK(cudaMemGetInfo(&f, &t));
        peak_used_ = int64_t(t - f);
    }

    int64_t n_params() const { return n_; }
    const char* state_dtype() const { return "fp32"; }
    void zero_grad() { model_.zero_grad(); }
    double train_batch(const int32_t* in, const int32_t* tg, int B, int T_, double scale, bool last) {
        // overlap path: the last micro-batch's backward starts each bucket's reduction as soon as
        // its gradients are final (cuda/nccl.cuh GpuDataParallel::on_grads_final); that
        // micro-batch runs eagerly, the others (and all without overlap) replay the CUDA graph
        // with --cuda-graph 1
        const bool hook = dp_.overlap && last;
        double loss = 0;
        model_.profile = o_.profile_stages ? &prof_ : nullptr;  // training micro-batches only (not evals)
        if (hook) {
            cudaStream_t st = model_.stream;
            loss = model_.forward(in, tg, B, T_, scale);
            model_.grad_hook = [this, st](int stage) { dp_.on_grads_final(stage, st); };
            model_.backward(scale);
            model_.grad_hook = nullptr;
        } else {
            const int64_t before = model_.graph_captures();
            loss = model_.train_micro_batch(in, tg, B, T_, scale, o_.cuda_graph != 0);
            if (model_.graph_captures() != before)
                std::printf("CUDA graph: micro-batch B=%d x T=%d captured (%lld nodes), replayed from now on\n", B, T_,
                            (long long)model_.graph_nodes());
        }
        model_.profile = nullptr;
        if (!measured_) {  // peak memory: after the first micro-batch of the run
            size_t fr = 0, to = 0;
            CUDA_CHECK(cudaMemGetInfo(&fr, &to));
            peak_used_ = std::max<int64_t>(peak_used_, int64_t(to - fr));
        }
        return loss;
    }
    double eval_batch(const int32_t* in, const int32_t* tg, int B, int T_) { return model_.forward(in, tg, B, T_, 0.0); }

    // Gradients summed over the ranks (GpuDataParallel::reduce_grads; ZeRO-1: this rank's slice),
    // then the global L2 norm before clipping.
    double reduce_gradients() {
        cudaStream_t st = model_.stream;
        StageScope stage(o_.profile_stages ? &prof_ : nullptr, "step gradient reduction + norm", st);
        dp_.finish_reduction(st);  // the compute stream waits for the overlapped reductions
        g_ = dp_.reduce_grads(model_.grads.ptr, st);
        global_norm_squared(norm_out_.ptr, nscratch_.ptr, g_, dp_.own_count, st);
        std::vector<float> sq = download(norm_out_.ptr, 1);
        return std::sqrt(dp_.zero1 ? dp_.sum(double(sq[0]), st) : double(sq[0]));
    }
    // One AdamW step on the device. ZeRO-1 updates only this rank's slice, then gathers.
    void optimizer_step(double lr, double norm) {
        cudaStream_t st = model_.stream;
        StageScope stage(o_.profile_stages ? &prof_ : nullptr, "step AdamW", st);
        adam_t_ += 1;
        // the scalars in double, rounded once exactly as core/optim.cpp does (bit-identical update)
        *step_h_.ptr = adamw_step_scalars(ac_.beta1, ac_.beta2, ac_.eps, ac_.weight_decay, lr,
                                          adamw_clip_factor(norm, ac_.grad_clip), adam_t_);
        CUDA_CHECK(cudaMemcpyAsync(step_d_.ptr, step_h_.ptr, sizeof(AdamWStep), cudaMemcpyHostToDevice, st));
        enqueue_adamw(st);
        T* copy = sizeof(T) == sizeof(float) ? nullptr : model_.work.ptr;
        if (dp_.zero1 && dp_.overlap) {
            dp_.gather_params<T>(copy, model_.master.ptr, scheme_lo_, st);  // bf16 working copy (+ scheme fp32)
        } else if (dp_.zero1) {
            dp_.allgather_master(model_.master.ptr, st);
            model_.refresh_working_copy();
        }
        CUDA_CHECK(cudaStreamSynchronize(st));
    }
    // The whole step as one CUDA graph (train_loop's fused path): with --cuda-graph 1 on one GPU
    // without NCCL, not while profiling stages, and with several micro-batches only when the
    // scheme cannot switch kernels after one of them (LDM's armed drift check; then each
    // micro-batch is a graph of its own and the optimizer runs eagerly, as without this).
    bool fuses_step(int64_t accum) const {
        return o_.cuda_graph != 0 && !dp_.nccl && !o_.profile_stages && (accum == 1 || !model_.kernels_may_switch());
    }
    // zero_grad, `accum` micro-batches (in/tg [accum*B*T]) forward + backward with grad_scale,
    // the gradient norm, the divergence guard and clip factor on the device (adamw_step_guard) and
    // AdamW: captured once per (B, T, accum, grad_scale) on the trainer's stream and replayed; the
    // host stages the ids before it and reads the losses and the norm after it. Bit-identical to
    // zero_grad + train_batch x accum + reduce_gradients + optimizer_step. A non-finite loss or
    // norm leaves parameters and moments as they were (the loop then stops with "diverged").
    train::StepResult train_step(const int32_t* in, const int32_t* tg, int64_t accum, int B, int T_, double scale,
                                 double lr) {
        if (!fuses_step(accum)) throw Error("GpuBackend::train_step: this configuration runs the step eagerly");
        if (model_.stream == 0) throw Error("GpuBackend::train_step: a CUDA graph needs a created stream, not stream 0");
        const int64_t bt = int64_t(B) * T_;
        for (int64_t a = 0; a < accum; a++) model_.stage_micro_batch(int(a), in + a * bt, tg + a * bt, B, T_);
        cudaStream_t st = model_.stream;
        // lr and bias corrections for this step; the clip factor and skip flag come from the guard.
        // (Safe to rewrite: the previous launch was synchronised; staging and step_h_ rely on it.)
        *step_h_.ptr = adamw_step_scalars(ac_.beta1, ac_.beta2, ac_.eps, ac_.weight_decay, lr, 1.0, adam_t_ + 1);
        if (!step_exec_ || step_B_ != B || step_T_ != T_ || step_accum_ != accum || step_scale_ != scale) {
            drop_step_graph();
            int64_t nodes = 0;
            step_exec_ = capture_graph(
                st,
                [&] {
                    CUDA_CHECK(cudaMemsetAsync(model_.grads.ptr, 0, (size_t)model_.grads.bytes(), st));
                    CUDA_CHECK(cudaMemsetAsync(loss_flag_.ptr, 0, sizeof(unsigned), st));
                    for (int64_t a = 0; a < accum; a++) model_.enqueue_micro_batch(int(a), scale, loss_flag_.ptr);
                    g_ = dp_.reduce_grads(model_.grads.ptr, st);  // (no NCCL: the gradients themselves)
                    global_norm_squared(norm_out_.ptr, nscratch_.ptr, g_, dp_.own_count, st);
                    CUDA_CHECK(cudaMemcpyAsync(step_d_.ptr, step_h_.ptr, sizeof(AdamWStep), cudaMemcpyHostToDevice, st));
                    adamw_step_guard(step_d_.ptr, norm_out_.ptr, loss_flag_.ptr, ac_.grad_clip, st);
                    enqueue_adamw(st);
                    CUDA_CHECK(cudaMemcpyAsync(norm_h_.ptr, norm_out_.ptr, sizeof(float), cudaMemcpyDeviceToHost, st));
                },
                &nodes, "the training step");
            step_B_ = B;
            step_T_ = T_;
            step_accum_ = accum;
            step_scale_ = scale;
            step_captures_++;
            std::printf("CUDA graph: training step (%lld micro-batch%s of B=%d x T=%d, gradient norm, AdamW) captured "
                        "(%lld nodes), replayed from now on\n",
                        (long long)accum, accum == 1 ? "" : "es", B, T_, (long long)nodes);
        }
        CUDA_CHECK(cudaGraphLaunch(step_exec_, st));
        CUDA_CHECK(cudaStreamSynchronize(st));
        train::StepResult r;
        for (int64_t a = 0; a < accum; a++) r.losses.push_back(model_.finish_micro_batch(int(a)));
        r.grad_norm = std::sqrt(double(*norm_h_.ptr));
        bool finite = std::isfinite(r.grad_norm);
        for (double l : r.losses) finite = finite && std::isfinite(l);
        if (finite) adam_t_ += 1;  // else the guard skipped the update (and the loop stops)
        if (model_.after_backward()) drop_step_graph();  // e.g. LDM's drift fallback: other kernels from now on
        if (!measured_) {
            size_t fr = 0, to = 0;
            CUDA_CHECK(cudaMemGetInfo(&fr, &to));
            peak_used_ = std::max<int64_t>(peak_used_, int64_t(to - fr));
        }
        return r;
    }
    void set_step_count(int64_t t) { adam_t_ = t; }
    double sum_over_ranks(double x) { return dp_.sum(x, model_.stream); }
    void barrier() { dp_.barrier(model_.stream); }

    std::vector<float> next_logits(const int32_t* ctx, int Ts, int pos) {
        model_.forward(ctx, nullptr, 1, Ts, 0.0);
        return model_.logits_row(pos);
    }
    ScoringModel& scorer() { return *scorer_; }
    std::vector<std::pair<std::string, double>> metrics() { return model_.scheme().metrics(); }
    std::vector<std::pair<std::string, double>> scheme_state() { return model_.scheme().saved_state(); }
    std::string restore_scheme_state(const std::vector<std::pair<std::string, double>>& s) {
        return model_.scheme().restore_state(s);
    }

    std::vector<float> checkpoint_params() {
        // ZeRO-1 overlap path: the fp32 master is complete only in this rank's slice (and the
        // scheme range); gather it first (the flat path all-gathers it every step)
        if (dp_.zero1 && dp_.overlap) dp_.allgather_master(model_.master.ptr, model_.stream);
        if (dctx_.rank != 0) return {};  // only rank 0 writes the model file (no 4n bytes per rank)
        return model_.get_master();
    }
    bool params_finite() { return true; }  // the loop checks the downloaded master (checkpoint_params)
    void checkpoint_state(TrainState& ts, int64_t off, int64_t count) {
        ts.dtype = "fp32";  // dtype of m, v (always fp32 on the GPU)
        // only this rank's part [off, off + count) goes to the host
        auto part = [&](const float* full) {
            const std::vector<float> h = download(full + off, count);
            return std::string(reinterpret_cast<const char*>(h.data()), size_t(count) * 4);
        };
        if (dp_.zero1) {
            // the moments are gathered into the shard layout of the checkpoint, in the fp32
            // gradient buffer: idle between steps (every step zeroes it first), so a checkpoint
            // allocates nothing (an n-float buffer would be 5.6 GB at qwen-1.5b)
            float* full = model_.grads.ptr;
            dp_.allgather_full(full, model_.stream, m_.ptr);
            ts.m = part(full);
            dp_.allgather_full(full, model_.stream, v_.ptr);
            ts.v = part(full);
        } else {
            ts.m = part(m_.ptr);
            ts.v = part(v_.ptr);
        }
    }
    void restore(const ModelCheckpoint& mc, const dist::SavedState& saved) {
        for (const TrainState& ts : saved.parts)
            if (!ts.exact_params.empty() || ts.dtype != "fp32")
                throw Error("--resume: the checkpoint holds fp64 training state; the GPU trainer resumes fp32 states only");
        model_.set_master(mc.params.data());
        const int64_t len = dp_.state_len();
        std::vector<float> hm((size_t)len, 0.0f), hv((size_t)len, 0.0f);
        for (size_t p = 0; p < saved.parts.size(); p++) {
            dist::copy_saved_part(hm.data(), dp_.own_off, dp_.own_count, saved.parts[p].m, saved.shards[p], "adam_m");
            dist::copy_saved_part(hv.data(), dp_.own_off, dp_.own_count, saved.parts[p].v, saved.shards[p], "adam_v");
        }
        CUDA_CHECK(cudaMemcpy(m_.ptr, hm.data(), size_t(len) * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(v_.ptr, hv.data(), size_t(len) * 4, cudaMemcpyHostToDevice));
    }
    // One optimizer step's gradients. With --total-batch-tokens > B*T the `accum` micro-batches are
    // accumulated (grads of the mean over all of them) and the dump holds all of them:
    // inputs/targets/logits [accum*B, T] (header B = accum*B).
    void dump_debug_state(const std::string& path, DataLoader& train, int64_t accum, int B, int T_) {
        std::vector<int32_t> in(size_t(B) * T_), tg(size_t(B) * T_), all_in, all_tg;
        std::vector<float> all_logits;
        model_.zero_grad();
        double loss = 0;
        for (int64_t a = 0; a < accum; a++) {
            train.next_batch(in.data(), tg.data());
            loss += model_.forward(in.data(), tg.data(), B, T_, 0.0);
            std::vector<float> lg = model_.logits_host();
            all_logits.insert(all_logits.end(), lg.begin(), lg.end());
            all_in.insert(all_in.end(), in.begin(), in.end());
            all_tg.insert(all_tg.end(), tg.begin(), tg.end());
            model_.backward(1.0 / double(accum));
        }
        loss /= double(accum);
        std::vector<float> params = model_.get_master(), grads = model_.get_grads();
        save_debug_state<float>(path, cfg_, params.data(), all_in.data(), all_tg.data(), int(B * accum), T_,
                                all_logits.data(), loss, grads.data());
        std::printf("debug state (loss %.6f, %s) written to %s\n", loss, o_.dtype.c_str(), path.c_str());
    }

    nlohmann::json log_fields() {
        return {{"device", device_},
                {"data_parallel", {{"world", dctx_.world}, {"zero", dp_.zero1 ? 1 : 0}, {"nccl", dp_.nccl},
                                   {"overlap", dp_.overlap}, {"buckets", dp_.buckets.size()}}},
                {"gpu", {{"recompute", o_.recompute}, {"nccl_overlap", o_.nccl_overlap}, {"cuda_graph", o_.cuda_graph},
                         {"profile_stages", o_.profile_stages}}}};
    }
    std::string device() const { return device_; }
    void print_startup() {
        using trainer_detail::gib;
        const int W = dctx_.world;
        if (dp_.nccl)
            std::printf("data parallel: %d GPU process%s (%s), ZeRO-%d, NCCL %d, %s\n", W, W == 1 ? "" : "es",
                        dctx_.launcher.c_str(), dp_.zero1 ? 1 : 0, NCCL_VERSION_CODE,
                        dp_.overlap ? strprintf("reduction overlapped with backward (%zu buckets)", dp_.buckets.size()).c_str()
                                    : "reduction after backward");
        TransformerMemory mem = model_.memory();
        trainer_detail::shard_adamw_memory(mem, n_, W, o_.zero, o_.nccl_overlap);
        const double tok_mb = double(o_.B) * o_.T;
        std::printf("memory: params %.3f GiB (fp32 master%s) | grads %.3f GiB | AdamW m,v %.3f GiB | activations "
                    "%.1f KiB/token (%.3f GiB) | logits %.1f KiB/token (%.3f GiB) | scheme %s %lld B/token "
                    "(%.3f GiB) | recompute %d | allocated %.3f GiB\n",
                    gib(mem.params), sizeof(T) == 4 ? "" : " + bf16 copy", gib(mem.grads), gib(mem.adamw),
                    mem.act_per_token / 1024.0, gib(mem.act_per_token * tok_mb), mem.logits_per_token / 1024.0,
                    gib(mem.logits_per_token * tok_mb), cfg_.scheme.c_str(), (long long)mem.scheme_per_token,
                    gib(mem.scheme_per_token * tok_mb), o_.recompute, gib(double(allocated())));
    }
    void step_begin() { CUDA_CHECK(cudaDeviceSynchronize()); }
    void step_end() {
        measured_ = true;
        if (o_.profile_stages) {  // the stream is idle (optimizer_step synchronised); 2 warm-up steps dropped
            CUDA_CHECK(cudaDeviceSynchronize());
            prof_.collect(steps_done_ >= 2);
        }
        steps_done_++;
    }
    // step_ms: the mean timed step (the stage table's reference: its stages are per-step means)
    nlohmann::json bench_fields(double step_ms, double tps) {
        using trainer_detail::gib;
        const double fpt = train::model_flops_per_token(cfg_, o_.T);
        const double peak = trainer_detail::measure_peak_bf16_tflops(model_.stream);
        const double peak_random = trainer_detail::measure_peak_bf16_tflops(model_.stream, true);
        const double copy_tbs = trainer_detail::measure_copy_tbs(model_.stream);
        // per GPU: tps counts the whole job's tokens, the peak is one GPU's (MFU, spec performance.md)
        const double achieved = fpt * tps / double(dctx_.world) / 1e12;
        nlohmann::json stages = nlohmann::json::object();
        if (o_.profile_stages) {
            const auto ps = prof_.per_step();
            double sum = 0;
            for (const auto& kv : ps) sum += kv.second;
            std::printf("stage breakdown (--profile-stages: GPU time between CUDA events, mean of %d timed steps; step "
                        "%.2f ms, the mean):\n", prof_.steps(), step_ms);
            for (const auto& kv : ps) {
                std::printf("  %-52s %10.3f ms %6.1f%%\n", kv.first.c_str(), kv.second,
                            step_ms > 0 ? 100.0 * kv.second / step_ms : 0.0);
                stages[kv.first] = kv.second;
            }
            std::printf("  %-52s %10.3f ms %6.1f%% (the rest: host work and launch gaps)\n", "sum of the stages", sum,
                        step_ms > 0 ? 100.0 * sum / step_ms : 0.0);
        }
        return {{"trainer", "gpu"}, {"stages_ms", stages}, {"recompute", o_.recompute}, {"cuda_graph", o_.cuda_graph},
                {"graph_captures", model_.graph_captures() + step_captures_}, {"graph_step_captures", step_captures_},
                {"model_flops_per_token", fpt},
                {"achieved_tflops", achieved}, {"peak_bf16_tflops", peak},
                {"mfu", peak > 0 ? nlohmann::json(achieved / peak) : nlohmann::json(nullptr)},
                {"peak_bf16_tflops_random", peak_random > 0 ? nlohmann::json(peak_random) : nlohmann::json(nullptr)},
                {"mfu_random_peak", peak_random > 0 ? nlohmann::json(achieved / peak_random) : nlohmann::json(nullptr)},
                {"copy_tbs", copy_tbs > 0 ? nlohmann::json(copy_tbs) : nlohmann::json(nullptr)},
                {"peak_mem_gib", gib(double(peak_used_))}, {"alloc_gib", gib(double(allocated()))},
                {"scheme_bytes_per_token", model_.scheme().extra_bytes_per_token()}, {"device", device_},
                {"n_layer", cfg_.n_layer}, {"d_model", cfg_.d_model}, {"scheme_config", scheme_config()},
                {"nccl", dp_.nccl}, {"profile_stages", o_.profile_stages != 0}};
    }
    // The scheme's shape parameters, for scripts/gpu_targets.py (which target and floor a row meets).
    nlohmann::json scheme_config() const {
        const std::string& s = cfg_.scheme;
        if (s == "hc" || s == "mhc") return {{"n", cfg_.hc_streams}};
        if (s == "attnres-block") return {{"blocks", cfg_.attnres_blocks}};
        if (s == "ldm")
            return {{"rule", cfg_.ldm_rule}, {"mode", cfg_.ldm_mode}, {"d_k", cfg_.ldm_dk}, {"heads", cfg_.ldm_heads},
                    {"window", cfg_.ldm_window}, {"residual", cfg_.ldm_residual}};
        return nlohmann::json::object();
    }

    ~GpuBackend() {
        drop_step_graph();
        if (stream_) (void)cudaStreamDestroy(stream_);  // no throw from a destructor
    }

   private:
    struct SetDevice {  // selects this rank's GPU before any allocation
        explicit SetDevice(int d) { CUDA_CHECK(cudaSetDevice(d)); }
    };
    int64_t allocated() const { return model_.allocated_bytes() + m_.bytes() + v_.bytes(); }
    // AdamW on this rank's slice, per contiguous weight-decay range, with the scalars in step_d_.
    void enqueue_adamw(cudaStream_t st) {
        T* copy = sizeof(T) == sizeof(float) ? nullptr : model_.work.ptr;
        for (const auto& r : ranges_) {
            const int64_t a = std::max(r.offset, dp_.own_off);
            const int64_t b = std::min(r.offset + r.numel, dp_.own_off + dp_.own_count);
            if (b <= a) continue;
            const int64_t k = a - dp_.own_off;  // index in this rank's state and reduced gradients
            adamw_update<T>(model_.master.ptr + a, copy ? copy + a : nullptr, m_.ptr + k, v_.ptr + k, g_ + k, b - a,
                            step_d_.ptr, r.decay, st);
        }
    }
    void drop_step_graph() {
        if (step_exec_) (void)cudaGraphExecDestroy(step_exec_);
        step_exec_ = nullptr;
    }

    ModelConfig cfg_;
    const GpuTrainOptions& o_;
    const dist::Context& dctx_;
    int dev_;
    SetDevice set_dev_;
    std::string device_;
    Transformer<T> model_;
    int64_t n_ = 0, scheme_lo_ = 0, adam_t_ = 0, peak_used_ = 0;
    bool measured_ = false;
    GpuDataParallel dp_;
    DeviceBuffer<float> m_, v_, nscratch_, norm_out_;
    DeviceBuffer<AdamWStep> step_d_;  // the scalars the AdamW kernels read (adamw_step_scalars + guard)
    DeviceBuffer<unsigned> loss_flag_;  // step graph: 1 when a per-token loss was not finite
    PinnedBuffer<AdamWStep> step_h_;    // host side of step_d_ (page-locked: a graph copies it)
    PinnedBuffer<float> norm_h_;        // step graph: the squared norm, copied back
    cudaGraphExec_t step_exec_ = nullptr;  // the whole-step graph (train_step) and its key
    int step_B_ = 0, step_T_ = 0;
    int64_t step_accum_ = 0, step_captures_ = 0;
    double step_scale_ = 0;
    std::vector<ParamRange> ranges_;
    AdamWConfig ac_;
    float* g_ = nullptr;  // the reduced gradients reduce_gradients() returned (this rank's slice)
    std::unique_ptr<ScoringModel> scorer_;
    cudaStream_t stream_ = nullptr;  // created with --cuda-graph 1 (model_.stream), else none
    StageProfile prof_;              // --profile-stages
    int64_t steps_done_ = 0;
};

template <typename T>
int run(const GpuTrainOptions& o, const ModelConfig& cfg, const Tokenizer* tok) {
    GpuBackend<T> be(cfg, o);
    return train_loop(o, cfg, tok, be);
}

// main() of a GPU trainer: parses the flags (train_cpu's, plus the GPU ones), checks for a GPU
// and runs the loop with T = bf16 or float. default_scheme: --scheme's default (shown by --help).
inline int trainer_main_body(int argc, char** argv, const char* program, const char* description,
                             const char* default_scheme) {
    using trainer_detail::gib;
    try {
        GpuTrainOptions o;
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
        ap.add("--cuda-graph", &o.cuda_graph,
               "1: CUDA graphs, captured once and replayed (same results bit for bit): on one GPU the whole "
               "step (every micro-batch, gradient norm, divergence guard, AdamW; LDM's armed drift check with "
               "accumulation: each micro-batch), with NCCL each micro-batch; 0: launch every kernel");
        ap.add("--profile-stages", &o.profile_stages,
               "with --bench: time every stage of the timed steps (attention, each GEMM, the scheme's calls, AdamW, "
               "...) with CUDA events and print the breakdown (BENCH stages_ms); needs --cuda-graph 0");
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
        note_set_infer_flags(ap, o.infer);
        if (o.nccl_overlap != 0 && o.nccl_overlap != 1)
            throw Error(strprintf("--nccl-overlap must be 0 or 1, got %d", o.nccl_overlap));
        if (o.cuda_graph != 0 && o.cuda_graph != 1)
            throw Error(strprintf("--cuda-graph must be 0 or 1, got %d", o.cuda_graph));
        if (o.profile_stages && o.bench <= 0) throw Error("--profile-stages times the steps of --bench N: add --bench");
        if (o.profile_stages && o.cuda_graph) throw Error("--profile-stages needs --cuda-graph 0 (events around each stage)");
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
        check_train_flags(o);
        const int64_t bt = int64_t(o.B) * o.T;
        if (o.dtype != "fp32" && o.dtype != "bf16") throw Error("--dtype must be bf16 or fp32, got '" + o.dtype + "'");
        if (o.recompute < 0 || o.recompute > 2) throw Error(strprintf("--recompute must be 0, 1 or 2, got %d", o.recompute));
        // default: all cores, shared among the ranks on this node (as train_cpu)
        omp_set_num_threads(o.threads > 0 ? o.threads
                                          : std::max(1, omp_get_num_procs() / std::max(1, dist::context().local_world)));
        if (o.infer.active()) check_infer_options(o.infer, o.resume, o.T);  // flag errors even without a GPU

        std::unique_ptr<Tokenizer> tok = load_tokenizer_flag(o.tokenizer);
        if (o.infer.active()) cpu::check_stop_at_eot(o.infer, tok.get());  // (before the GPU check)
        if (!tok && !o.dry_run && !o.infer.active())  // inference without one: V = 50257, token ids only
            throw Error("--tokenizer: none given and no gpt2_tokenizer in the data directory");
        const int V = tok ? int(tok->vocab_size()) : 50257;

        ModelConfig cfg = model_config_from_flags(o, V);
        check_gpu_scheme(cfg);
        // head_dim must suit the attention kernels of this dtype (ldm::Error, before any GPU work)
        if (o.dtype == "bf16") (void)attention_uses_mma<bf16>(cfg.head_dim);
        else (void)attention_uses_mma<float>(cfg.head_dim);
        check_output_flags(o, false);

        if (o.dry_run) {
            std::printf("%s", describe(cfg, o.T).c_str());
            const int64_t es = o.dtype == "bf16" ? 2 : 4;
            TransformerMemory m = transformer_memory_estimate(cfg, o.recompute, es, 0);
            trainer_detail::shard_adamw_memory(m, count_params(cfg), dist::world(), o.zero, o.nccl_overlap);
            const double tk = double(bt);
            std::printf("GPU training memory (%s, recompute %d, B*T = %lld tokens): params %.3f GiB, grads %.3f GiB, "
                        "AdamW %.3f GiB; activations %.1f KiB/token = %.3f GiB; logits %.3f GiB; scheme state not "
                        "included (printed at startup); model FLOPs/token %.3f GFLOP\n",
                        o.dtype.c_str(), o.recompute, (long long)bt, gib(m.params), gib(m.grads), gib(m.adamw),
                        m.act_per_token / 1024.0, gib(m.act_per_token * tk), gib(m.logits_per_token * tk),
                        train::model_flops_per_token(cfg, o.T) / 1e9);
            return 0;
        }
        // Input errors first, so that they are reported the same with or without a GPU.
        if (!o.infer.active()) {
            if (o.train_data.empty()) throw Error("--train-data is required (a glob of token shards)");
            if (train::glob_files(o.train_data).empty()) throw Error("--train-data: no files match '" + o.train_data + "'");
            if (!o.val_data.empty() && train::glob_files(o.val_data).empty())
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
                       ? run_infer<bf16>(o.infer, cfg, o.B, o.T, uint64_t(o.seed), o.resume, o.dtype, tok.get())
                       : run_infer<float>(o.infer, cfg, o.B, o.T, uint64_t(o.seed), o.resume, o.dtype, tok.get());
        // Refuse before allocating what this GPU cannot hold (the estimate of --dry-run).
        {
            const int64_t es = o.dtype == "bf16" ? 2 : 4;
            TransformerMemory m = transformer_memory_estimate(cfg, o.recompute, es, 0);
            trainer_detail::shard_adamw_memory(m, count_params(cfg), dist::world(), o.zero, o.nccl_overlap);
            const double need = double(m.params + m.grads + m.adamw) +
                                double(m.act_per_token + m.logits_per_token) * double(bt);
            size_t fr = 0, to = 0;
            CUDA_CHECK(cudaSetDevice(local_device(dist::context())));
            CUDA_CHECK(cudaMemGetInfo(&fr, &to));
            if (need > double(fr))
                throw Error(strprintf("training %s (%s, B*T = %lld) needs at least %.2f GiB of GPU memory (params, "
                                      "grads, AdamW %.2f GiB, activations and logits %.2f GiB; the scheme's state "
                                      "comes on top) but only %.2f GiB are free on %s",
                                      cfg.preset.c_str(), o.dtype.c_str(), (long long)bt, need / 1073741824.0,
                                      double(m.params + m.grads + m.adamw) / 1073741824.0,
                                      double(m.act_per_token + m.logits_per_token) * double(bt) / 1073741824.0,
                                      double(fr) / 1073741824.0, device_description(local_device(dist::context())).c_str()));
        }
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
