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

namespace {
// b[0, n) = a[0, n), OpenMP over 4096-element chunks when large.
template <typename T>
void par_copy(const T* a, T* b, size_t n) {
    const int64_t chunks = (int64_t)((n + 4095) / 4096);
#pragma omp parallel for schedule(static) if (n >= (size_t)kParN * 1024)
    for (int64_t c = 0; c < chunks; c++) {
        const size_t lo = (size_t)c * 4096, hi = std::min(n, lo + 4096);
        std::copy(a + lo, a + hi, b + lo);
    }
}
}  // namespace

template <typename R>
void LDMScheme<R>::resize(int B, int T) {
    // Sizes only: every buffer is written before it is read in each step (no per-step fill).
    N_ = B * T;
    NT_ = (N_ + L - 1) / L;
    const size_t N = N_, W = D_ + 1, ls = lanes_per_state();
    src_.resize(N * d_);
    O_.resize(W * N * d_);
    Qn_.resize(W * N * HK_);
    Kn_.resize(W * N * HK_);
    Qnrm_.resize(W * N * Hm_);
    Knrm_.resize(W * N * Hm_);
    beta_.resize(delta_ ? W * N * Hm_ : 0);
    cur_.resize(ls);
    stored_.resize((size_t)kept_states(cfg_, ckpt_, unwind_) * ls);
    dS_.resize(ls);
    dsrc_.resize(N * d_);
    tmp_.resize(N * d_);
    raw_.resize(N * HK_);
    draw_.resize(N * HK_);
    dtok_.resize(N * Hm_);
    // per thread: k or q [dk], v [dv], their gradients [dk + dv], dlam [1], dr or r [dv], scratch
    lscr_per_thread_ = (size_t)(2 * dk_ + 3 * dv_ + 1) + scr_size();
    lscr_.resize((size_t)omp_get_max_threads() * lscr_per_thread_);
    if (window_) {
        Kt_.resize((size_t)NT_ * Hm_ * w_ * dk_);
        Et_.resize((size_t)NT_ * Hm_ * w_ * dv_);
        Lc_.resize((size_t)NT_ * Hm_ * w_ * w_);
    }
    live_ = cur_.data();
}

template <typename R>
typename LDMScheme<R>::LV* LDMScheme<R>::lane_scratch() const {
    return lscr_.data() + (size_t)omp_get_thread_num() * lscr_per_thread_;
}

template <typename R>
void LDMScheme<R>::gather(LV* out, const R* src, int t, size_t ld, int off, int cnt) const {
    const R* p = src + (size_t)t * L * ld + off;
    if (t * L + L <= N_) {  // full tile: one strided load of L values per element
        for (int i = 0; i < cnt; i++) {
            R* o = (R*)&out[i].v;
#pragma omp simd
            for (int l = 0; l < L; l++) o[l] = p[(size_t)l * ld + i];
        }
        return;
    }
    for (int l = 0; l < L; l++) {
        const bool real = t * L + l < N_;
        for (int i = 0; i < cnt; i++) out[i].v[l] = real ? p[(size_t)l * ld + i] : R(0);
    }
}

template <typename R>
void LDMScheme<R>::scatter(const LV* in, R* dst, int t, size_t ld, int off, int cnt, bool add) const {
    const int n1 = std::min(L, N_ - t * L);
    R* p = dst + (size_t)t * L * ld + off;
    for (int l = 0; l < n1; l++) {
        R* q = p + (size_t)l * ld;
        if (add)
            for (int i = 0; i < cnt; i++) q[i] += in[i].v[l];
        else
            for (int i = 0; i < cnt; i++) q[i] = in[i].v[l];
    }
}

template <typename R>
std::vector<R> LDMScheme<R>::state() const {
    const int SP = SS_ + PP_;
    std::vector<R> s((size_t)N_ * ST_);
    for (int n = 0; n < N_; n++)
        for (int h = 0; h < Hm_; h++)
            for (int e = 0; e < SP; e++)
                s[(size_t)n * ST_ + h * SP + e] = live_[blk(n / L, h) + e].v[n % L];
    return s;
}

