// cpu/scheme_ldm.cpp — Linear Depth Memory (spec §2.5), CPU reference. See scheme_ldm.h.
#include "cpu/scheme_ldm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/common.h"
#include "math/ldm_math.h"
#include "cpu/ops.h"
#include "cpu/rng.h"

namespace ldm {
namespace cpu {

namespace {
constexpr double kBetaMax = 0.95;  // spec §2.5 delta rule
constexpr int kParN = 64;          // fork OpenMP only for at least this many tokens
}  // namespace

int64_t ldm_state_size(const ModelConfig& c) {
    const int64_t dv = c.d_model / c.ldm_heads, dk = c.ldm_dk;
    return c.ldm_heads * (dv * dk + (c.ldm_rule == "rls" ? dk * dk : 0));
}

static int64_t kept_states(const ModelConfig& c, int ckpt, bool unwind) {
    const int64_t W = c.n_sublayers() + 1;  // writes 0..D
    // window: unwinding keeps none; after a drift fallback (or with a checkpoint interval set)
    // the state at every window start.
    if (c.ldm_mode == "window") return ckpt > 0 ? (W + c.ldm_window - 1) / c.ldm_window : 0;
    if (ckpt > 0) return (W + ckpt - 1) / ckpt;
    return unwind ? 0 : W;
}

int64_t ldm_backward_state_values(const ModelConfig& c) {
    // + 1: the live (final) state, which every mode keeps.
    return (kept_states(c, c.ldm_checkpoint_every, c.ldm_mode == "unwind") + 1) * ldm_state_size(c);
}

int64_t ldm_scheme_values_per_token(const ModelConfig& c) {
    const int64_t d = c.d_model, W = c.n_sublayers() + 1, Hm = c.ldm_heads,
                  HK = (int64_t)c.ldm_heads * c.ldm_dk, ST = ldm_state_size(c);
    int64_t n = d;                          // src (h or c)
    n += W * d;                             // O: v of every write (o_j, o_0 = e)
    n += 2 * W * HK + 2 * W * Hm;           // normalised q, k and their norms
    if (c.ldm_rule == "delta") n += W * Hm; // beta
    n += ST;                                // live state
    n += kept_states(c, c.ldm_checkpoint_every, c.ldm_mode == "unwind") * ST;
    n += ST;                                // dS (and dP)
    n += 2 * d;                             // dsrc, tmp
    n += 2 * HK + Hm;                       // raw, draw, dtok
    if (c.ldm_mode == "window") {           // pending keys, errors and Cholesky factor
        const int64_t w = c.ldm_window, dv = d / c.ldm_heads;
        n += Hm * (w * c.ldm_dk + w * dv + w * w);
    }
    return n;
}

template <typename R>
LDMScheme<R>::LDMScheme(const ModelConfig& cfg) : cfg_(cfg) {
    cfg.validate();
    if (cfg.ldm_mode == "window" && cfg.ldm_rule != "rls")
        throw Error("ldm_mode 'window' (Woodbury form) is implemented for the rls rule only, not '" +
                    cfg.ldm_rule + "' (use --ldm-mode store)");
    d_ = cfg.d_model;
    D_ = cfg.n_sublayers();
    Hm_ = cfg.ldm_heads;
    dk_ = cfg.ldm_dk;
    dv_ = d_ / Hm_;
    HK_ = Hm_ * dk_;
    rls_ = cfg.ldm_rule == "rls";
    delta_ = cfg.ldm_rule == "delta";
    outer_ = cfg.ldm_rule == "outer";
    SS_ = dv_ * dk_;
    PP_ = rls_ ? dk_ * dk_ : 0;
    ST_ = Hm_ * (SS_ + PP_);
    residual_ = cfg.ldm_residual;
    forget_ = cfg.ldm_forget && !delta_;
    window_ = cfg.ldm_mode == "window";
    unwind_ = cfg.ldm_mode == "unwind" || window_;  // window mode unwinds in backward too
    ckpt_ = cfg.ldm_checkpoint_every;
    w_ = cfg.ldm_window;
    if (window_ && ckpt_ > 0) ckpt_ = w_;  // window mode checkpoints = the window-start states
    lam_.assign((size_t)(D_ + 1) * Hm_, R(1));
}

template <typename R>
void LDMScheme<R>::bind(const R* params, R* grads) {
    std::vector<ParamSpec> ss = scheme_param_specs(cfg_);
    auto find = [&](const std::string& name) -> int64_t {
        for (const auto& s : ss)
            if (s.name == name) return s.offset;
        throw Error("LDM scheme: no parameter '" + name + "'");
    };
    const int W = D_ + 1;
    Wk_.assign(W, nullptr); gWk_.assign(W, nullptr);
    Wq_.assign(D_ + 2, nullptr); gWq_.assign(D_ + 2, nullptr);
    A_.assign(D_ + 2, nullptr); gA_.assign(D_ + 2, nullptr);
    Wb_.assign(W, nullptr); gWb_.assign(W, nullptr);
    Bb_.assign(W, nullptr); gBb_.assign(W, nullptr);
    for (int i = 0; i < W; i++) {
        int64_t o = find("scheme.ldm.wk." + std::to_string(i));
        Wk_[i] = params + o; gWk_[i] = grads + o;
        if (delta_) {
            o = find("scheme.ldm.wbeta." + std::to_string(i));
            Wb_[i] = params + o; gWb_[i] = grads + o;
            o = find("scheme.ldm.bbeta." + std::to_string(i));
            Bb_[i] = params + o; gBb_[i] = grads + o;
        }
    }
    for (int j = 1; j <= D_ + 1; j++) {
        std::string s = j <= D_ ? std::to_string(j) : std::string("f");
        int64_t o = find("scheme.ldm.wq." + s);
        Wq_[j] = params + o; gWq_[j] = grads + o;
        if (residual_) {
            o = find("scheme.ldm.a." + s);
            A_[j] = params + o; gA_[j] = grads + o;
        }
    }
    if (forget_) {
        int64_t o = find("scheme.ldm.theta");
        theta_ = params + o; gtheta_ = grads + o;
    }
}

template <typename R>
void LDMScheme<R>::init_params(R* params, uint64_t seed, uint64_t first_index) {
    // Spec §2.5: W_q, W_k, w_beta ~ N(0, 0.02); a = 1; b = 0; theta = 3.
    std::vector<ParamSpec> ss = scheme_param_specs(cfg_);
    for (size_t k = 0; k < ss.size(); k++) {
        const ParamSpec& s = ss[k];
        R* p = params + s.offset;
        auto starts = [&](const char* pre) { return s.name.rfind(pre, 0) == 0; };
        if (starts("scheme.ldm.wk.") || starts("scheme.ldm.wq.") || starts("scheme.ldm.wbeta.")) {
            uint64_t s0 = init_stream(seed, first_index + k);
            for (int64_t i = 0; i < s.numel; i++) p[i] = (R)(0.02 * stream_normal(s0, (uint64_t)i));
        } else if (starts("scheme.ldm.a.")) {
            std::fill(p, p + s.numel, R(1));
        } else if (starts("scheme.ldm.bbeta.")) {
            std::fill(p, p + s.numel, R(0));
        } else if (s.name == "scheme.ldm.theta") {
            std::fill(p, p + s.numel, R(3));
        } else {
            throw Error("LDM scheme: no init rule for '" + s.name + "'");
        }
    }
}

template <typename R>
void LDMScheme<R>::resize(int B, int T) {
    N_ = B * T;
    const size_t N = N_, W = D_ + 1;
    src_.assign(N * d_, R(0));
    O_.assign(W * N * d_, R(0));
    Qn_.assign(W * N * HK_, R(0));
    Kn_.assign(W * N * HK_, R(0));
    Qnrm_.assign(W * N * Hm_, R(0));
    Knrm_.assign(W * N * Hm_, R(0));
    beta_.assign(delta_ ? W * N * Hm_ : 0, R(0));
    cur_.assign(N * ST_, R(0));
    stored_.assign((size_t)kept_states(cfg_, ckpt_, unwind_) * N * ST_, R(0));
    dS_.assign(N * ST_, R(0));
    dsrc_.assign(N * d_, R(0));
    tmp_.assign(N * d_, R(0));
    raw_.assign(N * HK_, R(0));
    draw_.assign(N * HK_, R(0));
    dtok_.assign(N * Hm_, R(0));
    scratch_.assign((size_t)omp_get_max_threads() * scr_size(), R(0));
    if (window_) {
        Kt_.assign(N * Hm_ * w_ * dk_, R(0));
        Et_.assign(N * Hm_ * w_ * dv_, R(0));
        Lc_.assign(N * Hm_ * w_ * w_, R(0));
    }
}

// ---- forward ----------------------------------------------------------------------------------

template <typename R>
void LDMScheme<R>::write_forward(int i, const R* o) {
    const int N = N_, d = d_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_;
    R* Oi = O_.data() + (size_t)i * N * d;
    std::copy(o, o + (size_t)N * d, Oi);
    matmul_forward(raw_.data(), Oi, Wk_[i], (const R*)nullptr, N, d, HK);
    R* Kn = Kn_.data() + (size_t)i * N * HK;
    R* Knrm = Knrm_.data() + (size_t)i * N * Hm;
    R* beta = delta_ ? beta_.data() + (size_t)i * N * Hm : nullptr;
    const R* lam = lam_.data() + (size_t)i * Hm;
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int n = 0; n < N; n++) {
        R* u = scratch_.data() + (size_t)omp_get_thread_num() * scr_size();
        for (int h = 0; h < Hm; h++) {
            const size_t kh = (size_t)n * HK + h * dk;
            Knrm[(size_t)n * Hm + h] = l2n_forward(raw_.data() + kh, Kn + kh, dk);
            const R* v = Oi + (size_t)n * d + h * dv;
            R* S = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_);
            if (window_) {
                window_append(n, h, i, Kn + kh, v, u);
            } else if (rls_) {
                rls_write(S, S + SS_, Kn + kh, v, lam[h], dv, dk, u);
            } else if (outer_) {
                outer_write(S, Kn + kh, v, lam[h], dv, dk);
            } else {
                const R* w = Wb_[i] + (size_t)h * d;
                const R* x = Oi + (size_t)n * d;
                R z = Bb_[i][h];
                for (int c = 0; c < d; c++) z += w[c] * x[c];
                const R b = R(kBetaMax) * sigmoid(z);
                beta[(size_t)n * Hm + h] = b;
                delta_write(S, Kn + kh, v, b, dv, dk);
            }
        }
    }
    const size_t st = (size_t)N * ST_;
    if (window_) {
        if ((i + 1) % w_ == 0 || i == D_) {
#pragma omp parallel for schedule(static) if (N >= kParN)
            for (int n = 0; n < N; n++)
                for (int h = 0; h < Hm; h++)
                    window_flush(n, h, i, scratch_.data() + (size_t)omp_get_thread_num() * scr_size());
            if (i < D_ && ckpt_ > 0)
                std::copy(cur_.begin(), cur_.end(), stored_.begin() + (size_t)((i + 1) / w_) * st);
        }
    } else if (ckpt_ > 0) {
        if (i % ckpt_ == 0) std::copy(cur_.begin(), cur_.end(), stored_.begin() + (size_t)(i / ckpt_) * st);
    } else if (!unwind_) {
        std::copy(cur_.begin(), cur_.end(), stored_.begin() + (size_t)i * st);
    }
}

