// cuda/attnres.cuh — the kernels of AttnRes, attention residuals over depth (spec §2.4), Full and
// Block, forward and backward; the scheme that drives them is GpuAttnRes in
// train_gpt_baselines.cu. CPU reference: cpu/scheme_attnres.* (same LDM_HD math:
// attnres_softmax, attnres_softmax_backward, attnres_score_grad, rms_scale).
//
// Aggregation of sublayer j over sources u_1..u_K (per token): s_k = r_k (q · u_k) with
// q = w_j ⊙ g_j and r_k = 1/sqrt(mean(u_k²) + eps) computed ONCE when the source is written
// (cached fp32 [N] per source), α = softmax(s), agg = Σ_k α_k u_k.
// Kernels (one block per token unless said otherwise):
//   aggregate_onepass     Full, the readout, and Block where the two-phase path does not apply:
//                         one pass over the sources (online softmax, running sum in registers),
//                         fused with RMSNorm_j of the sublayer input (x, xn, rstd); the two-pass
//                         aggregate_kernel for d > 8192.
//   aggregate_backward    (the direct backward: Block's fallback, Full at d > 8192)
//                         persistent blocks over tokens: recomputes s and α from (u_k, r_k),
//                         softmax backward, then dL/du_k = α_k dx + ds_k (r_k q − s_k r_k² u_k/d)
//                         added straight into the source's fp32 gradient buffer (written, not
//                         added, by the readout's backward, the first consumer in backward order:
//                         no memset), and dL/dq reduced per block in shared memory, then over
//                         blocks in a fixed order (deterministic): no per-pair d-sized buffer.
//   full_scores_backward, full_flush   Full, the deferred backward (section below): per sublayer
//                         the pair scalars and a dx stash; each source's gradient summed when
//                         due and rounded once to T (two sources per pass where many consumers
//                         remain; full_flush_last adds the lower one's last term).
//   source_kernel         writes a new source (o_j, or p + o_j for Block) and its r in one pass.
//   block_inter, block_merge, block_p_backward, block_flush2: Block, two-phase (section below).
// Block: the partial sum p lives in place in the snapshot array pv (pv_j = p as sublayer j sees it,
// needed for backward anyway): output(j) writes p + o_j straight into pv_{j+1}, or into the block
// source b_n at the block end; no running copy. In backward dL/dp accumulates in place in
// dL/db_n's buffer (final once the block's last sublayer is reached).
// Parameters: w_j, g_j (and the readout's w_f, g_f, index D+1) are read from the fp32 master
// array; gradients fp32, accumulated (+=). Activations T (float or bf16), arithmetic fp32.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/config.h"
#include "cuda/common.cuh"
#include "cuda/cp_async.cuh"
#include "cuda/scheme.cuh"
#include "cpu/scheme_attnres.h"

