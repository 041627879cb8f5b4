// cuda/scheme_attnres.cuh — AttnRes, attention residuals over depth (spec §2.4), Full and Block,
// on the GPU, forward and backward. CPU reference: cpu/scheme_attnres.* (same LDM_HD math:
// attnres_softmax, attnres_softmax_backward, attnres_score_grad, rms_scale).
//
// Aggregation of sublayer j over sources u_1..u_K (per token): s_k = r_k (q · u_k) with
// q = w_j ⊙ g_j and r_k = 1/sqrt(mean(u_k²) + eps) computed ONCE when the source is written
// (cached fp32 [N] per source), α = softmax(s), agg = Σ_k α_k u_k.
// Kernels (one block per token unless said otherwise):
//   aggregate_kernel      scores (one pass over the sources, block-reduced), softmax, weighted sum
//                         (second pass), fused with RMSNorm_j of the sublayer input (x, xn, rstd).
//   aggregate_backward    persistent blocks over tokens: recomputes s and α from (u_k, r_k),
//                         softmax backward, then dL/du_k = α_k dx + ds_k (r_k q − s_k r_k² u_k/d)
//                         added straight into the source's fp32 gradient buffer (written, not
//                         added, by the readout's backward, the first consumer in backward order:
//                         no memset), and dL/dq reduced per block in shared memory, then over
//                         blocks in a fixed order (deterministic): no per-pair d-sized buffer.
//   source_kernel         writes a new source (o_j, or p + o_j for Block) and its r in one pass.
// Block: the partial sum p lives in place in the snapshot array pv (pv_j = p as sublayer j sees it,
// needed for backward anyway): output(j) writes p + o_j straight into pv_{j+1}, or into the block
// source b_n at the block end; no running copy. In backward dL/dp accumulates in place in
// dL/db_n's buffer (final once the block's last sublayer is reached).
// Block backward variant 2 (LDM_ATTNRES_VARIANT=2, see GpuAttnRes): the block sources' gradients
// are applied once per block from per-sublayer scalars and a dx stash instead of once per sublayer.
// Parameters: w_j, g_j (and the readout's w_f, g_f, index D+1) are read from the fp32 master
// array; gradients fp32, accumulated (+=). Activations T (float or bf16), arithmetic fp32.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/config.h"
#include "cuda/common.cuh"
#include "cuda/scheme.cuh"
#include "cpu/scheme_attnres.h"

