// cpu/scheme_hc.cpp — HC (spec §2.2) and mHC (spec §2.3), forward and backward.
#include "cpu/scheme_hc.h"

#include <algorithm>
#include <cmath>

#include "core/common.h"
#include "cpu/lanes.h"
#include "cpu/ops.h"
#include "cpu/rng.h"

namespace ldm {
namespace cpu {

namespace {
template <typename R>
inline R dot(const R* a, const R* b, int n) {
    R s = 0;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < n; c++) s += a[c] * b[c];
    return s;
}
template <typename R>
inline void axpy(R* y, R a, const R* x, int n) {
#pragma omp simd
    for (int c = 0; c < n; c++) y[c] += a * x[c];
}
}  // namespace

// ================================================================ HC
template <typename R>
HC<R>::HC(const ModelConfig& cfg)
    : d_(cfg.d_model), n_(cfg.hc_streams), D_(cfg.n_sublayers()), eps_((R)cfg.norm_eps) {}

template <typename R>
int64_t HC<R>::state_values_per_token() const {
    const int64_t n = n_, d = d_, D = D_;
    // H_0..H_D, o_1..o_D, rstd, tanh values; scratch Hb, dHb, u/du, dH, dH_prev.
    return (D + 1) * n * d + D * d + D * n + D * n * (n + 2) + 4 * n * d + 2 * n * (n + 2);
}

// Readout of HC and mHC (spec §2.2, §2.3): y_t = (1/n) sum_i H_{t,i}. H [N, n, d], y [N, d].
template <typename R>
static void stream_mean(const R* H, int N, int n, int d, R* y) {
    const R inv = R(1) / (R)n;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        R* yt = y + (size_t)t * d;
        std::fill(yt, yt + d, R(0));
        for (int i = 0; i < n; i++) axpy(yt, R(1), H + ((size_t)t * n + i) * d, d);
#pragma omp simd
        for (int c = 0; c < d; c++) yt[c] *= inv;
    }
}

// Its backward: dH_{t,i} = dy_t / n (written, not accumulated). dy [N, d], dH [N, n, d].
template <typename R>
static void stream_mean_backward(const R* dy, int N, int n, int d, R* dH) {
    const R inv = R(1) / (R)n;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int i = 0; i < n; i++)
#pragma omp simd
            for (int c = 0; c < d; c++) dH[((size_t)t * n + i) * d + c] = dy[(size_t)t * d + c] * inv;
}

template <typename R>
void HC<R>::init_params(R* params, uint64_t, uint64_t) {
    const int n = n_, d = d_;
    for (int j = 1; j <= D_; j++) {
        R* p = params + (size_t)(j - 1) * block_size();
        std::fill(p, p + (size_t)(n + 2) * d, R(0));  // W_m, W_r, W_b = 0
        R* q = p + (size_t)(n + 2) * d;
        q[0] = R(0.01);  // s_a
        q[1] = R(0.01);  // s_b
        R* am0 = q + 2;
        R* ar0 = am0 + n;
        R* b0 = ar0 + n * n;
        for (int i = 0; i < n; i++) am0[i] = (i == (j - 1) % n) ? R(1) : R(0);
        for (int i = 0; i < n * n; i++) ar0[i] = (i / n == i % n) ? R(1) : R(0);
        for (int i = 0; i < n; i++) b0[i] = R(1);
    }
}

template <typename R>
void HC<R>::resize(int B, int T) {
    N_ = B * T;
    const size_t N = N_, n = n_, d = d_, D = D_;
    Hs_.resize((D + 1) * N * n * d);
    Os_.resize(D * N * d);
    rstd_.resize(D * N * n);
    tanh_.resize(D * N * n * (n + 2));
    Hb_.resize(N * n * d);
    dHb_.resize(N * n * d);
    U_.resize(N * n * (n + 2));
    dC_.resize(N * n * (n + 2));
    dH_.resize(N * n * d);
    dHp_.resize(N * n * d);
}

template <typename R>
void HC<R>::begin(const R* e) {
    const int n = n_, d = d_;
    R* H0 = H(0);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++)
        for (int i = 0; i < n; i++) std::copy(e + (size_t)t * d, e + (size_t)(t + 1) * d, H0 + ((size_t)t * n + i) * d);
}