// ---- window mode (spec §2.5 "window w"): per token-head pending writes of the current window in
// Kt_, Et_, Lc_ (layouts and math: ldm_math.h window_*); S, P in cur_ stay at the window start.
template <typename R>
void LDMScheme<R>::window_append(int n, int h, int i, const R* k, const R* v, R* u) {
    const int m = i % w_, s = i - m;
    const R c = window_decay(lam_.data() + (size_t)s * Hm_ + h, m + 1, Hm_);
    const R isc = R(1) / ldm_sqrt(c);
    const size_t th = (size_t)n * Hm_ + h;
    const R* S = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_);
    ldm::window_append(S, S + SS_, k, v, isc, Kt_.data() + th * w_ * dk_, Et_.data() + th * w_ * dv_,
                       Lc_.data() + th * w_ * w_, m, w_, dv_, dk_, u);
}

// r += E~_m^T C_m^-1 K~_m^T P q for the m pending writes (r already holds S q).
template <typename R>
void LDMScheme<R>::window_read(int n, int h, int m, const R* q, R* r, R* scr) {
    const size_t th = (size_t)n * Hm_ + h;
    const R* P = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_) + SS_;
    ldm::window_read(P, Kt_.data() + th * w_ * dk_, Et_.data() + th * w_ * dv_, Lc_.data() + th * w_ * w_,
                     m, w_, q, r, dv_, dk_, scr);
}