namespace ldm {
namespace gpu {
namespace ar_detail {

constexpr int kThreads = 256;
constexpr int kBackwardBlocks = 1024;  // fixed grid of the backward (fixed reduction order)

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Source k of a token: k < K0 from the contiguous block U [K0, N, d] (r: R [K0, N]), k == K0 the
// extra source Ux [N, d] (r: Rx [N]).
struct Sources {
    const void* U;
    const float* R;
    int K0;
    const void* Ux;
    const float* Rx;
    float* dU;   // gradient buffers [K0, N, d] fp32 (backward only)
    float* dUx;  // [N, d] fp32
    __host__ __device__ int K() const { return K0 + (Ux ? 1 : 0); }
};

template <typename T>
__device__ inline const T* src_row(const Sources& S, int k, int64_t t, int64_t N, int d) {
    return k < S.K0 ? (const T*)S.U + ((int64_t)k * N + t) * d : (const T*)S.Ux + t * d;
}
__device__ inline float src_r(const Sources& S, int k, int64_t t, int64_t N) {
    return k < S.K0 ? S.R[(int64_t)k * N + t] : S.Rx[t];
}
__device__ inline float* src_grad(const Sources& S, int k, int64_t t, int64_t N, int d) {
    return k < S.K0 ? S.dU + ((int64_t)k * N + t) * d : S.dUx + t * d;
}

// x[t] = Σ_k α_k u_k[t] (T); when xn != nullptr also rstd[t] and xn = wn ⊙ (x · rstd) (RMSNorm
// with eps_n of the rounded x). w, g: fp32 [d]. Dynamic smem: (nwarps + 1)·K floats. Grid N.
template <typename T>
__global__ void aggregate_kernel(T* x, T* xn, float* rstd, const T* wn, float eps_n, Sources S,
                                 const float* w, const float* g, int N, int d) {
    extern __shared__ float sm[];
    const int K = S.K(), nw = (blockDim.x + 31) >> 5, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float* part = sm;          // [nw, K]
    float* sc = sm + nw * K;   // [K]
    const int64_t t = blockIdx.x;
    for (int k = 0; k < K; k++) {
        const T* u = src_row<T>(S, k, t, N, d);
        float p = 0.f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) p += (w[c] * g[c]) * to_f(u[c]);
        p = warp_sum(p);
        if (lane == 0) part[wid * K + k] = p;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        float s = 0.f;
        for (int q = 0; q < nw; q++) s += part[q * K + k];
        sc[k] = s * src_r(S, k, t, N);
    }
    __syncthreads();
    if (threadIdx.x == 0) attnres_softmax(sc, K);
    __syncthreads();
    float ss = 0.f;
    T* xt = x + t * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = 0.f;
        for (int k = 0; k < K; k++) v += sc[k] * to_f(src_row<T>(S, k, t, N, d)[c]);
        const T xv = from_f<T>(v);
        xt[c] = xv;
        const float f = to_f(xv);
        ss += f * f;
    }
    if (xn == nullptr) return;
    ss = warp_sum(ss);
    __syncthreads();
    if (lane == 0) part[wid] = ss;
    __syncthreads();
    float tot = 0.f;
    for (int q = 0; q < nw; q++) tot += part[q];
    const float s = rms_scale(tot, d, eps_n);
    if (threadIdx.x == 0) rstd[t] = s;
    for (int c = threadIdx.x; c < d; c += blockDim.x) xn[t * d + c] = from_f<T>(to_f(wn[c]) * (to_f(xt[c]) * s));
}

// Backward of aggregate_kernel's x (not of the norm, which the backbone owns): for every token,
// dL/du_k += (or = when overwrite) α_k dx + attnres_score_grad(ds_k, r_k, s_k, q_c, u_c, d);
// dq_part[blockIdx.x, c] = this block's Σ_t Σ_k ds_k r_k u_k[c]. Grid kBackwardBlocks (or N if
// smaller), tokens strided by gridDim. Dynamic smem: (2·nwarps + 3)·K + d floats.
template <typename T>
__global__ void aggregate_backward_kernel(float* dq_part, const T* dx, Sources S, const float* w,
                                          const float* g, int N, int d, bool overwrite) {
    extern __shared__ float sm[];
    const int K = S.K(), nw = (blockDim.x + 31) >> 5, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float* pq = sm;                // [nw, K]  q·u partials
    float* pd = pq + nw * K;       // [nw, K]  dx·u partials
    float* sc = pd + nw * K;       // [K] scores s_k
    float* al = sc + K;            // [K] α
    float* da = al + K;            // [K] dL/dα, then dL/ds
    float* dq = da + K;            // [d] this block's dq accumulator
    for (int c = threadIdx.x; c < d; c += blockDim.x) dq[c] = 0.f;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        const T* dxt = dx + t * d;
        for (int k = 0; k < K; k++) {
            const T* u = src_row<T>(S, k, t, N, d);
            float a = 0.f, b = 0.f;
            for (int c = threadIdx.x; c < d; c += blockDim.x) {
                const float uc = to_f(u[c]);
                a += (w[c] * g[c]) * uc;
                b += to_f(dxt[c]) * uc;
            }
            a = warp_sum(a);
            b = warp_sum(b);
            if (lane == 0) {
                pq[wid * K + k] = a;
                pd[wid * K + k] = b;
            }
        }
        __syncthreads();
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            float a = 0.f, b = 0.f;
            for (int q = 0; q < nw; q++) {
                a += pq[q * K + k];
                b += pd[q * K + k];
            }
            sc[k] = a * src_r(S, k, t, N);
            al[k] = sc[k];
            da[k] = b;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            attnres_softmax(al, K);
            attnres_softmax_backward(da, al, K);
        }
        __syncthreads();
        for (int k = 0; k < K; k++) {
            const T* u = src_row<T>(S, k, t, N, d);
            float* du = src_grad(S, k, t, N, d);
            const float ak = al[k], ds = da[k], r = src_r(S, k, t, N), sk = sc[k];
            for (int c = threadIdx.x; c < d; c += blockDim.x) {
                const float uc = to_f(u[c]);
                const float v = ak * to_f(dxt[c]) + attnres_score_grad(ds, r, sk, w[c] * g[c], uc, d);
                du[c] = overwrite ? v : du[c] + v;
                dq[c] += ds * r * uc;
            }
        }
        __syncthreads();  // smem reuse by the next token
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) dq_part[(int64_t)blockIdx.x * d + c] = dq[c];
}