template <typename R>
void HC<R>::compute_hb(int j) {
    const int n = n_, d = d_;
    const R* Hj = H(j - 1);
    R* rs = rstd_.data() + (size_t)(j - 1) * N_ * n;
    R* hb = Hb_.data();
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N_ * n; r++) {
        const R* h = Hj + (size_t)r * d;
        R s = rms_scale(dot(h, h, d), d, eps_);
        rs[r] = s;
#pragma omp simd
        for (int c = 0; c < d; c++) hb[(size_t)r * d + c] = h[c] * s;
    }
}

template <typename R>
void HC<R>::input(int j, R* x) {
    const int n = n_, d = d_, m = n + 2;
    const R* W = P_ + (size_t)(j - 1) * block_size();
    const R* q = W + (size_t)m * d;
    const R s_a = q[0];
    const R* am0 = q + 2;
    compute_hb(j);
    matmul_forward(U_.data(), Hb_.data(), W, (const R*)nullptr, N_ * n, d, m);
    R* th = tanh_.data() + (size_t)(j - 1) * N_ * n * m;
    const R* U = U_.data();
    const R* Hj = H(j - 1);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        for (int k = 0; k < n * m; k++) th[(size_t)t * n * m + k] = ldm_tanh(U[(size_t)t * n * m + k]);
        R* xt = x + (size_t)t * d;
        std::fill(xt, xt + d, R(0));
        for (int i = 0; i < n; i++) {
            R a = hc_coef(s_a, th[((size_t)t * n + i) * m + 0], am0[i]);
            axpy(xt, a, Hj + ((size_t)t * n + i) * d, d);
        }
    }
}

template <typename R>
void HC<R>::output(int j, const R* o) {
    const int n = n_, d = d_, m = n + 2;
    const R* q = P_ + (size_t)(j - 1) * block_size() + (size_t)m * d;
    const R s_a = q[0], s_b = q[1];
    const R* ar0 = q + 2 + n;
    const R* b0 = ar0 + n * n;
    std::copy(o, o + (size_t)N_ * d, Os_.data() + (size_t)(j - 1) * N_ * d);
    const R* th = tanh_.data() + (size_t)(j - 1) * N_ * n * m;
    const R* Hp = H(j - 1);
    R* Hn = H(j);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        const R* tt = th + (size_t)t * n * m;
        for (int k = 0; k < n; k++) {
            R* out = Hn + ((size_t)t * n + k) * d;
            R b = hc_coef(s_b, tt[k * m + n + 1], b0[k]);
            const R* ot = o + (size_t)t * d;
#pragma omp simd
            for (int c = 0; c < d; c++) out[c] = b * ot[c];
            for (int i = 0; i < n; i++)
                axpy(out, hc_coef(s_a, tt[i * m + 1 + k], ar0[i * n + k]), Hp + ((size_t)t * n + i) * d, d);
        }
    }
}

template <typename R>
void HC<R>::readout(R* y) {
    stream_mean(H(D_), N_, n_, d_, y);
}

template <typename R>
void HC<R>::readout_backward(const R* dy) {
    stream_mean_backward(dy, N_, n_, d_, dH_.data());
}

template <typename R>
void HC<R>::output_backward(int j, R* d_o) {
    const int n = n_, d = d_, m = n + 2;
    const R* q = P_ + (size_t)(j - 1) * block_size() + (size_t)m * d;
    const R s_a = q[0], s_b = q[1];
    const R* ar0 = q + 2 + n;
    const R* b0 = ar0 + n * n;
    const R* th = tanh_.data() + (size_t)(j - 1) * N_ * n * m;
    const R* o = Os_.data() + (size_t)(j - 1) * N_ * d;
    const R* Hp = H(j - 1);
    const R* G = dH_.data();
    R* dHp = dHp_.data();
    R* dC = dC_.data();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        const R* tt = th + (size_t)t * n * m;
        R* dct = dC + (size_t)t * n * m;
        const R* Gt = G + (size_t)t * n * d;
        R* dot_ = d_o + (size_t)t * d;
        std::fill(dot_, dot_ + d, R(0));
        for (int k = 0; k < n; k++) {
            R b = hc_coef(s_b, tt[k * m + n + 1], b0[k]);
            axpy(dot_, b, Gt + (size_t)k * d, d);
            dct[k * m + n + 1] = dot(Gt + (size_t)k * d, o + (size_t)t * d, d);  // dB[k]
        }
        for (int i = 0; i < n; i++) {
            const R* Hi = Hp + ((size_t)t * n + i) * d;
            R* dHi = dHp + ((size_t)t * n + i) * d;
            std::fill(dHi, dHi + d, R(0));
            for (int k = 0; k < n; k++) {
                const R* Gk = Gt + (size_t)k * d;
                axpy(dHi, hc_coef(s_a, tt[i * m + 1 + k], ar0[i * n + k]), Gk, d);
                dct[i * m + 1 + k] = dot(Gk, Hi, d);  // dA_r[i,k]
            }
        }
    }
}