namespace ldm {
namespace gpu {
namespace ar_detail {

constexpr int kThreads = 256;
// Upper bound of the persistent backward kernels' grids; each launch takes one wave of resident
// blocks (persistent_grid, cuda/common.cuh), a fixed reduction order per device.
constexpr int kBackwardBlocks = 1024;

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

// One token t of the AttnRes backward, shared by aggregate_backward_kernel and the workbench's
// block_scores_backward_kernel (dev/cuda/attnres_onephase.cuh) (whole block, ends with __syncthreads): recomputes the scores
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
// dq_part[blockIdx.x, c] = this block's Σ_t Σ_k ds_k r_k u_k[c]. Grid: any number of blocks (the
// trainer: one resident wave, at most kBackwardBlocks), tokens strided by gridDim. Dynamic smem: (2·nwarps + 3)·K + d floats.
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

// Block-wide sums of the first `live` of R per-thread values with ONE __syncthreads (kThreads
// threads): every thread returns with v[i] = the block's total (warp sums, then a fixed-order sum
// over the warps: deterministic). buf: R·(kThreads/32) floats of shared memory. Successive calls
// must alternate between two such buffers (the caller passes half `parity` of a double buffer):
// the barrier of call n+1 then separates call n's reads of a buffer from call n+2's writes.
// `live` must be the same in every thread.
template <int R>
__device__ inline void block_sum_db(float (&v)[R], float* buf, int live = R) {
    constexpr int nw = kThreads / 32;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (i >= live) break;
        const float s = warp_sum(v[i]);
        if (lane == 0) buf[i * nw + wid] = s;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (i >= live) break;
        float s = 0.f;
        for (int w = 0; w < nw; w++) s += buf[i * nw + w];
        v[i] = s;
    }
}

// ---- Full, deferred backward (doc/cuda.md "AttnRes-Full, deferred backward") ------------------------
// Full's sublayer j (1..D, the readout j = D+1) reads sources v_0..v_{j-1}, so the direct backward
// above read-modify-writes j fp32 gradient rows per sublayer and token (8 bytes per source value,
// two thirds of Full's backward traffic). Deferred: sublayer j's backward (full_scores_backward_
// kernel) keeps only what source k's gradient needs from it, the pair's scalars α_jk, dL/ds_jk, s_jk
// (fp32 planes [pairs, N], pair (j, k) at full_pair(j, k)) and a copy of dx_j (T, the stash row j-1
// of [D+1, N, d]); when v_k's gradient is due (output_backward(k), begin_backward for k = 0) one
// pass (full_flush_kernel) sums Σ_{j = D+1 .. k+1} α_jk dx_j + attnres_score_grad(ds_jk, r_k, s_jk,
// q_j, v_k, d), in that order, and writes it straight in T. The arithmetic and its order are the
// direct backward's (its first consumer writes, the later ones add), so the results are the same.
// Per token and source pair: one read of dx_j in T instead of an fp32 read and write of v_k's row.
// Where many consumers remain, one pass sums two sources (k, and k−1 but for its consumer j = k) per
// read of the dx_j rows (full_flush_kernel, NS = 2; full_flush_last_kernel adds k−1's last term).

// Index of the pair (sublayer j, source k), k < j <= D+1, in the planes [pairs, N].
__host__ __device__ inline int64_t full_pair(int j, int k) { return (int64_t)j * (j - 1) / 2 + k; }

// Sources per barrier in full_scores_backward_kernel: G·VPT <= 16 source values in registers (at 32,
// G = 8 at VPT = 4, ptxas capped the kernel at 128 registers and spilled).
template <int VPT>
__host__ __device__ constexpr int full_group() { return VPT >= 16 ? 1 : (16 / VPT > 8 ? 8 : 16 / VPT); }
// Dynamic shared memory of full_scores_backward_kernel<T, VPT, G, STAGE> for K sources: the
// double-buffered block sums (2·2G·nwarps floats), s, dL/ds, α, r [K] each, and with STAGE the
// token's K source rows in T (16-byte aligned).
template <typename T>
__host__ __device__ inline size_t full_scores_smem(int G, bool stage, int K, int d) {
    const size_t f = ((size_t)4 * G * (kThreads / 32) + 4 * (size_t)K) * sizeof(float);
    return stage ? (f + 15) / 16 * 16 + (size_t)K * d * sizeof(T) : f;
}

// Sublayer j's backward on the deferred path, persistent blocks (the trainer: one resident wave,
// at most kBackwardBlocks; tokens strided by gridDim). Per token t: pass 1 reads the K = j sources
// u_k (U [K, N, d], r: R [K, N]) in groups of G, the group's 2G dots q·u_k and dx·u_k reduced with
// one barrier (block_sum_db); s_k = r_k q·u_k; then thread 0 forms α = softmax(s) and dL/ds
// (attnres_softmax, attnres_softmax_backward); pa/pds/psc[(pair0 + k)·N + t] = α_k, dL/ds_k, s_k;
// stash[t·d ..] = dx[t] (T); pass 2 adds ds_k r_k u_k into this thread's dL/dq channels
// (registers). STAGE: the token's K rows and r values are first copied into shared memory as one
// batch of asynchronous copies (cp.async; the rows 16 bytes each where d·sizeof(T) and U are
// 16-byte aligned, else plain loads), all of them in flight at once, and both passes read there; else both passes
// read global memory, pass 1 loading each group's rows and r together. dq_part[blockIdx.x, c] =
// the block's Σ_t Σ_k ds_k r_k u_k[c] (reduced over blocks by dq_reduce_kernel). q = w ⊙ g (fp32
// [d]). kThreads threads, channel c = threadIdx.x + v·kThreads (d <= kThreads·VPT); dynamic smem
// full_scores_smem. The sums and their order do not depend on STAGE (explicit fmaf: the
// contractions nvcc makes anyway, and the same ones on the host under dev/emu).
template <typename T, int VPT, int G, bool STAGE>
__global__ void __launch_bounds__(kThreads)
full_scores_backward_kernel(float* dq_part, float* pa, float* pds, float* psc, T* stash, const T* dx, const T* U,
                            const float* R, int K, const float* w, const float* g, int64_t pair0, int N, int d) {
    extern __shared__ __align__(16) float sm[];  // 16-byte cp.async destinations in stage
    constexpr int nw = kThreads / 32, HALF = 2 * G * nw;
    float* sc = sm + 2 * HALF;  // [K] s_k
    float* da = sc + K;         // [K] dx·u_k, then dL/ds_k
    float* al = da + K;         // [K] α_k
    float* rr = al + K;         // [K] r_k
    T* stage = (T*)(sm + (2 * HALF + 4 * K + 3) / 4 * 4);  // [K, d] (STAGE)
    float q[VPT], dq[VPT];
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        q[v] = c < d ? w[c] * g[c] : 0.f;
        dq[v] = 0.f;
    }
    // STAGE: 16-byte copies where every row starts 16-byte aligned (cpr chunks per row)
    const bool vec16 = STAGE && (d * sizeof(T)) % 16 == 0 && (reinterpret_cast<uintptr_t>(U) & 15) == 0;
    const int cpr = (int)(d * sizeof(T) / 16);
    int parity = 0;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        if (STAGE) {
            __syncthreads();  // every thread is done with the previous token's staged rows and r
            if (vec16) {
                for (int i = threadIdx.x; i < K * cpr; i += kThreads) {
                    const int k = i / cpr;
                    const char* src = reinterpret_cast<const char*>(U + ((int64_t)k * N + t) * d);
                    cp_async_16(reinterpret_cast<char*>(stage) + (size_t)i * 16, src + (size_t)(i - k * cpr) * 16,
                                true);
                }
            } else {
                for (int64_t i = threadIdx.x; i < (int64_t)K * d; i += kThreads) {
                    const int64_t k = i / d;
                    stage[i] = U[(k * N + t) * d + (i - k * d)];
                }
            }
            for (int k = threadIdx.x; k < K; k += kThreads) cp_async_4(rr + k, R + (int64_t)k * N + t, true);
            cp_async_commit();
        }
        float xd[VPT];
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            xd[v] = 0.f;
            if (c < d) {
                const T xv = dx[t * d + c];
                stash[t * d + c] = xv;
                xd[v] = to_f(xv);
            }
        }
        if (STAGE) {
            cp_async_wait<0>();
            __syncthreads();  // the token's rows and r values are in shared memory
        }
        for (int k0 = 0; k0 < K; k0 += G) {  // pass 1: scores and dots
            const int gk = K - k0 < G ? K - k0 : G;
            float dot[2 * G], rk[G];  // (rk: without STAGE; with it, thread 0 reads rr)
            if constexpr (STAGE) {  // the rows are in shared memory: each value read at its use
#pragma unroll
                for (int i = 0; i < G; i++) {
                    dot[2 * i] = dot[2 * i + 1] = 0.f;
                    if (i >= gk) break;
                    const T* u = stage + (int64_t)(k0 + i) * d;
#pragma unroll
                    for (int v = 0; v < VPT; v++) {
                        const int c = threadIdx.x + v * kThreads;
                        const float uf = c < d ? to_f(u[c]) : 0.f;
                        dot[2 * i] = fmaf(q[v], uf, dot[2 * i]);
                        dot[2 * i + 1] = fmaf(xd[v], uf, dot[2 * i + 1]);
                    }
                }
            } else {
                float uv[G][VPT];
#pragma unroll
                for (int i = 0; i < G; i++) {  // every load of the group first
                    dot[2 * i] = dot[2 * i + 1] = 0.f;
                    rk[i] = 0.f;
                    if (i >= gk) break;
                    const T* u = U + ((int64_t)(k0 + i) * N + t) * d;
                    rk[i] = R[(int64_t)(k0 + i) * N + t];
#pragma unroll
                    for (int v = 0; v < VPT; v++) {
                        const int c = threadIdx.x + v * kThreads;
                        const T ut = c < d ? u[c] : from_f<T>(0.f);
                        uv[i][v] = to_f(ut);
                    }
                }
#pragma unroll
                for (int i = 0; i < G; i++) {
                    if (i >= gk) break;
#pragma unroll
                    for (int v = 0; v < VPT; v++) {
                        dot[2 * i] = fmaf(q[v], uv[i][v], dot[2 * i]);
                        dot[2 * i + 1] = fmaf(xd[v], uv[i][v], dot[2 * i + 1]);
                    }
                }
            }
            block_sum_db<2 * G>(dot, sm + parity * HALF, 2 * gk);
            parity ^= 1;
            if (threadIdx.x == 0) {
#pragma unroll
                for (int i = 0; i < G; i++) {
                    if (i >= gk) break;
                    if (!STAGE) rr[k0 + i] = rk[i];  // (STAGE: the copies put it there)
                    sc[k0 + i] = dot[2 * i] * rr[k0 + i];
                    al[k0 + i] = sc[k0 + i];
                    da[k0 + i] = dot[2 * i + 1];
                }
            }
        }
        if (threadIdx.x == 0) {  // thread 0 wrote every s_k and dot itself
            attnres_softmax(al, K);
            attnres_softmax_backward(da, al, K);
        }
        __syncthreads();
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            const int64_t o = (pair0 + k) * N + t;
            pa[o] = al[k];
            pds[o] = da[k];
            psc[o] = sc[k];
        }
        for (int k0 = 0; k0 < K; k0 += G) {  // pass 2: dL/dq
            const int gk = K - k0 < G ? K - k0 : G;
            float uv[G][VPT];
#pragma unroll
            for (int i = 0; i < G; i++) {
                if (i >= gk) break;
                const T* u = STAGE ? stage + (int64_t)(k0 + i) * d : U + ((int64_t)(k0 + i) * N + t) * d;
#pragma unroll
                for (int v = 0; v < VPT; v++) {
                    const int c = threadIdx.x + v * kThreads;
                    uv[i][v] = c < d ? to_f(u[c]) : 0.f;
                }
            }
#pragma unroll
            for (int i = 0; i < G; i++) {
                if (i >= gk) break;
                const float f = da[k0 + i] * rr[k0 + i];
#pragma unroll
                for (int v = 0; v < VPT; v++) dq[v] = fmaf(f, uv[i][v], dq[v]);
            }
        }
        // No barrier here for s, dL/ds, α, r: the next token's thread 0 rewrites them only after
        // its first block_sum_db barrier, which every thread reaches after its reads above (the
        // staged rows and r: the barrier at the top of the loop).
    }
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c < d) dq_part[(int64_t)blockIdx.x * d + c] = dq[v];
    }
}

