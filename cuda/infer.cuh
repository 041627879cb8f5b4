// cuda/infer.cuh — inference on the GPU over a Transformer<T> (cuda/transformer.cuh) with any GpuScheme: prefill +
// incremental decode with a KV cache on the device, mirroring cpu/infer.h (same contract, same
// logits layout) so that the host-side sampling of cpu/infer.h (SamplingParams, sample_token)
// picks the tokens. Spec: ../shared/spec/model.md §1-§2, performance.md ("inference: prefill
// tokens/s and per-token decode latency"). Walkthrough: doc/cuda.md "Inference on the GPU".
//
// Why a cache of attention keys/values is all that is needed (see cpu/infer.h): every depth
// scheme keeps its state per token and mixes only across the depth of that token, so a step runs
// the scheme's forward on the rows of the new tokens only (N = B·n rows, its own scheme instance
// and buffers); only causal attention looks back in time, through the cache.
//
// One step of n new tokens per sequence (positions len .. len+n-1), per layer:
//   scheme input_norm -> qkv GEMM -> QK-norm + RoPE (qknorm_rope_forward with the cos/sin tables
//   offset by len rows and period n: row (b, t) gets absolute position len + t) -> append k, v to
//   the cache (kv_append_kernel) -> attention: len == 0 (a prefill) uses the training kernels
//   (attention_forward on the prompt itself); len > 0 uses cached_attention_kernel (each query row
//   against cache[0 .. len+t], GQA, fp32 online softmax split over 4 warps, math in
//   cuda/infer_math.h) -> wo GEMM -> scheme output -> MLP as in Transformer::forward.
// Then the scheme's readout, the last row per sequence (or every row), final RMSNorm, LM head into
// [rows, Vp] (columns >= V stay 0), downloaded as fp32.
//
// The model is only read (its working-copy weights and fp32 master through const pointers): its
// activations, gradients, scheme state, stream buffers and cuBLASLt workspace are never touched, so
// sampling in the middle of training leaves training bit-identical. The weights are read at every
// step, so the same object follows the model while it trains.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "cuda/adamw.cuh"
#include "cuda/attention.cuh"
#include "cuda/common.cuh"
#include "cuda/embedding.cuh"
#include "cuda/transformer.cuh"
#include "cuda/infer_math.h"
#include "cuda/matmul.cuh"
#include "cuda/rmsnorm.cuh"
#include "cuda/rope.cuh"
#include "cuda/scheme.cuh"
#include "cuda/swiglu.cuh"
#include "cpu/infer.h"
#include "cpu/ops.h"
#include "cpu/rng.h"