template <typename R>
void HC<R>::input_backward(int j, const R* dx) {
    const int n = n_, d = d_, m = n + 2;
    const R* W = P_ + (size_t)(j - 1) * block_size();
    R* gW = G_ + (size_t)(j - 1) * block_size();
    const R* q = W + (size_t)m * d;
    R* gq = gW + (size_t)m * d;
    const R s_a = q[0], s_b = q[1];
    const R* am0 = q + 2;
    const R* th = tanh_.data() + (size_t)(j - 1) * N_ * n * m;
    const R* Hp = H(j - 1);
    R* dHp = dHp_.data();
    R* dC = dC_.data();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        const R* tt = th + (size_t)t * n * m;
        R* dct = dC + (size_t)t * n * m;
        const R* dxt = dx + (size_t)t * d;
        for (int i = 0; i < n; i++) {
            const R* Hi = Hp + ((size_t)t * n + i) * d;
            dct[i * m] = dot(dxt, Hi, d);  // dA_m[i]
            axpy(dHp + ((size_t)t * n + i) * d, hc_coef(s_a, tt[i * m], am0[i]), dxt, d);
        }
    }
    // Coefficients -> (s_a, s_b, constants) and du (in place in dC_), reduced over tokens in
    // double, serially in token order (deterministic).
    std::vector<double> dconst((size_t)n * m, 0.0);
    double dsa = 0, dsb = 0;
    for (int t = 0; t < N_; t++) {
        for (int i = 0; i < n; i++)
            for (int c = 0; c < m; c++) {
                size_t k = ((size_t)t * n + i) * m + c;
                R dcv = dC[k];
                dconst[(size_t)i * m + c] += dcv;
                R ds = 0;
                if (c == m - 1) {
                    dC[k] = hc_coef_backward(dcv, s_b, th[k], &ds);
                    dsb += ds;
                } else {
                    dC[k] = hc_coef_backward(dcv, s_a, th[k], &ds);
                    dsa += ds;
                }
            }
    }
    gq[0] += (R)dsa;
    gq[1] += (R)dsb;
    R* gam0 = gq + 2;
    R* gar0 = gam0 + n;
    R* gb0 = gar0 + n * n;
    for (int i = 0; i < n; i++) {
        gam0[i] += (R)dconst[(size_t)i * m];
        for (int k = 0; k < n; k++) gar0[i * n + k] += (R)dconst[(size_t)i * m + 1 + k];
        gb0[i] += (R)dconst[(size_t)i * m + m - 1];
    }
    // u = Hb Wᵀ backward, then rms0.
    compute_hb(j);
    std::fill(dHb_.begin(), dHb_.end(), R(0));
    matmul_backward(dHb_.data(), gW, (R*)nullptr, dC, Hb_.data(), W, N_ * n, d, m);
    const R* rs = rstd_.data() + (size_t)(j - 1) * N_ * n;
    const R* hb = Hb_.data();
    const R* dhb = dHb_.data();
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N_ * n; r++) {
        const R* a = hb + (size_t)r * d;
        const R* g = dhb + (size_t)r * d;
        R proj = dot(a, g, d) / (R)d;
        R s = rs[r];
        R* out = dHp + (size_t)r * d;
#pragma omp simd
        for (int c = 0; c < d; c++) out[c] += s * (g[c] - a[c] * proj);
    }
    std::swap(dH_, dHp_);
}

template <typename R>
void HC<R>::begin_backward(R* de) {
    const int n = n_, d = d_;
    const R* dH = dH_.data();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        R* o = de + (size_t)t * d;
        std::fill(o, o + d, R(0));
        for (int i = 0; i < n; i++) axpy(o, R(1), dH + ((size_t)t * n + i) * d, d);
    }
}

// ================================================================ mHC
template <typename R>
MHC<R>::MHC(const ModelConfig& cfg)
    : d_(cfg.d_model),
      n_(cfg.hc_streams),
      D_(cfg.n_sublayers()),
      m_(2 * cfg.hc_streams + cfg.hc_streams * cfg.hc_streams),
      iters_(cfg.sinkhorn_iters),
      eps_((R)cfg.norm_eps) {}