// Tokens per thread block of full_flush_kernel with NS sources: TT·VPT·NS <= 32 values of the
// gradient sums (and as many of the sources; TT·VPT of dx_j) per thread; a block of TT tokens reads
// each q_j = w_j ⊙ g_j once for all. 0: NS = 2 does not apply (VPT > 16, d > 4096).
template <int VPT, int NS = 1>
__host__ __device__ constexpr int flush_tokens() { return (VPT >= 32 ? 1 : (32 / VPT > 8 ? 8 : 32 / VPT)) / NS; }

// One slot of full_flush_kernel's ring: TT stash rows in T, then the 3·NS·TT pair scalars (α,
// dL/ds, s; fp32), each part rounded up to 16 bytes.
template <typename T>
__host__ __device__ inline size_t flush_slot_bytes(int TT, int NS, int d) {
    return ((size_t)TT * d * sizeof(T) + 15) / 16 * 16 + ((size_t)3 * NS * TT * sizeof(float) + 15) / 16 * 16;
}
constexpr int kFlushStages = 4;  // ring slots of full_flush_kernel: 3 consumers in flight

// The deferred Full backward's pairing rule (GpuAttnRes::full_flush): source k's flush also sums
// source k − 1 where k >= 1 and k still has J − k >= pair_min consumers (J = D + 1, the readout).
// One predicate for the trainer's schedule, its allocation test and the workbench's byte count.
__host__ __device__ constexpr bool full_flush_pairs(int k, int J, int pair_min) { return k >= 1 && J - k >= pair_min; }

