// cpu/scheme_hc.h — HC (dynamic hyper-connections, spec §2.2) and mHC (manifold-constrained
// hyper-connections, spec §2.3) for the CPU reference, with hand-written backward passes.
//
// Both keep n streams H [N, n, d] (token-major, stream rows of d) per sublayer boundary j = 0..D
// and the sublayer outputs o_j [N, d] for backward (the reference's `store` form).
// Parameter blocks (core/config.cpp add_scheme_specs, in this order per sublayer j = 1..D):
//   HC : w_m [1,d], w_r [n,d], w_b [1,d]  (one [(n+2), d] matrix W_j: rows m, r_0..r_{n-1}, b),
//        s_a, s_b, a_m0 [n], a_r0 [n,n] (row i, column k = A_r0[i,k]), b0 [n].
//   mHC: phi_pre [n,nd], phi_post [n,nd], phi_res [n²,nd] (one [(2n+n²), nd] matrix Φ_j),
//        a_pre, a_post, a_res, b_pre [n], b_post [n], b_res [n,n] (row k = output stream).
// Per-element math lives in the LDM_HD helpers below (shared with the CUDA kernels, cuda/hc.cuh).
#pragma once
#include <cmath>
#include <vector>

#include "math/elementwise.h"
#include "cpu/scheme.h"
#include "math/sinkhorn.h"

namespace ldm {

LDM_HD inline float ldm_tanh(float x) { return tanhf(x); }
LDM_HD inline double ldm_tanh(double x) { return tanh(x); }

// HC dynamic coefficient (spec §2.2): c = s * tanh(u) + c0, given t = tanh(u).
template <typename R>
LDM_HD inline R hc_coef(R s, R t, R c0) { return s * t + c0; }
// Its backward: given dc, adds dc*t to *ds and returns du = dc * s * (1 - t²) (dc0 = dc).
template <typename R>
LDM_HD inline R hc_coef_backward(R dc, R s, R t, R* ds) {
    *ds += dc * t;
    return dc * s * (R(1) - t * t);
}

// mHC gates (spec §2.3) from the pre-activations: H_pre = sigmoid(Pt), H_post = 2 sigmoid(Qt).
// Backward of g = c*sigmoid(z): dz = dg * g * (1 - g/c).
template <typename R>
LDM_HD inline R mhc_gate(R c, R z) { return c * sigmoid(z); }
template <typename R>
LDM_HD inline R mhc_gate_backward(R dg, R c, R g) { return dg * g * (R(1) - g / c); }

namespace cpu {

// HC, spec §2.2. input(j): Hb = rms0(H_{j-1}) per stream row (eps = cfg.norm_eps), u = Hb W_jᵀ
// ([n, n+2] per token), A_m, A_r, B by hc_coef, x_j = Σ_i A_m[i] H_i. output(j, o):
// H_j[k] = Σ_i A_r[i,k] H_i + B[k] o. readout: mean over streams. Init: W = 0, s_a = s_b = 0.01,
// a_m0 = e_{(j-1) mod n}, a_r0 = I, b0 = 1 (every stream equals PreLN's h).
template <typename R>
struct HC final : Scheme<R> {
    explicit HC(const ModelConfig& cfg);
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
    // H_0..H_D (n d each), o_1..o_D, rstd and tanh values per sublayer, and the backward's
    // two n·d gradient buffers.
    int64_t state_values_per_token() const override;
    int64_t block_size() const { return (int64_t)(n_ + 2) * d_ + 2 + n_ + n_ * n_ + n_; }

   private:
    int d_, n_, D_;
    R eps_;
    int N_ = 0;
    const R* P_ = nullptr;
    R* G_ = nullptr;
    std::vector<R> Hs_, Os_, rstd_, tanh_, Hb_, U_, dC_, dHb_, dH_, dHp_;
    R* H(int j) { return Hs_.data() + (size_t)j * N_ * n_ * d_; }
    void compute_hb(int j);  // Hb_ = rms0(H_{j-1}), rstd_ of sublayer j
};

// mHC, spec §2.3. input(j): z = vec(H_{j-1}) (n d), zh = z / sqrt(mean(z²) + eps), p = zh Φ_jᵀ
// ([2n+n²] per token: pre, post, res); Pt = a_pre p_pre + b_pre etc.; H_pre = sigmoid(Pt),
// x_j = Σ_i H_pre[i] H_i. output(j, o): H_post = 2 sigmoid(Qt), H_res = SK(Rt) (sinkhorn.h,
// cfg.sinkhorn_iters), H_j[k] = Σ_i H_res[k,i] H_i + H_post[k] o. readout: mean of rows.
// Stores p per token (which holds Rt) and recomputes the Sinkhorn iterates in backward.
// zh is never materialised: p = rstd (z Φ_jᵀ), and backward uses dΦ += (rstd dp)ᵀ z. The
// Sinkhorn runs on SIMD lanes, Lane<R>::W tokens per call (cpu/lanes.h: 16 fp32 / 8 fp64 with
// AVX-512, 8 / 4 otherwise).
// Init: Φ ~ N(0, 0.02) (stream of its param_specs index), a = 0.01, b = 0.
template <typename R>
struct MHC final : Scheme<R> {
    explicit MHC(const ModelConfig& cfg);
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
    int64_t block_size() const { return (int64_t)m_ * n_ * d_ + 3 + m_; }

   private:
    int d_, n_, D_, m_, iters_;
    R eps_;
    int N_ = 0;
    const R* P_ = nullptr;
    R* G_ = nullptr;
    std::vector<R> Hs_, Os_, rstd_, proj_, dT_, dTs_, dZ_, dH_, dHp_;
    R* H(int j) { return Hs_.data() + (size_t)j * N_ * n_ * d_; }
    void compute_rstd(int j);  // rstd_ of sublayer j: 1/rms of vec(H_{j-1}) per token
};

}  // namespace cpu
}  // namespace ldm