namespace ldm {
namespace gpu {

namespace infer_detail {

constexpr int kDecWarps = 4;     // warps per query row (key parts merged at the end)
constexpr int kDecMaxHd = 256;   // each lane owns dims lane + 32·i, i < 8
constexpr int kDecPerLane = kDecMaxHd / 32;

__device__ __forceinline__ float dec_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Appends the k and v heads of the n new tokens of every sequence to one layer's cache.
// qkvr [B·n, (nh + 2·nkv)·hd] (after QK-norm + RoPE), rows in (b, t) order; kc, vc [B, max_T, kvd]
// (kvd = nkv·hd); row (b, t) goes to position len + t.
template <typename T>
__global__ void kv_append_kernel(T* kc, T* vc, const T* qkvr, int B, int n, int len, int max_T, int nh,
                                 int nkv, int hd) {
    const int64_t kvd = (int64_t)nkv * hd, C3 = (int64_t)(nh + 2 * nkv) * hd;
    const int64_t total = (int64_t)B * n * kvd;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t bt = i / kvd, c = i - bt * kvd;
        const int64_t b = bt / n, t = bt - b * n;
        const int64_t dst = (b * max_T + len + t) * kvd + c;
        kc[dst] = qkvr[bt * C3 + (int64_t)nh * hd + c];
        vc[dst] = qkvr[bt * C3 + (int64_t)(nh + nkv) * hd + c];
    }
}

// Causal attention of the n new query rows of every sequence over one layer's cache: one block of
// kDecWarps warps per (b, t, h) (blockIdx.x = (b·n + t)·nh + h). Query row (b, t) sees cache
// positions 0 .. len + t (its own key was appended before). Warp w takes the keys j ≡ w mod
// kDecWarps: per key the warp sums q·k over its lanes (dims lane + 32·i), then
// online_softmax_add; at the end the warps' states are merged in order 0..3
// (online_softmax_merge), exactly the decomposition of cached_attention_row_ref
// (cuda/infer_math.h). out [B·n, nh·hd]. scale = 1/sqrt(hd); fp32 arithmetic. hd <= 256, even.
template <typename T>
__global__ void __launch_bounds__(kDecWarps * 32)
cached_attention_kernel(T* out, const T* qkvr, const T* kc, const T* vc, int n, int len, int max_T, int nh,
                        int nkv, int hd, float scale) {
    __shared__ float qs[kDecMaxHd];
    __shared__ float sm[kDecWarps], sl[kDecWarps];
    __shared__ float sacc[kDecWarps][kDecMaxHd];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = blockIdx.x;
    const int h = (int)(row % nh);
    const int64_t bt = row / nh;
    const int t = (int)(bt % n);
    const int64_t b = bt / n;
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * hd, kvd = (int64_t)nkv * hd;
    const T* qrow = qkvr + bt * C3 + (int64_t)h * hd;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) qs[c] = to_f(qrow[c]);
    __syncthreads();
    const int L = len + t + 1;
    const T* K = kc + b * max_T * kvd + (int64_t)g * hd;
    const T* V = vc + b * max_T * kvd + (int64_t)g * hd;
    float m = -INFINITY, l = 0.f;
    float acc[kDecPerLane];
#pragma unroll
    for (int i = 0; i < kDecPerLane; i++) acc[i] = 0.f;
    for (int j = warp; j < L; j += kDecWarps) {  // warp-uniform loop
        const T* kr = K + (int64_t)j * kvd;
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < kDecPerLane; i++) {
            const int c = lane + 32 * i;
            if (c < hd) dot = fmaf(qs[c], to_f(kr[c]), dot);
        }
        dot = dec_warp_sum(dot);
        float alpha, p;
        online_softmax_add(m, l, dot * scale, &alpha, &p);
        const T* vr = V + (int64_t)j * kvd;
#pragma unroll
        for (int i = 0; i < kDecPerLane; i++) {
            const int c = lane + 32 * i;
            if (c < hd) acc[i] = acc[i] * alpha + p * to_f(vr[c]);
        }
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < kDecPerLane; i++) {
        const int c = lane + 32 * i;
        if (c < hd) sacc[warp][c] = acc[i];
    }
    __syncthreads();
    T* orow = out + bt * (int64_t)nh * hd + (int64_t)h * hd;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float M = sm[0], Ls = sl[0], a = sacc[0][c];
        for (int w = 1; w < kDecWarps; w++) {
            float mm, ll, a1, a2;
            online_softmax_merge(M, Ls, sm[w], sl[w], &mm, &ll, &a1, &a2);
            a = a * a1 + sacc[w][c] * a2;
            M = mm;
            Ls = ll;
        }
        orow[c] = from_f<T>(a / Ls);  // Ls > 0: key 0 is always seen (by warp 0)
    }
}

}  // namespace infer_detail