template <typename R>
void LDMScheme<R>::init_state(LV* st) {
    const int NT = NT_;
#pragma omp parallel for schedule(static) if (N_ >= kParN)
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < Hm_; h++) {
            LV* S = st + blk(t, h);
            ldm_init_state(S, rls_ ? S + SS_ : (LV*)nullptr, dv_, dk_, LV((R)cfg_.ldm_delta));
        }
}

// ---- forward ----------------------------------------------------------------------------------

// Write i of o [N, d] (v = o; k = L2n(W_k^i o); beta for delta) from the state `from` (nullptr:
// the initial state) into dst: dst == from updates in place; else each (tile, head) block is
// copied into dst first (store mode: the state after write i gets its own slot, no copy pass).
template <typename R>
void LDMScheme<R>::write_forward(int i, const R* o, const LV* from, LV* dst) {
    const int N = N_, NT = NT_, d = d_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_, SP = SS_ + PP_;
    R* Oi = O_.data() + (size_t)i * N * d;
    matmul_forward(raw_.data(), o, Wk_[i], (const R*)nullptr, N, d, HK);
    R* Kn = Kn_.data() + (size_t)i * N * HK;
    R* Knrm = Knrm_.data() + (size_t)i * N * Hm;
    R* beta = delta_ ? beta_.data() + (size_t)i * N * Hm : nullptr;
    if (delta_) matmul_forward(beta, o, Wb_[i], Bb_[i], N, d, Hm);  // pre-activations z, then beta below
    const R* lam = lam_.data() + (size_t)i * Hm;
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int t = 0; t < NT; t++) {
        LV* kl = lane_scratch();
        LV* vl = kl + dk;
        LV* u = vl + 3 * dv + 2 * dk + 1;
        for (int n = t * L; n < std::min(N, t * L + L); n++) {
            std::copy(o + (size_t)n * d, o + (size_t)(n + 1) * d, Oi + (size_t)n * d);
            for (int h = 0; h < Hm; h++) {
                const size_t kh = (size_t)n * HK + h * dk;
                Knrm[(size_t)n * Hm + h] = l2n_forward(raw_.data() + kh, Kn + kh, dk);
                if (delta_) beta[(size_t)n * Hm + h] = R(kBetaMax) * sigmoid(beta[(size_t)n * Hm + h]);
            }
        }
        for (int h = 0; h < Hm; h++) {
            LV* S = dst + blk(t, h);
            if (!from)
                ldm_init_state(S, rls_ ? S + SS_ : (LV*)nullptr, dv, dk, LV((R)cfg_.ldm_delta));
            else if (from != dst)
                std::copy(from + blk(t, h), from + blk(t, h) + SP, S);
            gather(kl, Kn, t, HK, h * dk, dk);
            gather(vl, Oi, t, d, h * dv, dv);
            if (window_) {
                window_append(t, h, i, kl, vl, u);
            } else if (rls_) {
                rls_write(S, S + SS_, (const LV*)kl, (const LV*)vl, LV(lam[h]), dv, dk, u);
            } else if (outer_) {
                outer_write(S, (const LV*)kl, (const LV*)vl, LV(lam[h]), dv, dk);
            } else {
                LV b;
                gather(&b, beta, t, Hm, h, 1);
                delta_write(S, (const LV*)kl, (const LV*)vl, b, dv, dk);
            }
        }
    }
    live_ = dst;
    const size_t ls = lanes_per_state();
    if (window_) {
        if ((i + 1) % w_ == 0 || i == D_) {
#pragma omp parallel for schedule(static) if (N >= kParN)
            for (int t = 0; t < NT; t++)
                for (int h = 0; h < Hm; h++) window_flush(t, h, i, lane_scratch());
            if (i < D_ && ckpt_ > 0) par_copy(cur_.data(), stored_.data() + (size_t)((i + 1) / w_) * ls, ls);
        }
    } else if (ckpt_ > 0) {
        if (i % ckpt_ == 0) par_copy(cur_.data(), stored_.data() + (size_t)(i / ckpt_) * ls, ls);
    }
}

// Where write i puts its result: its own slot in store mode, else the live buffer cur_.
template <typename R>
typename LDMScheme<R>::LV* LDMScheme<R>::write_dst(int i) {
    if (!window_ && ckpt_ == 0 && !unwind_) return stored_.data() + (size_t)i * lanes_per_state();
    return cur_.data();
}