// dL/dv_k of every token, written as T: out[t] = Σ_{j = J .. k+1} (α_jk dx_j[t] +
// attnres_score_grad(ds_jk, r_k, s_jk, w_j ⊙ g_j, v_k[t], d)) (fp32 sum in that order, rounded
// once). NS = 2 also sums source k−1 (u1, r1) over the same j = J .. k+1 and writes that partial sum
// to part (fp32 [N, d]); full_flush_last_kernel adds its last term (j = k) at output_backward(k−1):
// each dx_j row is read once for both sources, and the sums, their terms and their order are those
// of one launch per source. u, r: source k [N, d] (T) and its r [N]; stash: dx_j at row j-1 of
// [J, N, d]; pa/pds/psc: full_scores_backward_kernel's planes; wg: the fp32 master, (w_j, g_j) at
// (j-1)·2d; J = D+1 (the readout). Grid ceil(N / TT), kThreads threads, channel c = threadIdx.x +
// v·kThreads (d <= kThreads·VPT). S = 0: no shared memory; every load of a consumer (TT rows and
// the pair scalars) is issued before its sums. S >= 2 (the trainer: kFlushStages where the ring
// fits the opt-in limit): a ring of S slots in shared memory (dynamic smem S·flush_slot_bytes)
// holds consumers' TT stash rows and scalars, copied with cp.async (16-byte copies where d·sizeof(T)
// and stash are 16-byte aligned, else plain loads for the rows) S − 1 consumers ahead, so S − 1
// consumers' rows are in flight while one is summed; one barrier per consumer. The sums and their
// order do not depend on S. Launch bounds (blocks per SM): S = 0 leaves it to ptxas (0: as
// without a minimum; it keeps two blocks at VPT <= 8); with the ring the pair kernels at VPT <= 8
// are held to two (128 registers) and the others may take up to 255 registers (1; ptxas's own
// choice spilled at VPT 12). No spills in any instantiation (doc/ptxas.md).
template <typename T, int VPT, int NS = 1, int TT = flush_tokens<VPT, NS>(), int S = 0>
__global__ void __launch_bounds__(kThreads, S == 0 ? 0 : NS == 2 && VPT <= 8 ? 2 : 1)
full_flush_kernel(T* out, float* part, const T* u, const float* r, const T* u1, const float* r1, const T* stash,
                  const float* pa, const float* pds, const float* psc, const float* wg, int k, int J, int N, int d) {
    static_assert((NS == 1 || NS == 2) && TT >= 1, "full_flush_kernel: one or two sources, TT >= 1");
    const int64_t t0 = (int64_t)blockIdx.x * TT;
    const int nt = N - t0 < TT ? (int)(N - t0) : TT;  // the same in the whole block
    float acc[NS][TT][VPT], uk[NS][TT][VPT], rk[NS][TT];
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const T* us = s == 0 ? u : u1;
        const float* rs = s == 0 ? r : r1;
#pragma unroll
        for (int i = 0; i < TT; i++) {
            rk[s][i] = i < nt ? rs[t0 + i] : 0.f;
#pragma unroll
            for (int v = 0; v < VPT; v++) {
                const int c = threadIdx.x + v * kThreads;
                uk[s][i][v] = i < nt && c < d ? to_f(us[(t0 + i) * d + c]) : 0.f;
                acc[s][i][v] = 0.f;
            }
        }
    }
    // S > 0: the ring (slot e: rows at ring + e·slot, scalars [3][NS][TT] after them)
    extern __shared__ __align__(16) unsigned char ring[];
    const int rows_bytes = (int)(((size_t)TT * d * sizeof(T) + 15) / 16 * 16);
    const int slot = (int)flush_slot_bytes<T>(TT, NS, d);
    const bool vec16 = S > 0 && (d * sizeof(T)) % 16 == 0 && (reinterpret_cast<uintptr_t>(stash) & 15) == 0;
    // copies of consumer j's nt rows and scalars into slot e (S > 0)
    auto issue = [&](int j, int e) {
        const T* src = stash + ((int64_t)(j - 1) * N + t0) * d;
        unsigned char* dst = ring + e * slot;
        if (vec16) {
            const int chunks = (int)((size_t)nt * d * sizeof(T) / 16);
            for (int i = threadIdx.x; i < chunks; i += kThreads)
                cp_async_16(dst + i * 16, reinterpret_cast<const unsigned char*>(src) + (size_t)i * 16, true);
        } else {
            for (int i = threadIdx.x; i < nt * d; i += kThreads) reinterpret_cast<T*>(dst)[i] = src[i];
        }
        const int64_t o = full_pair(j, k) * N + t0;
        float* sl = reinterpret_cast<float*>(dst + rows_bytes);
        for (int e2 = threadIdx.x; e2 < 3 * NS * TT; e2 += kThreads) {  // e2 = (plane·NS + s)·TT + i
            const int i = e2 % TT, sj = (e2 / TT) % NS, pl = e2 / (NS * TT);
            const float* plane = pl == 0 ? pa : pl == 1 ? pds : psc;
            cp_async_4(sl + e2, plane + o - sj * N + (i < nt ? i : 0), i < nt);
        }
    };
    if constexpr (S > 0) {
        for (int e = 0; e < S - 1; e++) {  // consumers J .. J − S + 2
            if (J - e > k) issue(J - e, e);
            cp_async_commit();
        }
    }
    for (int j = J; j > k; j--) {
        const float* w = wg + (int64_t)(j - 1) * 2 * d;
        const float* g = w + d;
        float q[VPT];
        if constexpr (S == 0) {
            const T* sx = stash + ((int64_t)(j - 1) * N + t0) * d;
            const int64_t o = full_pair(j, k) * N + t0;  // pair (j, k − 1) is the plane row before
            float x[TT][VPT], a[NS][TT], ds[NS][TT], sk[NS][TT];
#pragma unroll
            for (int i = 0; i < TT; i++) {  // every load of this sublayer first
                if (i >= nt) break;
#pragma unroll
                for (int s = 0; s < NS; s++) {
                    a[s][i] = pa[o - s * N + i];
                    ds[s][i] = pds[o - s * N + i];
                    sk[s][i] = psc[o - s * N + i];
                }
#pragma unroll
                for (int v = 0; v < VPT; v++) {
                    const int c = threadIdx.x + v * kThreads;
                    x[i][v] = c < d ? to_f(sx[(int64_t)i * d + c]) : 0.f;
                }
            }
#pragma unroll
            for (int v = 0; v < VPT; v++) {
                const int c = threadIdx.x + v * kThreads;
                q[v] = c < d ? w[c] * g[c] : 0.f;
            }
#pragma unroll
            for (int i = 0; i < TT; i++) {
                if (i >= nt) break;
#pragma unroll
                for (int s = 0; s < NS; s++) {
#pragma unroll
                    for (int v = 0; v < VPT; v++) {
                        const float val =
                            a[s][i] * x[i][v] + attnres_score_grad(ds[s][i], rk[s][i], sk[s][i], q[v], uk[s][i][v], d);
                        acc[s][i][v] = j == J ? val : acc[s][i][v] + val;  // the first term written, then adds
                    }
                }
            }
        } else {
            const int n = J - j;  // this consumer's slot n % S; the ring holds n .. n + S − 2
#pragma unroll
            for (int v = 0; v < VPT; v++) {  // (L2) issued before the wait
                const int c = threadIdx.x + v * kThreads;
                q[v] = c < d ? w[c] * g[c] : 0.f;
            }
            cp_async_wait<S - 2>();  // this thread's copies of consumer n landed
            __syncthreads();         // everyone's; and every thread is done with consumer n − 1's slot
            if (j - (S - 1) > k) issue(j - (S - 1), (n + S - 1) % S);  // into n − 1's slot
            cp_async_commit();
            const unsigned char* cur = ring + (n % S) * slot;
            const T* xs = reinterpret_cast<const T*>(cur);
            const float* sl = reinterpret_cast<const float*>(cur + rows_bytes);
            // the S = 0 branch's sums, each row value and scalar read from the slot at its use
#pragma unroll
            for (int i = 0; i < TT; i++) {
                if (i >= nt) break;
#pragma unroll
                for (int s = 0; s < NS; s++) {
                    const float as = sl[(0 * NS + s) * TT + i], dss = sl[(1 * NS + s) * TT + i],
                                sks = sl[(2 * NS + s) * TT + i];
#pragma unroll
                    for (int v = 0; v < VPT; v++) {
                        const int c = threadIdx.x + v * kThreads;
                        const float xv = c < d ? to_f(xs[(int64_t)i * d + c]) : 0.f;
                        const float val = as * xv + attnres_score_grad(dss, rk[s][i], sks, q[v], uk[s][i][v], d);
                        acc[s][i][v] = j == J ? val : acc[s][i][v] + val;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < TT; i++) {
        if (i >= nt) break;
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            if (c >= d) continue;
            out[(t0 + i) * d + c] = from_f<T>(acc[0][i][v]);
            if (NS == 2) part[(t0 + i) * d + c] = acc[NS - 1][i][v];
        }
    }
}

// The last term of a paired source k's gradient (full_flush_kernel<T, VPT, 2> at k+1 summed j = J
// .. k+2 into part): out[t] = T(part[t] + α dx_{k+1}[t] + attnres_score_grad(ds, r_k, s, w_{k+1} ⊙
// g_{k+1}, v_k[t], d)), the same expression and order as full_flush_kernel's. pa/pds/psc: the
// plane rows of pair (k+1, k) [N]; dx: the stash row of sublayer k+1 [N, d] (T); w, g: w_{k+1},
// g_{k+1} (fp32 [d]). One thread per element (grid ceil(N·d / kThreads)).
template <typename T>
__global__ void __launch_bounds__(kThreads)
full_flush_last_kernel(T* out, const float* part, const T* u, const float* r, const T* dx, const float* pa,
                       const float* pds, const float* psc, const float* w, const float* g, int N, int d) {
    const int64_t e = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (e >= (int64_t)N * d) return;
    const int64_t t = e / d;
    const int c = (int)(e - t * d);
    const float val = pa[t] * to_f(dx[e]) + attnres_score_grad(pds[t], r[t], psc[t], w[c] * g[c], to_f(u[e]), d);
    out[e] = from_f<T>(part[e] + val);
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
        if (p || dst != o) dst[t * d + c] = tv;  // (o written in place: nothing to copy)
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

// ---- Block, two-phase (doc/cuda.md "AttnRes-Block, two-phase") -----------------------------------------
// Every sublayer of block n attends to the same block sources b_0..b_{n-1} with its own pseudo-query
// q_i = w_i ⊙ g_i (a parameter, not a function of the token), so one pass over those sources serves
// the whole block:
//   forward, at the block's first sublayer: block_inter_kernel reads b_0..b_{n-1} once and, for each
//     of the block's ns sublayers i, keeps an online softmax over them; position 1 (no partial sum
//     yet) gets its x, xn, rstd straight away, positions i >= 2 get the inter-block aggregate
//     a_i = Σ_k α_ik u_k / Σ_k α_ik (T) and their log-sum-exp lse_i; at each sublayer i >= 2
//     block_merge_kernel merges a_i with the partial-sum source p (one row): p's weight
//     α_p = attnres_merge_weight(s_p, lse_i), β = attnres_merge_weight(lse_i, s_p) (= 1 − α_p),
//     x = β a_i + α_p p, and x's RMSNorm.
//   backward: at each sublayer i >= 2 block_p_backward_kernel reads dx, a_i and p (not the block
//     sources): ds_p = α_p β (dx·p − dx·a_i) with β = 1 − α_p the block sources' share (both
//     from attnres_merge_weight, so each keeps its relative accuracy when small), p's gradient now
//     (dL/dp must be complete before output_backward(j-1)), and β, e = α_p dx·p kept for the
//     flush; dx_i overwrites a_i's row. At the block's first sublayer
//     block_flush2_kernel reads every block source, recomputes the scores s_ik and the dots
//     dx_i·u_k for all of the block's sublayers, the weights α_ik = β_i softmax_k(s_ik) (so that
//     α_p + Σ_k α_ik = 1 up to rounding, as in the one-pass softmax), the softmax backward's mean
//     c_i = e_i + Σ_k α_ik dx_i·u_k, ds_ik = α_ik (dx_i·u_k − c_i), and adds
//     Σ_i (α_ik dx_i + ds_ik (r_k q_i − s_ik r_k² u_k/d)) into dL/du_k once per block.
// Per block each block source is read once in the forward and once in the backward (+ one fp32
// read-modify-write of its gradient); the per-sublayer path reads it ns times in the forward and
// ns + 1 times in the backward. The cost:
// a_i [N, d] (T) is kept from the forward to the backward for every sublayer at position >= 2.

// Sublayers handled together by block_inter_kernel (block_chunk) and block_flush2_kernel
// (flush_chunk): each thread holds NC·VPT fp32 values of the pseudo-queries q_i and as many of the
// running sums (forward) or of dx_i (flush), at most 32 each in the forward and 64 in the flush.
// More sublayers per block than NC: the forward runs ceil(ns/NC) thread blocks per token
// (adjacent, so the repeated source reads mostly hit L2); the flush repeats its passes over the
// sources per chunk of NC, which repeats the fp32 read-modify-write of their gradients, hence its
// larger budget (one pass for blocks of up to 8 sublayers at d <= 2048: llama-400m, the qwen
// presets at N_b = 8).
template <int VPT>
__host__ __device__ constexpr int block_chunk() { return VPT >= 32 ? 1 : (32 / VPT > 8 ? 8 : 32 / VPT); }
template <int VPT>
__host__ __device__ constexpr int flush_chunk() { return 64 / VPT > 8 ? 8 : 64 / VPT; }
// Block sources loaded per barrier in block_inter_kernel (rows in flight vs registers). At VPT 2
// and 4 the kernel holds one thread block per SM whatever G is, so G = 8, 4 double the bytes in
// flight per SM; VPT 1 and 8 keep two blocks per SM with G = 4, 2 (register counts: doc/ptxas.md,
// doc/cuda.md "AttnRes-Block, two-phase").
template <int VPT>
__host__ __device__ constexpr int inter_group() { return VPT == 2 ? 8 : VPT <= 4 ? 4 : VPT <= 8 ? 2 : 1; }
template <int VPT>
__host__ __device__ constexpr size_t inter_smem() {
    return 2 * (size_t)inter_group<VPT>() * block_chunk<VPT>() * (kThreads / 32) * sizeof(float);
}

// Phase 1 of block n's forward. Sources: the K0 block sources U [K0, N, d] (T) with r: R [K0, N];
// the block's ns sublayers have their (w, g) at wg + i·2d (fp32 master, i = 0 .. ns-1). Position i
// (0-based) gets
//   i = 0: x[t] = Σ_k α_0k u_k (T) and, when xn != nullptr, rstd[t] and xn = wn ⊙ (x · rstd) of the
//          rounded x (RMSNorm with eps_n);
//   i >= 1: a[((i−1)·N + t)·d ..] = a_i = Σ_k α_ik u_k / Σ_k α_ik (T) and
//          lsei[(i−1)·N + t] = log Σ_k exp(s_ik), for block_merge_kernel and the backward.
// Grid N·ceil(ns/NC): thread block b handles token b / nchunk, sublayers NC·(b % nchunk) ...;
// kThreads threads, channel c = threadIdx.x + v·kThreads (v < VPT, d <= kThreads·VPT); dynamic
// smem inter_smem<VPT>(). Each group of G sources: its rows and r values loaded together, its G·nc
// dots reduced with one barrier, then folded source by source into the online softmaxes.
template <typename T, int VPT, int NC = block_chunk<VPT>(), int G = inter_group<VPT>()>
__global__ void __launch_bounds__(kThreads)
block_inter_kernel(T* x, T* xn, float* rstd, const T* wn, float eps_n, T* a, float* lsei, const T* U,
                   const float* R, int K0, const float* wg, int ns, int N, int d) {
    extern __shared__ float sm[];
    constexpr int HALF = G * NC * (kThreads / 32);
    const int nchunk = (ns + NC - 1) / NC;
    const int64_t t = blockIdx.x / nchunk;
    const int i0 = (int)(blockIdx.x % nchunk) * NC, nc = min(NC, ns - i0);
    float q[NC][VPT], acc[NC][VPT], m[NC], l[NC];
#pragma unroll
    for (int i = 0; i < NC; i++) {
        const float* ws = wg + (int64_t)(i0 + (i < nc ? i : 0)) * 2 * d;
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            q[i][v] = (i < nc && c < d) ? ws[c] * ws[d + c] : 0.f;
            acc[i][v] = 0.f;
        }
        m[i] = -INFINITY;
        l[i] = 0.f;
    }
    int parity = 0;
    for (int k0 = 0; k0 < K0; k0 += G, parity ^= 1) {
        const int gk = min(G, K0 - k0);
        float uv[G][VPT], rk[G], dot[G * NC];
#pragma unroll
        for (int gi = 0; gi < G; gi++) {  // every load of the group first
            rk[gi] = 0.f;
#pragma unroll
            for (int v = 0; v < VPT; v++) uv[gi][v] = 0.f;
            if (gi >= gk) continue;
            const T* u = U + ((int64_t)(k0 + gi) * N + t) * d;
            rk[gi] = R[(int64_t)(k0 + gi) * N + t];
#pragma unroll
            for (int v = 0; v < VPT; v++) {
                const int c = threadIdx.x + v * kThreads;
                if (c < d) uv[gi][v] = to_f(u[c]);
            }
        }
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int i = 0; i < NC; i++) {
                float p = 0.f;
#pragma unroll
                for (int v = 0; v < VPT; v++) p += q[i][v] * uv[gi][v];
                dot[gi * NC + i] = p;
            }
        block_sum_db<G * NC>(dot, sm + parity * HALF, gk * NC);
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            if (gi >= gk) break;
#pragma unroll
            for (int i = 0; i < NC; i++) {
                if (i >= nc) break;
                const float s = dot[gi * NC + i] * rk[gi];
                const float m_new = fmaxf(m[i], s);
                const float scale = ldm_exp(m[i] - m_new), e = ldm_exp(s - m_new);  // exp(-inf) = 0 at k = 0
                l[i] = l[i] * scale + e;
#pragma unroll
                for (int v = 0; v < VPT; v++) acc[i][v] = acc[i][v] * scale + e * uv[gi][v];
                m[i] = m_new;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NC; i++) {
        if (i >= nc) break;
        const int ip = i0 + i;
        if (ip == 0) continue;
        if (threadIdx.x == 0) lsei[(int64_t)(ip - 1) * N + t] = m[i] + ldm_log(l[i]);
        const float inv = 1.f / l[i];
        T* at = a + ((int64_t)(ip - 1) * N + t) * d;
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            if (c < d) at[c] = from_f<T>(acc[i][v] * inv);
        }
    }
    if (i0 != 0) return;  // uniform per thread block
    const float inv = 1.f / l[0];
    float ss[1] = {0.f};
    T* xt = x + t * d;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c >= d) continue;
        const T xv = from_f<T>(acc[0][v] * inv);
        xt[c] = xv;
        acc[0][v] = to_f(xv);  // the rounded x, for the norm
        ss[0] += acc[0][v] * acc[0][v];
    }
    if (xn == nullptr) return;
    block_sum_db<1>(ss, sm + parity * HALF);
    const float sc = rms_scale(ss[0], d, eps_n);
    if (threadIdx.x == 0) rstd[t] = sc;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c < d) xn[t * d + c] = from_f<T>(to_f(wn[c]) * (acc[0][v] * sc));
    }
}

