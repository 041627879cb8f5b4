// cuda/attnres.cuh — the kernels of AttnRes, attention residuals over depth (spec §2.4), Full and
// Block, forward and backward; the scheme that drives them is GpuAttnRes in
// train_gpt_baselines.cu. CPU reference: cpu/scheme_attnres.* (same LDM_HD math:
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
// Block's deferred backward (block_scores_backward + block_flush): the block sources' gradients are
// applied once per block from per-sublayer scalars and a dx stash instead of once per sublayer.
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

// One pass over the sources (the production forward where d <= kThreads * kOnePassMaxVpt): the
// same x, xn, rstd as aggregate_kernel, but every source row is read once. Thread i holds the
// channels c = i + kThreads·v (v < VPT) of the running sum in registers. Sources go in groups of G
// (onepass_group): the group's rows and r values are loaded together, the block reduces the G
// dots q·u_k with one __syncthreads (double-buffered partials), then every thread forms the same
// scores s_k = r_k (q·u_k) and folds u_k into the sum source by source with an online softmax
// (running max m, sum l, rescale by exp(m_old − m_new)); x = acc / l. Grouping only moves loads and
// barriers: the arithmetic and its order are those of G = 1, so the results do not depend on G.
// Traffic per token: K·d·sizeof(T) source reads instead of the two passes' 2·K·d. Dynamic smem:
// onepass_smem floats. Grid N, kThreads threads.
constexpr int kOnePassMaxVpt = 32;  // d <= 8192
// Sources per barrier: G·VPT source values stay in registers, so G shrinks as VPT grows (doc/cuda.md
// "HC/mHC/AttnRes kernels": registers, resident blocks and bytes in flight per G).
template <int VPT>
__host__ __device__ constexpr int onepass_group() { return VPT <= 8 ? 4 : VPT <= 16 ? 2 : 1; }
template <int VPT>
__host__ __device__ constexpr size_t onepass_smem() { return 2 * onepass_group<VPT>() * (kThreads / 32) * sizeof(float); }
template <typename T, int VPT, int G = onepass_group<VPT>()>
__global__ void __launch_bounds__(kThreads)
aggregate_onepass_kernel(T* x, T* xn, float* rstd, const T* wn, float eps_n, Sources S, const float* w,
                         const float* g, int N, int d) {
    extern __shared__ float sm[];
    const int K = S.K(), nw = kThreads / 32, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t t = blockIdx.x;
    float q[VPT], acc[VPT];
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        q[v] = c < d ? w[c] * g[c] : 0.f;
        acc[v] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    int grp = 0;
    for (int k0 = 0; k0 < K; k0 += G, grp++) {
        float uv[G][VPT], p[G], rk[G];
#pragma unroll
        for (int i = 0; i < G; i++) {  // every load of the group first
            p[i] = 0.f;
            rk[i] = 0.f;
            if (k0 + i >= K) break;
            const T* u = src_row<T>(S, k0 + i, t, N, d);
            rk[i] = src_r(S, k0 + i, t, N);
#pragma unroll
            for (int v = 0; v < VPT; v++) {
                const int c = threadIdx.x + v * kThreads;
                uv[i][v] = c < d ? to_f(u[c]) : 0.f;
                p[i] += q[v] * uv[i][v];
            }
        }
        float* part = sm + (grp & 1) * (G * nw);  // double-buffered: the other half is still being read
#pragma unroll
        for (int i = 0; i < G; i++) {
            if (k0 + i >= K) break;  // K is the same for the whole block
            const float pi = warp_sum(p[i]);
            if (lane == 0) part[i * nw + wid] = pi;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < G; i++) {
            if (k0 + i >= K) break;
            float dot = 0.f;
            for (int j = 0; j < nw; j++) dot += part[i * nw + j];
            const float sk = dot * rk[i];
            const float m_new = fmaxf(m, sk);
            const float scale = ldm_exp(m - m_new), e = ldm_exp(sk - m_new);  // exp(-inf) = 0 at k = 0
            l = l * scale + e;
#pragma unroll
            for (int v = 0; v < VPT; v++) acc[v] = acc[v] * scale + e * uv[i][v];
            m = m_new;
        }
    }
    const float inv = 1.f / l;
    float ss = 0.f;
    T* xt = x + t * d;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c >= d) continue;
        const T xv = from_f<T>(acc[v] * inv);
        xt[c] = xv;
        acc[v] = to_f(xv);  // the rounded x, for the norm
        ss += acc[v] * acc[v];
    }
    if (xn == nullptr) return;
    ss = warp_sum(ss);
    float* part = sm + (grp & 1) * (G * nw);  // the half the last group did not use (grp = groups)
    if (lane == 0) part[wid] = ss;
    __syncthreads();
    float tot = 0.f;
    for (int i = 0; i < nw; i++) tot += part[i];
    const float sc = rms_scale(tot, d, eps_n);
    if (threadIdx.x == 0) rstd[t] = sc;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c < d) xn[t * d + c] = from_f<T>(to_f(wn[c]) * (acc[v] * sc));
    }
}

