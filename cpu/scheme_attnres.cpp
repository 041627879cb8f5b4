// cpu/scheme_attnres.cpp — AttnRes Full and Block (spec §2.4), forward and backward.
#include "cpu/scheme_attnres.h"

#include <algorithm>
#include <cmath>

#include <omp.h>

#include "core/common.h"

namespace ldm {
namespace cpu {

template <typename R>
AttnRes<R>::AttnRes(const ModelConfig& cfg, bool block)
    : d_(cfg.d_model), D_(cfg.n_sublayers()), block_(block), eps_((R)cfg.norm_eps) {
    if (block_) {
        nb_ = std::min(cfg.attnres_blocks, D_);  // N > D is clamped to D (= Full)
        if (nb_ <= 0) throw Error(strprintf("attnres-block: attnres_blocks must be positive, got %d", cfg.attnres_blocks));
        S_ = D_ / nb_;
    } else {
        nb_ = D_;
        S_ = 1;
    }
}

template <typename R>
void AttnRes<R>::locate(int j, int* n, int* i) const {
    int b = (j - 1) / S_ + 1;
    if (b > nb_) b = nb_;  // the last block takes the remainder
    *n = b;
    *i = j - (b - 1) * S_;
}

template <typename R>
int64_t AttnRes<R>::state_values_per_token() const {
    const int64_t d = d_, D = D_, K = nb_ + 1;
    int64_t v = 2 * K * d + K;  // sources, their gradients, their r
    if (block_) v += D * d + D + 2 * d;
    return v;
}

template <typename R>
void AttnRes<R>::init_params(R* params, uint64_t, uint64_t) {
    for (int j = 1; j <= D_ + 1; j++) {
        R* p = params + (size_t)(j - 1) * 2 * d_;
        std::fill(p, p + d_, R(0));        // pseudo-query w = 0
        std::fill(p + d_, p + 2 * d_, R(1));  // key norm weight g = 1
    }
}

template <typename R>
void AttnRes<R>::resize(int B, int T) {
    N_ = B * T;
    const size_t N = N_, d = d_, K = nb_ + 1;
    src_.resize(K * N * d);
    dsrc_.resize(K * N * d);
    rsrc_.resize(K * N);
    if (block_) {
        pv_.resize((size_t)D_ * N * d);
        rp_.resize((size_t)D_ * N);
        p_.resize(N * d);
        dp_.resize(N * d);
    }
}

template <typename R>
void AttnRes<R>::rms_of(const R* u, R* r) {
    const int d = d_;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N_; t++) {
        const R* ut = u + (size_t)t * d;
        R s = 0;
        for (int c = 0; c < d; c++) s += ut[c] * ut[c];
        r[t] = rms_scale(s, d, eps_);
    }
}

template <typename R>
std::vector<typename AttnRes<R>::Src> AttnRes<R>::sources(int j) {
    std::vector<Src> s;
    if (j == D_ + 1) {
        for (int k = 0; k <= nb_; k++) s.push_back({U(k), RU(k), DU(k)});
        return s;
    }
    if (!block_) {
        for (int k = 0; k < j; k++) s.push_back({U(k), RU(k), DU(k)});
        return s;
    }
    int n, i;
    locate(j, &n, &i);
    for (int k = 0; k < n; k++) s.push_back({U(k), RU(k), DU(k)});
    if (i >= 2)
        s.push_back({pv_.data() + (size_t)(j - 1) * N_ * d_, rp_.data() + (size_t)(j - 1) * N_, dp_.data()});
    return s;
}

template <typename R>
void AttnRes<R>::aggregate(int j, R* x) {
    const int d = d_;
    const R* w = P_ + (size_t)(j - 1) * 2 * d;
    const R* g = w + d;
    std::vector<R> q(d);
    for (int c = 0; c < d; c++) q[c] = w[c] * g[c];
    std::vector<Src> src = sources(j);
    const int K = (int)src.size();
#pragma omp parallel
    {
        std::vector<R> a(K);
#pragma omp for schedule(static)
        for (int t = 0; t < N_; t++) {
            for (int k = 0; k < K; k++) {
                const R* u = src[k].u + (size_t)t * d;
                R s = 0;
#pragma omp simd reduction(+ : s)
                for (int c = 0; c < d; c++) s += q[c] * u[c];
                a[k] = s * src[k].r[t];
            }
            attnres_softmax(a.data(), K);
            R* xt = x + (size_t)t * d;
            std::fill(xt, xt + d, R(0));
            for (int k = 0; k < K; k++) {
                const R* u = src[k].u + (size_t)t * d;
                const R ak = a[k];
#pragma omp simd
                for (int c = 0; c < d; c++) xt[c] += ak * u[c];
            }
        }
    }
}

template <typename R>
void AttnRes<R>::aggregate_backward(int j, const R* dx) {
    const int d = d_;
    const R* w = P_ + (size_t)(j - 1) * 2 * d;
    const R* g = w + d;
    R* gw = G_ + (size_t)(j - 1) * 2 * d;
    R* gg = gw + d;
    std::vector<R> q(d);
    for (int c = 0; c < d; c++) q[c] = w[c] * g[c];
    std::vector<Src> src = sources(j);
    const int K = (int)src.size();
    const int nt = omp_get_max_threads();
    std::vector<double> dq_part((size_t)nt * d, 0.0);
#pragma omp parallel
    {
        std::vector<R> s(K), a(K), da(K);
        double* dq = dq_part.data() + (size_t)omp_get_thread_num() * d;
#pragma omp for schedule(static)
        for (int t = 0; t < N_; t++) {
            const R* dxt = dx + (size_t)t * d;
            for (int k = 0; k < K; k++) {
                const R* u = src[k].u + (size_t)t * d;
                R sq = 0, sd = 0;
#pragma omp simd reduction(+ : sq, sd)
                for (int c = 0; c < d; c++) {
                    sq += q[c] * u[c];
                    sd += dxt[c] * u[c];
                }
                s[k] = sq * src[k].r[t];
                da[k] = sd;
            }
            std::copy(s.begin(), s.end(), a.begin());
            attnres_softmax(a.data(), K);
            attnres_softmax_backward(da.data(), a.data(), K);  // da := ds
            for (int k = 0; k < K; k++) {
                const R* u = src[k].u + (size_t)t * d;
                R* du = src[k].du + (size_t)t * d;
                const R ak = a[k], ds = da[k], r = src[k].r[t], sk = s[k];
#pragma omp simd
                for (int c = 0; c < d; c++) {
                    du[c] += ak * dxt[c] + attnres_score_grad(ds, r, sk, q[c], u[c], d);
                    dq[c] += (double)(ds * r * u[c]);
                }
            }
        }
    }
    for (int c = 0; c < d; c++) {
        double dqc = 0;
        for (int th = 0; th < nt; th++) dqc += dq_part[(size_t)th * d + c];
        gw[c] += (R)(dqc * g[c]);
        gg[c] += (R)(dqc * w[c]);
    }
}

template <typename R>
void AttnRes<R>::begin(const R* e) {
    std::copy(e, e + (size_t)N_ * d_, U(0));
    rms_of(U(0), RU(0));
    if (block_) std::fill(p_.begin(), p_.end(), R(0));
}

template <typename R>
void AttnRes<R>::input(int j, R* x) {
    if (block_) {
        int n, i;
        locate(j, &n, &i);
        if (i >= 2) {
            R* pv = pv_.data() + (size_t)(j - 1) * N_ * d_;
            std::copy(p_.begin(), p_.end(), pv);
            rms_of(pv, rp_.data() + (size_t)(j - 1) * N_);
        }
    }
    aggregate(j, x);
}

template <typename R>
void AttnRes<R>::output(int j, const R* o) {
    const size_t nd = (size_t)N_ * d_;
    if (!block_) {
        std::copy(o, o + nd, U(j));
        rms_of(U(j), RU(j));
        return;
    }
    int n, i;
    locate(j, &n, &i);
    R* p = p_.data();
#pragma omp parallel for simd schedule(static)
    for (size_t k = 0; k < nd; k++) p[k] += o[k];
    const bool end = (n < nb_) ? (j == n * S_) : (j == D_);
    if (end) {
        std::copy(p_.begin(), p_.end(), U(n));
        rms_of(U(n), RU(n));
        std::fill(p_.begin(), p_.end(), R(0));
    }
}

template <typename R>
void AttnRes<R>::readout(R* y) { aggregate(D_ + 1, y); }

template <typename R>
void AttnRes<R>::readout_backward(const R* dy) {
    std::fill(dsrc_.begin(), dsrc_.end(), R(0));
    aggregate_backward(D_ + 1, dy);
}

template <typename R>
void AttnRes<R>::output_backward(int j, R* d_o) {
    const size_t nd = (size_t)N_ * d_;
    if (!block_) {
        std::copy(DU(j), DU(j) + nd, d_o);
        return;
    }
    int n, i;
    locate(j, &n, &i);
    const bool end = (n < nb_) ? (j == n * S_) : (j == D_);
    if (end) std::copy(DU(n), DU(n) + nd, dp_.begin());  // dL/d(p after the block's last sublayer)
    std::copy(dp_.begin(), dp_.end(), d_o);               // p_after = p_before + o_j
}

template <typename R>
void AttnRes<R>::input_backward(int j, const R* dx) { aggregate_backward(j, dx); }

template <typename R>
void AttnRes<R>::begin_backward(R* de) { std::copy(DU(0), DU(0) + (size_t)N_ * d_, de); }

template struct AttnRes<float>;
template struct AttnRes<double>;

}  // namespace cpu
}  // namespace ldm