// Phase 2 of the forward of a Block sublayer at position >= 2: merges its inter-block aggregate
// a [N, d] (T) and log-sum-exp lsei [N] (block_inter_kernel) with the partial-sum source p [N, d]
// (r: rp [N]) under the pseudo-query q = w ⊙ g: s_p = r_p (q·p), α_p = attnres_merge_weight(s_p,
// lsei), β = attnres_merge_weight(lsei, s_p), x = β a + α_p p (T), rstd and xn = wn ⊙ (x · rstd)
// as in block_inter_kernel.
// Grid N, kThreads threads, VPT values per thread; dynamic smem 2·(kThreads/32) floats.
template <typename T, int VPT>
__global__ void __launch_bounds__(kThreads)
block_merge_kernel(T* x, T* xn, float* rstd, const T* wn, float eps_n, const float* lsei, const T* a, const T* p,
                   const float* rp, const float* w, const float* g, int N, int d) {
    extern __shared__ float sm[];
    constexpr int nw = kThreads / 32;
    const int64_t t = blockIdx.x;
    float av[VPT], pv[VPT], dot[1] = {0.f};
#pragma unroll
    for (int v = 0; v < VPT; v++) {  // loads first
        const int c = threadIdx.x + v * kThreads;
        av[v] = c < d ? to_f(a[t * d + c]) : 0.f;
        pv[v] = c < d ? to_f(p[t * d + c]) : 0.f;
    }
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c < d) dot[0] += (w[c] * g[c]) * pv[v];
    }
    block_sum_db<1>(dot, sm);
    const float s = dot[0] * rp[t], alpha = attnres_merge_weight(s, lsei[t]), beta = attnres_merge_weight(lsei[t], s);
    float ss[1] = {0.f};
    T* xt = x + t * d;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c >= d) continue;
        const T xv = from_f<T>(beta * av[v] + alpha * pv[v]);
        xt[c] = xv;
        av[v] = to_f(xv);
        ss[0] += av[v] * av[v];
    }
    if (xn == nullptr) return;
    block_sum_db<1>(ss, sm + nw);
    const float sc = rms_scale(ss[0], d, eps_n);
    if (threadIdx.x == 0) rstd[t] = sc;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c < d) xn[t * d + c] = from_f<T>(to_f(wn[c]) * (av[v] * sc));
    }
}

