// cpu/infer.h — inference on the CPU reference: prefill and incremental decode with a KV
// cache, and sampling (greedy, temperature, top-k, top-p). Spec: ../shared/spec/model.md §1-§2
// (the same forward as Model<R>), ../shared/spec/performance.md ("inference: prefill tokens/s
// and per-token decode latency"). Walkthrough: doc/benchmarks.md "Inference".
//
// Why a cache of attention keys/values is all that is needed: every depth-aggregation scheme
// (PreLN, HC, mHC, AttnRes Full/Block, LDM) keeps its state per token and mixes only across the
// depth of that token (cpu/scheme_*.cpp index everything by the token row n < N = B*T and
// never look at another row; resize() only uses B*T). So the scheme simply runs on the rows of
// the new tokens; only causal attention looks back in time, through the cache.
//
// The weights are read from the Model's flat params at every call (they may change between
// calls, e.g. sampling during training); the model itself is never touched (its activations,
// grads and scheme are left alone), so training stays bit-identical.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/config.h"
#include "cpu/model.h"
#include "cpu/rng.h"
#include "cpu/scheme.h"

namespace ldm {
namespace cpu {

// Keys (after QK-norm and RoPE) and values of every layer for B sequences that advance in
// lockstep (all have `len` positions). k, v: [n_layer, B, max_T, kv_dim] row-major.
template <typename R>
struct KVCache {
    int n_layer = 0, B = 0, max_T = 0, kvd = 0;
    int len = 0;  // positions filled, the same for every sequence
    std::vector<R> k, v;
    void allocate(const ModelConfig& c, int B, int max_T);  // zeroed, len = 0
    R* K(int l, int b) { return k.data() + ((size_t)l * B + b) * (size_t)max_T * kvd; }
    R* V(int l, int b) { return v.data() + ((size_t)l * B + b) * (size_t)max_T * kvd; }
    int64_t bytes() const { return (int64_t)(k.size() + v.size()) * (int64_t)sizeof(R); }
};

// Prefill + decode over a model's current parameters. Not thread-safe (one instance per caller);
// uses OpenMP/BLAS threads inside like the model.
template <typename R>
class Inference {
   public:
    // B sequences of at most max_T positions; max_T in [1, cfg.seq_len] (ldm::Error else). The
    // model must outlive this object; its params are read on every call.
    Inference(const Model<R>& model, int B, int max_T);
    ~Inference();
    Inference(const Inference&) = delete;
    Inference& operator=(const Inference&) = delete;

    // Empties the cache (len = 0).
    void reset();
    // Runs n >= 1 new tokens per sequence at positions len .. len+n-1 and appends their keys and
    // values to the cache. tokens: [B, n] row-major, ids in [0, V) (ldm::Error else, also when
    // len + n > max_T). Returns the logits: all_logits ? [B*n, Vp] in (b, t) order : [B, Vp]
    // for each sequence's last new position. Columns >= V are 0. Valid until the next call.
    const R* step(const int32_t* tokens, int n, bool all_logits);
    // reset() then step(tokens [B, P], P, all_logits).
    const R* prefill(const int32_t* tokens, int P, bool all_logits = false);
    // One new token per sequence (tokens [B]); returns [B, Vp].
    const R* decode_step(const int32_t* tokens) { return step(tokens, 1, false); }

    int pos() const { return cache_.len; }
    int batch() const { return B_; }
    int max_len() const { return max_T_; }
    int vocab_size() const { return cfg_.vocab_size; }
    const KVCache<R>& cache() const { return cache_; }