// ---- window mode (spec §2.5 "window w"): per token-head pending writes of the current window in
// Kt_, Et_, Lc_ (layouts and math: ldm_math.h window_*, tiled like the state); S, P in cur_ stay
// at the window start.
template <typename R>
void LDMScheme<R>::window_append(int t, int h, int i, const LV* k, const LV* v, LV* u) {
    const int m = i % w_, s = i - m;
    const R c = window_decay(lam_.data() + (size_t)s * Hm_ + h, m + 1, Hm_);
    const R isc = R(1) / ldm::ldm_sqrt(c);
    const size_t th = (size_t)t * Hm_ + h;
    const LV* S = cur_.data() + blk(t, h);
    ldm::window_append(S, S + SS_, k, v, LV(isc), Kt_.data() + th * w_ * dk_, Et_.data() + th * w_ * dv_,
                       Lc_.data() + th * w_ * w_, m, w_, dv_, dk_, u);
}

// r += E~_m^T C_m^-1 K~_m^T P q for the m pending writes (r already holds S q).
template <typename R>
void LDMScheme<R>::window_read(int t, int h, int m, const LV* q, LV* r, LV* scr) {
    const size_t th = (size_t)t * Hm_ + h;
    const LV* P = cur_.data() + blk(t, h) + SS_;
    ldm::window_read(P, (const LV*)Kt_.data() + th * w_ * dk_, (const LV*)Et_.data() + th * w_ * dv_,
                     (const LV*)Lc_.data() + th * w_ * w_, m, w_, q, r, dv_, dk_, scr);
}

// Applies the window's m = i - s + 1 writes at once (ldm_math.h window_flush).
template <typename R>
void LDMScheme<R>::window_flush(int t, int h, int i, LV* scr) {
    const int m = i % w_ + 1, s = i + 1 - m;
    const R c = window_decay(lam_.data() + (size_t)s * Hm_ + h, m, Hm_);
    const size_t th = (size_t)t * Hm_ + h;
    LV* S = cur_.data() + blk(t, h);
    ldm::window_flush(S, S + SS_, (const LV*)Kt_.data() + th * w_ * dk_, (const LV*)Et_.data() + th * w_ * dv_,
                      (const LV*)Lc_.data() + th * w_ * w_, m, w_, LV(c), dv_, dk_, scr);
}

// Read j of the live state: q_j = L2n(W_q^j src), r = S q (+ pending window writes), then
// x = src + a_j (.) r (residual) or x = r; r is left in tmp_.
template <typename R>
void LDMScheme<R>::read_forward(int j, const R* src, R* x) {
    const int N = N_, NT = NT_, d = d_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_;
    matmul_forward(raw_.data(), src, Wq_[j], (const R*)nullptr, N, d, HK);
    R* Qn = Qn_.data() + (size_t)(j - 1) * N * HK;
    R* Qnrm = Qnrm_.data() + (size_t)(j - 1) * N * Hm;
    const R* a = residual_ ? A_[j] : nullptr;
    const LV* st = live_;
    const int pending = window_ && j <= D_ ? j % w_ : 0;  // writes 0..j-1 done
    R* r = tmp_.data();
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int t = 0; t < NT; t++) {
        LV* ql = lane_scratch();
        LV* rl = ql + dk;
        LV* scr = rl + 3 * dv + 2 * dk + 1;
        const int n0 = t * L, n1 = std::min(N, t * L + L);
        for (int n = n0; n < n1; n++)
            for (int h = 0; h < Hm; h++) {
                const size_t qh = (size_t)n * HK + h * dk;
                Qnrm[(size_t)n * Hm + h] = l2n_forward(raw_.data() + qh, Qn + qh, dk);
            }
        for (int h = 0; h < Hm; h++) {
            gather(ql, Qn, t, HK, h * dk, dk);
            ldm_read(st + blk(t, h), (const LV*)ql, rl, dv, dk);
            if (pending > 0) window_read(t, h, pending, ql, rl, scr);
            scatter(rl, r, t, d, h * dv, dv, false);
        }
        for (int n = n0; n < n1; n++) {
            R* xr = x + (size_t)n * d;
            const R* sr = src + (size_t)n * d;
            const R* rr = r + (size_t)n * d;
            if (a)
#pragma omp simd
                for (int c = 0; c < d; c++) xr[c] = sr[c] + a[c] * rr[c];
            else
                std::copy(rr, rr + d, xr);
        }
    }
}