// Applies the window's m = i - s + 1 writes at once (ldm_math.h window_flush).
template <typename R>
void LDMScheme<R>::window_flush(int n, int h, int i, R* scr) {
    const int m = i % w_ + 1, s = i + 1 - m;
    const R c = window_decay(lam_.data() + (size_t)s * Hm_ + h, m, Hm_);
    const size_t th = (size_t)n * Hm_ + h;
    R* S = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_);
    ldm::window_flush(S, S + SS_, Kt_.data() + th * w_ * dk_, Et_.data() + th * w_ * dv_,
                      Lc_.data() + th * w_ * w_, m, w_, c, dv_, dk_, scr);
}

template <typename R>
void LDMScheme<R>::read_forward(int j, const R* src, R* r) {
    const int N = N_, d = d_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_;
    matmul_forward(raw_.data(), src, Wq_[j], (const R*)nullptr, N, d, HK);
    R* Qn = Qn_.data() + (size_t)(j - 1) * N * HK;
    R* Qnrm = Qnrm_.data() + (size_t)(j - 1) * N * Hm;
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < Hm; h++) {
            const size_t qh = (size_t)n * HK + h * dk;
            Qnrm[(size_t)n * Hm + h] = l2n_forward(raw_.data() + qh, Qn + qh, dk);
            const R* S = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_);
            ldm_read(S, Qn + qh, r + (size_t)n * d + h * dv, dv, dk);
            const int pending = window_ && j <= D_ ? j % w_ : 0;  // writes 0..j-1 done
            if (pending > 0)
                window_read(n, h, pending, Qn + qh, r + (size_t)n * d + h * dv,
                            scratch_.data() + (size_t)omp_get_thread_num() * scr_size());
        }
}

