// cuda/transformer.cuh — Transformer<T>: the spec §1 decoder-only backbone (the Llama / Qwen
// presets) on the GPU over a depth scheme GpuScheme<T> (cuda/scheme.cuh), shared by both GPU
// trainers. It mirrors cpu/model.cpp operation by operation (same math, same flat
// parameter layout core/config.h param_specs, same init) with these GPU-side fusions:
//   * one GEMM for q|k|v over the contiguous attn.wq|wk|wv block (bias bq|bk|bv) -> qkv [N, qkvd]
//   * QK-norm (qwen3) + RoPE in one kernel (qknorm_rope_forward) -> qkvr
//   * flash-style attention (no T×T buffer; lse [B, nh, T] kept for backward)
//   * one GEMM for h1|h3 over the contiguous mlp.w1|w3 block -> h13 [N, 2F]
//   * LM head over the real V columns of a [N, Vp] logits buffer, then fused_classifier (loss,
//     and dlogits in place, never storing probabilities)
// Data flow and memory accounting: doc/cuda.md "Backbone".
//
// Precision: activations T (float or bf16); parameters: fp32 master flat array + working copy of
// type T (the same array for fp32); gradients fp32, accumulated (+=) across micro-steps.
// All sizes and offsets are 64-bit.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dist.h"
#include "cuda/adamw.cuh"  // global_norm_scratch (the shared scratch is sized for it)
#include "cuda/attention.cuh"
#include "cuda/classifier.cuh"
#include "cuda/common.cuh"
#include "cuda/embedding.cuh"
#include "cuda/matmul.cuh"
#include "cuda/profile.cuh"
#include "cuda/rmsnorm.cuh"
#include "cuda/rope.cuh"
#include "cuda/scheme.cuh"
#include "cuda/swiglu.cuh"
#include "cpu/model.h"
#include "cpu/ops.h"

namespace ldm {
namespace gpu {

// Factory of the trainer's schemes (defined by each trainer: train_gpt_baselines.cu, train_ldm.cu).
template <typename T>
std::unique_ptr<GpuScheme<T>> make_gpu_scheme(const ModelConfig& cfg);
// ldm::Error unless this trainer has cfg.scheme (defined by each trainer; no GPU work, so
// --dry-run refuses a scheme of the other trainer too).
void check_gpu_scheme(const ModelConfig& cfg);

// Byte counts of one training configuration (printed at startup, doc/cuda.md "Memory").
struct TransformerMemory {
    int64_t params = 0;        // fp32 master + working copy (bf16 runs)
    int64_t grads = 0;         // fp32
    int64_t adamw = 0;         // m, v fp32 (allocated by the trainer)
    int64_t act_per_token = 0; // backbone activations kept for backward + shared scratch, per token
    int64_t scheme_per_token = 0;
    int64_t logits_per_token = 0;  // [Vp] of T + fp32 loss
    int64_t fixed = 0;         // token buffers, RoPE tables, float scratch
};

template <typename T>
struct Transformer {
    // Allocates parameters, gradients and activations for micro-batches of up to B_max x T_max
    // tokens (any B·T <= B_max·T_max with T <= T_max runs without reallocation). recompute:
    // 0 = keep everything; 1 = recompute the SwiGLU output a in backward; 2 = also the two
    // RMSNorm outputs of each layer.
    Transformer(const ModelConfig& cfg, int B_max, int T_max, int recompute);

    ModelConfig cfg;
    std::vector<ParamSpec> specs;
    int64_t n_params = 0;
    DeviceBuffer<float> master, grads;   // fp32 [n_params]
    DeviceBuffer<T> work;                // bf16 working copy (empty for T = float)
    T* params = nullptr;                 // what the kernels read: work (bf16) or master (fp32)
    cudaStream_t stream = 0;

    // Host-side init exactly as the CPU reference (cpu::init_params), then upload.
    void init(uint64_t seed);
    // Replace the master weights (fp32 [n_params], e.g. from a checkpoint) and refresh the copy.
    void set_master(const float* host);
    std::vector<float> get_master() const;
    std::vector<float> get_grads() const;
    void refresh_working_copy();   // work = (T) master (bf16 runs)
    void zero_grad();

    // Forward of B sequences of T tokens (host int32 [B*T], ids < V). targets == nullptr: logits
    // only (loss NaN). grad_scale > 0: the classifier also writes dlogits for a following
    // backward() with d(loss)/d(logits) scaled by grad_scale (mean over the B·T tokens, times
    // grad_scale: 1/accum for accumulation). grad_scale <= 0 keeps the logits readable
    // (logits_host); backward() then first turns them into dlogits with scale `grad_scale_later`.
    // Returns the mean cross-entropy (nats, summed in double on the host).
    double forward(const int32_t* tokens, const int32_t* targets, int B, int T_, double grad_scale);
    // grads += grad_scale · d(mean loss)/d(params) (needs a forward with targets).
    void backward(double grad_scale);
    // forward(tokens, targets, B, T_, grad_scale) then backward(grad_scale) (grad_scale > 0), with
    // the same results bit for bit. use_graph: the micro-batch (enqueue_micro_batch of staging
    // slot 0: uploads, forward, backward, embedding backward, loss download) is one CUDA graph,
    // captured at the first call for a (B, T_, grad_scale) and replayed after that; the host
    // stages the ids before and reads the losses after it. use_graph needs `stream` to be a
    // created stream (the legacy stream 0 cannot be captured), no grad_hook and no profile;
    // ldm::Error otherwise. Safe to replay because no buffer moves after construction (the
    // schemes' resize only grows, and the constructor sized them for B_max x T_max).
    // doc/cuda.md "CUDA graph".
    double train_micro_batch(const int32_t* tokens, const int32_t* targets, int B, int T_, double grad_scale,
                             bool use_graph);
    int64_t graph_captures() const { return graph_captures_; }
    int64_t graph_nodes() const { return graph_nodes_; }  // of the last capture