// out [B·n, nh·hd] = attention of the n new query rows per sequence (q heads of qkvr [B·n, C3])
// over the cache kc, vc [B, max_T, nkv·hd] holding positions 0 .. len+n-1. Throws ldm::Error on a
// bad shape (hd odd or > 256, nh % nkv != 0, len + n > max_T).
template <typename T>
void cached_attention_forward(T* out, const T* qkvr, const T* kc, const T* vc, int B, int n, int len, int max_T,
                              int nh, int nkv, int hd, cudaStream_t s) {
    if (B < 1 || n < 1 || len < 0 || len + n > max_T || nh < 1 || nkv < 1 || nh % nkv != 0 || hd < 2 ||
        hd % 2 != 0 || hd > infer_detail::kDecMaxHd)
        throw Error(strprintf("cached_attention_forward: bad shape B=%d n=%d len=%d max_T=%d nh=%d nkv=%d hd=%d", B,
                              n, len, max_T, nh, nkv, hd));
    const int64_t rows = (int64_t)B * n * nh;
    infer_detail::cached_attention_kernel<T><<<(unsigned)rows, infer_detail::kDecWarps * 32, 0, s>>>(
        out, qkvr, kc, vc, n, len, max_T, nh, nkv, hd, 1.f / sqrtf((float)hd));
    LDM_LAUNCH_CHECK();
}

// Appends the k, v heads of qkvr [B·n, C3] at positions len .. len+n-1 of kc, vc [B, max_T, nkv·hd].
template <typename T>
void kv_cache_append(T* kc, T* vc, const T* qkvr, int B, int n, int len, int max_T, int nh, int nkv, int hd,
                     cudaStream_t s) {
    if (len + n > max_T) throw Error(strprintf("kv_cache_append: %d + %d positions exceed max_T=%d", len, n, max_T));
    const int64_t total = (int64_t)B * n * nkv * hd;
    if (total <= 0) return;
    infer_detail::kv_append_kernel<T><<<elementwise_blocks(total), 256, 0, s>>>(kc, vc, qkvr, B, n, len, max_T, nh,
                                                                               nkv, hd);
    LDM_LAUNCH_CHECK();
}

// Prefill + decode for B sequences in lockstep over a Transformer's current weights (same API as
// cpu::Inference, cpu/infer.h). Not thread-safe. Allocates the KV cache (T, [n_layer, B, max_T,
// kv_dim] for k and for v) at construction and the step buffers for the largest B·n seen (they
// only grow; a prefill of P tokens needs about the training activations of B·P tokens plus the
// scheme's buffers for B·P rows).
template <typename T>
class GpuInference {
   public:
    // max_T in [1, cfg.seq_len], B >= 1 (ldm::Error else). The model must outlive this object.
    GpuInference(const Transformer<T>& model, int B, int max_T);
    GpuInference(const GpuInference&) = delete;
    GpuInference& operator=(const GpuInference&) = delete;

    void reset() { len_ = 0; }  // empties the cache
    // n >= 1 new tokens per sequence (host tokens [B, n] row-major, ids in [0, V); ldm::Error else,
    // also when len + n > max_T) at positions len .. len+n-1. Returns host fp32 logits:
    // all_logits ? [B·n, Vp] in (b, t) order : [B, Vp] (each sequence's last new position);
    // columns >= V are 0. Valid until the next call. Synchronises the model's stream.
    const float* step(const int32_t* tokens, int n, bool all_logits);
    const float* prefill(const int32_t* tokens, int P, bool all_logits = false) {
        reset();
        return step(tokens, P, all_logits);
    }
    const float* decode_step(const int32_t* tokens) { return step(tokens, 1, false); }

    int pos() const { return len_; }
    int batch() const { return B_; }
    int max_len() const { return max_T_; }
    int vocab_size() const { return cfg_.vocab_size; }
    int padded_vocab() const { return cfg_.padded_vocab; }
    int64_t cache_bytes() const { return kc_.bytes() + vc_.bytes(); }
    // Device bytes of this object: cache, step buffers, RoPE tables (not the scheme's own buffers,
    // nor the cuBLASLt workspace).
    int64_t allocated_bytes() const { return allocated_; }

   private:
    template <typename E>
    void fit(DeviceBuffer<E>& b, int64_t n) {
        if (b.n >= n) return;
        allocated_ -= b.bytes();
        b.alloc(n);
        allocated_ += b.bytes();
    }
    int64_t off(const std::string& name) const {
        for (const auto& s : model_.specs)
            if (s.name == name) return s.offset;
        throw Error("GpuInference: no parameter named '" + name + "'");
    }
    const T* P(int64_t o) const { return model_.params + o; }