template <typename R>
void LDMScheme<R>::begin(const R* e) {
    const size_t nd = (size_t)N_ * d_;
    for (int i = 0; i <= D_; i++)
        for (int h = 0; h < Hm_; h++)
            lam_[(size_t)i * Hm_ + h] =
                forget_ ? ldm_lambda(theta_[(size_t)i * Hm_ + h], (R)cfg_.ldm_lambda_min) : R(1);
    par_copy(e, src_.data(), nd);
    LV* dst = write_dst(0);
    if (dst == cur_.data()) {
        init_state(cur_.data());
        if (window_ && ckpt_ > 0) par_copy(cur_.data(), stored_.data(), lanes_per_state());  // before write 0
        write_forward(0, e, cur_.data(), dst);
    } else {
        write_forward(0, e, nullptr, dst);  // the initial state is written per block into write 0's slot
    }
}

template <typename R>
void LDMScheme<R>::input(int j, R* x) { read_forward(j, src_.data(), x); }

template <typename R>
void LDMScheme<R>::output(int j, const R* o) {
    const int N = N_, d = d_;
    R* src = src_.data();
    if (residual_) {
#pragma omp parallel for schedule(static) if (N >= kParN)
        for (int n = 0; n < N; n++)
#pragma omp simd
            for (int c = 0; c < d; c++) src[(size_t)n * d + c] += o[(size_t)n * d + c];
    } else {
        par_copy(o, src, (size_t)N * d);
    }
    write_forward(j, o, live_, write_dst(j));
}

template <typename R>
void LDMScheme<R>::readout(R* y) { input(D_ + 1, y); }

// ---- backward ---------------------------------------------------------------------------------

// VJP of read j at the state it saw (live_): dx [N, d] is dL/dx_j; adds dL/dS into dS_,
// da_j, dW_q^j, and dL/dsrc into dsrc (which first receives + dx when residual: x = src + a r).
template <typename R>
void LDMScheme<R>::read_backward(int j, const R* src, const R* dx, R* dsrc) {
    const int N = N_, NT = NT_, d = d_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_;
    const R* Qn = Qn_.data() + (size_t)(j - 1) * N * HK;
    const R* Qnrm = Qnrm_.data() + (size_t)(j - 1) * N * Hm;
    const R* a = residual_ ? A_[j] : nullptr;
    const LV* st = live_;
    R* draw = draw_.data();
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int t = 0; t < NT; t++) {
        LV* ql = lane_scratch();
        LV* rl = ql + dk;         // r (for da)
        LV* drl = rl + dv;        // dL/dr
        LV* dql = drl + dv;       // dL/dq
        const int n0 = t * L, n1 = std::min(N, t * L + L);
        if (a)
            for (int n = n0; n < n1; n++) {
                R* ds = dsrc + (size_t)n * d;
                const R* dxr = dx + (size_t)n * d;
#pragma omp simd
                for (int c = 0; c < d; c++) ds[c] += dxr[c];
            }
        for (int h = 0; h < Hm; h++) {
            gather(ql, Qn, t, HK, h * dk, dk);
            gather(drl, dx, t, d, h * dv, dv);
            const LV* S = st + blk(t, h);
            if (a) {  // da_j needs r = S q: recomputed here from the state the read saw
                ldm_read(S, (const LV*)ql, rl, dv, dk);
                scatter(rl, tmp_.data(), t, d, h * dv, dv, false);
                for (int c = 0; c < dv; c++) drl[c] = LV(a[h * dv + c]) * drl[c];
            }
            for (int b = 0; b < dk; b++) dql[b] = LV(R(0));
            ldm_read_vjp(S, (const LV*)ql, (const LV*)drl, dS_.data() + blk(t, h), dql, dv, dk);
            scatter(dql, draw, t, HK, h * dk, dk, false);
        }
        for (int n = n0; n < n1; n++)
            for (int h = 0; h < Hm; h++) {
                const size_t qh = (size_t)n * HK + h * dk;
                l2n_backward(Qn + qh, Qnrm[(size_t)n * Hm + h], draw + qh, draw + qh, dk);
            }
    }
    if (a) {  // da_j += sum_n dx (.) r, summed in token order per channel (threads: channel blocks)
        R* ga = gA_[j];
        const R* r = tmp_.data();
#pragma omp parallel if (N >= kParN)
        {
            const int nt = omp_get_num_threads(), th = omp_get_thread_num();
            const int c0 = (int)((int64_t)d * th / nt), c1 = (int)((int64_t)d * (th + 1) / nt);
            constexpr int kB = 64;  // channels per local accumulator block
            for (int b0 = c0; b0 < c1; b0 += kB) {
                const int nb = std::min(kB, c1 - b0);
                R acc[kB];
                for (int c = 0; c < nb; c++) acc[c] = ga[b0 + c];
                for (int n = 0; n < N; n++) {
                    const R* xr = dx + (size_t)n * d + b0;
                    const R* rr = r + (size_t)n * d + b0;
#pragma omp simd
                    for (int c = 0; c < nb; c++) acc[c] += xr[c] * rr[c];
                }
                for (int c = 0; c < nb; c++) ga[b0 + c] = acc[c];
            }
        }
    }
    matmul_backward(dsrc, gWq_[j], (R*)nullptr, draw_.data(), src, Wq_[j], N, d, HK);
}