// gw[c] += dq·g[c], gg[c] += dq·w[c] with dq = Σ_b dq_part[b, c] (fixed order over blocks).
template <typename F = float>
__global__ void dq_reduce_kernel(F* gw, F* gg, const F* dq_part, int nblocks, const F* w, const F* g, int d) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    float s = 0.f;
    for (int b = 0; b < nblocks; b++) s += dq_part[(int64_t)b * d + c];
    gw[c] += s * g[c];
    gg[c] += s * w[c];
}

// New source: dst[t] = (p ? p[t] : 0) + o[t] (rounded to T) and rdst[t] = r of the rounded row.
// Grid N.
template <typename T>
__global__ void source_kernel(T* dst, float* rdst, const T* p, const T* o, int d, float eps) {
    __shared__ float part[32];
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    float ss = 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = to_f(o[t * d + c]);
        if (p) v = to_f(p[t * d + c]) + v;
        const T tv = from_f<T>(v);
        dst[t * d + c] = tv;
        const float f = to_f(tv);
        ss += f * f;
    }
    ss = warp_sum(ss);
    if (lane == 0) part[wid] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float tot = 0.f;
        for (int q = 0; q < nw; q++) tot += part[q];
        rdst[t] = rms_scale(tot, d, eps);
    }
}

// out[i] = (T) in[i] (fp32 gradient buffer -> activation gradient).
template <typename T>
__global__ void to_act_kernel(T* out, const float* in, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = from_f<T>(in[i]);
}

// ---- Block backward, variant 2 (deferred block-source gradients) ------------------------------
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
    const int K = S.K(), nw = (blockDim.x + 31) >> 5, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float* pq = sm;
    float* pd = pq + nw * K;
    float* sc = pd + nw * K;
    float* al = sc + K;
    float* da = al + K;
    float* dq = da + K;
    for (int c = threadIdx.x; c < d; c += blockDim.x) dq[c] = 0.f;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        const T* dxt = dx + t * d;
        for (int k = 0; k < K; k++) {
            const T* u = src_row<T>(S, k, t, N, d);
            float a = 0.f, b = 0.f;
            for (int c = threadIdx.x; c < d; c += blockDim.x) {
                const float uc = to_f(u[c]);
                a += (w[c] * g[c]) * uc;
                b += to_f(dxt[c]) * uc;
            }
            a = warp_sum(a);
            b = warp_sum(b);
            if (lane == 0) {
                pq[wid * K + k] = a;
                pd[wid * K + k] = b;
            }
        }
        __syncthreads();
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            float a = 0.f, b = 0.f;
            for (int q = 0; q < nw; q++) {
                a += pq[q * K + k];
                b += pd[q * K + k];
            }
            sc[k] = a * src_r(S, k, t, N);
            al[k] = sc[k];
            da[k] = b;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            attnres_softmax(al, K);
            attnres_softmax_backward(da, al, K);
        }
        __syncthreads();
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

// For each of ns sublayers (blockIdx.y = s; parameters wg + s·2d = (w, g), gradients gwg + s·2d):
// dq = Σ_b dq_part[b, s, c] (fixed order); gw[c] += dq·g[c], gg[c] += dq·w[c].
template <typename F = float>
__global__ void dq_reduce_multi_kernel(F* gwg, const F* dq_part, int nblocks, int ns, const F* wg, int d) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
    if (c >= d) return;
    float acc = 0.f;
    for (int b = 0; b < nblocks; b++) acc += dq_part[((int64_t)b * ns + s) * d + c];
    const F* w = wg + (int64_t)s * 2 * d;
    F* gw = gwg + (int64_t)s * 2 * d;
    gw[c] += acc * w[d + c];
    gw[d + c] += acc * w[c];
}

}  // namespace ar_detail