template <typename R>
void LDMScheme<R>::begin(const R* e) {
    const size_t nd = (size_t)N_ * d_;
    for (int i = 0; i <= D_; i++)
        for (int h = 0; h < Hm_; h++)
            lam_[(size_t)i * Hm_ + h] =
                forget_ ? ldm_lambda(theta_[(size_t)i * Hm_ + h], (R)cfg_.ldm_lambda_min) : R(1);
    std::copy(e, e + nd, src_.begin());
    for (int n = 0; n < N_; n++)
        for (int h = 0; h < Hm_; h++) {
            R* S = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_);
            ldm_init_state(S, rls_ ? S + SS_ : (R*)nullptr, dv_, dk_, (R)cfg_.ldm_delta);
        }
    if (window_ && ckpt_ > 0) std::copy(cur_.begin(), cur_.end(), stored_.begin());  // before write 0
    write_forward(0, e);
}

template <typename R>
void LDMScheme<R>::input(int j, R* x) {
    const size_t nd = (size_t)N_ * d_;
    read_forward(j, src_.data(), tmp_.data());
    if (residual_) {
        const R* a = A_[j];
        for (size_t i = 0; i < nd; i++) x[i] = src_[i] + a[i % d_] * tmp_[i];
    } else {
        std::copy(tmp_.begin(), tmp_.begin() + nd, x);
    }
}

template <typename R>
void LDMScheme<R>::output(int j, const R* o) {
    const size_t nd = (size_t)N_ * d_;
    if (residual_)
        for (size_t i = 0; i < nd; i++) src_[i] += o[i];
    else
        std::copy(o, o + nd, src_.begin());
    write_forward(j, o);
}

template <typename R>
void LDMScheme<R>::readout(R* y) { input(D_ + 1, y); }

// ---- backward ---------------------------------------------------------------------------------