template <typename R>
void LDMScheme<R>::record_drift(const LV* ref, bool init) {
    double ms = 0, mp = 0;
    const R delta = (R)cfg_.ldm_delta;
    const int NT = NT_;
#pragma omp parallel for schedule(static) reduction(max : ms, mp) if (N_ >= kParN)
    for (int t = 0; t < NT; t++) {
        const int nl = std::min(L, N_ - t * L);  // real tokens of the tile
        for (int h = 0; h < Hm_; h++) {
            const size_t so = blk(t, h);
            for (int e = 0; e < SS_; e++)
                for (int l = 0; l < nl; l++) {
                    double r = init ? 0.0 : (double)ref[so + e].v[l];
                    ms = std::max(ms, ldm_drift_value((double)cur_[so + e].v[l] - r));
                }
            for (int a = 0; a < (rls_ ? dk_ : 0); a++)
                for (int b = 0; b < dk_; b++) {
                    const size_t e = so + SS_ + (size_t)a * dk_ + b;
                    for (int l = 0; l < nl; l++) {
                        double r = init ? (a == b ? 1.0 : 0.0) : (double)delta * (double)ref[e].v[l];
                        mp = std::max(mp, ldm_drift_value((double)delta * (double)cur_[e].v[l] - r));
                    }
                }
        }
    }
    drift_S_ = std::max(drift_S_, ms);
    drift_P_ = std::max(drift_P_, mp);
}