// AttnRes Full (block = false) and Block (block = true) behind GpuScheme<T>. Parameter block
// (core/config.cpp): per sublayer j = 1..D: w [d], g [d]; then w_f [d], g_f [d] (readout, j = D+1).
// Buffers (resize): sources src [K, N, d] (T; Full K = D+1: v_0..v_D, Block K = N_b+1:
// b_0..b_N), their r [K, N] and fp32 gradients [K, N, d]; Block also pv [D, N, d] (T) and r [D, N].
// Backward variants (Block only; Full always uses 1):
//   1: every sublayer adds its gradient into each of its sources' fp32 rows (read-modify-write of
//      K·d fp32 per sublayer and token);
//   2: the block sources' gradients are deferred: each sublayer stores 3 scalars per source and
//      stashes dx_j (T); once per block one flush kernel adds Σ_j (α dx_j + β q_j − γ u_k) into
//      each block source (one read-modify-write per block instead of per sublayer).
// variant 0 = from the environment variable LDM_ATTNRES_VARIANT (1 or 2), default 1.
template <typename T>
struct GpuAttnRes final : GpuScheme<T> {
    GpuAttnRes(const ModelConfig& cfg, bool block, int variant = 0)
        : d_(cfg.d_model), D_(cfg.n_sublayers()), block_(block), eps_((float)cfg.norm_eps) {
        if (block_) {
            nb_ = std::min(cfg.attnres_blocks, D_);
            if (nb_ <= 0)
                throw Error(strprintf("attnres-block: attnres_blocks must be positive, got %d", cfg.attnres_blocks));
            S_ = D_ / nb_;
        } else {
            nb_ = D_;
            S_ = 1;
        }
        if (variant == 0) {
            const char* e = std::getenv("LDM_ATTNRES_VARIANT");
            variant = e ? std::atoi(e) : 1;
        }
        if (variant != 1 && variant != 2) throw Error(strprintf("attnres: backward variant %d (1 or 2)", variant));
        v2_ = block_ && variant == 2;
        smax_ = block_ ? std::max(S_, D_ - (nb_ - 1) * S_) : 1;
    }
    int variant() const { return v2_ ? 2 : 1; }

    void bind(const T* params, const float* master, float* grads) override {
        P_ = params;
        M_ = master;
        G_ = grads;
    }

    void resize(int B, int T_) override {
        N_ = B * T_;
        const int64_t N = N_, d = d_, K = nb_ + 1;
        grow(src_, K * N * d);
        grow(rsrc_, K * N);
        grow(dsrc_, K * N * d);
        if (block_) {
            grow(pv_, (int64_t)D_ * N * d);
            grow(rp_, (int64_t)D_ * N);
        }
        grow(dq_part_, (int64_t)bwd_blocks() * d);
        if (v2_) {
            grow(co_, 3 * (int64_t)smax_ * N * nb_);
            grow(stash_, (int64_t)smax_ * N * d);
            grow(dq2_part_, (int64_t)bwd_blocks() * smax_ * d);
            if (flush_smem() > 227 * 1024)
                throw Error(strprintf("attnres-block variant 2: %d sublayers per block x d = %d need %zu bytes of "
                                      "shared memory; use LDM_ATTNRES_VARIANT=1", smax_, d_, flush_smem()));
        }
    }

    void begin(const T* e, cudaStream_t s) override {
        ar_detail::source_kernel<T><<<N_, ar_detail::kThreads, 0, s>>>(U(0), RU(0), nullptr, e, d_, eps_);
        LDM_LAUNCH_CHECK();
    }

    void input_norm(int j, T* x, T* xn, float* rstd, const T* w, float eps, cudaStream_t s) override {
        aggregate(j, x, xn, rstd, w, eps, s);
    }

    void output(int j, const T* o, cudaStream_t s) override {
        if (!block_) {
            ar_detail::source_kernel<T><<<N_, ar_detail::kThreads, 0, s>>>(U(j), RU(j), nullptr, o, d_, eps_);
            LDM_LAUNCH_CHECK();
            return;
        }
        int n, i;
        locate(j, &n, &i);
        const T* p = i >= 2 ? PV(j) : nullptr;
        if (block_end(j, n))
            ar_detail::source_kernel<T><<<N_, ar_detail::kThreads, 0, s>>>(U(n), RU(n), p, o, d_, eps_);
        else
            ar_detail::source_kernel<T><<<N_, ar_detail::kThreads, 0, s>>>(PV(j + 1), RP(j + 1), p, o, d_, eps_);
        LDM_LAUNCH_CHECK();
    }

    void readout(T* y, cudaStream_t s) override { aggregate(D_ + 1, y, nullptr, nullptr, nullptr, 0.f, s); }

    void readout_backward(const T* dy, cudaStream_t s) override { aggregate_backward(D_ + 1, dy, true, s); }