template <typename R>
void LDMScheme<R>::read_backward(int j, const R* src, const R* dx, R* dsrc) {
    const int N = N_, d = d_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_;
    const R* Qn = Qn_.data() + (size_t)(j - 1) * N * HK;
    const R* Qnrm = Qnrm_.data() + (size_t)(j - 1) * N * Hm;
    const R* a = residual_ ? A_[j] : nullptr;
    if (residual_) {
        // da_j += sum_n dx (.) r: recompute r = S q with the state the read saw (cur_).
#pragma omp parallel for schedule(static) if (N >= kParN)
        for (int n = 0; n < N; n++)
            for (int h = 0; h < Hm; h++)
                ldm_read(cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_), Qn + (size_t)n * HK + h * dk,
                         tmp_.data() + (size_t)n * d + h * dv, dv, dk);
        R* ga = gA_[j];
        for (int n = 0; n < N; n++)
            for (int c = 0; c < d; c++) ga[c] += dx[(size_t)n * d + c] * tmp_[(size_t)n * d + c];
    }
    std::fill(draw_.begin(), draw_.end(), R(0));
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int n = 0; n < N; n++) {
        R* dr = tmp_.data() + (size_t)n * d;  // dL/dr (reuses tmp_)
        for (int c = 0; c < d; c++) dr[c] = a ? a[c] * dx[(size_t)n * d + c] : dx[(size_t)n * d + c];
        for (int h = 0; h < Hm; h++) {
            const size_t qh = (size_t)n * HK + h * dk;
            const size_t so = (size_t)n * ST_ + h * (SS_ + PP_);
            ldm_read_vjp(cur_.data() + so, Qn + qh, dr + h * dv, dS_.data() + so, draw_.data() + qh, dv, dk);
            l2n_backward(Qn + qh, Qnrm[(size_t)n * Hm + h], draw_.data() + qh, draw_.data() + qh, dk);
        }
    }
    matmul_backward(dsrc, gWq_[j], (R*)nullptr, draw_.data(), src, Wq_[j], N, d, HK);
}

template <typename R>
void LDMScheme<R>::record_drift(const R* ref, bool init) {
    double ms = 0, mp = 0;
    const R delta = (R)cfg_.ldm_delta;
    for (int n = 0; n < N_; n++)
        for (int h = 0; h < Hm_; h++) {
            const size_t so = (size_t)n * ST_ + h * (SS_ + PP_);
            for (int t = 0; t < SS_; t++) {
                double r = init ? 0.0 : (double)ref[so + t];
                ms = std::max(ms, std::fabs((double)cur_[so + t] - r));
            }
            for (int a = 0; a < (rls_ ? dk_ : 0); a++)
                for (int b = 0; b < dk_; b++) {
                    const size_t t = so + SS_ + (size_t)a * dk_ + b;
                    double r = init ? (a == b ? 1.0 : 0.0) : (double)delta * (double)ref[t];
                    mp = std::max(mp, std::fabs((double)delta * (double)cur_[t] - r));
                }
        }
    drift_S_ = std::max(drift_S_, ms);
    drift_P_ = std::max(drift_P_, mp);
}