template <typename R>
int64_t MHC<R>::state_values_per_token() const {
    const int64_t n = n_, d = d_, D = D_;
    // H_0..H_D, o_1..o_D, rstd, projections p; scratch dzh, dp and rstd dp, dH, dH_prev.
    return (D + 1) * n * d + D * d + D + D * m_ + 3 * n * d + 2 * m_;
}

template <typename R>
void MHC<R>::init_params(R* params, uint64_t seed, uint64_t first_index) {
    // Scheme tensors per sublayer: phi_pre, phi_post, phi_res, a_pre, a_post, a_res, b_pre,
    // b_post, b_res (9 tensors), the three φ contiguous.
    const int n = n_, nd = n_ * d_;
    for (int j = 1; j <= D_; j++) {
        R* p = params + (size_t)(j - 1) * block_size();
        const uint64_t k0 = first_index + (uint64_t)(j - 1) * 9;
        const int rows[3] = {n, n, n * n};
        R* dst = p;
        for (int t = 0; t < 3; t++) {
            uint64_t s0 = init_stream(seed, k0 + t);
            for (int64_t e = 0; e < (int64_t)rows[t] * nd; e++) dst[e] = (R)(0.02 * stream_normal(s0, (uint64_t)e));
            dst += (size_t)rows[t] * nd;
        }
        dst[0] = dst[1] = dst[2] = R(0.01);
        std::fill(dst + 3, dst + 3 + m_, R(0));
    }
}

template <typename R>
void MHC<R>::resize(int B, int T) {
    N_ = B * T;
    const size_t N = N_, n = n_, d = d_, D = D_, m = m_;
    Hs_.resize((D + 1) * N * n * d);
    Os_.resize(D * N * d);
    rstd_.resize(D * N);
    proj_.resize(D * N * m);
    dZ_.resize(N * n * d);
    dTs_.resize(N * m);
    dT_.resize(N * m);
    dH_.resize(N * n * d);
    dHp_.resize(N * n * d);
}

template <typename R>
void MHC<R>::begin(const R* e) {
    const int n = n_, d = d_;
    R* H0 = H(0);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++)
        for (int i = 0; i < n; i++) std::copy(e + (size_t)t * d, e + (size_t)(t + 1) * d, H0 + ((size_t)t * n + i) * d);
}

template <typename R>
void MHC<R>::compute_rstd(int j) {
    const int nd = n_ * d_;
    const R* Hj = H(j - 1);
    R* rs = rstd_.data() + (size_t)(j - 1) * N_;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        const R* h = Hj + (size_t)t * nd;
        rs[t] = rms_scale(dot(h, h, nd), nd, eps_);
    }
}

template <typename R>
void MHC<R>::input(int j, R* x) {
    const int n = n_, d = d_, m = m_;
    const R* Phi = P_ + (size_t)(j - 1) * block_size();
    const R* q = Phi + (size_t)m * n * d;
    const R a_pre = q[0];
    const R* b_pre = q + 3;
    // p = zh Φᵀ = rstd (.) (z Φᵀ) per token (zh never materialised).
    compute_rstd(j);
    R* pj = proj_.data() + (size_t)(j - 1) * N_ * m;
    matmul_forward(pj, H(j - 1), Phi, (const R*)nullptr, N_, n * d, m);
    const R* Hj = H(j - 1);
    const R* rs = rstd_.data() + (size_t)(j - 1) * N_;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        for (int e = 0; e < m; e++) pj[(size_t)t * m + e] *= rs[t];
        R* xt = x + (size_t)t * d;
        std::fill(xt, xt + d, R(0));
        for (int i = 0; i < n; i++) {
            R g = mhc_gate(R(1), a_pre * pj[(size_t)t * m + i] + b_pre[i]);
            axpy(xt, g, Hj + ((size_t)t * n + i) * d, d);
        }
    }
}