// Makes live_ the state before write i (= the state read i saw): in store mode a pointer to the
// kept state (no copy); else cur_, unwound in place (rls, outer), copied from a checkpoint, or
// recomputed forward from one (delta, window).
template <typename R>
void LDMScheme<R>::prev_state(int i) {
    const int N = N_, NT = NT_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_, d = d_;
    const size_t ls = lanes_per_state();
    // cur_: state before write w -> after write w, recomputed (rls: window mode; delta).
    auto rewrite = [&](int w) {
        const R* Kn = Kn_.data() + (size_t)w * N * HK;
        const R* Ow = O_.data() + (size_t)w * N * d;
        const R* beta = delta_ ? beta_.data() + (size_t)w * N * Hm : nullptr;
        const R* lam = lam_.data() + (size_t)w * Hm;
#pragma omp parallel for schedule(static) if (N >= kParN)
        for (int t = 0; t < NT; t++) {
            LV* kl = lane_scratch();
            LV* vl = kl + dk;
            LV* u = vl + 3 * dv + 2 * dk + 1;
            for (int h = 0; h < Hm; h++) {
                LV* S = cur_.data() + blk(t, h);
                gather(kl, Kn, t, HK, h * dk, dk);
                gather(vl, Ow, t, d, h * dv, dv);
                if (rls_) {
                    rls_write(S, S + SS_, (const LV*)kl, (const LV*)vl, LV(lam[h]), dv, dk, u);
                } else {
                    LV b;
                    gather(&b, beta, t, Hm, h, 1);
                    delta_write(S, (const LV*)kl, (const LV*)vl, b, dv, dk);
                }
            }
        }
    };
    auto unwind = [&](int w) {  // cur_: after write w -> before write w (rls, outer)
        const R* Kn = Kn_.data() + (size_t)w * N * HK;
        const R* Ow = O_.data() + (size_t)w * N * d;
        const R* lam = lam_.data() + (size_t)w * Hm;
#pragma omp parallel for schedule(static) if (N >= kParN)
        for (int t = 0; t < NT; t++) {
            LV* kl = lane_scratch();
            LV* vl = kl + dk;
            LV* g = vl + 3 * dv + 2 * dk + 1;
            for (int h = 0; h < Hm; h++) {
                LV* S = cur_.data() + blk(t, h);
                gather(kl, Kn, t, HK, h * dk, dk);
                gather(vl, Ow, t, d, h * dv, dv);
                if (rls_) rls_unwind(S, S + SS_, (const LV*)kl, (const LV*)vl, LV(lam[h]), dv, dk, g);
                else outer_unwind(S, (const LV*)kl, (const LV*)vl, LV(lam[h]), dv, dk);
            }
        }
    };
    live_ = cur_.data();
    if (window_ && ckpt_ > 0) {  // recompute from the state kept at the start of write i's window
        const int s = i / w_ * w_;
        par_copy(stored_.data() + (size_t)(i / w_) * ls, cur_.data(), ls);
        for (int w = s; w < i; w++) rewrite(w);
        return;
    }
    const bool keep_all = ckpt_ == 0 && !unwind_;
    if (keep_all) {
        if (i == 0) init_state(cur_.data());
        else live_ = stored_.data() + (size_t)(i - 1) * ls;
        return;
    }
    if (i == 0) {
        if (!delta_) {
            unwind(0);
            record_drift(nullptr, true);
        }
        init_state(cur_.data());  // the VJP of write 0 uses the exact initial state
        return;
    }
    const int p = i - 1;  // the state wanted: after write p
    if (ckpt_ > 0 && p % ckpt_ == 0) {
        const LV* ref = stored_.data() + (size_t)(p / ckpt_) * ls;
        if (!delta_) {
            unwind(i);
            record_drift(ref, false);
        }
        par_copy(ref, cur_.data(), ls);
        return;
    }
    if (!delta_) {
        unwind(i);
        return;
    }
    // delta with checkpoints: recompute from the segment's checkpoint s*c up to write p.
    const int s = p / ckpt_ * ckpt_;
    par_copy(stored_.data() + (size_t)(s / ckpt_) * ls, cur_.data(), ls);
    for (int w = s + 1; w <= p; w++) rewrite(w);
}

