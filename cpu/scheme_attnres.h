// cpu/scheme_attnres.h — AttnRes, attention residuals over depth (spec §2.4), Full and Block,
// for the CPU reference, with a hand-written backward.
//
// Aggregation of sublayer j over sources u_1..u_K (per token): s_k = w_j · RMSNorm_{g_j}(u_k)
// = r_k (q · u_k) with q = w_j ⊙ g_j and r_k = 1/sqrt(mean(u_k²) + eps) (eps = cfg.norm_eps),
// α = softmax(s), agg = Σ_k α_k u_k. Every source's r_k is computed once when the source is
// created and stored; backward recomputes s and α from (u_k, r_k) and accumulates dL/du_k
// straight into the source's gradient buffer (no per-pair d-sized intermediate).
// Parameter block (core/config.cpp): per sublayer j = 1..D: w [d], g [d]; then w_f [d], g_f [d]
// (the readout, indexed j = D+1 here). Init: w = 0, g = 1.
#pragma once
#include <vector>

#include "math/elementwise.h"
#include "cpu/scheme.h"

namespace ldm {

// In-place softmax over K logits (max-subtracted).
template <typename R>
LDM_HD inline void attnres_softmax(R* s, int K) {
    R mx = s[0];
    for (int k = 1; k < K; k++) mx = s[k] > mx ? s[k] : mx;
    R z = 0;
    for (int k = 0; k < K; k++) {
        s[k] = ldm_exp(s[k] - mx);
        z += s[k];
    }
    R inv = R(1) / z;
    for (int k = 0; k < K; k++) s[k] *= inv;
}

// Softmax backward in place: da (K) -> ds_k = α_k (da_k - Σ_i α_i da_i).
template <typename R>
LDM_HD inline void attnres_softmax_backward(R* da, const R* alpha, int K) {
    R m = 0;
    for (int k = 0; k < K; k++) m += alpha[k] * da[k];
    for (int k = 0; k < K; k++) da[k] = alpha[k] * (da[k] - m);
}

// Weight of one more source with score s in a softmax whose other sources have log-sum-exp lse:
// e^s / (e^lse + e^s) = 1 / (1 + e^(lse − s)) (0 or 1, never NaN, for any finite or infinite
// difference). The rest keep their weights times 1 − this. (Two-phase AttnRes-Block on the GPU,
// cuda/attnres.cuh: the partial-sum source p merged into the block sources' softmax.)
template <typename R>
LDM_HD inline R attnres_merge_weight(R s, R lse) {
    return R(1) / (R(1) + ldm_exp(lse - s));
}

// dL/du_c of the score s = r (q · u), r = (mean(u²) + eps)^-1/2, for one channel:
// ds * (r q_c - s r² u_c / d).
template <typename R>
LDM_HD inline R attnres_score_grad(R ds, R r, R s, R q_c, R u_c, int d) {
    return ds * (r * q_c - s * r * r * u_c / R(d));
}

namespace cpu {

// Full (block = false): sources of sublayer j are v_0 = e, v_i = o_i (i < j); readout over
// v_0..v_D. Block (block = true): N = min(attnres_blocks, D) blocks of S = floor(D/N) sublayers,
// the last one taking the remainder; b_0 = e; the i-th sublayer of block n sees b_0..b_{n-1} and,
// for i >= 2, the partial sum p of the block's earlier outputs; p += o_j after each sublayer; at
// the block end b_n = p and p restarts at 0; readout over b_0..b_N.
// Stored per token: Full: v_0..v_D (d each) and their r; Block: b_0..b_N, the p each sublayer
// saw (D·d; it cannot be recovered without o_j) and their r; plus the gradient buffers.
template <typename R>
struct AttnRes final : Scheme<R> {
    AttnRes(const ModelConfig& cfg, bool block);
    void bind(const R* params, R* grads) override { P_ = params; G_ = grads; }
    void init_params(R* params, uint64_t seed, uint64_t first_index) override;
    void resize(int B, int T) override;
    void begin(const R* e) override;
    void input(int j, R* x) override;
    void output(int j, const R* o) override;
    void readout(R* y) override;
    void readout_backward(const R* dy) override;
    void output_backward(int j, R* d_o) override;
    void input_backward(int j, const R* dx) override;
    void begin_backward(R* de) override;
    int64_t state_values_per_token() const override;
    int n_blocks() const { return nb_; }
    // Block index n (1-based) and position i (1-based) of sublayer j.
    void locate(int j, int* n, int* i) const;

   private:
    struct Src {
        const R* u;   // [N, d]
        const R* r;   // [N]
        R* du;        // [N, d] gradient accumulator
    };
    int d_, D_, nb_ = 0, S_ = 1;
    bool block_;
    R eps_;
    int N_ = 0;
    const R* P_ = nullptr;
    R* G_ = nullptr;
    std::vector<R> src_, rsrc_, dsrc_;  // Full: v_0..v_D; Block: b_0..b_N
    std::vector<R> pv_, rp_;            // Block: p seen by each sublayer [D, N, d], its r [D, N]
    std::vector<R> p_, dp_;             // Block: running partial sum and its gradient
    R* U(int k) { return src_.data() + (size_t)k * N_ * d_; }
    R* RU(int k) { return rsrc_.data() + (size_t)k * N_; }
    R* DU(int k) { return dsrc_.data() + (size_t)k * N_ * d_; }
    std::vector<Src> sources(int j);    // j = D+1: the readout's
    void rms_of(const R* u, R* r);
    void aggregate(int j, R* x);
    void aggregate_backward(int j, const R* dx);
};

}  // namespace cpu
}  // namespace ldm