// Per-sublayer part of the two-phase Block backward at position >= 2 (block_flush2_kernel does
// the rest): dx = dL/dx [N, d]; a_stash [N, d] holds the sublayer's inter-block aggregate a on
// entry and dx on return; p the partial-sum source [N, d] with r rp [N] and gradient dp [N, d]
// (fp32, +=); lsei [N] the block sources' log-sum-exp. Per token: s_p = r_p (q·p),
// α_p = attnres_merge_weight(s_p, lsei) and β = attnres_merge_weight(lsei, s_p) (as in the
// forward), ds_p = α_p β (dx·p − dx·a) (= α_p (dx·p − Σ_k α_k dx·u_k) with a in place of the
// block sources), dp += α_p dx + attnres_score_grad(ds_p, ...), bp[t] = β and e[t] = α_p dx·p
// (for the flush), and dq_part [gridDim, d] = this thread block's Σ_t ds_p r_p p. Grid: persistent blocks
// (the trainer: one resident wave, at most kBackwardBlocks), tokens strided; kThreads threads, VPT values per thread; dynamic smem
// 2·3·(kThreads/32) floats.
template <typename T, int VPT>
__global__ void __launch_bounds__(kThreads)
block_p_backward_kernel(float* dq_part, float* bp, float* e, T* a_stash, const T* dx, const T* p, const float* rp,
                        float* dp, const float* lsei, const float* w, const float* g, int N, int d) {
    extern __shared__ float sm[];
    constexpr int HALF = 3 * (kThreads / 32);
    float q[VPT], dq[VPT];
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        q[v] = c < d ? w[c] * g[c] : 0.f;
        dq[v] = 0.f;
    }
    int parity = 0;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x, parity ^= 1) {
        float dxv[VPT], av[VPT], pv[VPT], dots[3] = {0.f, 0.f, 0.f};  // dx·p, dx·a, q·p
#pragma unroll
        for (int v = 0; v < VPT; v++) {  // loads first
            const int c = threadIdx.x + v * kThreads;
            dxv[v] = c < d ? to_f(dx[t * d + c]) : 0.f;
            av[v] = c < d ? to_f(a_stash[t * d + c]) : 0.f;
            pv[v] = c < d ? to_f(p[t * d + c]) : 0.f;
        }
        const float r = rp[t], Li = lsei[t];
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            if (c >= d) continue;
            dots[0] += dxv[v] * pv[v];
            dots[1] += dxv[v] * av[v];
            dots[2] += q[v] * pv[v];
            a_stash[t * d + c] = from_f<T>(dxv[v]);  // exact (dxv holds a T value); this thread read a[c] above
        }
        block_sum_db<3>(dots, sm + parity * HALF);
        const float s = r * dots[2], al = attnres_merge_weight(s, Li), be = attnres_merge_weight(Li, s);
        const float ds = al * be * (dots[0] - dots[1]);
        if (threadIdx.x == 0) {
            bp[t] = be;
            e[t] = al * dots[0];
        }
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            if (c >= d) continue;
            dp[t * d + c] += al * dxv[v] + attnres_score_grad(ds, r, s, q[v], pv[v], d);
            dq[v] += ds * r * pv[v];
        }
    }
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c < d) dq_part[(int64_t)blockIdx.x * d + c] = dq[v];
    }
}