// VJP of write i: d_o = dsrc (the gradient reaching o through the residual or the next read)
// plus the write's own (through v directly and through k = L2n(W_k o)). back: the source
// update of output_backward (i >= 1; residual: h_{i-1} = h_i - o_i; no residual: dsrc = 0,
// src = o_{i-1}), fused into the per-tile pass; false for write 0.
template <typename R>
void LDMScheme<R>::write_backward(int i, R* d_o, bool back) {
    const int N = N_, NT = NT_, d = d_, Hm = Hm_, dk = dk_, dv = dv_, HK = HK_;
    prev_state(i);
    const R* Oi = O_.data() + (size_t)i * N * d;
    const R* Kn = Kn_.data() + (size_t)i * N * HK;
    const R* Knrm = Knrm_.data() + (size_t)i * N * Hm;
    const R* beta = delta_ ? beta_.data() + (size_t)i * N * Hm : nullptr;
    const R* lam = lam_.data() + (size_t)i * Hm;
    const LV* st = live_;
    R* src = src_.data();
    R* dsrc = dsrc_.data();
    R* draw = draw_.data();
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int t = 0; t < NT; t++) {
        LV* kl = lane_scratch();
        LV* vl = kl + dk;
        LV* gk = vl + dv;
        LV* gv = gk + dk;
        LV* dl = gv + dv;
        LV* scr = dl + dv + 1;
        const int n0 = t * L, n1 = std::min(N, t * L + L);
        for (int n = n0; n < n1; n++) {
            R* dor = d_o + (size_t)n * d;
            R* dsr = dsrc + (size_t)n * d;
            std::copy(dsr, dsr + d, dor);
            if (back) {
                R* sr = src + (size_t)n * d;
                const R* orow = Oi + (size_t)n * d;
                if (residual_) {
#pragma omp simd
                    for (int c = 0; c < d; c++) sr[c] -= orow[c];
                } else {
                    std::fill(dsr, dsr + d, R(0));
                    std::copy(orow - (size_t)N * d, orow - (size_t)N * d + d, sr);  // c_{i-1} = o_{i-1}
                }
            }
        }
        for (int h = 0; h < Hm; h++) {
            const LV* S = st + blk(t, h);
            LV* dS = dS_.data() + blk(t, h);
            gather(kl, Kn, t, HK, h * dk, dk);
            gather(vl, Oi, t, d, h * dv, dv);
            for (int b = 0; b < dk; b++) gk[b] = LV(R(0));
            for (int c = 0; c < dv; c++) gv[c] = LV(R(0));
            *dl = LV(R(0));
            if (rls_) {
                rls_write_vjp(S, S + SS_, (const LV*)kl, (const LV*)vl, LV(lam[h]), dS, dS + SS_, gk, gv, dl, dv, dk,
                              scr);
            } else if (outer_) {
                outer_write_vjp(S, (const LV*)kl, (const LV*)vl, LV(lam[h]), dS, gk, gv, dl, dv, dk);
            } else {
                LV b, db = LV(R(0));
                gather(&b, beta, t, Hm, h, 1);
                delta_write_vjp(S, (const LV*)kl, (const LV*)vl, b, dS, gk, gv, &db, dv, dk);
                *dl = db * b * (LV(R(1)) - b / LV(R(kBetaMax)));  // d beta / dz = beta (1 - sigmoid)
            }
            scatter(gv, d_o, t, d, h * dv, dv, true);
            scatter(gk, draw, t, HK, h * dk, dk, false);
            scatter(dl, dtok_.data(), t, Hm, h, 1, false);
        }
        for (int n = n0; n < n1; n++)
            for (int h = 0; h < Hm; h++) {
                const size_t kh = (size_t)n * HK + h * dk;
                l2n_backward(Kn + kh, Knrm[(size_t)n * Hm + h], draw + kh, draw + kh, dk);
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
    const int N = N_, d = d_;
    R* dsrc = dsrc_.data();
    std::fill(dS_.begin(), dS_.end(), LV(R(0)));
#pragma omp parallel for schedule(static) if (N >= kParN)
    for (int n = 0; n < N; n++)
        std::fill(dsrc + (size_t)n * d, dsrc + (size_t)(n + 1) * d, R(0));  // read_backward adds dy (residual)
    read_backward(D_ + 1, src_.data(), dy, dsrc);
}

template <typename R>
void LDMScheme<R>::output_backward(int j, R* d_o) { write_backward(j, d_o, true); }

template <typename R>
void LDMScheme<R>::input_backward(int j, const R* dx) { read_backward(j, src_.data(), dx, dsrc_.data()); }

template <typename R>
void LDMScheme<R>::begin_backward(R* de) {
    write_backward(0, de, false);
    const bool unwinding = !delta_ && (unwind_ || ckpt_ > 0);
    if (!unwinding) return;  // (the same on every rank: same flags, same restored state)
    const bool mine = ldm_drift_exceeds(std::max(drift_S_, drift_P_), cfg_.ldm_drift_tol);
    // data parallel: every rank switches together; asked only while the interval can still change
    const bool can_change = ldm_fallback_interval(unwinding, ckpt_, fell_back_, window_, w_, D_, true) != ckpt_;
    const bool exceeded = can_change && this->any_rank_(mine);
    const int next = ldm_fallback_interval(unwinding, ckpt_, fell_back_, window_, w_, D_, exceeded);
    if (fell_back_ && next == ckpt_) settled_ = true;
    if (next != ckpt_) {
        const bool first = !fell_back_;
        ckpt_ = next;
        fell_back_ = true;
        settled_ = false;
        if (this->warns_) ldm_warn_fallback(first, drift_S_, drift_P_, cfg_.ldm_drift_tol, ckpt_, !mine);
    }
}

template <typename R>
std::string LDMScheme<R>::restore_state(const std::vector<std::pair<std::string, double>>& saved) {
    const bool unwinding = !delta_ && (unwind_ || ckpt_ > 0);
    return ldm_restore_fallback(saved, unwinding, window_, w_, D_, ckpt_, fell_back_, settled_);
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