    // ---- staged micro-batches: the pieces a CUDA graph of a whole training step is made of
    // (GpuBackend::train_step); train_micro_batch's graph uses slot 0.
    // Host only: checks the ids (ldm::Error as forward()), copies tokens and targets [B*T_] into
    // page-locked staging slot `slot` (created at first use, never moved) and builds the
    // embedding buckets there. Enqueues nothing.
    void stage_micro_batch(int slot, const int32_t* tokens, const int32_t* targets, int B, int T_);
    // Enqueues on `stream`, without host synchronisation or pageable memory (capturable), the
    // training micro-batch staged in `slot`: the uploads from the slot, forward and backward
    // (grads += grad_scale · d(mean loss)/dθ), the embedding backward (bucket count read on the
    // device), the per-token losses copied back into the slot and, when loss_flag != nullptr,
    // *loss_flag = 1 if any loss is not finite (device flag, never cleared here).
    void enqueue_micro_batch(int slot, double grad_scale, unsigned* loss_flag);
    // After the enqueued work of `slot` completed (the stream synchronised): sets the host-side
    // state the enqueued calls leave (also after a graph replay) and returns the slot's mean loss,
    // summed in double exactly as forward() does.
    double finish_micro_batch(int slot);
    // The scheme's host-side check after a backward (GpuScheme::after_backward: LDM's drift);
    // drops the micro-batch graph and returns true when the scheme switched kernels.
    bool after_backward() {
        const bool switched = scheme_->after_backward(stream);
        if (switched) drop_graph();
        return switched;
    }
    bool kernels_may_switch() const { return scheme_->kernels_may_switch(); }
    ~Transformer() { drop_graph(); }
    // Backward hook for the data-parallel overlap (cuda/nccl.cuh GpuDataParallel): when set,
    // backward() calls grad_hook(stage) on the host at each backward stage of core/dist.h
    // (dist::grad_stage_head() after the head, dist::grad_stage_block(l, L) after block l,
    // dist::grad_stage_end(L) after the embedding), right after the last kernel writing the
    // gradients final at that stage was enqueued on `stream`. The hook may record an event on
    // `stream` but must not enqueue work on it. Empty (the default): backward is unchanged.
    std::function<void(int)> grad_hook;
    // --profile-stages: when set, forward and backward record CUDA events around each group of
    // kernels into it (cuda/profile.cuh; eager runs only, not while a graph is captured).
    StageProfile* profile = nullptr;
    // [B*T, Vp] logits of the last forward as fp32 (columns >= V are 0); only valid when the
    // forward ran with grad_scale <= 0.
    std::vector<float> logits_host() const;
    const T* logits_device() const { return logits_.ptr; }
    // Row `row` of the last forward's logits, columns [0, V), as fp32 (sampling).
    std::vector<float> logits_row(int64_t row) const {
        return download(logits_.ptr + row * cfg.padded_vocab, cfg.vocab_size);
    }

    TransformerMemory memory() const;
    int64_t allocated_bytes() const { return allocated_; }
    GpuScheme<T>& scheme() { return *scheme_; }
    int B_max() const { return Bmax_; }
    int T_max() const { return Tmax_; }

   private:
    struct Layer {  // offsets into params/grads
        int64_t attn_norm, wqkv, bqkv = -1, q_norm = -1, k_norm = -1, wo, mlp_norm, w13, w2;
    };
    struct Act {  // saved activations of one layer
        DeviceBuffer<T> x_att, ln_att, qkv, qkvr, ao, x_mlp, ln_mlp, h13, a;
        DeviceBuffer<float> rstd_att, rstd_qk, lse, rstd_mlp;
    };
    template <typename E>
    void alloc(DeviceBuffer<E>& b, int64_t n) {
        b.alloc(n);
        allocated_ += b.bytes();
    }
    int64_t off(const std::string& name) const;
    // The pieces of forward() / backward(): checks, state and uploads; the kernels (no host
    // synchronisation, no host memory: what a CUDA graph captures); the loss download; the
    // embedding backward with its host-built buckets.
    void check_batch(const int32_t* tokens, const int32_t* targets, int B, int T_) const;
    void forward_prologue(const int32_t* tokens, const int32_t* targets, int B, int T_);
    void forward_kernels(double grad_scale);
    double forward_loss();
    void backward_prologue();
    void backward_kernels(double grad_scale);
    void embedding_backward_tail();
    void stage(const char* name) {
        if (profile) profile->next(name, stream);
    }
    void drop_graph() {
        if (graph_exec_) (void)cudaGraphExecDestroy(graph_exec_);
        graph_exec_ = nullptr;
    }
    const T* P(int64_t o) const { return params + o; }
    float* G(int64_t o) const { return grads.ptr + o; }
    T* ln_att(int l) { return recompute_ >= 2 ? ln_tmp_.ptr : act_[l].ln_att.ptr; }
    T* ln_mlp(int l) { return recompute_ >= 2 ? ln_tmp_.ptr : act_[l].ln_mlp.ptr; }
    T* a_buf(int l) { return recompute_ >= 1 ? a_tmp_.ptr : act_[l].a.ptr; }
    T* out_buf(int j) {  // where sublayer j's output GEMM writes o_j
        T* o = scheme_->output_buffer(j);
        return o ? o : o_.ptr;
    }

