// core/optim.h — AdamW with decoupled weight decay, global-norm gradient clipping, and the
// learning-rate schedules of the trainers (spec model.md §1 "AdamW defaults").
//
// The optimizer works on the flat parameter/gradient arrays of a model (param_specs order,
// core/config.h). Which ranges get weight decay is given as a list of ParamRange (built from
// ParamSpec.decay by the trainer), so this file does not depend on the model code.
//
// Determinism: every reduction (the global gradient norm) is summed in fixed-size chunks in a
// fixed order, so results are bit-identical for any thread count. This is what makes resume
// bit-exact (doc/training.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ldm {

// ---------------------------------------------------------------------------------------------
// Learning-rate schedules. Steps are 0-based: step s is the s-th optimizer update (s = 0 is the
// first). With W = warmup_steps, N = total_steps, peak = lr, lo = min_lr_ratio * peak:
//   warmup (all kinds): s < W  ->  peak * (s + 1) / W
//   cosine:   p = (s - W) / max(1, N - W)  (clamped to [0,1]);  lo + (peak - lo) * 0.5 * (1 + cos(pi p))
//   linear:   p as above;  peak + (lo - peak) * p
//   wsd:      decay starts at D = N - round(wsd_decay_frac * N) (never before W);
//             s < D -> peak;  else p = (s - D) / max(1, N - D);  peak + (lo - peak) * p
//   constant: peak
// Steps s >= N are clamped to the final value (p = 1).
struct LRSchedule {
    std::string kind = "cosine";   // cosine | linear | wsd | constant
    double lr = 6e-4;              // peak learning rate
    double min_lr_ratio = 0.1;     // final lr = min_lr_ratio * lr (cosine, linear, wsd)
    int64_t warmup_steps = 0;
    int64_t total_steps = 1;
    double wsd_decay_frac = 0.2;   // fraction of total_steps spent in the final linear decay (wsd)

    // ldm::Error naming the field when a value is impossible (unknown kind, negative steps, ...).
    void validate() const;
    // The learning rate for 0-based optimizer step `step` (formulas above).
    double lr_at(int64_t step) const;
};

// A contiguous range of the flat parameter array and whether AdamW applies weight decay to it.
struct ParamRange {
    int64_t offset = 0, numel = 0;
    bool decay = false;
};

struct AdamWConfig {
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double weight_decay = 0.1;  // decoupled: p -= lr * wd * p, only on ParamRange.decay ranges
    double grad_clip = 1.0;     // global-norm clip; <= 0 disables clipping
    void validate() const;      // ldm::Error on out-of-range betas, eps <= 0, wd < 0
};

// Global L2 norm sqrt(sum g_i^2) of n values, accumulated in double in fixed 65536-element chunks
// (per-chunk sums in parallel, then added in chunk order): identical for any thread count.
template <typename T>
double global_norm(const T* g, int64_t n);

// AdamW (Loshchilov & Hutter; PyTorch torch.optim.AdamW semantics) over a flat array of n
// parameters. State m, v (first/second moments) have the parameter dtype T. For update t
// (1-based, t = step() + 1 on entry) with clip scale c = min(1, grad_clip / ||g||):
//   g' = c g;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
//   m^ = m / (1 - b1^t);  v^ = v / (1 - b2^t)
//   p = p - lr * ( m^ / (sqrt(v^) + eps) + wd_i * p )      wd_i = weight_decay on decay ranges, else 0
// Every index of [0, n) not covered by a range gets no decay.
template <typename T>
class AdamW {
 public:
    AdamW(int64_t n, const AdamWConfig& cfg, std::vector<ParamRange> ranges);
    // One update with learning rate lr. params, grads: [n]. grads are not modified.
    // Returns the global gradient norm before clipping (what the trainers log as "grad_norm").
    double step(T* params, const T* grads, double lr);
    // The same update with the global gradient norm computed by the caller (after reducing the
    // gradients over ranks, or to check it for divergence first): clip by grad_norm, then update.
    void update(T* params, const T* grads, double lr, double grad_norm);

    int64_t n() const { return n_; }
    int64_t step_count() const { return t_; }   // number of updates done so far
    const AdamWConfig& config() const { return cfg_; }
    std::vector<T>& m() { return m_; }
    std::vector<T>& v() { return v_; }
    const std::vector<T>& m() const { return m_; }
    const std::vector<T>& v() const { return v_; }
    void set_step_count(int64_t t) { t_ = t; }   // used when loading a training state

 private:
    int64_t n_;
    AdamWConfig cfg_;
    std::vector<uint8_t> decay_;  // [n] 1 where weight decay applies
    std::vector<T> m_, v_;
    int64_t t_ = 0;
};

extern template class AdamW<float>;
extern template class AdamW<double>;

}  // namespace ldm