template <typename R>
void LDMScheme<R>::prev_state(int i) {
    const int N = N_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_, d = d_;
    const size_t st = (size_t)N * ST_;
    auto unwind = [&](int w) {  // cur_: after write w -> before write w (rls, outer)
        const R* Kn = Kn_.data() + (size_t)w * N * HK;
        const R* Ow = O_.data() + (size_t)w * N * d;
        const R* lam = lam_.data() + (size_t)w * Hm;
#pragma omp parallel for schedule(static) if (N >= kParN)
        for (int n = 0; n < N; n++) {
            R* g = scratch_.data() + (size_t)omp_get_thread_num() * scr_size();
            for (int h = 0; h < Hm; h++) {
                R* S = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_);
                const R* k = Kn + (size_t)n * HK + h * dk;
                const R* v = Ow + (size_t)n * d + h * dv;
                if (rls_) rls_unwind(S, S + SS_, k, v, lam[h], dv, dk, g);
                else outer_unwind(S, k, v, lam[h], dv, dk);
            }
        }
    };
    auto set_init = [&]() {
        for (int n = 0; n < N; n++)
            for (int h = 0; h < Hm; h++) {
                R* S = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_);
                ldm_init_state(S, rls_ ? S + SS_ : (R*)nullptr, dv, dk, (R)cfg_.ldm_delta);
            }
    };
    if (window_ && ckpt_ > 0) {  // recompute from the state kept at the start of write i's window
        const int s = i / w_ * w_;
        std::copy(stored_.begin() + (size_t)(i / w_) * st, stored_.begin() + (size_t)(i / w_ + 1) * st,
                  cur_.begin());
        for (int w = s; w < i; w++) {
            const R* Kn = Kn_.data() + (size_t)w * N * HK;
            const R* Ow = O_.data() + (size_t)w * N * d;
            const R* lam = lam_.data() + (size_t)w * Hm;
#pragma omp parallel for schedule(static) if (N >= kParN)
            for (int n = 0; n < N; n++) {
                R* u = scratch_.data() + (size_t)omp_get_thread_num() * scr_size();
                for (int h = 0; h < Hm; h++) {
                    R* S = cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_);
                    rls_write(S, S + SS_, Kn + (size_t)n * HK + h * dk, Ow + (size_t)n * d + h * dv, lam[h], dv, dk, u);
                }
            }
        }
        return;
    }
    const bool keep_all = ckpt_ == 0 && !unwind_;
    if (keep_all) {
        if (i == 0) set_init();
        else std::copy(stored_.begin() + (size_t)(i - 1) * st, stored_.begin() + (size_t)i * st, cur_.begin());
        return;
    }
    if (i == 0) {
        if (!delta_) {
            unwind(0);
            record_drift(nullptr, true);
        }
        set_init();  // the VJP of write 0 uses the exact initial state
        return;
    }
    const int p = i - 1;  // the state wanted: after write p
    if (ckpt_ > 0 && p % ckpt_ == 0) {
        const R* ref = stored_.data() + (size_t)(p / ckpt_) * st;
        if (!delta_) {
            unwind(i);
            record_drift(ref, false);
        }
        std::copy(ref, ref + st, cur_.begin());
        return;
    }
    if (!delta_) {
        unwind(i);
        return;
    }
    // delta with checkpoints: recompute from the segment's checkpoint s*c up to write p.
    const int s = p / ckpt_ * ckpt_;
    const R* ref = stored_.data() + (size_t)(s / ckpt_) * st;
    std::copy(ref, ref + st, cur_.begin());
    for (int w = s + 1; w <= p; w++) {
        const R* Kn = Kn_.data() + (size_t)w * N * HK;
        const R* Ow = O_.data() + (size_t)w * N * d;
        const R* beta = beta_.data() + (size_t)w * N * Hm;
#pragma omp parallel for schedule(static) if (N >= kParN)
        for (int n = 0; n < N; n++)
            for (int h = 0; h < Hm; h++)
                delta_write(cur_.data() + (size_t)n * ST_ + h * (SS_ + PP_), Kn + (size_t)n * HK + h * dk,
                            Ow + (size_t)n * d + h * dv, beta[(size_t)n * Hm + h], dv, dk);
    }
}

template <typename R>
void LDMScheme<R>::write_backward(int i, R* d_o) {
    const int N = N_, d = d_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_;
    prev_state(i);
    const R* Oi = O_.data() + (size_t)i * N * d;
    const R* Kn = Kn_.data() + (size_t)i * N * HK;
    const R* Knrm = Knrm_.data() + (size_t)i * N * Hm;
    const R* beta = delta_ ? beta_.data() + (size_t)i * N * Hm : nullptr;
    const R* lam = lam_.data() + (size_t)i * Hm;
    std::fill(draw_.begin(), draw_.end(), R(0));
    std::fill(dtok_.begin(), dtok_.end(), R(0));
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int n = 0; n < N; n++) {
        R* scr = scratch_.data() + (size_t)omp_get_thread_num() * scr_size();
        for (int h = 0; h < Hm; h++) {
            const size_t kh = (size_t)n * HK + h * dk, so = (size_t)n * ST_ + h * (SS_ + PP_);
            const R* S = cur_.data() + so;
            R* dS = dS_.data() + so;
            const R* v = Oi + (size_t)n * d + h * dv;
            R* dvp = d_o + (size_t)n * d + h * dv;
            R* dt = dtok_.data() + (size_t)n * Hm + h;
            if (rls_) {
                rls_write_vjp(S, S + SS_, Kn + kh, v, lam[h], dS, dS + SS_, draw_.data() + kh, dvp, dt, dv, dk, scr);
            } else if (outer_) {
                outer_write_vjp(S, Kn + kh, v, lam[h], dS, draw_.data() + kh, dvp, dt, dv, dk);
            } else {
                const R b = beta[(size_t)n * Hm + h];
                R db = 0;
                delta_write_vjp(S, Kn + kh, v, b, dS, draw_.data() + kh, dvp, &db, dv, dk);
                *dt = db * b * (R(1) - b / R(kBetaMax));  // d beta / dz = beta (1 - sigmoid)
            }
            l2n_backward(Kn + kh, Knrm[(size_t)n * Hm + h], draw_.data() + kh, draw_.data() + kh, dk);
        }
    }
    matmul_backward(d_o, gWk_[i], (R*)nullptr, draw_.data(), Oi, Wk_[i], N, d, HK);
    if (delta_) matmul_backward(d_o, gWb_[i], gBb_[i], dtok_.data(), Oi, Wb_[i], N, d, Hm);
    if (forget_)
        for (int h = 0; h < Hm; h++) {
            R s = 0;
            for (int n = 0; n < N; n++) s += dtok_[(size_t)n * Hm + h];
            const R th = theta_[(size_t)i * Hm + h];
            gtheta_[(size_t)i * Hm + h] += s * ldm_lambda_grad(th, (R)cfg_.ldm_lambda_min);
        }
}

