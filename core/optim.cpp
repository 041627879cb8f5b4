#include "core/optim.h"

#include <algorithm>
#include <cmath>

#include "core/common.h"
#include "math/optim_math.h"

namespace ldm {

void LRSchedule::validate() const {
    if (kind != "cosine" && kind != "linear" && kind != "wsd" && kind != "constant")
        throw Error("--schedule: unknown schedule '" + kind + "' (expected cosine|linear|wsd|constant)");
    if (!(lr >= 0) || !std::isfinite(lr)) throw Error(strprintf("--lr: must be finite and >= 0, got %g", lr));
    if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
        throw Error(strprintf("--min-lr-ratio: must be in [0, 1], got %g", min_lr_ratio));
    if (warmup_steps < 0) throw Error(strprintf("--warmup-steps: must be >= 0, got %lld", (long long)warmup_steps));
    if (total_steps < 1) throw Error(strprintf("--steps: must be >= 1, got %lld", (long long)total_steps));
    if (!(wsd_decay_frac >= 0 && wsd_decay_frac <= 1))
        throw Error(strprintf("--wsd-decay-frac: must be in [0, 1], got %g", wsd_decay_frac));
}

double LRSchedule::lr_at(int64_t s) const {
    const double peak = lr, lo = min_lr_ratio * lr;
    const int64_t W = warmup_steps, N = total_steps;
    if (s < W) return peak * double(s + 1) / double(W);
    if (kind == "constant") return peak;
    if (kind == "wsd") {
        int64_t D = N - int64_t(std::llround(wsd_decay_frac * double(N)));
        D = std::max(D, W);
        if (s < D) return peak;
        double p = std::min(1.0, double(s - D) / double(std::max<int64_t>(1, N - D)));
        return peak + (lo - peak) * p;
    }
    double p = std::min(1.0, double(s - W) / double(std::max<int64_t>(1, N - W)));
    if (kind == "linear") return peak + (lo - peak) * p;
    // cosine
    return lo + (peak - lo) * 0.5 * (1.0 + std::cos(M_PI * p));
}

void AdamWConfig::validate() const {
    if (!(beta1 >= 0 && beta1 < 1)) throw Error(strprintf("--beta1: must be in [0, 1), got %g", beta1));
    if (!(beta2 >= 0 && beta2 < 1)) throw Error(strprintf("--beta2: must be in [0, 1), got %g", beta2));
    if (!(eps > 0)) throw Error(strprintf("--adam-eps: must be > 0, got %g", eps));
    if (!(weight_decay >= 0)) throw Error(strprintf("--weight-decay: must be >= 0, got %g", weight_decay));
    if (std::isnan(grad_clip)) throw Error("--grad-clip: NaN");
}

template <typename T>
double global_norm(const T* g, int64_t n) {
    const int64_t chunk = 65536;
    const int64_t nchunks = (n + chunk - 1) / chunk;
    std::vector<double> part(size_t(std::max<int64_t>(nchunks, 1)), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        const int64_t a = c * chunk, b = std::min(n, a + chunk);
        double s = 0;
        for (int64_t i = a; i < b; i++) s += double(g[i]) * double(g[i]);
        part[size_t(c)] = s;
    }
    double s = 0;
    for (double x : part) s += x;
    return std::sqrt(s);
}
template double global_norm<float>(const float*, int64_t);
template double global_norm<double>(const double*, int64_t);

template <typename T>
AdamW<T>::AdamW(int64_t n, const AdamWConfig& cfg, std::vector<ParamRange> ranges)
    : n_(n), cfg_(cfg), decay_(size_t(n), 0), m_(size_t(n), T(0)), v_(size_t(n), T(0)) {
    cfg_.validate();
    for (const auto& r : ranges) {
        if (r.offset < 0 || r.numel < 0 || r.offset + r.numel > n)
            throw Error(strprintf("AdamW: parameter range [%lld, %lld) outside [0, %lld)",
                                  (long long)r.offset, (long long)(r.offset + r.numel), (long long)n));
        if (r.decay) std::fill(decay_.begin() + r.offset, decay_.begin() + r.offset + r.numel, 1);
    }
}

template <typename T>
double AdamW<T>::step(T* p, const T* g, double lr) {
    const double norm = global_norm(g, n_);
    update(p, g, lr, norm);
    return norm;
}

template <typename T>
void AdamW<T>::update(T* p, const T* g, double lr, double norm) {
    const double clip = adamw_clip_factor(norm, cfg_.grad_clip);
    t_ += 1;
    // Scalars are computed in double, then used in T (the parameter dtype), identical on every
    // thread and independent of the partitioning. The per-element arithmetic is adamw_element
    // (math/optim_math.h), the same function the GPU update (cuda/adamw.cuh) runs.
    const AdamWScalars<T> sc = adamw_scalars<T>(cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay,
                                                lr, clip, t_);
    T* m = m_.data();
    T* v = v_.data();
    const uint8_t* dk = decay_.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n_; i++) adamw_element(p[i], m[i], v[i], g[i], sc, dk[i] != 0);
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace ldm