    std::unique_ptr<GpuScheme<T>> scheme_;
    Matmul mm_;
    int Bmax_, Tmax_, recompute_;
    int64_t allocated_ = 0;
    std::vector<Layer> L_;
    int64_t wte_ = 0, final_norm_ = 0, lm_head_ = 0, scheme_off_ = -1;
    int qkvd_ = 0;
    // activations
    std::vector<Act> act_;
    DeviceBuffer<int32_t> tokens_, targets_, uniq_, start_, pos_, count_;
    struct StagedSlot {  // page-locked host side of one staged micro-batch
        PinnedBuffer<int32_t> tokens, targets, uniq, start, pos, count;
        PinnedBuffer<float> losses;
        int batch = 0, seq = 0;  // B, T
    };
    std::vector<std::unique_ptr<StagedSlot>> slots_;
    DeviceBuffer<float> cos_, sin_, rstd_f_, losses_, fscratch_, rstd_tmp_;
    DeviceBuffer<T> emb_, o_, y_, yn_, logits_, ln_tmp_, a_tmp_;
    DeviceBuffer<T> dyn_, dy_, d_o_, dln_, dx_, dao_, dqkvr_, dqkv_, da_, dh13_;
    std::vector<int32_t> tokens_h_;
    int B_ = 0, Tcur_ = 0;
    int64_t N_ = 0;
    bool have_targets_ = false, dlogits_ready_ = false, backward_done_ = true;
    // the captured micro-batch (train_micro_batch with use_graph) and its key
    cudaGraphExec_t graph_exec_ = nullptr;
    int graph_B_ = 0, graph_T_ = 0;
    double graph_scale_ = 0;
    int64_t graph_captures_ = 0, graph_nodes_ = 0;
};

// ------------------------------------------------------------------------------------------------

template <typename T>
int64_t Transformer<T>::off(const std::string& name) const {
    for (const auto& s : specs)
        if (s.name == name) return s.offset;
    throw Error("Transformer: no parameter named '" + name + "'");
}

template <typename T>
Transformer<T>::Transformer(const ModelConfig& c, int B_max, int T_max, int recompute)
    : cfg(c), specs(param_specs(c)), Bmax_(B_max), Tmax_(T_max), recompute_(recompute) {
    if (B_max <= 0 || T_max <= 0) throw Error(strprintf("Transformer: B=%d, T=%d must be positive", B_max, T_max));
    if (T_max > cfg.seq_len) throw Error(strprintf("Transformer: T=%d exceeds seq_len %d", T_max, cfg.seq_len));
    if (recompute < 0 || recompute > 2) throw Error(strprintf("--recompute must be 0, 1 or 2, got %d", recompute));
    n_params = count_params(cfg);
    scheme_ = make_gpu_scheme<T>(cfg);
    const int64_t N = (int64_t)B_max * T_max, d = cfg.d_model, qd = cfg.q_dim(), kvd = cfg.kv_dim(),
                  F = cfg.ffn, nh = cfg.n_head, nkv = cfg.n_kv_head, hd = cfg.head_dim,
                  Vp = cfg.padded_vocab;
    qkvd_ = (int)(qd + 2 * kvd);
    // parameters
    alloc(master, n_params);
    alloc(grads, n_params);
    if (sizeof(T) != sizeof(float)) {
        alloc(work, n_params);
        params = work.ptr;
    } else {
        params = reinterpret_cast<T*>(master.ptr);
    }
    CUDA_CHECK(cudaMemset(master.ptr, 0, (size_t)master.bytes()));
    CUDA_CHECK(cudaMemset(grads.ptr, 0, (size_t)grads.bytes()));
    L_.resize(cfg.n_layer);
    for (int l = 0; l < cfg.n_layer; l++) {
        const std::string p = "blocks." + std::to_string(l) + ".";
        Layer& y = L_[l];
        y.attn_norm = off(p + "attn_norm.w");
        y.wqkv = off(p + "attn.wq");
        if (off(p + "attn.wk") != y.wqkv + qd * d || off(p + "attn.wv") != y.wqkv + (qd + kvd) * d)
            throw Error("Transformer: attn.wq|wk|wv are not contiguous in param_specs");
        if (cfg.qkv_bias) {
            y.bqkv = off(p + "attn.bq");
            if (off(p + "attn.bk") != y.bqkv + qd || off(p + "attn.bv") != y.bqkv + qd + kvd)
                throw Error("Transformer: attn.bq|bk|bv are not contiguous in param_specs");
        }
        if (cfg.qk_norm) {
            y.q_norm = off(p + "attn.q_norm.w");
            y.k_norm = off(p + "attn.k_norm.w");
        }
        y.wo = off(p + "attn.wo");
        y.mlp_norm = off(p + "mlp_norm.w");
        y.w13 = off(p + "mlp.w1");
        if (off(p + "mlp.w3") != y.w13 + F * d) throw Error("Transformer: mlp.w1|w3 are not contiguous");
        y.w2 = off(p + "mlp.w2");
    }
    wte_ = off("wte");
    final_norm_ = off("final_norm.w");
    lm_head_ = cfg.tied ? wte_ : off("lm_head");
    std::vector<ParamSpec> ss = scheme_param_specs(cfg);
    if (!ss.empty()) scheme_off_ = off(ss.front().name);
    if (scheme_off_ >= 0)
        scheme_->bind(params + scheme_off_, master.ptr + scheme_off_, grads.ptr + scheme_off_);
    else
        scheme_->bind(nullptr, nullptr, nullptr);

    // activations, per layer
    act_.resize(cfg.n_layer);
    for (auto& a : act_) {
        alloc(a.x_att, N * d);
        alloc(a.rstd_att, N);
        if (recompute_ < 2) alloc(a.ln_att, N * d);
        if (cfg.qk_norm) {
            alloc(a.qkv, N * qkvd_);
            alloc(a.rstd_qk, N * (nh + nkv));
        }
        alloc(a.qkvr, N * qkvd_);
        alloc(a.ao, N * qd);
        alloc(a.lse, (int64_t)B_max * nh * T_max);
        alloc(a.x_mlp, N * d);
        alloc(a.rstd_mlp, N);
        if (recompute_ < 2) alloc(a.ln_mlp, N * d);
        alloc(a.h13, N * 2 * F);
        if (recompute_ < 1) alloc(a.a, N * F);
    }
    if (recompute_ >= 2) alloc(ln_tmp_, N * d);
    if (recompute_ >= 1) alloc(a_tmp_, N * F);
    alloc(rstd_tmp_, N);
    // shared buffers
    alloc(tokens_, N);
    alloc(targets_, N);
    alloc(uniq_, N + 1);
    alloc(start_, N + 1);
    alloc(pos_, N + 1);
    alloc(count_, 1);
    alloc(cos_, (int64_t)T_max * hd / 2);
    alloc(sin_, (int64_t)T_max * hd / 2);
    {
        std::vector<double> ct((size_t)T_max * hd / 2), st((size_t)T_max * hd / 2);
        cpu::rope_tables<double>(ct.data(), st.data(), T_max, (int)hd, cfg.rope_theta);
        upload(cos_.ptr, ct.data(), (int64_t)ct.size());
        upload(sin_.ptr, st.data(), (int64_t)st.size());
    }
    alloc(emb_, N * d);
    alloc(y_, N * d);
    alloc(yn_, N * d);
    alloc(rstd_f_, N);
    alloc(logits_, N * Vp);
    CUDA_CHECK(cudaMemset(logits_.ptr, 0, (size_t)logits_.bytes()));  // columns >= V stay 0
    alloc(losses_, N);
    for (DeviceBuffer<T>* b : {&dyn_, &dy_, &d_o_, &dln_, &dx_}) alloc(*b, N * d);
    alloc(dao_, N * qd);
    alloc(dqkvr_, N * qkvd_);
    if (cfg.qk_norm) alloc(dqkv_, N * qkvd_);  // without QK-norm the RoPE backward runs in place
    alloc(da_, N * F);
    alloc(dh13_, N * 2 * F);
    int64_t fs = std::max<int64_t>(linear_backward_scratch(N, (int)std::max<int64_t>({Vp, 2 * F, qkvd_, d})),
                                   rmsnorm_backward_scratch(N, (int)d));
    fs = std::max(fs, qknorm_rope_backward_scratch(N, (int)nh, (int)nkv, (int)hd));
    fs = std::max(fs, attention_backward_scratch(B_max, T_max, (int)nh, (int)nkv, (int)hd));
    fs = std::max(fs, rmsnorm_backward_scratch(N * std::max(nh, nkv), (int)hd));
    fs = std::max(fs, global_norm_scratch());
    alloc(fscratch_, std::max<int64_t>(fs, 1));
    scheme_->resize(B_max, T_max);
    // The backbone's o_j buffer only where the scheme keeps some o_j nowhere itself (PreLN,
    // AttnRes-Block); HC, mHC, AttnRes-Full and LDM give every sublayer an output_buffer.
    for (int j = 1; j <= cfg.n_sublayers(); j++)
        if (!scheme_->output_buffer(j)) {
            alloc(o_, N * d);
            break;
        }
    CUDA_CHECK(cudaDeviceSynchronize());
}

template <typename T>
void Transformer<T>::refresh_working_copy() {
    if (sizeof(T) != sizeof(float)) convert_f32<T>(work.ptr, master.ptr, n_params, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

template <typename T>
void Transformer<T>::init(uint64_t seed) {
    std::vector<float> h((size_t)n_params);
    cpu::init_params<float>(cfg, h.data(), seed);
    set_master(h.data());
}

template <typename T>
void Transformer<T>::set_master(const float* host) {
    CUDA_CHECK(cudaMemcpy(master.ptr, host, (size_t)master.bytes(), cudaMemcpyHostToDevice));
    refresh_working_copy();
}

template <typename T>
std::vector<float> Transformer<T>::get_master() const { return download(master.ptr, n_params); }
template <typename T>
std::vector<float> Transformer<T>::get_grads() const { return download(grads.ptr, n_params); }

template <typename T>
void Transformer<T>::zero_grad() {
    CUDA_CHECK(cudaMemsetAsync(grads.ptr, 0, (size_t)grads.bytes(), stream));
}

template <typename T>
std::vector<float> Transformer<T>::logits_host() const {
    if (dlogits_ready_) throw Error("Transformer::logits_host: logits were replaced by dlogits (forward with grad_scale <= 0)");
    return download(logits_.ptr, N_ * cfg.padded_vocab);
}

template <typename T>
double Transformer<T>::forward(const int32_t* tokens, const int32_t* targets, int B, int T_, double grad_scale) {
    forward_prologue(tokens, targets, B, T_);
    forward_kernels(grad_scale);
    if (!targets) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        return std::nan("");
    }
    return forward_loss();
}

template <typename T>
void Transformer<T>::check_batch(const int32_t* tokens, const int32_t* targets, int B, int T_) const {
    const ModelConfig& c = cfg;
    if (B <= 0 || T_ <= 0) throw Error(strprintf("Transformer::forward: B=%d and T=%d must be positive", B, T_));
    if (T_ > Tmax_ || (int64_t)B * T_ > (int64_t)Bmax_ * Tmax_)
        throw Error(strprintf("Transformer::forward: B=%d x T=%d exceeds the allocated %d x %d", B, T_, Bmax_, Tmax_));
    const int64_t N = (int64_t)B * T_;
    const int V = c.vocab_size;
    for (int64_t n = 0; n < N; n++) {
        if (tokens[n] < 0 || tokens[n] >= V)
            throw Error(strprintf("Transformer::forward: token id %d at position %lld is outside [0, %d)",
                                  tokens[n], (long long)n, V));
        if (targets && (targets[n] < 0 || targets[n] >= V))
            throw Error(strprintf("Transformer::forward: target id %d at position %lld is outside [0, %d)",
                                  targets[n], (long long)n, V));
    }
}

template <typename T>
void Transformer<T>::forward_prologue(const int32_t* tokens, const int32_t* targets, int B, int T_) {
    check_batch(tokens, targets, B, T_);
    const int64_t N = (int64_t)B * T_;
    B_ = B;
    Tcur_ = T_;
    N_ = N;
    have_targets_ = targets != nullptr;
    backward_done_ = false;
    cudaStream_t s = stream;
    tokens_h_.assign(tokens, tokens + N);
    CUDA_CHECK(cudaMemcpyAsync(tokens_.ptr, tokens, (size_t)N * 4, cudaMemcpyHostToDevice, s));
    if (targets) CUDA_CHECK(cudaMemcpyAsync(targets_.ptr, targets, (size_t)N * 4, cudaMemcpyHostToDevice, s));
    scheme_->resize(B, T_);
}

template <typename T>
void Transformer<T>::forward_kernels(double grad_scale) {
    const ModelConfig& c = cfg;
    const int B = B_, T_ = Tcur_;
    const int64_t N = N_;
    const int d = c.d_model, qd = c.q_dim(), F = c.ffn, nh = c.n_head, nkv = c.n_kv_head,
              hd = c.head_dim, V = c.vocab_size, Vp = c.padded_vocab;
    cudaStream_t s = stream;
    const float eps = (float)c.norm_eps;
    GpuScheme<T>& S = *scheme_;

    stage("fwd embedding + scheme begin");
    embedding_forward<T>(emb_.ptr, tokens_.ptr, P(wte_), N, d, s);
    S.begin(emb_.ptr, s);
    for (int l = 0; l < c.n_layer; l++) {
        Act& a = act_[l];
        const Layer& p = L_[l];
        // ---- attention sublayer j = 2l+1
        stage("fwd scheme input + RMSNorm");
        S.input_norm(2 * l + 1, a.x_att.ptr, ln_att(l), a.rstd_att.ptr, P(p.attn_norm), eps, s);
        T* qkv = c.qk_norm ? a.qkv.ptr : a.qkvr.ptr;  // without QK-norm RoPE runs in place
        stage("fwd GEMM qkv");
        linear_forward<T>(mm_, qkv, ln_att(l), P(p.wqkv), p.bqkv >= 0 ? P(p.bqkv) : nullptr, N, d, qkvd_, s);
        stage("fwd QK-norm + RoPE");
        qknorm_rope_forward<T>(a.qkvr.ptr, c.qk_norm ? a.rstd_qk.ptr : nullptr, qkv,
                               c.qk_norm ? P(p.q_norm) : nullptr, c.qk_norm ? P(p.k_norm) : nullptr,
                               cos_.ptr, sin_.ptr, N, T_, nh, nkv, hd, eps, s);
        stage("fwd attention");
        attention_forward<T>(a.ao.ptr, a.lse.ptr, a.qkvr.ptr, B, T_, nh, nkv, hd, s);
        stage("fwd GEMM attn out");
        T* o = out_buf(2 * l + 1);  // (the scheme's own buffer where it keeps o_j)
        linear_forward<T>(mm_, o, a.ao.ptr, P(p.wo), nullptr, N, qd, d, s);
        stage("fwd scheme output");
        S.output(2 * l + 1, o, s);
        // ---- MLP sublayer j = 2l+2
        stage("fwd scheme input + RMSNorm");
        S.input_norm(2 * l + 2, a.x_mlp.ptr, ln_mlp(l), a.rstd_mlp.ptr, P(p.mlp_norm), eps, s);
        stage("fwd GEMM w1|w3");
        linear_forward<T>(mm_, a.h13.ptr, ln_mlp(l), P(p.w13), nullptr, N, d, 2 * F, s);
        stage("fwd SwiGLU");
        swiglu_forward<T>(a_buf(l), a.h13.ptr, N, F, s);
        stage("fwd GEMM w2");
        o = out_buf(2 * l + 2);
        linear_forward<T>(mm_, o, a_buf(l), P(p.w2), nullptr, N, F, d, s);
        stage("fwd scheme output");
        S.output(2 * l + 2, o, s);
    }
    stage("fwd scheme readout + final RMSNorm");
    S.readout(y_.ptr, s);
    rmsnorm_forward<T>(yn_.ptr, rstd_f_.ptr, y_.ptr, P(final_norm_), N, d, eps, s);
    // LM head over the real V rows only (row stride Vp); columns >= V are never written (zeroed
    // at allocation), as in the CPU reference.
    stage("fwd GEMM LM head");
    linear_forward<T>(mm_, logits_.ptr, yn_.ptr, P(lm_head_), nullptr, N, d, V, s, Vp);
    dlogits_ready_ = false;
    if (!have_targets_) {
        if (profile) profile->close(s);
        return;
    }
    const bool write = grad_scale > 0;
    stage("fwd classifier (loss, dlogits)");
    fused_classifier<T>(logits_.ptr, losses_.ptr, targets_.ptr, N, V, Vp,
                        write ? (float)(grad_scale / (double)N) : 0.0f, write, s);
    dlogits_ready_ = write;
    if (profile) profile->close(s);
}

template <typename T>
double Transformer<T>::forward_loss() {
    std::vector<float> lh = download(losses_.ptr, N_);  // synchronises
    double sum = 0;
    for (float x : lh) sum += x;
    return sum / (double)N_;
}

template <typename T>
void Transformer<T>::backward(double grad_scale) {
    backward_prologue();
    backward_kernels(grad_scale);
    embedding_backward_tail();
}

template <typename T>
void Transformer<T>::backward_prologue() {
    if (N_ == 0 || !have_targets_) throw Error("Transformer::backward: needs a preceding forward() with targets");
    if (backward_done_) throw Error("Transformer::backward: called twice after one forward (run forward again)");
    backward_done_ = true;
}

template <typename T>
void Transformer<T>::backward_kernels(double grad_scale) {
    const ModelConfig& c = cfg;
    const int64_t N = N_;
    const int B = B_, T_ = Tcur_, d = c.d_model, qd = c.q_dim(), F = c.ffn, nh = c.n_head,
              nkv = c.n_kv_head, hd = c.head_dim, V = c.vocab_size, Vp = c.padded_vocab;
    const float eps = (float)c.norm_eps;
    cudaStream_t s = stream;
    GpuScheme<T>& S = *scheme_;
    float* scr = fscratch_.ptr;
    if (!dlogits_ready_) {  // forward kept the logits readable: turn them into dlogits now
        stage("bwd classifier (dlogits)");
        fused_classifier<T>(logits_.ptr, losses_.ptr, targets_.ptr, N, V, Vp,
                            (float)(grad_scale / (double)N), true, s);
        dlogits_ready_ = true;
    }
    // Head: LM head (over the V real columns of the Vp-strided dlogits), then RMSNorm_f.
    stage("bwd GEMM LM head");
    linear_backward<T>(mm_, dyn_.ptr, G(lm_head_), nullptr, logits_.ptr, yn_.ptr, P(lm_head_), N, d, V,
                       false, scr, s, Vp);
    stage("bwd final RMSNorm + scheme readout");
    rmsnorm_backward<T>(dy_.ptr, G(final_norm_), scr, dyn_.ptr, y_.ptr, P(final_norm_), rstd_f_.ptr, N, d,
                        false, s);
    if (grad_hook) grad_hook(dist::grad_stage_head());
    S.readout_backward(dy_.ptr, s);

    for (int l = c.n_layer - 1; l >= 0; l--) {
        Act& a = act_[l];
        const Layer& p = L_[l];
        // ---- MLP sublayer j = 2l+2
        stage("bwd scheme output");
        S.output_backward(2 * l + 2, d_o_.ptr, s);
        stage("bwd recompute");
        if (recompute_ >= 2)
            rmsnorm_forward<T>(ln_mlp(l), rstd_tmp_.ptr, a.x_mlp.ptr, P(p.mlp_norm), N, d, eps, s);
        if (recompute_ >= 1) swiglu_forward<T>(a_buf(l), a.h13.ptr, N, F, s);
        stage("bwd GEMM w2");
        linear_backward<T>(mm_, da_.ptr, G(p.w2), nullptr, d_o_.ptr, a_buf(l), P(p.w2), N, F, d, false, scr, s);
        stage("bwd SwiGLU");
        swiglu_backward<T>(dh13_.ptr, da_.ptr, a.h13.ptr, N, F, s);
        stage("bwd GEMM w1|w3");
        linear_backward<T>(mm_, dln_.ptr, G(p.w13), nullptr, dh13_.ptr, ln_mlp(l), P(p.w13), N, d, 2 * F,
                           false, scr, s);
        // RMSNorm backward + the scheme's input backward (PreLN fuses them with the next
        // output_backward: d_o_ then already holds dL/do_{2l+1})
        stage("bwd RMSNorm + scheme input");
        S.input_norm_backward(2 * l + 2, dln_.ptr, a.x_mlp.ptr, P(p.mlp_norm), a.rstd_mlp.ptr, N, d,
                              G(p.mlp_norm), scr, dx_.ptr, d_o_.ptr, s);
        // ---- attention sublayer j = 2l+1
        stage("bwd scheme output");
        S.output_backward(2 * l + 1, d_o_.ptr, s);
        stage("bwd GEMM attn out");
        linear_backward<T>(mm_, dao_.ptr, G(p.wo), nullptr, d_o_.ptr, a.ao.ptr, P(p.wo), N, qd, d, false, scr, s);
        stage("bwd attention");
        attention_backward<T>(dqkvr_.ptr, scr, dao_.ptr, a.ao.ptr, a.lse.ptr, a.qkvr.ptr, B, T_, nh, nkv, hd, s);
        // RoPE (and QK-norm) backward: dqkv = ∂L/∂(q|k|v before RoPE / QK-norm); v passes through.
        // Without QK-norm in place (q, k rotated back, v untouched); with it into dqkv_ (the norm's
        // weight gradients read dqkvr_ afterwards).
        T* dqkv = c.qk_norm ? dqkv_.ptr : dqkvr_.ptr;
        stage("bwd QK-norm + RoPE");
        qknorm_rope_backward<T>(dqkv, c.qk_norm ? G(p.q_norm) : nullptr, c.qk_norm ? G(p.k_norm) : nullptr, scr,
                                dqkvr_.ptr, c.qk_norm ? a.qkv.ptr : a.qkvr.ptr,
                                c.qk_norm ? a.rstd_qk.ptr : nullptr, c.qk_norm ? P(p.q_norm) : nullptr,
                                c.qk_norm ? P(p.k_norm) : nullptr, cos_.ptr, sin_.ptr, N, T_, nh, nkv, hd, s);
        stage("bwd recompute");
        if (recompute_ >= 2)
            rmsnorm_forward<T>(ln_att(l), rstd_tmp_.ptr, a.x_att.ptr, P(p.attn_norm), N, d, eps, s);
        stage("bwd GEMM qkv");
        linear_backward<T>(mm_, dln_.ptr, G(p.wqkv), p.bqkv >= 0 ? G(p.bqkv) : nullptr, dqkv, ln_att(l),
                           P(p.wqkv), N, d, qkvd_, false, scr, s);
        stage("bwd RMSNorm + scheme input");
        S.input_norm_backward(2 * l + 1, dln_.ptr, a.x_att.ptr, P(p.attn_norm), a.rstd_att.ptr, N, d,
                              G(p.attn_norm), scr, dx_.ptr, d_o_.ptr, s);
        if (grad_hook) grad_hook(dist::grad_stage_block(l, c.n_layer));
    }
    // Embedding: de in dx_ (then embedding_backward_tail).
    stage("bwd scheme begin + embedding (incl. host buckets)");
    S.begin_backward(dx_.ptr, s);
}

// Deterministic bucketed embedding backward of de (dx_), the buckets built on the host.
template <typename T>
void Transformer<T>::embedding_backward_tail() {
    const int64_t N = N_;
    const int d = cfg.d_model;
    cudaStream_t s = stream;
    EmbeddingBuckets bk = EmbeddingBuckets::build(tokens_h_.data(), N);
    const int U = (int)bk.uniq.size();
    CUDA_CHECK(cudaMemcpyAsync(uniq_.ptr, bk.uniq.data(), bk.uniq.size() * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(start_.ptr, bk.start.data(), bk.start.size() * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(pos_.ptr, bk.pos.data(), bk.pos.size() * 4, cudaMemcpyHostToDevice, s));
    embedding_backward<T>(G(wte_), dx_.ptr, uniq_.ptr, start_.ptr, pos_.ptr, U, d, s);
    if (profile) profile->close(s);  // (the last stage, opened in backward_kernels)
    if (grad_hook) grad_hook(dist::grad_stage_end(cfg.n_layer));
    CUDA_CHECK(cudaStreamSynchronize(s));  // the host bucket vectors die here
    if (scheme_->after_backward(s)) drop_graph();  // e.g. LDM's drift fallback: other kernels from now on
}

template <typename T>
double Transformer<T>::train_micro_batch(const int32_t* tokens, const int32_t* targets, int B, int T_,
                                         double grad_scale, bool use_graph) {
    if (!targets || !(grad_scale > 0))
        throw Error("Transformer::train_micro_batch: needs targets and grad_scale > 0");
    if (!use_graph) {
        const double loss = forward(tokens, targets, B, T_, grad_scale);
        backward(grad_scale);
        return loss;
    }
    if (grad_hook) throw Error("Transformer::train_micro_batch: a CUDA graph cannot run the backward grad_hook");
    if (profile) throw Error("Transformer::train_micro_batch: --profile-stages needs --cuda-graph 0 (events per stage)");
    if (stream == 0) throw Error("Transformer::train_micro_batch: a CUDA graph needs a created stream, not stream 0");
    stage_micro_batch(0, tokens, targets, B, T_);
    if (!graph_exec_ || graph_B_ != B || graph_T_ != T_ || graph_scale_ != grad_scale) {
        drop_graph();
        graph_exec_ = capture_graph(stream, [&] { enqueue_micro_batch(0, grad_scale, nullptr); }, &graph_nodes_,
                                    "the micro-batch");
        graph_B_ = B;
        graph_T_ = T_;
        graph_scale_ = grad_scale;
        graph_captures_++;
    }
    CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double loss = finish_micro_batch(0);
    after_backward();
    return loss;
}

template <typename T>
void Transformer<T>::stage_micro_batch(int slot, const int32_t* tokens, const int32_t* targets, int B, int T_) {
    if (slot < 0 || slot > (int)slots_.size())
        throw Error(strprintf("Transformer::stage_micro_batch: slot %d (slots are used in order 0, 1, ...)", slot));
    if (!targets) throw Error("Transformer::stage_micro_batch: needs targets");
    check_batch(tokens, targets, B, T_);
    if (slot == (int)slots_.size()) {  // page-locked, sized for B_max x T_max, never reallocated
        const int64_t Nm = (int64_t)Bmax_ * Tmax_;
        std::unique_ptr<StagedSlot> sl(new StagedSlot);
        sl->tokens.alloc(Nm);
        sl->targets.alloc(Nm);
        sl->uniq.alloc(Nm + 1);
        sl->start.alloc(Nm + 1);
        sl->pos.alloc(Nm + 1);
        sl->count.alloc(1);
        sl->losses.alloc(Nm);
        slots_.push_back(std::move(sl));
    }
    StagedSlot& sl = *slots_[(size_t)slot];
    const int64_t N = (int64_t)B * T_;
    std::copy(tokens, tokens + N, sl.tokens.ptr);
    std::copy(targets, targets + N, sl.targets.ptr);
    const EmbeddingBuckets bk = EmbeddingBuckets::build(tokens, N);
    std::copy(bk.uniq.begin(), bk.uniq.end(), sl.uniq.ptr);
    std::copy(bk.start.begin(), bk.start.end(), sl.start.ptr);
    std::copy(bk.pos.begin(), bk.pos.end(), sl.pos.ptr);
    sl.count.ptr[0] = bk.U();
    sl.batch = B;
    sl.seq = T_;
    scheme_->resize(B, T_);  // host bookkeeping only (sized for B_max x T_max at construction)
}

template <typename T>
void Transformer<T>::enqueue_micro_batch(int slot, double grad_scale, unsigned* loss_flag) {
    if (slot < 0 || slot >= (int)slots_.size()) throw Error(strprintf("Transformer::enqueue_micro_batch: slot %d not staged", slot));
    if (!(grad_scale > 0)) throw Error("Transformer::enqueue_micro_batch: grad_scale must be > 0");
    if (grad_hook || profile) throw Error("Transformer::enqueue_micro_batch: no grad_hook / profile (a CUDA graph records it)");
    StagedSlot& sl = *slots_[(size_t)slot];
    B_ = sl.batch;
    Tcur_ = sl.seq;
    N_ = (int64_t)sl.batch * sl.seq;
    have_targets_ = true;
    backward_done_ = false;
    scheme_->resize(sl.batch, sl.seq);  // host bookkeeping only (no allocation: sized at construction)
    const int64_t N = N_;
    cudaStream_t s = stream;
    // whole bounds for the buckets (their count varies with the batch; the copy sizes may not)
    CUDA_CHECK(cudaMemcpyAsync(tokens_.ptr, sl.tokens.ptr, (size_t)N * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(targets_.ptr, sl.targets.ptr, (size_t)N * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(uniq_.ptr, sl.uniq.ptr, (size_t)N * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(start_.ptr, sl.start.ptr, (size_t)(N + 1) * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(pos_.ptr, sl.pos.ptr, (size_t)N * 4, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(count_.ptr, sl.count.ptr, 4, cudaMemcpyHostToDevice, s));
    forward_kernels(grad_scale);
    backward_prologue();
    backward_kernels(grad_scale);
    embedding_backward<T>(G(wte_), dx_.ptr, uniq_.ptr, start_.ptr, pos_.ptr, (int)N, cfg.d_model, s, count_.ptr);
    CUDA_CHECK(cudaMemcpyAsync(sl.losses.ptr, losses_.ptr, (size_t)N * 4, cudaMemcpyDeviceToHost, s));
    if (loss_flag) flag_nonfinite(loss_flag, losses_.ptr, N, s);
}

template <typename T>
double Transformer<T>::finish_micro_batch(int slot) {
    if (slot < 0 || slot >= (int)slots_.size()) throw Error(strprintf("Transformer::finish_micro_batch: slot %d not staged", slot));
    const StagedSlot& sl = *slots_[(size_t)slot];
    B_ = sl.batch;
    Tcur_ = sl.seq;
    N_ = (int64_t)sl.batch * sl.seq;
    have_targets_ = true;
    dlogits_ready_ = true;
    backward_done_ = true;
    double sum = 0;
    for (int64_t i = 0; i < N_; i++) sum += sl.losses.ptr[i];
    return sum / (double)N_;
}

// Byte counts of a configuration without allocating anything (also for --dry-run without a GPU):
// the same buffers as the Transformer constructor. elt = sizeof(T) (4 fp32, 2 bf16).
// backbone_o: whether the backbone's o_j buffer exists (true unless the scheme keeps every o_j
// itself; counting it anyway keeps the estimate below the need: such a scheme holds ≥ N·d more).
inline TransformerMemory transformer_memory_estimate(const ModelConfig& cfg, int recompute, int64_t elt,
                                     int64_t scheme_bytes_per_token, bool backbone_o = true) {
    TransformerMemory m;
    const int64_t n = count_params(cfg), d = cfg.d_model, qd = cfg.q_dim(),
                  qkvd = cfg.q_dim() + 2 * cfg.kv_dim(), F = cfg.ffn, nh = cfg.n_head,
                  nkv = cfg.n_kv_head, Vp = cfg.padded_vocab, et = elt;
    m.params = n * 4 + (et != 4 ? n * et : 0);
    m.grads = n * 4;
    m.adamw = 2 * n * 4;
    // per layer and token: x_att, ln_att (recompute < 2), qkv (QK-norm), qkvr, ao, x_mlp,
    // ln_mlp (recompute < 2), h13, a (recompute < 1); fp32 rstd_att, rstd_qk, lse, rstd_mlp
    const int64_t layer = et * (d + (recompute < 2 ? d : 0) + (cfg.qk_norm ? qkvd : 0) + qkvd + qd + d +
                                (recompute < 2 ? d : 0) + 2 * F + (recompute < 1 ? F : 0)) +
                          4 * (1 + (cfg.qk_norm ? nh + nkv : 0) + nh + 1);
    // shared: ln_tmp / a_tmp (recompute), emb, o (backbone_o), y, yn, dyn, dy, d_o, dln, dx, dao, dqkvr,
    // dqkv (QK-norm), da, dh13; fp32 rstd_f, rstd_tmp; int32 tokens, targets, uniq, start, pos
    const int64_t shared = et * ((recompute >= 2 ? d : 0) + (recompute >= 1 ? F : 0) + (backbone_o ? 9 : 8) * d + qd +
                                 (cfg.qk_norm ? 2 : 1) * qkvd + F + 2 * F) +
                           4 * 2 + 4 * 5;
    m.act_per_token = cfg.n_layer * layer + shared;
    m.scheme_per_token = scheme_bytes_per_token;
    m.logits_per_token = et * Vp + 4;
    return m;
}

template <typename T>
TransformerMemory Transformer<T>::memory() const {
    TransformerMemory m =
        transformer_memory_estimate(cfg, recompute_, sizeof(T), scheme_->extra_bytes_per_token(), o_.ptr != nullptr);
    m.fixed = fscratch_.bytes() + cos_.bytes() * 2;
    return m;
}

}  // namespace gpu
}  // namespace ldm