template <typename R>
void LDMScheme<R>::readout_backward(const R* dy) {
    drift_S_ = drift_P_ = 0;
    std::fill(dS_.begin(), dS_.end(), R(0));
    const size_t nd = (size_t)N_ * d_;
    if (residual_) std::copy(dy, dy + nd, dsrc_.begin());
    else std::fill(dsrc_.begin(), dsrc_.end(), R(0));
    read_backward(D_ + 1, src_.data(), dy, dsrc_.data());
}

template <typename R>
void LDMScheme<R>::output_backward(int j, R* d_o) {
    const size_t nd = (size_t)N_ * d_;
    std::copy(dsrc_.begin(), dsrc_.end(), d_o);
    const R* Oj = O_.data() + (size_t)j * nd;
    if (residual_) {
        for (size_t i = 0; i < nd; i++) src_[i] -= Oj[i];  // h_{j-1} = h_j - o_j
    } else {
        std::fill(dsrc_.begin(), dsrc_.end(), R(0));
        std::copy(Oj - nd, Oj, src_.begin());  // c_{j-1} = o_{j-1}
    }
    write_backward(j, d_o);
}

template <typename R>
void LDMScheme<R>::input_backward(int j, const R* dx) {
    const size_t nd = (size_t)N_ * d_;
    if (residual_)
        for (size_t i = 0; i < nd; i++) dsrc_[i] += dx[i];
    read_backward(j, src_.data(), dx, dsrc_.data());
}

template <typename R>
void LDMScheme<R>::begin_backward(R* de) {
    std::copy(dsrc_.begin(), dsrc_.end(), de);
    write_backward(0, de);
    const bool unwinding = !delta_ && (unwind_ || ckpt_ > 0);
    if (unwinding && ckpt_ == 0 && std::max(drift_S_, drift_P_) > cfg_.ldm_drift_tol) {
        ckpt_ = window_ ? w_  // window mode: keep the window-start states
                : cfg_.ldm_checkpoint_every > 0
                    ? cfg_.ldm_checkpoint_every
                    : std::max(1, (int)std::lround(std::sqrt((double)(D_ + 1))));
        fell_back_ = true;
        if (!warned_) {
            std::fprintf(stderr,
                         "warning: LDM unwind drift %.3g (S) / %.3g (P) exceeds %.3g: falling back "
                         "to checkpointed segments every %d writes from the next step on\n",
                         drift_S_, drift_P_, cfg_.ldm_drift_tol, ckpt_);
            warned_ = true;
        }
    }
}

template <typename R>
std::vector<std::pair<std::string, double>> LDMScheme<R>::metrics() const {
    if (delta_ || (!unwind_ && ckpt_ == 0)) return {};
    return {{"ldm_drift_S", drift_S_}, {"ldm_drift_P", drift_P_},
            {"ldm_fallback", fell_back_ ? 1.0 : 0.0}, {"ldm_ckpt", (double)ckpt_}};
}

template struct LDMScheme<float>;
template struct LDMScheme<double>;

}  // namespace cpu
}  // namespace ldm