    void output_backward(int j, T* d_o, cudaStream_t s) override {
        int n = j, i = 1;
        if (block_) locate(j, &n, &i);
        // Full: dL/dv_j. Block: dL/dp after sublayer j, kept in place in b_n's gradient buffer.
        to_act(d_o, DU(n), s);
    }

    void input_backward(int j, const T* dx, cudaStream_t s) override {
        if (v2_) block_backward_v2(j, dx, s);
        else aggregate_backward(j, dx, false, s);
    }

    void begin_backward(T* de, cudaStream_t s) override { to_act(de, DU(0), s); }

    // Every byte per token allocated in resize(): sources (T) + r + fp32 gradients; Block also the
    // partial-sum snapshots pv (T) + r. (The dq partials are per block, not per token.)
    int64_t extra_bytes_per_token() const override {
        const int64_t d = d_, K = nb_ + 1, tb = sizeof(T);
        int64_t v = K * d * tb + K * 4 + K * d * 4;
        if (block_) v += (int64_t)D_ * d * tb + (int64_t)D_ * 4;
        if (v2_) v += 3 * (int64_t)smax_ * nb_ * 4 + (int64_t)smax_ * d * tb;  // scalars + dx stash
        return v;
    }
    int n_blocks() const { return nb_; }
    // Block index n and position i (1-based) of sublayer j (same rule as the CPU reference).
    void locate(int j, int* n, int* i) const {
        int b = (j - 1) / S_ + 1;
        if (b > nb_) b = nb_;
        *n = b;
        *i = j - (b - 1) * S_;
    }

   private:
    int d_, D_, nb_ = 0, S_ = 1;
    bool block_;
    bool v2_ = false;
    int smax_ = 1;  // most sublayers in one block (the last block takes the remainder)
    float eps_;
    int N_ = 0;
    const T* P_ = nullptr;
    const float* M_ = nullptr;
    float* G_ = nullptr;
    DeviceBuffer<T> src_, pv_;
    DeviceBuffer<float> rsrc_, dsrc_, rp_, dq_part_;
    DeviceBuffer<T> stash_;                 // v2: dx_j of the current block [smax, N, d]
    DeviceBuffer<float> co_, dq2_part_;     // v2: α, β, γ [3][smax][N][nb]; flush dq partials

    template <typename E>
    static void grow(DeviceBuffer<E>& b, int64_t n) {  // allocations only grow (resize per step)
        if (b.n < n) b.alloc(n);
    }
    T* U(int k) const { return src_.ptr + (int64_t)k * N_ * d_; }
    float* RU(int k) const { return rsrc_.ptr + (int64_t)k * N_; }
    float* DU(int k) const { return dsrc_.ptr + (int64_t)k * N_ * d_; }
    T* PV(int j) const { return pv_.ptr + (int64_t)(j - 1) * N_ * d_; }
    float* RP(int j) const { return rp_.ptr + (int64_t)(j - 1) * N_; }
    bool block_end(int j, int n) const { return (n < nb_) ? (j == n * S_) : (j == D_); }
    int bwd_blocks() const { return std::max(1, std::min(N_, ar_detail::kBackwardBlocks)); }

    ar_detail::Sources sources(int j) const {
        ar_detail::Sources S{U(0), RU(0), 0, nullptr, nullptr, DU(0), nullptr};
        if (j == D_ + 1) {
            S.K0 = nb_ + 1;
        } else if (!block_) {
            S.K0 = j;
        } else {
            int n, i;
            locate(j, &n, &i);
            S.K0 = n;
            if (i >= 2) {
                S.Ux = PV(j);
                S.Rx = RP(j);
                S.dUx = DU(n);  // dL/dp accumulates in place in b_n's gradient buffer
            }
        }
        return S;
    }

    void aggregate(int j, T* x, T* xn, float* rstd, const T* wn, float eps_n, cudaStream_t s) {
        const ar_detail::Sources S = sources(j);
        const float* w = M_ + (int64_t)(j - 1) * 2 * d_;
        const float* g = w + d_;
        const int nw = ar_detail::kThreads / 32;
        const size_t smem = (size_t)(nw + 1) * S.K() * sizeof(float);
        ar_detail::aggregate_kernel<T><<<N_, ar_detail::kThreads, smem, s>>>(x, xn, rstd, wn, eps_n, S, w, g, N_, d_);
        LDM_LAUNCH_CHECK();
    }

