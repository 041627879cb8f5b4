// dev/cuda/attnres_onephase.cuh — the Block AttnRes path production ran before the two-phase one
// (workbench only, "attnres-block-1phase" in dev/cuda/attnres.cu): a per-sublayer forward over all
// of the sublayer's sources (aggregate_onepass_kernel) and the deferred backward: each sublayer
// recomputes its scores from every block source, updates p's gradient and stores three scalars
// per block source (α, β = ds·r, γ = ds·s·r²/d) and its dx; at the block's first sublayer one
// flush adds Σ_j (α_jk dx_j + β_jk q_j − γ_jk u_k) into each block source. Per block it reads each
// block source ns + 1 times in backward (the two-phase path: once) and ns times in forward (once).
// Kept to check and time against the two-phase path (doc/cuda.md "AttnRes-Block, two-phase").
// Included by dev/cuda/attnres.cu after train_gpt_baselines.cu.
#pragma once
#include "cuda/attnres.cuh"

namespace ldm {
namespace gpu {
namespace ar_detail {

// Per sublayer j of block n (position i): like aggregate_backward_kernel for the scores, but the
// block sources b_0..b_{n-1} (the first S.K0 sources) are NOT updated: their per-token scalars
// α_k, β_k = ds_k r_k, γ_k = ds_k s_k r_k²/d are written to a[t·ldc + k], b[..], c[..] and dx is
// stashed (stash [N, d]); only the partial-sum source p (S.Ux, when present) is updated now
// (dL/dp is needed by output_backward(j-1)), with its dq contribution in dq_part [gridDim, d].
// block_flush_kernel later applies, once per block, du_k += Σ_j (α_jk dx_j + β_jk q_j − γ_jk u_k).
// Dynamic smem: (2·nwarps + 3)·K + d floats.
template <typename T>
__global__ void block_scores_backward_kernel(float* dq_part, float* ca, float* cb, float* cc, int ldc, T* stash,
                                             const T* dx, Sources S, const float* w, const float* g, int N, int d) {
    extern __shared__ float sm[];
    const int K = S.K(), nw = (blockDim.x + 31) >> 5;
    float* sc = sm + 2 * nw * K;  // layout of scores_backward_token
    float* al = sc + K;
    float* da = al + K;
    float* dq = da + K;
    for (int c = threadIdx.x; c < d; c += blockDim.x) dq[c] = 0.f;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        const T* dxt = dx + t * d;
        scores_backward_token<T>(sm, t, dxt, S, w, g, N, d);
        for (int k = threadIdx.x; k < S.K0; k += blockDim.x) {
            const float r = src_r(S, k, t, N);
            ca[t * ldc + k] = al[k];
            cb[t * ldc + k] = da[k] * r;
            cc[t * ldc + k] = da[k] * sc[k] * r * r / (float)d;
        }
        for (int c = threadIdx.x; c < d; c += blockDim.x) stash[t * d + c] = dxt[c];
        if (S.Ux) {
            const int k = S.K0;
            const T* u = src_row<T>(S, k, t, N, d);
            float* du = src_grad(S, k, t, N, d);
            const float ak = al[k], ds = da[k], r = src_r(S, k, t, N), sk = sc[k];
            for (int c = threadIdx.x; c < d; c += blockDim.x) {
                const float uc = to_f(u[c]);
                du[c] += ak * to_f(dxt[c]) + attnres_score_grad(ds, r, sk, w[c] * g[c], uc, d);
                dq[c] += ds * r * uc;
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) dq_part[(int64_t)blockIdx.x * d + c] = dq[c];
}

// Once per block (after its first sublayer's scores): for the K0 block sources u_k (U [K0, N, d],
// gradients dU, fp32) and the block's ns sublayers (coefficients ca/cb/cc [ns][N, ldc], stashed dx
// [ns][N, d], parameters wg = the first sublayer's (w, g) block, 2d floats per sublayer):
// dU_k += Σ_s (α_sk dx_s + β_sk q_s) − (Σ_s γ_sk) u_k, and dq_part [gridDim, ns, d] = this grid
// block's Σ_t Σ_k β_sk u_k. Dynamic smem: ns·d + 3·ns floats.
template <typename T>
__global__ void block_flush_kernel(float* dq_part, const float* ca, const float* cb, const float* cc, int ldc,
                                   const T* stash, const T* U, float* dU, int K0, const float* wg, int ns, int N,
                                   int d) {
    extern __shared__ float sm[];
    float* dq = sm;             // [ns, d]
    float* co = sm + ns * d;    // [3, ns]: α, β, γ of the current (t, k)
    const int64_t Nd = (int64_t)N * d;
    for (int e = threadIdx.x; e < ns * d; e += blockDim.x) dq[e] = 0.f;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        for (int k = 0; k < K0; k++) {
            __syncthreads();
            for (int s = threadIdx.x; s < ns; s += blockDim.x) {
                const int64_t o = (int64_t)s * N * ldc + t * ldc + k;
                co[s] = ca[o];
                co[ns + s] = cb[o];
                co[2 * ns + s] = cc[o];
            }
            __syncthreads();
            float gam = 0.f;
            for (int s = 0; s < ns; s++) gam += co[2 * ns + s];
            const T* u = U + (int64_t)k * Nd + t * d;
            float* du = dU + (int64_t)k * Nd + t * d;
            for (int c = threadIdx.x; c < d; c += blockDim.x) {
                const float uc = to_f(u[c]);
                float acc = 0.f;
                for (int s = 0; s < ns; s++) {
                    const float* ws = wg + (int64_t)s * 2 * d;
                    const float bs = co[ns + s];
                    acc += co[s] * to_f(stash[(int64_t)s * Nd + t * d + c]) + bs * (ws[c] * ws[d + c]);
                    dq[s * d + c] += bs * uc;
                }
                du[c] += acc - gam * uc;
            }
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ns * d; e += blockDim.x) dq_part[(int64_t)blockIdx.x * ns * d + e] = dq[e];
}

}  // namespace ar_detail

// Block with the per-sublayer forward and the deferred per-sublayer-scores backward.
template <typename T>
struct AttnResOnePhase : GpuAttnRes<T> {
    using Base = GpuAttnRes<T>;
    explicit AttnResOnePhase(const ModelConfig& c) : Base(c, true) {
        this->two_phase_ = false;
        if ((size_t)(this->smax_ * this->d_ + 3 * this->smax_) * sizeof(float) > this->smem_optin_)
            throw Error("AttnResOnePhase: the flush does not fit in shared memory at this shape");
    }
    void resize(int B, int T_) override {
        Base::resize(B, T_);
        const int64_t N = this->N_, d = this->d_;
        Base::grow(co_, 3 * (int64_t)this->smax_ * N * this->nb_);
        Base::grow(stash_, (int64_t)this->smax_ * N * d);
        Base::grow(dq2_, (int64_t)this->bwd_blocks() * this->smax_ * d);
    }
    void input_backward(int j, const T* dx, cudaStream_t s) override {
        int n, i;
        this->locate(j, &n, &i);
        const ar_detail::Sources S = this->sources(j);
        const int d = this->d_, N = this->N_, nb = this->nb_;
        const float* w = this->Wj(j);
        const float* g = w + d;
        float* gw = this->GWj(j);
        const int nw = ar_detail::kThreads / 32, nbk = this->bwd_blocks();
        const int64_t plane = (int64_t)this->smax_ * N * nb;
        float* ca = co_.ptr + (int64_t)(i - 1) * N * nb;
        const size_t smem = ((size_t)(2 * nw + 3) * S.K() + d) * sizeof(float);
        ensure_dynamic_smem(ar_detail::block_scores_backward_kernel<T>, smem);
        ar_detail::block_scores_backward_kernel<T><<<nbk, ar_detail::kThreads, smem, s>>>(
            this->dq_part_.ptr, ca, ca + plane, ca + 2 * plane, nb, stash_.ptr + (int64_t)(i - 1) * N * d, dx, S, w,
            g, N, d);
        LDM_LAUNCH_CHECK();
        if (S.Ux) {
            ar_detail::dq_reduce_kernel<float><<<(unsigned)ceil_div(d, 256), 256, 0, s>>>(gw, gw + d, this->dq_part_.ptr,
                                                                                           nbk, w, g, d);
            LDM_LAUNCH_CHECK();
        }
        if (i != 1) return;
        const int ns = this->block_len(n);
        const size_t fsm = ((size_t)ns * d + 3 * (size_t)ns) * sizeof(float);
        ensure_dynamic_smem(ar_detail::block_flush_kernel<T>, fsm);
        ar_detail::block_flush_kernel<T><<<nbk, ar_detail::kThreads, fsm, s>>>(
            dq2_.ptr, co_.ptr, co_.ptr + plane, co_.ptr + 2 * plane, nb, stash_.ptr, this->U(0), this->DU(0), n, w, ns,
            N, d);
        LDM_LAUNCH_CHECK();
        dim3 rg((unsigned)ceil_div(d, 256), (unsigned)ns);
        ar_detail::dq_reduce_multi_kernel<float><<<rg, 256, 0, s>>>(gw, dq2_.ptr, nbk, ns, w, d);
        LDM_LAUNCH_CHECK();
    }
    int64_t extra_bytes_per_token() const override {
        return Base::extra_bytes_per_token() + 3 * (int64_t)this->smax_ * this->nb_ * 4 +
               (int64_t)this->smax_ * this->d_ * (int64_t)sizeof(T);
    }

   private:
    DeviceBuffer<float> co_, dq2_;  // α, β, γ [3][smax][N][nb]; flush dq partials
    DeviceBuffer<T> stash_;         // dx_j of the current block [smax, N, d]
};

}  // namespace gpu
}  // namespace ldm