    struct Layer {
        int64_t attn_norm, wqkv, bqkv = -1, q_norm = -1, k_norm = -1, wo, mlp_norm, w13, w2;
    };
    const Transformer<T>& model_;
    const ModelConfig& cfg_;
    int B_, max_T_, len_ = 0, qkvd_ = 0;
    int64_t allocated_ = 0, wte_ = 0, final_norm_ = 0, lm_head_ = 0;
    std::vector<Layer> L_;
    std::unique_ptr<GpuScheme<T>> scheme_;
    Matmul mm_;
    DeviceBuffer<float> scheme_grads_;  // never read: the scheme's forward does not write gradients
    DeviceBuffer<T> kc_, vc_;            // [n_layer, B, max_T, kvd]
    DeviceBuffer<float> cos_, sin_;      // [max_T, hd/2]
    std::vector<DeviceBuffer<T>> xs_;    // x_j of every sublayer j (schemes may read x_j back)
    DeviceBuffer<int32_t> tokens_;
    DeviceBuffer<T> emb_, ln_, qkv_, qkvr_, ao_, o_, h13_, a_, y_, ysel_, yn_, logits_;
    DeviceBuffer<float> rstd_, lse_;
    std::vector<float> logits_h_;
};

template <typename T>
GpuInference<T>::GpuInference(const Transformer<T>& model, int B, int max_T)
    : model_(model), cfg_(model.cfg), B_(B), max_T_(max_T) {
    const ModelConfig& c = cfg_;
    if (B < 1) throw Error(strprintf("GpuInference: B=%d must be >= 1", B));
    if (max_T < 1 || max_T > c.seq_len)
        throw Error(strprintf("GpuInference: max_T=%d must be in [1, seq_len=%d]", max_T, c.seq_len));
    if (c.head_dim > infer_detail::kDecMaxHd)
        throw Error(strprintf("GpuInference: head_dim %d exceeds %d", c.head_dim, infer_detail::kDecMaxHd));
    const int64_t qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim;
    qkvd_ = (int)(qd + 2 * kvd);
    L_.resize(c.n_layer);
    for (int l = 0; l < c.n_layer; l++) {  // contiguity of wq|wk|wv, bq|bk|bv, w1|w3 checked by Transformer
        const std::string p = "blocks." + std::to_string(l) + ".";
        Layer& y = L_[l];
        y.attn_norm = off(p + "attn_norm.w");
        y.wqkv = off(p + "attn.wq");
        if (c.qkv_bias) y.bqkv = off(p + "attn.bq");
        if (c.qk_norm) {
            y.q_norm = off(p + "attn.q_norm.w");
            y.k_norm = off(p + "attn.k_norm.w");
        }
        y.wo = off(p + "attn.wo");
        y.mlp_norm = off(p + "mlp_norm.w");
        y.w13 = off(p + "mlp.w1");
        y.w2 = off(p + "mlp.w2");
    }
    wte_ = off("wte");
    final_norm_ = off("final_norm.w");
    lm_head_ = c.tied ? wte_ : off("lm_head");
    // The scheme: a fresh instance bound to the model's scheme parameters (read only) and to a
    // private gradient block.
    scheme_ = make_gpu_scheme<T>(c);
    std::vector<ParamSpec> ss = scheme_param_specs(c);
    if (!ss.empty()) {
        int64_t ns = 0;
        for (const auto& s : ss) ns += s.numel;
        fit(scheme_grads_, ns);
        CUDA_CHECK(cudaMemset(scheme_grads_.ptr, 0, (size_t)scheme_grads_.bytes()));
        const int64_t so = off(ss.front().name);
        // the scheme's bind() takes const pointers to params and master
        scheme_->bind(model_.params + so, model_.master.ptr + so, scheme_grads_.ptr);
    } else {
        scheme_->bind(nullptr, nullptr, nullptr);
    }
    const int64_t cache = (int64_t)c.n_layer * B * max_T * kvd;
    fit(kc_, cache);
    fit(vc_, cache);
    CUDA_CHECK(cudaMemset(kc_.ptr, 0, (size_t)kc_.bytes()));
    CUDA_CHECK(cudaMemset(vc_.ptr, 0, (size_t)vc_.bytes()));
    fit(cos_, (int64_t)max_T * hd / 2);
    fit(sin_, (int64_t)max_T * hd / 2);
    {  // the tables of Transformer (double on the host, rounded to fp32)
        std::vector<double> ct((size_t)max_T * hd / 2), st((size_t)max_T * hd / 2);
        cpu::rope_tables<double>(ct.data(), st.data(), max_T, (int)hd, c.rope_theta);
        upload(cos_.ptr, ct.data(), (int64_t)ct.size());
        upload(sin_.ptr, st.data(), (int64_t)st.size());
    }
    xs_.resize((size_t)2 * c.n_layer);
}