    void aggregate_backward(int j, const T* dx, bool overwrite, cudaStream_t s) {
        const ar_detail::Sources S = sources(j);
        const float* w = M_ + (int64_t)(j - 1) * 2 * d_;
        const float* g = w + d_;
        float* gw = G_ + (int64_t)(j - 1) * 2 * d_;
        float* gg = gw + d_;
        const int nw = ar_detail::kThreads / 32, nb = bwd_blocks();
        const size_t smem = ((size_t)(2 * nw + 3) * S.K() + d_) * sizeof(float);
        if (smem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(ar_detail::aggregate_backward_kernel<T>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ar_detail::aggregate_backward_kernel<T><<<nb, ar_detail::kThreads, smem, s>>>(dq_part_.ptr, dx, S, w, g, N_,
                                                                                       d_, overwrite);
        LDM_LAUNCH_CHECK();
        ar_detail::dq_reduce_kernel<float><<<(unsigned)ceil_div(d_, 256), 256, 0, s>>>(gw, gg, dq_part_.ptr, nb, w, g, d_);
        LDM_LAUNCH_CHECK();
    }

    size_t flush_smem() const { return ((size_t)smax_ * d_ + 3 * (size_t)smax_) * sizeof(float); }

    // Variant 2 backward of sublayer j (Block): scores + p-source update now, block sources at the
    // block's first sublayer (the last one in backward order).
    void block_backward_v2(int j, const T* dx, cudaStream_t s) {
        int n, i;
        locate(j, &n, &i);
        const ar_detail::Sources S = sources(j);
        const float* w = M_ + (int64_t)(j - 1) * 2 * d_;
        const float* g = w + d_;
        float* gw = G_ + (int64_t)(j - 1) * 2 * d_;
        float* gg = gw + d_;
        const int nw = ar_detail::kThreads / 32, nbk = bwd_blocks();
        const int64_t N = N_, plane = (int64_t)smax_ * N * nb_;
        float* ca = co_.ptr + (int64_t)(i - 1) * N * nb_;
        const size_t smem = ((size_t)(2 * nw + 3) * S.K() + d_) * sizeof(float);
        if (smem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(ar_detail::block_scores_backward_kernel<T>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ar_detail::block_scores_backward_kernel<T><<<nbk, ar_detail::kThreads, smem, s>>>(
            dq_part_.ptr, ca, ca + plane, ca + 2 * plane, nb_, stash_.ptr + (int64_t)(i - 1) * N * d_, dx, S, w, g, N_,
            d_);
        LDM_LAUNCH_CHECK();
        if (S.Ux) {
            ar_detail::dq_reduce_kernel<float><<<(unsigned)ceil_div(d_, 256), 256, 0, s>>>(gw, gg, dq_part_.ptr, nbk,
                                                                                            w, g, d_);
            LDM_LAUNCH_CHECK();
        }
        if (i != 1) return;
        // Flush: the block's ns sublayers j .. j+ns-1 into the block sources b_0..b_{n-1}.
        const int ns = n < nb_ ? S_ : D_ - (nb_ - 1) * S_;
        const size_t fsm = ((size_t)ns * d_ + 3 * (size_t)ns) * sizeof(float);
        if (fsm > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(ar_detail::block_flush_kernel<T>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fsm));
        ar_detail::block_flush_kernel<T><<<nbk, ar_detail::kThreads, fsm, s>>>(
            dq2_part_.ptr, co_.ptr, co_.ptr + plane, co_.ptr + 2 * plane, nb_, stash_.ptr, U(0), DU(0), n, w, ns, N_,
            d_);
        LDM_LAUNCH_CHECK();
        dim3 rg((unsigned)ceil_div(d_, 256), (unsigned)ns);
        ar_detail::dq_reduce_multi_kernel<float><<<rg, 256, 0, s>>>(gw, dq2_part_.ptr, nbk, ns, w, d_);
        LDM_LAUNCH_CHECK();
    }

    void to_act(T* out, const float* in, cudaStream_t s) {
        const int64_t n = (int64_t)N_ * d_;
        const unsigned b = (unsigned)std::min<int64_t>(std::max<int64_t>(ceil_div(n, 256), 1), 65535 * 16);
        ar_detail::to_act_kernel<T><<<b, 256, 0, s>>>(out, in, n);
        LDM_LAUNCH_CHECK();
    }
};

}  // namespace gpu
}  // namespace ldm