template <typename R>
void MHC<R>::output(int j, const R* o) {
    const int n = n_, d = d_, m = m_, nn = n * n, it = iters_;
    const R* q = P_ + (size_t)(j - 1) * block_size() + (size_t)m * n * d;
    const R a_post = q[1], a_res = q[2];
    const R* b_post = q + 3 + n;
    const R* b_res = q + 3 + 2 * n;
    std::copy(o, o + (size_t)N_ * d, Os_.data() + (size_t)(j - 1) * N_ * d);
    const R* pj = proj_.data() + (size_t)(j - 1) * N_ * m;
    const R* Hp = H(j - 1);
    R* Hn = H(j);
    // Sinkhorn on SIMD lanes: L tokens per call (cpu/lanes.h), the last tile padded with copies
    // of its first token; everything else per token as before.
    using LV = Lane<R>;
    constexpr int L = LV::W;
    const int NT = (N_ + L - 1) / L;
#pragma omp parallel
    {
        std::vector<LV> work(sinkhorn_work_size(n, it)), Rt(nn), Hres(nn);
#pragma omp for schedule(static)
        for (int tile = 0; tile < NT; tile++) {
            const int t0 = tile * L, nl = std::min(L, N_ - t0);
            for (int l = 0; l < L; l++) {
                const R* pt = pj + (size_t)(t0 + (l < nl ? l : 0)) * m;
                for (int e = 0; e < nn; e++) Rt[e].v[l] = a_res * pt[2 * n + e] + b_res[e];
            }
            sinkhorn_forward(Rt.data(), n, it, Hres.data(), work.data());
            for (int l = 0; l < nl; l++) {
                const int t = t0 + l;
                const R* pt = pj + (size_t)t * m;
                for (int k = 0; k < n; k++) {
                    R* out = Hn + ((size_t)t * n + k) * d;
                    R g = mhc_gate(R(2), a_post * pt[n + k] + b_post[k]);
                    const R* ot = o + (size_t)t * d;
#pragma omp simd
                    for (int c = 0; c < d; c++) out[c] = g * ot[c];
                    for (int i = 0; i < n; i++) axpy(out, Hres[k * n + i].v[l], Hp + ((size_t)t * n + i) * d, d);
                }
            }
        }
    }
}

template <typename R>
void MHC<R>::readout(R* y) {
    stream_mean(H(D_), N_, n_, d_, y);
}

template <typename R>
void MHC<R>::readout_backward(const R* dy) {
    stream_mean_backward(dy, N_, n_, d_, dH_.data());
}

template <typename R>
void MHC<R>::output_backward(int j, R* d_o) {
    const int n = n_, d = d_, m = m_, nn = n * n, it = iters_;
    const R* q = P_ + (size_t)(j - 1) * block_size() + (size_t)m * n * d;
    const R a_post = q[1], a_res = q[2];
    const R* b_post = q + 3 + n;
    const R* b_res = q + 3 + 2 * n;
    const R* pj = proj_.data() + (size_t)(j - 1) * N_ * m;
    const R* o = Os_.data() + (size_t)(j - 1) * N_ * d;
    const R* Hp = H(j - 1);
    const R* G = dH_.data();
    R* dHp = dHp_.data();
    R* dT = dT_.data();
    using LV = Lane<R>;  // Sinkhorn on SIMD lanes, as in output()
    constexpr int L = LV::W;
    const int NT = (N_ + L - 1) / L;
#pragma omp parallel
    {
        std::vector<LV> work(sinkhorn_work_size(n, it)), Rt(nn), Hres(nn), dHres(nn), dRt(nn);
#pragma omp for schedule(static)
        for (int tile = 0; tile < NT; tile++) {
            const int t0 = tile * L, nl = std::min(L, N_ - t0);
            for (int l = 0; l < L; l++) {
                const R* pt = pj + (size_t)(t0 + (l < nl ? l : 0)) * m;
                for (int e = 0; e < nn; e++) Rt[e].v[l] = a_res * pt[2 * n + e] + b_res[e];
            }
            sinkhorn_forward(Rt.data(), n, it, Hres.data(), work.data());
            for (int e = 0; e < nn; e++) dHres[e] = LV(R(0));  // padding lanes stay 0
            for (int l = 0; l < nl; l++) {
                const int t = t0 + l;
                const R* pt = pj + (size_t)t * m;
                R* dtt = dT + (size_t)t * m;
                const R* Gt = G + (size_t)t * n * d;
                R* dot_ = d_o + (size_t)t * d;
                std::fill(dot_, dot_ + d, R(0));
                for (int k = 0; k < n; k++) {
                    R g = mhc_gate(R(2), a_post * pt[n + k] + b_post[k]);
                    axpy(dot_, g, Gt + (size_t)k * d, d);
                    R dg = dot(Gt + (size_t)k * d, o + (size_t)t * d, d);
                    dtt[n + k] = mhc_gate_backward(dg, R(2), g);
                }
                for (int i = 0; i < n; i++) {
                    const R* Hi = Hp + ((size_t)t * n + i) * d;
                    R* dHi = dHp + ((size_t)t * n + i) * d;
                    std::fill(dHi, dHi + d, R(0));
                    for (int k = 0; k < n; k++) {
                        const R* Gk = Gt + (size_t)k * d;
                        axpy(dHi, Hres[k * n + i].v[l], Gk, d);
                        dHres[k * n + i].v[l] = dot(Gk, Hi, d);
                    }
                }
            }
            sinkhorn_backward(dHres.data(), n, it, work.data(), dRt.data());
            for (int l = 0; l < nl; l++) {
                R* dtt = dT + (size_t)(t0 + l) * m;
                for (int e = 0; e < nn; e++) dtt[2 * n + e] = dRt[e].v[l];
            }
        }
    }
}