// Calls f(std::integral_constant<int, VPT>{}) with the register width of aggregate_onepass_kernel
// for d channels (VPT = values per thread), or returns false when d > kThreads * kOnePassMaxVpt.
template <typename F>
inline bool dispatch_vpt(int d, F&& f) {
    const int need = (d + kThreads - 1) / kThreads;
    if (need <= 1) f(std::integral_constant<int, 1>{});
    else if (need <= 2) f(std::integral_constant<int, 2>{});
    else if (need <= 4) f(std::integral_constant<int, 4>{});
    else if (need <= 8) f(std::integral_constant<int, 8>{});
    else if (need <= 12) f(std::integral_constant<int, 12>{});
    else if (need <= 16) f(std::integral_constant<int, 16>{});
    else if (need <= 24) f(std::integral_constant<int, 24>{});
    else if (need <= kOnePassMaxVpt) f(std::integral_constant<int, kOnePassMaxVpt>{});
    else return false;
    return true;
}

// One token t of the AttnRes backward, shared by aggregate_backward_kernel and
// block_scores_backward_kernel (whole block, ends with __syncthreads): recomputes the scores
// s_k = r_k (w⊙g)·u_k and α = softmax(s), and turns dL/dα_k = dx·u_k into dL/ds_k. Shared memory
// layout of those kernels: pq, pd [nwarps, K] partials, then sc, al, da [K] (s, α, dL/ds).
template <typename T>
__device__ inline void scores_backward_token(float* sm, int64_t t, const T* dxt, const Sources& S, const float* w,
                                             const float* g, int N, int d) {
    const int K = S.K(), nw = (blockDim.x + 31) >> 5, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float* pq = sm;
    float* pd = pq + nw * K;
    float* sc = pd + nw * K;
    float* al = sc + K;
    float* da = al + K;
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
}

// Backward of aggregate_kernel's x (not of the norm, which the backbone owns): for every token,
// dL/du_k += (or = when overwrite) α_k dx + attnres_score_grad(ds_k, r_k, s_k, q_c, u_c, d);
// dq_part[blockIdx.x, c] = this block's Σ_t Σ_k ds_k r_k u_k[c]. Grid kBackwardBlocks (or N if
// smaller), tokens strided by gridDim. Dynamic smem: (2·nwarps + 3)·K + d floats.
template <typename T>
__global__ void aggregate_backward_kernel(float* dq_part, const T* dx, Sources S, const float* w,
                                          const float* g, int N, int d, bool overwrite) {
    extern __shared__ float sm[];
    const int K = S.K(), nw = (blockDim.x + 31) >> 5;
    float* sc = sm + 2 * nw * K;   // [K] scores s_k (after the [nw, K] q·u and dx·u partials)
    float* al = sc + K;            // [K] α
    float* da = al + K;            // [K] dL/dα, then dL/ds
    float* dq = da + K;            // [d] this block's dq accumulator
    for (int c = threadIdx.x; c < d; c += blockDim.x) dq[c] = 0.f;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        const T* dxt = dx + t * d;
        scores_backward_token<T>(sm, t, dxt, S, w, g, N, d);
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

// ---- Block backward, deferred (block-source gradients applied once per block) ------------------------------
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

}  // namespace gpu
}  // namespace ldm