template <typename T>
const float* GpuInference<T>::step(const int32_t* tokens, int n, bool all_logits) {
    const ModelConfig& c = cfg_;
    const int B = B_, d = c.d_model, qd = c.q_dim(), F = c.ffn, nh = c.n_head, nkv = c.n_kv_head,
              hd = c.head_dim, V = c.vocab_size, Vp = c.padded_vocab, len = len_;
    if (n < 1) throw Error(strprintf("GpuInference::step: n=%d must be >= 1", n));
    if (len + n > max_T_)
        throw Error(strprintf("GpuInference::step: %d cached + %d new positions exceed max_T=%d", len, n, max_T_));
    const int64_t N = (int64_t)B * n;
    for (int64_t i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            throw Error(strprintf("GpuInference::step: token id %d at position %lld is outside [0, %d)", tokens[i],
                                  (long long)i, V));
    const int64_t rows_out = all_logits ? N : B;
    fit(tokens_, N);
    for (auto& x : xs_) fit(x, N * d);
    for (DeviceBuffer<T>* b : {&emb_, &ln_, &o_, &y_}) fit(*b, N * d);
    fit(qkv_, N * qkvd_);
    fit(qkvr_, N * qkvd_);
    fit(ao_, N * qd);
    fit(h13_, N * 2 * F);
    fit(a_, N * F);
    fit(rstd_, N);
    fit(lse_, (int64_t)B * nh * n);
    fit(ysel_, (int64_t)B * d);
    fit(yn_, rows_out * d);
    if (logits_.n < rows_out * Vp) {
        fit(logits_, rows_out * Vp);
        CUDA_CHECK(cudaMemset(logits_.ptr, 0, (size_t)logits_.bytes()));  // columns >= V stay 0
    }
    cudaStream_t s = model_.stream;
    CUDA_CHECK(cudaMemcpyAsync(tokens_.ptr, tokens, (size_t)N * 4, cudaMemcpyHostToDevice, s));
    const float eps = (float)c.norm_eps;
    GpuScheme<T>& S = *scheme_;
    S.resize(B, n);
    const int64_t half = hd / 2, layer_cache = (int64_t)B * max_T_ * c.kv_dim();
    const float* cos_l = cos_.ptr + (int64_t)len * half;  // row (b, t): position len + t
    const float* sin_l = sin_.ptr + (int64_t)len * half;

    embedding_forward<T>(emb_.ptr, tokens_.ptr, P(wte_), N, d, s);
    S.begin(emb_.ptr, s);
    for (int l = 0; l < c.n_layer; l++) {
        const Layer& p = L_[l];
        T* kc = kc_.ptr + l * layer_cache;
        T* vc = vc_.ptr + l * layer_cache;
        // ---- attention sublayer j = 2l+1
        S.input_norm(2 * l + 1, xs_[2 * l].ptr, ln_.ptr, rstd_.ptr, P(p.attn_norm), eps, s);
        linear_forward<T>(mm_, qkv_.ptr, ln_.ptr, P(p.wqkv), p.bqkv >= 0 ? P(p.bqkv) : nullptr, N, d, qkvd_, s);
        qknorm_rope_forward<T>(qkvr_.ptr, nullptr, qkv_.ptr, c.qk_norm ? P(p.q_norm) : nullptr,
                               c.qk_norm ? P(p.k_norm) : nullptr, cos_l, sin_l, N, n, nh, nkv, hd, eps, s);
        kv_cache_append<T>(kc, vc, qkvr_.ptr, B, n, len, max_T_, nh, nkv, hd, s);
        if (len == 0)  // a prefill: the training kernel over the prompt itself
            attention_forward<T>(ao_.ptr, lse_.ptr, qkvr_.ptr, B, n, nh, nkv, hd, s);
        else
            cached_attention_forward<T>(ao_.ptr, qkvr_.ptr, kc, vc, B, n, len, max_T_, nh, nkv, hd, s);
        linear_forward<T>(mm_, o_.ptr, ao_.ptr, P(p.wo), nullptr, N, qd, d, s);
        S.output(2 * l + 1, o_.ptr, s);
        // ---- MLP sublayer j = 2l+2
        S.input_norm(2 * l + 2, xs_[2 * l + 1].ptr, ln_.ptr, rstd_.ptr, P(p.mlp_norm), eps, s);
        linear_forward<T>(mm_, h13_.ptr, ln_.ptr, P(p.w13), nullptr, N, d, 2 * F, s);
        swiglu_forward<T>(a_.ptr, h13_.ptr, N, F, s);
        linear_forward<T>(mm_, o_.ptr, a_.ptr, P(p.w2), nullptr, N, F, d, s);
        S.output(2 * l + 2, o_.ptr, s);
    }
    S.readout(y_.ptr, s);
    const T* yrows = y_.ptr;
    if (!all_logits) {  // row (b, n-1) of every sequence
        CUDA_CHECK(cudaMemcpy2DAsync(ysel_.ptr, (size_t)d * sizeof(T), y_.ptr + (int64_t)(n - 1) * d,
                                     (size_t)n * d * sizeof(T), (size_t)d * sizeof(T), (size_t)B,
                                     cudaMemcpyDeviceToDevice, s));
        yrows = ysel_.ptr;
    }
    rmsnorm_forward<T>(yn_.ptr, rstd_.ptr, yrows, P(final_norm_), rows_out, d, eps, s);
    linear_forward<T>(mm_, logits_.ptr, yn_.ptr, P(lm_head_), nullptr, rows_out, d, V, s, Vp);
    CUDA_CHECK(cudaStreamSynchronize(s));
    logits_h_ = download(logits_.ptr, rows_out * Vp);
    len_ = len + n;
    return logits_h_.data();
}

// Autoregressive generation of one sequence (inf.batch() == 1): cpu::generate_loop
// (cpu/infer.h, the loop of cpu::generate) with the same sampler (cpu::sample_token over the real V) and the same
// random stream (draw i = stream_uniform(init_stream(seed, 0), i)): prefill of the prompt, then up
// to max_new tokens; stops after stop_token (>= 0, included) or when the cache is full. The same
// weights and settings therefore give the same tokens as build/generate_cpu up to the logits'
// rounding differences. stats: wall-clock timing (prefill; each decode step, which includes the
// device -> host copy of its logits).
template <typename T>
std::vector<int32_t> gpu_generate(GpuInference<T>& inf, const std::vector<int32_t>& prompt, int max_new,
                                  const cpu::SamplingParams& sp, uint64_t seed, int32_t stop_token = -1,
                                  cpu::GenerateStats* stats = nullptr) {
    return cpu::generate_loop(inf, prompt, max_new, sp, seed, stop_token, stats, "GpuInference");
}

}  // namespace gpu
}  // namespace ldm