// The two-phase Block backward's once-per-block pass, at the block's first sublayer (after every
// other sublayer of the block ran block_p_backward_kernel). Block sources u_k: U [K0, N, d] (T),
// r: R [K0, N], gradients dU [K0, N, d] (fp32, +=). The block's ns sublayers, position i
// (0-based): (w, g) at wg + i·2d; dx_i from dx1 [N, d] for i = 0 (the caller's dx) and from
// stash [((i−1)·N + t)·d] for i >= 1; the block sources' share β_i = 1 − α_p and
// e_i = α_p dx_i·p at bp / e[(i−1)·N + t] for i >= 1 (1 and 0 for i = 0: no p). Per token and chunk of NC sublayers, two passes over the
// sources: the first forms s_ik = r_k (q_i·u_k) and dx_i·u_k (kept in shared memory), then
// α_ik = β_i e^(s_ik − m_i) / Σ_k' e^(s_ik' − m_i) (m_i = max_k s_ik) and
// c_i = e_i + Σ_k α_ik dx_i·u_k; the second (the rows again, from cache) adds Σ_i (α_ik dx_i + ds_ik r_k q_i) − (Σ_i ds_ik s_ik r_k²/d) u_k to dU_k with
// ds_ik = α_ik (dx_i·u_k − c_i). dq_part [gridDim, ns, d] = this thread block's
// Σ_t Σ_k ds_ik r_k u_k. Grid: persistent blocks (one resident wave), tokens strided;
// kThreads threads, VPT values per thread; dynamic smem flush2_smem_floats(ns, d, K0) floats: ns·d
// (dq, each thread touching only its own channels), the reductions' double buffer, 2·NC·K0 (s, dx·u).
// Both passes take the sources in groups of G = flush2_group<VPT>() rows, loaded together (the
// first reduces the group's 2·NC·G dots at one barrier; the second loads the gradient rows too):
// the kernel runs one thread block per SM, so one row at a time would keep only d·sizeof(T) bytes
// in flight per SM.
template <int VPT>
__host__ __device__ constexpr int flush2_group() { return VPT <= 2 ? 4 : VPT <= 4 ? 2 : 1; }
constexpr int kFlush2Dots = 32;  // the largest NC·G (VPT <= 2: 8·4; VPT 4: 8·2)
inline size_t flush2_smem_floats(int ns, int d, int K0) {
    return (size_t)ns * d + 2 * 2 * kFlush2Dots * (kThreads / 32) + 2 * 8 * (size_t)K0;
}
template <typename T, int VPT, int NC = flush_chunk<VPT>(), int G = flush2_group<VPT>()>
__global__ void __launch_bounds__(kThreads, 1)
block_flush2_kernel(float* dq_part, const float* bp, const float* e, const T* dx1, const T* stash, const T* U,
                    const float* R, float* dU, int K0, const float* wg, int ns, int N, int d) {
    static_assert(NC <= 8 && NC * G <= kFlush2Dots, "block_flush2_kernel: flush2_smem_floats too small");
    extern __shared__ float sm[];
    constexpr int HALF = 2 * NC * G * (kThreads / 32);
    float* dqs = sm;                 // [ns, d]
    float* part = sm + ns * d;       // 2 halves of HALF floats
    float* ssc = part + 2 * HALF;    // [NC, K0] s_ik
    float* sdu = ssc + NC * K0;      // [NC, K0] dx_i·u_k
    const int64_t Nd = (int64_t)N * d;
    for (int i = 0; i < ns; i++)
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            if (c < d) dqs[i * d + c] = 0.f;
        }
    int parity = 0;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        for (int i0 = 0; i0 < ns; i0 += NC) {
            const int nc = min(NC, ns - i0);
            float q[NC][VPT], dxv[NC][VPT], be[NC], cm[NC];
#pragma unroll
            for (int i = 0; i < NC; i++) {
                const int ip = i0 + (i < nc ? i : 0);
                const float* ws = wg + (int64_t)ip * 2 * d;
                const T* dxi = ip == 0 ? dx1 + t * d : stash + (ip - 1) * Nd + t * d;
#pragma unroll
                for (int v = 0; v < VPT; v++) {
                    const int c = threadIdx.x + v * kThreads;
                    const bool in = i < nc && c < d;
                    q[i][v] = in ? ws[c] * ws[d + c] : 0.f;
                    dxv[i][v] = in ? to_f(dxi[c]) : 0.f;
                }
                be[i] = ip == 0 ? 1.f : bp[(int64_t)(ip - 1) * N + t];  // the block sources' share
                cm[i] = ip == 0 ? 0.f : e[(int64_t)(ip - 1) * N + t];
            }
            // pass 1: scores and dx·u of every (sublayer, source) pair, G sources per barrier
            for (int k0 = 0; k0 < K0; k0 += G, parity ^= 1) {
                const int gk = min(G, K0 - k0);
                float uv[G][VPT], rk[G], dots[2 * NC * G];  // dots of (source g, sublayer i) at 2·(g·NC + i)
#pragma unroll
                for (int g = 0; g < G; g++) {  // every load of the group first
                    rk[g] = 0.f;
                    if (G > 1 && g >= gk) break;
                    const T* u = U + (int64_t)(k0 + g) * Nd + t * d;
                    rk[g] = R[(int64_t)(k0 + g) * N + t];
#pragma unroll
                    for (int v = 0; v < VPT; v++) {
                        const int c = threadIdx.x + v * kThreads;
                        uv[g][v] = c < d ? to_f(u[c]) : 0.f;
                    }
                }
#pragma unroll
                for (int g = 0; g < G; g++)
#pragma unroll
                    for (int i = 0; i < NC; i++) {
                        float qa = 0.f, da = 0.f;
                        if (G == 1 || g < gk) {
#pragma unroll
                            for (int v = 0; v < VPT; v++) {
                                qa += q[i][v] * uv[g][v];
                                da += dxv[i][v] * uv[g][v];
                            }
                        }
                        dots[2 * (g * NC + i)] = qa;
                        dots[2 * (g * NC + i) + 1] = da;
                    }
                block_sum_db<2 * NC * G>(dots, part + parity * HALF, 2 * NC * (gk - 1) + 2 * nc);
                if (threadIdx.x == 0)
                    for (int g = 0; g < gk; g++)
                        for (int i = 0; i < nc; i++) {
                            ssc[i * K0 + k0 + g] = rk[g] * dots[2 * (g * NC + i)];
                            sdu[i * K0 + k0 + g] = dots[2 * (g * NC + i) + 1];
                        }
            }
            __syncthreads();  // ssc, sdu written by thread 0
            float mx[NC], sc[NC];  // per sublayer: max score, then β / Σ_k e^(s_ik − max)
#pragma unroll
            for (int i = 0; i < NC; i++) {
                mx[i] = sc[i] = 0.f;
                if (i >= nc) continue;
                float m = ssc[i * K0];
                for (int k = 1; k < K0; k++) m = fmaxf(m, ssc[i * K0 + k]);
                float z = 0.f, dz = 0.f;
                for (int k = 0; k < K0; k++) {
                    const float w = ldm_exp(ssc[i * K0 + k] - m);
                    z += w;
                    dz += w * sdu[i * K0 + k];
                }
                mx[i] = m;
                sc[i] = be[i] / z;
                cm[i] += sc[i] * dz;
            }
            // pass 2: the gradient rows (ssc and sdu stay until every thread passed the next
            // chunk's first reduction barrier, after which thread 0 rewrites them)
            // (G sources at a time: their rows, r and gradient rows loaded before any is used)
            for (int k0 = 0; k0 < K0; k0 += G) {
                const int gk = min(G, K0 - k0);
                float uv[G][VPT], dv[G][VPT], rk[G];
#pragma unroll
                for (int g = 0; g < G; g++) {
                    rk[g] = 0.f;
                    if (G > 1 && g >= gk) break;
                    const int64_t row = (int64_t)(k0 + g) * Nd + t * d;
                    rk[g] = R[(int64_t)(k0 + g) * N + t];
#pragma unroll
                    for (int v = 0; v < VPT; v++) {
                        const int c = threadIdx.x + v * kThreads;
                        uv[g][v] = c < d ? to_f(U[row + c]) : 0.f;
                        if constexpr (G > 1) dv[g][v] = c < d ? dU[row + c] : 0.f;  // (G = 1: read at use, no spill)
                    }
                }
#pragma unroll
                for (int g = 0; g < G; g++) {
                    if (G > 1 && g >= gk) break;
                    const int k = k0 + g;
                    const float r = rk[g];
                    float* du = dU + (int64_t)k * Nd + t * d;
                    float al[NC], bq[NC], gam = 0.f;
#pragma unroll
                    for (int i = 0; i < NC; i++) {
                        al[i] = bq[i] = 0.f;
                        if (i >= nc) continue;
                        const float s = ssc[i * K0 + k];
                        al[i] = sc[i] * ldm_exp(s - mx[i]);
                        const float ds = al[i] * (sdu[i * K0 + k] - cm[i]);
                        bq[i] = ds * r;
                        gam += ds * s * r * r / (float)d;
                    }
#pragma unroll
                    for (int v = 0; v < VPT; v++) {
                        const int c = threadIdx.x + v * kThreads;
                        if (c >= d) continue;
                        float acc = 0.f;
#pragma unroll
                        for (int i = 0; i < NC; i++) {
                            if (i >= nc) break;
                            acc += al[i] * dxv[i][v] + bq[i] * q[i][v];
                            dqs[(i0 + i) * d + c] += bq[i] * uv[g][v];
                        }
                        if constexpr (G > 1) du[c] = dv[g][v] + (acc - gam * uv[g][v]);
                        else du[c] += acc - gam * uv[g][v];
                    }
                }
            }
        }
    }
    for (int i = 0; i < ns; i++)
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            if (c < d) dq_part[((int64_t)blockIdx.x * ns + i) * d + c] = dqs[i * d + c];
        }
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