   private:
    const Model<R>& model_;
    const ModelConfig& cfg_;
    int B_, max_T_;
    KVCache<R> cache_;
    std::unique_ptr<Scheme<R>> scheme_;
    std::map<std::string, int64_t> off_;  // param_specs name -> offset in model.params
    std::vector<R> scheme_grads_;  // unused gradient block the scheme binds to
    std::vector<R> cos_t_, sin_t_;  // RoPE tables [max_T, hd/2]
    // per-step buffers (sized for the largest n seen)
    std::vector<R> emb_, x_, ln_, q_, k_, v_, qn_, kn_, rstd_, ao_, o_, h13_, a_, y_, yn_,
        ysel_, logits_, scores_;
};

// Sampling settings. greedy (or temperature <= 0, or top_k == 1) picks the argmax. Otherwise the
// logits over the real V are divided by the temperature, softmaxed (in double), restricted to
// the top_k most probable tokens (0 = all) and then to the nucleus: the smallest prefix of the
// tokens sorted by descending probability (ties: lower id first) whose mass reaches top_p
// (1 = all); the kept probabilities are renormalised.
struct SamplingParams {
    bool greedy = false;
    double temperature = 1.0;
    int top_k = 0;
    double top_p = 1.0;
};

// First index of the maximum of logits[0..V).
template <typename R>
int32_t argmax_token(const R* logits, int V);

// The distribution sample_token draws from: ids sorted by descending probability (ties: lower id
// first) and their renormalised probabilities (sum 1). Greedy: the argmax with probability 1.
// ldm::Error for top_k < 0, top_p outside (0, 1], or a non-finite logit (NaN, +-inf).
template <typename R>
void sampling_distribution(const R* logits, int V, const SamplingParams& sp, std::vector<int32_t>* ids,
                           std::vector<double>* probs);

// Draws one token from sampling_distribution with u uniform in [0, 1) (inverse CDF).
template <typename R>
int32_t sample_token(const R* logits, int V, const SamplingParams& sp, double u);

// Timing of one generate() call (wall clock).
struct GenerateStats {
    int prompt_tokens = 0, new_tokens = 0;
    double prefill_s = 0;              // prefill of the prompt (including its last-row logits)
    std::vector<double> decode_ms;     // one entry per decode_step (new tokens after the first)
    // Tokens generated after the context was full: each re-prefilled the last max_len tokens
    // (sliding window, below) instead of a decode_step; their total time.
    int window_steps = 0;
    double window_s = 0;
    double prefill_tokens_per_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0; }
    double mean_decode_ms() const;     // 0 when no decode step ran
    double median_decode_ms() const;
};

// Autoregressive generation for one sequence (the Inference must have B == 1): prefill of the
// prompt (>= 1 token), then up to max_new tokens, each sampled from the last logits; decoding
// stops early after a token equal to stop_token (>= 0; included in the result). Once the cache is
// full (max_len positions) the context slides: every further token is predicted from the last
// max_len tokens, re-prefilled from position 0 (the crop of nanoGPT/llm.c generation; cost one
// prefill of max_len tokens per token; counted in GenerateStats::window_steps). Sampling uses the
// splitmix64 stream of `seed` (cpu/rng.h: draw i is stream_uniform(init_stream(seed, 0), i)).
// Returns the new tokens.
template <typename R>
std::vector<int32_t> generate(Inference<R>& inf, const std::vector<int32_t>& prompt, int max_new,
                              const SamplingParams& sp, uint64_t seed, int32_t stop_token = -1,
                              GenerateStats* stats = nullptr);

// The loop of generate() over any inference object with B == 1 — this Inference<R> or the GPU's
// gpu::GpuInference<T> (cuda/infer.cuh) — that has batch(), max_len(), pos(), vocab_size(),
// prefill(tokens, n, false) and decode_step(&token) returning the last row's logits (host memory).
// Same contract and errors as generate(); `what` names the caller in the error messages.
template <class Inf>
std::vector<int32_t> generate_loop(Inf& inf, const std::vector<int32_t>& prompt, int max_new, const SamplingParams& sp,
                                   uint64_t seed, int32_t stop_token, GenerateStats* stats, const char* what) {
    using clock = std::chrono::steady_clock;
    if (inf.batch() != 1) throw Error(std::string("generate: the ") + what + " must have B = 1");
    if (prompt.empty()) throw Error("generate: the prompt is empty (give at least one token)");
    if ((int)prompt.size() > inf.max_len())
        throw Error(strprintf("generate: prompt of %zu tokens exceeds the context of %d", prompt.size(), inf.max_len()));
    GenerateStats st;
    st.prompt_tokens = (int)prompt.size();
    std::vector<int32_t> out;
    auto t0 = clock::now();
    auto lg = inf.prefill(prompt.data(), (int)prompt.size(), false);
    st.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
    const uint64_t s0 = init_stream(seed, 0);
    uint64_t draw = 0;
    const int L = inf.max_len();
    std::vector<int32_t> window;  // the last L tokens of prompt + out, once the cache is full
    for (int i = 0; i < max_new; i++) {
        const int32_t tok = sample_token(lg, inf.vocab_size(), sp, stream_uniform(s0, draw++));
        out.push_back(tok);
        if (tok == stop_token || i + 1 == max_new) break;
        auto t1 = clock::now();
        if (inf.pos() < L) {
            lg = inf.decode_step(&tok);
            st.decode_ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t1).count());
        } else {
            window.clear();
            const size_t total = prompt.size() + out.size();
            for (size_t k = total - size_t(L); k < total; k++)
                window.push_back(k < prompt.size() ? prompt[k] : out[k - prompt.size()]);
            lg = inf.prefill(window.data(), L, false);
            st.window_steps++;
            st.window_s += std::chrono::duration<double>(clock::now() - t1).count();
        }
    }
    st.new_tokens = (int)out.size();
    if (stats) *stats = st;
    return out;
}

extern template struct KVCache<float>;
extern template struct KVCache<double>;
extern template class Inference<float>;
extern template class Inference<double>;

}  // namespace cpu
}  // namespace ldm