template <typename R>
void MHC<R>::input_backward(int j, const R* dx) {
    const int n = n_, d = d_, m = m_, nd = n_ * d_;
    const R* Phi = P_ + (size_t)(j - 1) * block_size();
    R* gPhi = G_ + (size_t)(j - 1) * block_size();
    const R* q = Phi + (size_t)m * nd;
    R* gq = gPhi + (size_t)m * nd;
    const R a_pre = q[0];
    const R* b_pre = q + 3;
    const R* pj = proj_.data() + (size_t)(j - 1) * N_ * m;
    const R* Hp = H(j - 1);
    R* dHp = dHp_.data();
    R* dT = dT_.data();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        const R* dxt = dx + (size_t)t * d;
        for (int i = 0; i < n; i++) {
            const R* Hi = Hp + ((size_t)t * n + i) * d;
            R g = mhc_gate(R(1), a_pre * pj[(size_t)t * m + i] + b_pre[i]);
            dT[(size_t)t * m + i] = mhc_gate_backward(dot(dxt, Hi, d), R(1), g);
            axpy(dHp + ((size_t)t * n + i) * d, g, dxt, d);
        }
    }
    // Pre-activations c = a_grp * p + b: da_grp += Σ dc p, db += dc, dp = a_grp dc (in place).
    double da[3] = {0, 0, 0};
    std::vector<double> db(m, 0.0);
    for (int t = 0; t < N_; t++)
        for (int e = 0; e < m; e++) {
            int grp = e < n ? 0 : (e < 2 * n ? 1 : 2);
            R dc = dT[(size_t)t * m + e];
            da[grp] += (double)dc * pj[(size_t)t * m + e];
            db[e] += dc;
            dT[(size_t)t * m + e] = q[grp] * dc;
        }
    for (int g = 0; g < 3; g++) gq[g] += (R)da[g];
    for (int e = 0; e < m; e++) gq[3 + e] += (R)db[e];
    // p = zh Φᵀ backward (zh = rstd z, never materialised): dzh = dp Φ, dΦ += (rstd dp)ᵀ z;
    // then the RMS normalisation.
    const R* rs = rstd_.data() + (size_t)(j - 1) * N_;
    R* dTs = dTs_.data();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++)
        for (int e = 0; e < m; e++) dTs[(size_t)t * m + e] = dT[(size_t)t * m + e] * rs[t];
    gemm<R>(false, false, N_, nd, m, R(1), dT, m, Phi, nd, R(0), dZ_.data(), nd);
    gemm<R>(true, false, m, nd, N_, R(1), dTs, m, Hp, nd, R(1), gPhi, nd);
    const R* dz = dZ_.data();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        const R* h = Hp + (size_t)t * nd;
        const R* g = dz + (size_t)t * nd;
        const R s = rs[t];
        const R proj = s * dot(h, g, nd) / (R)nd;  // (zh . g) / (n d)
        R* out = dHp + (size_t)t * nd;
#pragma omp simd
        for (int c = 0; c < nd; c++) out[c] += s * (g[c] - (h[c] * s) * proj);
    }
    std::swap(dH_, dHp_);
}

template <typename R>
void MHC<R>::begin_backward(R* de) {
    const int n = n_, d = d_;
    const R* dH = dH_.data();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        R* o = de + (size_t)t * d;
        std::fill(o, o + d, R(0));
        for (int i = 0; i < n; i++) axpy(o, R(1), dH + ((size_t)t * n + i) * d, d);
    }
}

template struct HC<float>;
template struct HC<double>;
template struct MHC<float>;
template struct MHC<double>;

}  // namespace cpu
}  // namespace ldm
