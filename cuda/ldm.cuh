// cuda/ldm.cuh — the kernels of Linear Depth Memory (spec §2.5) and their launch helpers; the
// scheme that orchestrates them (forward and backward in every mode) is LdmGpuScheme in
// train_ldm.cu. The per (token, head) math is math/ldm_math.h, shared with the CPU reference.
// State layout, kernels and the bytes each moves: doc/cuda.md "LDM kernels".
//
// Two kernel families compute the same math: thread kernels (one thread per (token, head), the
// ldm_math.h functions on global memory: any d_k, and the Woodbury window forward with error
// rows E~ for any w) and warp kernels (one warp per (token, head), S rows over the lanes, k, q, P
// in registers: d_k <= kWarpMaxDk; window reads/flushes without E~: w <= kWarpMaxWindow). The
// scheme uses the warp kernels wherever the shape allows them (doc/cuda.md).
// Precision: S, P, dS, dP fp32; deterministic (no floating-point atomics).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/config.h"
#include "cuda/common.cuh"
#include "math/ldm_math.h"

namespace ldm {
namespace gpu {

namespace ldmk {  // LDM kernels and their launch helpers

enum Rule { kRls = 0, kDelta = 1, kOuter = 2 };
constexpr float kBetaMax = 0.95f;  // spec §2.5 delta rule
constexpr int kThreads = 128;

// Shapes of one LDM layer: N tokens, d channels, Hm heads of dv = d/Hm values and dk keys.
// State per token [ST] = per head (S [dv, dk] row-major, then P [dk, dk] for rls), heads in order.
struct Dims {
    int N, d, Hm, dk, dv, HK, SS, PP, ST;
    LDM_HD int64_t state_off(int n, int h) const { return (int64_t)n * ST + (int64_t)h * (SS + PP); }
    LDM_HD int64_t key_off(int n, int h) const { return (int64_t)n * HK + (int64_t)h * dk; }
    LDM_HD int64_t val_off(int n, int h) const { return (int64_t)n * d + (int64_t)h * dv; }
    LDM_HD int64_t tok_off(int n, int h) const { return (int64_t)n * Hm + h; }
};
inline Dims make_dims(const ModelConfig& c, int N) {
    Dims D;
    D.N = N;
    D.d = c.d_model;
    D.Hm = c.ldm_heads;
    D.dk = c.ldm_dk;
    D.dv = D.d / D.Hm;
    D.HK = D.Hm * D.dk;
    D.SS = D.dv * D.dk;
    D.PP = c.ldm_rule == "rls" ? D.dk * D.dk : 0;
    D.ST = D.Hm * (D.SS + D.PP);
    return D;
}
// Scratch floats per (token, head) for the thread kernels (rls_write_vjp needs 4 dk + 2 dv).
LDM_HD inline int64_t thread_scratch_floats(const Dims& D) { return 4 * (int64_t)D.dk + 2 * (int64_t)D.dv; }

inline unsigned thread_blocks(const Dims& D) { return (unsigned)ceil_div((int64_t)D.N * D.Hm, kThreads); }
inline unsigned elem_blocks(int64_t n) { return (unsigned)std::min<int64_t>(ceil_div(n, 256), 65535LL * 16); }

#define LDM_TH_INDEX(D)                                   \
    const int64_t t_ = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; \
    if (t_ >= (int64_t)(D).N * (D).Hm) return;            \
    const int n = (int)(t_ / (D).Hm), h = (int)(t_ % (D).Hm);

// ---- elementwise helpers --------------------------------------------------------------------

// cur [N, ST] = initial state (S = 0, P = I/delta), coalesced.
__global__ void init_state_kernel(Dims D, float* cur, float delta) {
    const int64_t total = (int64_t)D.N * D.ST;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int hb = (int)(i % D.ST) % (D.SS + D.PP);
        float v = 0.f;
        if (hb >= D.SS) {
            const int p = hb - D.SS;
            if (p / D.dk == p % D.dk) v = 1.f / delta;
        }
        cur[i] = v;
    }
}
inline void init_state(const Dims& D, float* cur, float delta, cudaStream_t s) {
    init_state_kernel<<<elem_blocks((int64_t)D.N * D.ST), 256, 0, s>>>(D, cur, delta);
    LDM_LAUNCH_CHECK();
}

// lam[i] = λ(θ_i) (or 1), lgrad[i] = dλ/dθ (or 0), for (D+1)·Hm entries; theta fp32 master.
__global__ void lambda_kernel(int n, const float* theta, float lam_min, float* lam, float* lgrad) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    lam[i] = theta ? ldm_lambda(theta[i], lam_min) : 1.f;
    lgrad[i] = theta ? ldm_lambda_grad(theta[i], lam_min) : 0.f;
}

template <typename T>
__global__ void to_f32_kernel(const T* in, float* out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = to_f(in[i]);
}
template <typename T>
__global__ void from_f32_kernel(const float* in, T* out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = from_f<T>(in[i]);
}
// dL/do_i in unwind mode's fused backward above HK = kRowMaxK (below it the row pass does this):
// when c != nullptr, b += c (dsrc += dx_j, the residual's
// share of read j's input gradient, deferred from input_backward) and then out = T(a + b) (a: the
// write's own gradient, dv plus the key GEMM, fp32; one rounding). out may alias a (T = float).
template <typename T>
__global__ void resid_sum_kernel(const float* a, float* b, const T* c, T* out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float bv = b[i];
        if (c) {
            bv += to_f(c[i]);
            b[i] = bv;
        }
        out[i] = from_f<T>(a[i] + bv);
    }
}

template <typename T>
inline void to_f32(const T* in, float* out, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    to_f32_kernel<T><<<elem_blocks(n), 256, 0, s>>>(in, out, n);
    LDM_LAUNCH_CHECK();
}
template <typename T>
inline void from_f32(const float* in, T* out, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    from_f32_kernel<T><<<elem_blocks(n), 256, 0, s>>>(in, out, n);
    LDM_LAUNCH_CHECK();
}

// Forward residual bookkeeping of output(j, o): Oj = o (unless Oj is nullptr: o is O_j itself);
// src32 = (residual ? src32 : 0) + o; srcT = T(src32) (srcT may alias src32 when T = float).
template <typename T>
__global__ void output_kernel(int64_t n, const T* o, T* Oj, float* src32, T* srcT, bool residual) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const T ov = o[i];
        if (Oj) Oj[i] = ov;
        const float s = residual ? src32[i] + to_f(ov) : to_f(ov);
        src32[i] = s;
        srcT[i] = from_f<T>(s);
    }
}
// Backward: residual: src32 -= Oj (h_{j-1} = h_j - o_j); else src32 = Oprev (c_{j-1} = o_{j-1}).
template <typename T>
__global__ void restore_src_kernel(int64_t n, const T* Oj, const T* Oprev, float* src32, T* srcT, bool residual) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float s = residual ? src32[i] - to_f(Oj[i]) : to_f(Oprev[i]);
        src32[i] = s;
        srcT[i] = from_f<T>(s);
    }
}
// dsrc32 = (or += when accumulate) dx.
template <typename T>
__global__ void add_grad_kernel(int64_t n, const T* dx, float* dsrc32, bool accumulate) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dsrc32[i] = accumulate ? dsrc32[i] + to_f(dx[i]) : to_f(dx[i]);
}

// Deterministic column sums: out[c] += scale[c]·Σ_n A[n·ld + c]·(B ? B[n·ld + c] : 1), c < C.
// Stage 1: block (32, 8) per (32 columns, kColRows rows) -> partial [RB, C]; stage 2 sums RB in order.
constexpr int kColRows = 256;
inline int64_t colsum_scratch(int64_t N, int64_t C) { return ceil_div(N, kColRows) * C; }
template <typename TA>
__global__ void colsum_partial_kernel(const TA* A, const float* B, int64_t N, int C, int64_t ld, float* partial) {
    __shared__ float sh[8][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * 32 + tx;
    const int64_t n0 = (int64_t)blockIdx.y * kColRows, n1 = min(N, n0 + kColRows);
    float s = 0.f;
    if (c < C)
        for (int64_t n = n0 + ty; n < n1; n += 8) s += to_f(A[n * ld + c]) * (B ? B[n * ld + c] : 1.f);
    sh[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        float t = 0.f;
        for (int r = 0; r < 8; r++) t += sh[r][tx];
        partial[(int64_t)blockIdx.y * C + c] = t;
    }
}
__global__ void colsum_final_kernel(const float* partial, int RB, int C, const float* scale, float* out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.f;
    for (int r = 0; r < RB; r++) s += partial[(int64_t)r * C + c];
    out[c] += scale ? s * scale[c] : s;
}
template <typename TA>
inline void colsum(float* out, const TA* A, const float* B, int64_t N, int C, int64_t ld,
                   const float* scale, float* partial, cudaStream_t s) {
    const int RB = (int)ceil_div(N, kColRows);
    dim3 grid((unsigned)ceil_div(C, 32), (unsigned)RB);
    colsum_partial_kernel<TA><<<grid, dim3(32, 8), 0, s>>>(A, B, N, C, ld, partial);
    LDM_LAUNCH_CHECK();
    colsum_final_kernel<<<(unsigned)ceil_div(C, 128), 128, 0, s>>>(partial, RB, C, scale, out);
    LDM_LAUNCH_CHECK();
}

// ---- the d-sized rows of the fused backward in one pass ---------------------------------------
// After read j+1's backward and write j's unwind + VJP ran in one kernel (unwind mode, fused
// backward), everything left of sublayer j's [N, d] rows is one pass (doc/cuda.md "The d-sized
// rows"); the two GEMMs with the small inner size HK = H_m·d_k (dq·W_q, dk·W_k) are folded in as
// dot products of length HK per element on CUDA cores. Per element (n, c):
//   s      = dsrc + Σ_k dq[n,k]·W_q[k,c]  (+ dx[n,c])     dL/dh_j (read j+1's query; dx_{j+1}'s residual share)
//   d_o    = T((dv + Σ_k dk[n,k]·W_k[k,c]) + s)           dL/do_j (dv as stored: T, so in bf16
//                                                          rounded twice; above HK = 32 dv is fp32)
//   dsrc   = residual ? s : 0
//   src32  = residual ? src32 − O_j : O_{j−1};  srcT = T(src32)   h_{j−1}, read j's input
//   gA     += Σ_n prod[n, c]                               the gate a_{j+1}'s gradient (optional)
//   gWq[k, c] += Σ_n dq[n,k]·T(h_j)[n,c],  gWk[k, c] += Σ_n dk[n,k]·O_j[n,c]   (optional, residual
//                                          only: the weight gradients without their GEMMs)
// Sums over k run in order k = 0..HK−1 in fp32, gA's per lane over its tokens in order, then the
// pair of lanes, then the slices in order; the weight gradients' per lane over its tokens in
// order, then the slices in order (deterministic; the grid depends on N and d only).
template <typename T>
struct RowBackward {
    int N = 0, d = 0, HK = 0;
    const float* dq = nullptr;  // [N, HK] fp32: dL/dq_raw of read j+1
    const float* dk = nullptr;  // [N, HK] fp32: dL/dk_raw of write j
    const T* Wq = nullptr;      // [HK, d]: W_q^{j+1}
    const T* Wk = nullptr;      // [HK, d]: W_k^j
    const T* dx = nullptr;      // [N, d] dL/dx_{j+1}, or nullptr (nothing pending)
    const T* dv = nullptr;      // [N, d]: the write's dv as the fused state kernel stored it (may alias d_o)
    float* dsrc = nullptr;      // [N, d] fp32, read and written
    T* d_o = nullptr;           // [N, d]
    const T* O = nullptr;       // [N, d]: residual: O_j; else O_{j−1}
    float* src32 = nullptr;     // [N, d] fp32, read (residual) and written
    T* srcT = nullptr;          // [N, d], or nullptr when T = float (srcT is src32 then)
    bool residual = true;
    // The gate's gradient (or nullptr): gA [d] += Σ_n prod[n, c], prod [N, d] = dx ⊙ r of read j+1
    // as the fused state kernel wrote it (FusedRead::prod); each block sums its tokens per
    // channel into gpart [grid.y, d] (fp32), a second kernel sums the slices in order.
    const T* prod = nullptr;
    float* gpart = nullptr;
    float* gA = nullptr;
    // The weight gradients (or nullptr; residual and HK <= kRowDwMaxK only): each block sums its
    // tokens' dq[n,k]·T(h_j)[n,c] and dk[n,k]·O_j[n,c] per (k, c) into dwpart [2, grid.y, HK, d]
    // (fp32; row_backward_dw_scratch floats), then the slices are added in order to gWq = dL/dW_q^{j+1}
    // and gWk = dL/dW_k^j ([HK, d] fp32 each). h_j is src32 as read, rounded to T as the forward's
    // q GEMM read it (srcT); dq, dk enter in fp32 (the GEMMs took them rounded to T).
    float* dwpart = nullptr;
    float* gWq = nullptr;
    float* gWk = nullptr;
};
// One element of the pass above, given its row values and the two dot products gq, gk.
template <typename T>
struct RowOut {
    float dsrc, src;
    T d_o;
};
template <typename T>
LDM_HD inline RowOut<T> row_backward_element(float dsrc, float gq, bool has_dx, float dx, float dv, float gk,
                                             float src32, float o, bool residual) {
    float s = dsrc + gq;
    if (has_dx) s += dx;
    RowOut<T> r;
    r.d_o = from_f<T>((dv + gk) + s);
    r.dsrc = residual ? s : 0.f;
    r.src = residual ? src32 - o : o;
    return r;
}
// Geometry: a block of kRowThreads threads covers kRowChannels channels; in each warp, lanes l
// and l ^ 16 share a channel: the low half holds its W_q column, the high half its W_k column
// (KMAX fp32 registers each). For a pair of tokens (t, t+1) both lanes form their dot products
// for both tokens, swap one with a shuffle, and the low lane finishes token t, the high lane
// token t+1. A block stages the dq, dk rows of kRowTokens tokens in shared memory and walks the
// tiles of its token slice, loading the rows of kRowPairs tokens per lane before computing.
constexpr int kRowThreads = 256;
constexpr int kRowChannels = kRowThreads / 2;  // channels per block
constexpr int kRowTokens = 32;                 // tokens per tile
constexpr int kRowPairs = 4;                   // token pairs per step (a lane's row loads in flight)
constexpr int kRowBlocks = 512;                // about this many blocks in all
constexpr int kRowMaxK = 32;                   // the largest HK the pass takes
constexpr int kRowDwMaxK = 16;                 // the largest HK whose weight gradients it sums
                                               // (at width 32 the partials would halve the blocks
                                               // per SM: doc/cuda.md "The weight gradients in the
                                               // row pass")
// Grid: x = channel blocks, y = token slices (at most one per tile; about kRowBlocks blocks).
inline dim3 row_backward_grid(int N, int d) {
    return slice_grid(d, kRowChannels, ceil_div(N, kRowTokens), kRowBlocks);
}
// Block kRowThreads threads; any grid.y (blocks stride over the token tiles); HK <= KMAX. DW: the
// weight gradients' slices too (p.dwpart; the low lane of a channel sums dW_q's column from the
// dq rows, the high lane dW_k's from the dk rows, a shuffle per token pair hands each the other
// token's h_j or O_j).
template <typename T, int KMAX, bool DW = false>
__global__ void __launch_bounds__(kRowThreads) row_backward_kernel(RowBackward<T> p) {
    static_assert(KMAX % 4 == 0 && kRowTokens % (2 * kRowPairs) == 0, "row pass tiling");
    // dq rows at 0, dk rows at kDk (4 words off a multiple of 32: the two halves' broadcast
    // reads of one step fall in different banks)
    constexpr int kDk = kRowTokens * KMAX + 4;
    __shared__ __align__(16) float sbuf[kDk + kRowTokens * KMAX];
    const int lane = threadIdx.x & 31, half = lane >> 4;
    const int c = blockIdx.x * kRowChannels + (threadIdx.x >> 5) * 16 + (lane & 15);
    const bool live = c < p.d;
    float w[KMAX];  // this channel's W_q (low half) or W_k (high half) column, 0 beyond HK
    {
        const T* W = half ? p.Wk : p.Wq;
#pragma unroll
        for (int k = 0; k < KMAX; k++) w[k] = live && k < p.HK ? to_f(W[(int64_t)k * p.d + c]) : 0.f;
    }
    const float* srow = sbuf + (half ? kDk : 0);
    float gsum = 0.f;  // this lane's share of Σ_n prod[n, c] over the block's tokens
    float dw[DW ? KMAX : 1];  // DW: this block's Σ_n dq[n,k]·h[n,c] (low half) or dk[n,k]·O[n,c] (high)
#pragma unroll
    for (int k = 0; k < (DW ? KMAX : 1); k++) dw[k] = 0.f;
    const int tiles = (p.N + kRowTokens - 1) / kRowTokens;
    for (int tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
        const int64_t n0 = (int64_t)tile * kRowTokens;
        const int nt = p.N - n0 < kRowTokens ? (int)(p.N - n0) : kRowTokens;
        __syncthreads();  // the previous tile's dq, dk are no longer read
        for (int i = threadIdx.x; i < kRowTokens * KMAX; i += kRowThreads) {
            const int t = i / KMAX, k = i % KMAX;
            const bool ok = t < nt && k < p.HK;
            sbuf[i] = ok ? p.dq[(n0 + t) * p.HK + k] : 0.f;
            sbuf[kDk + i] = ok ? p.dk[(n0 + t) * p.HK + k] : 0.f;
        }
        __syncthreads();
        for (int t0 = 0; t0 < nt; t0 += 2 * kRowPairs) {
            // this lane's token of each pair: t0 + 2u + half
            float ds[kRowPairs], dv[kRowPairs], sr[kRowPairs], ov[kRowPairs], dxv[kRowPairs], pv[kRowPairs];
#pragma unroll
            for (int u = 0; u < kRowPairs; u++) {  // all loads of the step first
                ds[u] = dv[u] = sr[u] = ov[u] = dxv[u] = pv[u] = 0.f;
                const int t = t0 + 2 * u + half;
                if (live && t < nt) {
                    const int64_t i = (n0 + t) * p.d + c;
                    ds[u] = p.dsrc[i];
                    dv[u] = to_f(p.dv[i]);
                    ov[u] = to_f(p.O[i]);
                    if (p.residual) sr[u] = p.src32[i];
                    if (p.dx) dxv[u] = to_f(p.dx[i]);
                    if (p.prod) pv[u] = to_f(p.prod[i]);
                }
            }
#pragma unroll
            for (int u = 0; u < kRowPairs; u++) {
                const int t = t0 + 2 * u;  // the pair (t, t+1); rows past nt are zero in sbuf
                float g0 = 0.f, g1 = 0.f;
#pragma unroll
                for (int k = 0; k < KMAX; k++) {
                    g0 = fmaf(srow[t * KMAX + k], w[k], g0);
                    g1 = fmaf(srow[(t + 1) * KMAX + k], w[k], g1);
                }
                // low lane: gq(t) = g0, needs gk(t) = the high lane's g0; high lane: gk(t+1) = g1,
                // needs gq(t+1) = the low lane's g1
                const float other = __shfl_xor_sync(0xffffffffu, half ? g0 : g1, 16);
                const float gq = half ? other : g0, gk = half ? g1 : other;
                if (DW) {  // (zeros past nt and for idle channels: rows and values are 0 there)
                    // low lane: T(h_j) of t (own) and t+1 (the high lane's); high lane: O_j of t
                    // (the low lane's) and t+1 (own)
                    const float hq = to_f(from_f<T>(sr[u]));
                    const float x = __shfl_xor_sync(0xffffffffu, half ? hq : ov[u], 16);
                    const float a0 = half ? x : hq, a1 = half ? ov[u] : x;
#pragma unroll
                    for (int k = 0; k < KMAX; k++) {
                        dw[k] = fmaf(srow[t * KMAX + k], a0, dw[k]);
                        dw[k] = fmaf(srow[(t + 1) * KMAX + k], a1, dw[k]);
                    }
                }
                const int tm = t + half;
                if (!live || tm >= nt) continue;
                gsum += pv[u];
                const RowOut<T> r =
                    row_backward_element<T>(ds[u], gq, p.dx != nullptr, dxv[u], dv[u], gk, sr[u], ov[u], p.residual);
                const int64_t i = (n0 + tm) * p.d + c;
                p.dsrc[i] = r.dsrc;
                p.d_o[i] = r.d_o;
                p.src32[i] = r.src;
                if (p.srcT) p.srcT[i] = from_f<T>(r.src);
            }
        }
    }
    if (p.prod) {
        gsum += __shfl_xor_sync(0xffffffffu, gsum, 16);  // the pair's two token sets
        if (half == 0 && live) p.gpart[(int64_t)blockIdx.y * p.d + c] = gsum;
    }
    if (DW && live) {
        float* o = p.dwpart + ((int64_t)half * gridDim.y + blockIdx.y) * p.HK * p.d + c;
#pragma unroll
        for (int k = 0; k < KMAX; k++)
            if (k < p.HK) o[(int64_t)k * p.d] = dw[k];
    }
}
// Launches row_backward_kernel (grid row_backward_grid), then, with prod, the slices' sum into gA
// and, with dwpart, into gWq and gWk (colsum_final_kernel). Throws ldm::Error when HK > kRowMaxK,
// prod without gpart and gA, or dwpart without gWq and gWk, with HK > kRowDwMaxK or without the
// residual.
template <typename T>
inline void row_backward(const RowBackward<T>& p, cudaStream_t s) {
    if (p.HK <= 0 || p.HK > kRowMaxK) throw Error(strprintf("row_backward: HK %d outside 1..%d", p.HK, kRowMaxK));
    if (p.prod && (!p.gpart || !p.gA)) throw Error("row_backward: prod given without gpart and gA");
    if (p.dwpart && (!p.gWq || !p.gWk || p.HK > kRowDwMaxK || !p.residual))
        throw Error(strprintf("row_backward: weight gradients need gWq, gWk, the residual and HK <= %d (HK %d)",
                              kRowDwMaxK, p.HK));
    const dim3 g = row_backward_grid(p.N, p.d);
    if (p.dwpart) row_backward_kernel<T, 16, true><<<g, kRowThreads, 0, s>>>(p);
    else if (p.HK <= 16) row_backward_kernel<T, 16><<<g, kRowThreads, 0, s>>>(p);
    else row_backward_kernel<T, 32><<<g, kRowThreads, 0, s>>>(p);
    LDM_LAUNCH_CHECK();
    if (p.prod) {
        colsum_final_kernel<<<(unsigned)ceil_div(p.d, 128), 128, 0, s>>>(p.gpart, (int)g.y, p.d, nullptr, p.gA);
        LDM_LAUNCH_CHECK();
    }
    if (p.dwpart) {  // [2, grid.y, HK·d]: the slices of dW_q, then of dW_k
        const int C = p.HK * p.d;
        colsum_final_kernel<<<(unsigned)ceil_div(C, 128), 128, 0, s>>>(p.dwpart, (int)g.y, C, nullptr, p.gWq);
        LDM_LAUNCH_CHECK();
        colsum_final_kernel<<<(unsigned)ceil_div(C, 128), 128, 0, s>>>(p.dwpart + (int64_t)g.y * C, (int)g.y, C,
                                                                       nullptr, p.gWk);
        LDM_LAUNCH_CHECK();
    }
}
// Floats of gpart row_backward needs at N tokens and width d.
inline int64_t row_backward_scratch(int N, int d) { return (int64_t)row_backward_grid(N, d).y * d; }
// Floats of dwpart row_backward needs at N tokens, width d and HK.
inline int64_t row_backward_dw_scratch(int N, int d, int HK) {
    return 2 * (int64_t)row_backward_grid(N, d).y * HK * d;
}


// Drift: out[0] = max(out[0], max|S - S_ref|), out[1] = max(out[1], max|δP - δP_ref|) over all
// tokens and heads (a non-finite difference counts as +inf: ldm_drift_value); ref == nullptr
// compares with the initial state (0, I/δ). out holds the bits of non-negative floats (integer
// atomicMax is exact and order-independent).
__global__ void drift_kernel(Dims D, const float* cur, const float* ref, float delta, unsigned* out) {
    const int64_t total = (int64_t)D.N * D.ST;
    float ms = 0.f, mp = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int hb = (int)(i % D.ST) % (D.SS + D.PP);
        if (hb < D.SS) {
            ms = fmaxf(ms, ldm_drift_value(cur[i] - (ref ? ref[i] : 0.f)));
        } else {
            const int p = hb - D.SS;
            const float r = ref ? delta * ref[i] : (p / D.dk == p % D.dk ? 1.f : 0.f);
            mp = fmaxf(mp, ldm_drift_value(delta * cur[i] - r));
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        ms = fmaxf(ms, __shfl_xor_sync(0xffffffffu, ms, o));
        mp = fmaxf(mp, __shfl_xor_sync(0xffffffffu, mp, o));
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(out, __float_as_uint(ms));
        atomicMax(out + 1, __float_as_uint(mp));
    }
}

// ---- thread kernels: one thread per (token, head), ldm_math.h on global memory -------------

// Write i (forward): k = L2n(raw) -> Kn, Knrm; then the rule's write on cur with v = v32.
// delta: z = zraw + bb (fp32 master bias) -> beta = β_max sigmoid(z) -> beta.
template <int RULE>
__global__ void write_thread_kernel(Dims D, float* cur, const float* raw, float* Kn, float* Knrm,
                                const float* v32, const float* lam, const float* zraw,
                                const float* bb, float* beta, float* scratch) {
    LDM_TH_INDEX(D)
    const int64_t kh = D.key_off(n, h), so = D.state_off(n, h), nh = D.tok_off(n, h);
    float* k = Kn + kh;
    Knrm[nh] = l2n_forward(raw + kh, k, D.dk);
    float* S = cur + so;
    const float* v = v32 + D.val_off(n, h);
    if (RULE == kRls) {
        rls_write(S, S + D.SS, (const float*)k, v, lam[h], D.dv, D.dk, scratch + t_ * D.dk);
    } else if (RULE == kOuter) {
        outer_write(S, (const float*)k, v, lam[h], D.dv, D.dk);
    } else {
        const float b = kBetaMax * sigmoid(zraw[nh] + bb[h]);
        beta[nh] = b;
        delta_write(S, (const float*)k, v, b, D.dv, D.dk);
    }
}

// Re-applies a stored write (window / delta-checkpoint recompute): k from Kn, beta from beta.
template <int RULE>
__global__ void rewrite_thread_kernel(Dims D, float* cur, const float* Kn, const float* v32,
                                  const float* lam, const float* beta, float* scratch) {
    LDM_TH_INDEX(D)
    float* S = cur + D.state_off(n, h);
    const float* k = Kn + D.key_off(n, h);
    const float* v = v32 + D.val_off(n, h);
    if (RULE == kRls) rls_write(S, S + D.SS, k, v, lam[h], D.dv, D.dk, scratch + t_ * D.dk);
    else if (RULE == kOuter) outer_write(S, k, v, lam[h], D.dv, D.dk);
    else delta_write(S, k, v, beta[D.tok_off(n, h)], D.dv, D.dk);
}

// Read j (forward): q = L2n(raw) -> Qn, Qnrm; r = S q (-> r32); x = src32 + a ⊙ r (a = nullptr:
// no residual, x = r).
template <typename T>
__global__ void read_thread_kernel(Dims D, const float* cur, const float* raw, float* Qn, float* Qnrm,
                               float* r32, const float* src32, const float* a, T* x) {
    LDM_TH_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h);
    float* q = Qn + kh;
    Qnrm[D.tok_off(n, h)] = l2n_forward(raw + kh, q, D.dk);
    float* r = r32 + vo;
    ldm_read(cur + D.state_off(n, h), (const float*)q, r, D.dv, D.dk);
    for (int c = 0; c < D.dv; c++)
        x[vo + c] = from_f<T>(a ? src32[vo + c] + a[h * D.dv + c] * r[c] : r[c]);
}

// Read j (backward): dr = a ⊙ dx (or dx) -> dr32; prod32 = dx ⊙ r (when a, for da);
// dS += dr qᵀ; draw = L2n-backward(Sᵀ dr) (overwritten).
template <typename T>
__global__ void read_bwd_thread_kernel(Dims D, const float* cur, const float* Qn, const float* Qnrm,
                                   const T* dx, const float* a, float* dS, float* draw, float* dr32,
                                   float* prod32) {
    LDM_TH_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h);
    const float* S = cur + so;
    const float* q = Qn + kh;
    if (a) {
        float* pr = prod32 + vo;
        ldm_read(S, q, pr, D.dv, D.dk);
        for (int c = 0; c < D.dv; c++) pr[c] = to_f(dx[vo + c]) * pr[c];
    }
    float* dr = dr32 + vo;
    for (int c = 0; c < D.dv; c++) dr[c] = a ? a[h * D.dv + c] * to_f(dx[vo + c]) : to_f(dx[vo + c]);
    float* dq = draw + kh;
    for (int b = 0; b < D.dk; b++) dq[b] = 0.f;
    ldm_read_vjp(S, q, (const float*)dr, dS + so, dq, D.dv, D.dk);
    l2n_backward(q, Qnrm[D.tok_off(n, h)], (const float*)dq, dq, D.dk);
}

// Unwind write i in place (cur: after -> before), rls / outer.
template <int RULE>
__global__ void unwind_thread_kernel(Dims D, float* cur, const float* Kn, const float* v32,
                                 const float* lam, float* scratch) {
    LDM_TH_INDEX(D)
    float* S = cur + D.state_off(n, h);
    const float* k = Kn + D.key_off(n, h);
    const float* v = v32 + D.val_off(n, h);
    if (RULE == kRls) rls_unwind(S, S + D.SS, k, v, lam[h], D.dv, D.dk, scratch + t_ * D.dk);
    else outer_unwind(S, k, v, lam[h], D.dv, D.dk);
}

// VJP of write i at the state before it (cur). UNWIND: first unwinds cur in place (after ->
// before; the fused unwind mode). dS/dP: after -> before in place; dvacc = dsrc32 + dv (fp32,
// overwritten); draw = L2n-backward(dk) (overwritten); dtok = dL/dλ (rls/outer) or dL/dz (delta).
template <int RULE, bool UNWIND>
__global__ void write_vjp_thread_kernel(Dims D, float* cur, float* dS, const float* Kn,
                                    const float* Knrm, const float* v32, const float* lam,
                                    const float* beta, const float* dsrc32, float* dvacc,
                                    float* draw, float* dtok, float* scratch) {
    LDM_TH_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h),
                  nh = D.tok_off(n, h);
    float* S = cur + so;
    const float* k = Kn + kh;
    const float* v = v32 + vo;
    float* scr = scratch + t_ * thread_scratch_floats(D);
    if (UNWIND) {
        if (RULE == kRls) rls_unwind(S, S + D.SS, k, v, lam[h], D.dv, D.dk, scr);
        else if (RULE == kOuter) outer_unwind(S, k, v, lam[h], D.dv, D.dk);
    }
    float* dvp = dvacc + vo;
    for (int c = 0; c < D.dv; c++) dvp[c] = dsrc32[vo + c];
    float* dq = draw + kh;
    for (int b = 0; b < D.dk; b++) dq[b] = 0.f;
    float dt = 0.f;
    if (RULE == kRls) {
        rls_write_vjp((const float*)S, (const float*)(S + D.SS), k, v, lam[h], dS + so,
                      dS + so + D.SS, dq, dvp, &dt, D.dv, D.dk, scr);
    } else if (RULE == kOuter) {
        outer_write_vjp((const float*)S, k, v, lam[h], dS + so, dq, dvp, &dt, D.dv, D.dk);
    } else {
        const float b = beta[nh];
        float db = 0.f;
        delta_write_vjp((const float*)S, k, v, b, dS + so, dq, dvp, &db, D.dv, D.dk);
        dt = db * b * (1.f - b / kBetaMax);
    }
    dtok[nh] = dt;
    l2n_backward(k, Knrm[nh], (const float*)dq, dq, D.dk);
}

// ---- warp kernels: one warp per (token, head) ------------------------------------------------
// Lane l owns the rows a = l, l+32, ... of S [dv, dk] (row a is dk contiguous floats, loaded and
// stored as float4 when dk is 4, 8 or 16, so a warp moves one contiguous 32·dk·4-byte span per
// row step: coalesced); k, q, u = P k (dk <= kWarpMaxDk) live in registers of every lane, P in
// registers or in the warp's slice of shared memory (PMat below; read once per warp, broadcast).
// Registers beyond dk hold 0, so the unguarded sums equal the dk-term sums. The per-row math is
// the same expression as ldm_math.h's loops; sums over rows (dk-vectors) are warp reductions
// (fixed butterfly order, deterministic).
constexpr int kWarpMaxDk = 16;
constexpr int kWarpsPerBlock = 4;

// Calls f(std::integral_constant<int, DK>{}) with the register width DK (4, 8 or 16) of the warp
// kernels for this d_k (<= kWarpMaxDk): one instantiation per width, zero-padded beyond d_k.
template <typename F>
inline void dispatch_dk(int dk, F&& f) {
    if (dk <= 4) f(std::integral_constant<int, 4>{});
    else if (dk <= 8) f(std::integral_constant<int, 8>{});
    else f(std::integral_constant<int, 16>{});
}

inline unsigned warp_blocks(const Dims& D) {
    return (unsigned)ceil_div((int64_t)D.N * D.Hm, kWarpsPerBlock);
}
#define LDM_WARP_INDEX(D)                                                                   \
    const int64_t t_ = blockIdx.x * (int64_t)kWarpsPerBlock + threadIdx.x / 32;             \
    if (t_ >= (int64_t)(D).N * (D).Hm) return;                                              \
    const int lane = threadIdx.x & 31;                                                      \
    const int n = (int)(t_ / (D).Hm), h = (int)(t_ % (D).Hm);

__device__ inline float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// x[0..DK) = p[0..dk) and 0 beyond; float4 loads when dk == DK (16-byte aligned: every row of
// S, P, dS starts at a multiple of dk floats from a cudaMalloc base).
template <int DK>
__device__ inline void load_row(const float* p, float (&x)[DK], int dk) {
    if (DK % 4 == 0 && dk == DK) {
#pragma unroll
        for (int b = 0; b < DK; b += 4) {
            const float4 t = *reinterpret_cast<const float4*>(p + b);
            x[b] = t.x; x[b + 1] = t.y; x[b + 2] = t.z; x[b + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int b = 0; b < DK; b++) x[b] = b < dk ? p[b] : 0.f;
    }
}
template <int DK>
__device__ inline void store_row(float* p, const float (&x)[DK], int dk) {
    if (DK % 4 == 0 && dk == DK) {
#pragma unroll
        for (int b = 0; b < DK; b += 4) *reinterpret_cast<float4*>(p + b) = make_float4(x[b], x[b + 1], x[b + 2], x[b + 3]);
    } else {
#pragma unroll
        for (int b = 0; b < DK; b++)
            if (b < dk) p[b] = x[b];
    }
}
// Lane `lane` < dk writes x[lane] to p[lane].
template <int DK>
__device__ inline void store_vec_lanes(float* p, const float (&x)[DK], int dk, int lane) {
    if (lane < dk) {
#pragma unroll
        for (int b = 0; b < DK; b++)
            if (b == lane) p[b] = x[b];
    }
}

// L2n of a dk-vector held (replicated, zero-padded) in registers: returns the norm.
template <int DK>
__device__ inline float l2n_reg(float (&x)[DK]) {
    float s = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) s += x[b] * x[b];
    const float nrm = sqrtf(s + 1e-6f), inv = 1.f / nrm;
#pragma unroll
    for (int b = 0; b < DK; b++) x[b] *= inv;
    return nrm;
}
// P [dk, dk] (row-major, dk <= DK) into registers Pl[a*DK + b], zero-padded.
template <int DK>
__device__ inline void load_P(const float* P, float (&Pl)[DK * DK], int dk) {
#pragma unroll
    for (int a = 0; a < DK; a++) {
        float row[DK];
        if (a < dk) load_row<DK>(P + a * dk, row, dk);
        else
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) Pl[a * DK + b] = row[b];
    }
}
// x[i] for a lane-dependent i (a select over the registers: indexing a register array with a
// runtime index would move it to local memory).
template <int N>
__device__ inline float reg_select(const float (&x)[N], int i) {
    float v = 0.f;
#pragma unroll
    for (int c = 0; c < N; c++)
        if (c == i) v = x[c];
    return v;
}

// Lanes write P [dk, dk] from registers (element p by lane p % 32).
template <int DK>
__device__ inline void store_P(float* P, const float (&Pl)[DK * DK], int dk, int lane) {
    for (int p = lane; p < dk * dk; p += 32) {
        const int a = p / dk, b = p % dk;
        P[p] = reg_select<DK * DK>(Pl, a * DK + b);
    }
}

// x[i] += v for a lane-dependent or loop-carried i (see reg_select).
template <int DK>
__device__ inline void reg_add(float (&x)[DK], int i, float v) {
#pragma unroll
    for (int c = 0; c < DK; c++)
        if (c == i) x[c] += v;
}

// The rls inverse-covariance P [dk, dk] (zero-padded to DK x DK, row-major, element (a, b) at
// a·DK + b) as a warp kernel holds it while it works on one (token, head). DK <= PREG: in
// registers of every lane (replicated; loaded once per warp as broadcasts). DK > PREG: the matrix
// lives in this warp's slice of shared memory (DK² floats per warp and SLOT; every lane reads the
// same element at a time: broadcasts, no bank conflicts) and each lane owns the elements p = lane,
// lane + 32, ... for loads, stores and element-wise updates. SLOT tells apart two matrices of one
// kernel (P and dP). The element-wise update applies the same expression f(old, x[a], y[b]) in
// both layouts, so the results do not depend on the layout. Production: PREG = kRegPMax = 4
// (registers at width 4, shared memory at widths 8 and 16): with P and dP in registers the fused
// unwind + VJP kernels hit the register limit at width 8 and spilled at width 16 (doc/ptxas.md,
// doc/cuda.md "LDM kernels"). The rls kernels take PREG as their last template argument so that
// the workbench (dev/cuda/ldm.cu) times P in registers at width 8 (PREG = 8) beside production.
constexpr int kRegPMax = 4;
// Rows of S that one lane of an rls warp kernel handles per step of its row loop (the ROWS
// template argument): all loads of a step (S rows, dS rows, the rows' v, dx, gate, src values)
// are issued before its first store, which the compiler cannot do across steps itself (the
// pointers may alias), so a warp keeps ROWS row steps of loads in flight. The results do not
// depend on ROWS (same expressions, rows in the same order). Chosen from ptxas register counts as
// the largest of 1, 2, 4 that keeps at least 16 resident warps per SM (doc/cuda.md "LDM
// kernels"): forward kernels (write, write + read) and backward kernels (unwind + VJP, read
// backward + unwind + VJP) by register width.
template <int DK>
constexpr int kFwdRows = DK <= 8 ? 4 : 1;
template <int DK>
constexpr int kBwdRows = DK <= 4 ? 2 : 1;
template <int DK, int SLOT>
__device__ inline float* warp_p_slice() {
    __shared__ float sh[kWarpsPerBlock * DK * DK];
    return sh + (threadIdx.x >> 5) * (DK * DK);
}
template <int DK, int SLOT = 0, int PREG = kRegPMax>
struct PMat {
    static constexpr bool kShared = DK > PREG;
    static_assert(!kShared || (32 % DK == 0 && (DK * DK) % 32 == 0), "PMat: shared layout needs DK | 32 | DK²");
    float r[kShared ? 1 : DK * DK];
    float* s = nullptr;
    __device__ PMat() {
        if constexpr (kShared) s = warp_p_slice<DK, SLOT>();
    }
    // element (a, b); a, b compile-time after unrolling
    __device__ float operator()(int a, int b) const {
        if constexpr (kShared) return s[a * DK + b];
        else return r[a * DK + b];
    }
    // from global P [dk, dk] (every lane of the warp calls it)
    __device__ void load(const float* P, int dk, int lane) {
        if constexpr (kShared) {
            for (int p = lane; p < DK * DK; p += 32) {
                const int a = p / DK, b = p % DK;
                s[p] = a < dk && b < dk ? P[a * dk + b] : 0.f;
            }
            __syncwarp();
        } else {
            load_P<DK>(P, r, dk);
        }
    }
    // to global P [dk, dk]; the caller has synchronised the warp after its last read of P there
    __device__ void store(float* P, int dk, int lane) const {
        if constexpr (kShared) {
            __syncwarp();
            for (int p = lane; p < dk * dk; p += 32) P[p] = s[(p / dk) * DK + p % dk];
        } else {
            store_P<DK>(P, r, dk, lane);
        }
    }
    // M(a, b) = f(M(a, b), x[a], y[b]) for every element
    template <class F>
    __device__ void update(const float (&x)[DK], const float (&y)[DK], int lane, F f) {
        if constexpr (kShared) {
            __syncwarp();  // every lane's reads of the old values are done
            const int b = lane % DK;  // fixed per lane (32 is a multiple of DK)
            const float yb = reg_select<DK>(y, b);
#pragma unroll
            for (int i = 0; i < DK * DK / 32; i++) {
                const int p = lane + 32 * i;
                s[p] = f(s[p], reg_select<DK>(x, p / DK), yb);
            }
            __syncwarp();
        } else {
            (void)lane;
#pragma unroll
            for (int p = 0; p < DK * DK; p++) r[p] = f(r[p], x[p / DK], y[p % DK]);
        }
    }
};

// A read fused into another kernel's pass over the state (the forward: read j of the state that
// write j-1 has just produced, cuda/ldm.cuh *_read_warp_kernel; the backward: read j's backward
// before the unwind + VJP of write j-1, read_bwd_* kernels), so the state moves once for both.
// Per (token, head): forward q = L2n(raw) -> Qn, Qnrm, x = src32 + a ⊙ (S q) (a == nullptr: no
// residual, x = S q); backward dr = a ⊙ dx (or dx), dS += dr qᵀ, prod = T(dx ⊙ (S q)) (when a),
// draw = L2n-backward(Sᵀ dr) with Qn, Qnrm of the forward.
template <typename T>
struct FusedRead {
    const float* raw = nullptr;    // forward: q before the L2n [N, HK]
    float* Qn = nullptr;           // forward: written; backward: read
    float* Qnrm = nullptr;         // forward: written; backward: read
    const float* src32 = nullptr;  // forward: the residual stream h (fp32)
    const float* a = nullptr;      // the gate a_j (fp32 master), nullptr without residual
    T* x = nullptr;                // forward: x_j
    const T* dx = nullptr;         // backward: dL/dx_j
    float* draw = nullptr;         // backward: dL/d(q before the L2n) [N, HK]
    T* prod = nullptr;             // backward: dx ⊙ r rounded to T (the gate's gradient; summed by the row pass)
};
// forward: q of (n, h) normalised into registers, Qn / Qnrm written.
template <typename T, int DK>
__device__ inline void fused_read_q(const FusedRead<T>& f, const Dims& D, int n, int h, int lane, float (&q)[DK]) {
    const int64_t kh = D.key_off(n, h);
#pragma unroll
    for (int b = 0; b < DK; b++) q[b] = b < D.dk ? f.raw[kh + b] : 0.f;
    const float nrm = l2n_reg<DK>(q);
    store_vec_lanes<DK>(f.Qn + kh, q, D.dk, lane);
    if (lane == 0) f.Qnrm[D.tok_off(n, h)] = nrm;
}
// backward: dq = Sᵀ dr (warp-summed here) through the L2n backward into draw.
template <typename T, int DK>
__device__ inline void fused_read_bwd_finish(const FusedRead<T>& f, const Dims& D, int n, int h, int lane,
                                             const float (&q)[DK], float (&dq)[DK]) {
#pragma unroll
    for (int b = 0; b < DK; b++) dq[b] = warp_sum(dq[b]);
    float yd = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) yd += q[b] * dq[b];
    const float inv = 1.f / f.Qnrm[D.tok_off(n, h)];
#pragma unroll
    for (int b = 0; b < DK; b++) dq[b] = (dq[b] - q[b] * yd) * inv;
    store_vec_lanes<DK>(f.draw + D.key_off(n, h), dq, D.dk, lane);
}
// backward, one row r of (n, h): the read's part on the state row (the state the read saw) and
// its gradient row (updated in place). fused_read_bwd_in loads the row's inputs (dx and the gate;
// before the caller's first store of the row step), fused_read_bwd_row applies them.
template <typename T>
__device__ inline void fused_read_bwd_in(const FusedRead<T>& f, const Dims& D, int h, int64_t vo, int r, float& dxr,
                                         float& ar) {
    dxr = to_f(f.dx[vo + r]);
    ar = f.a ? f.a[h * D.dv + r] : 0.f;
}
template <typename T, int DK>
__device__ inline void fused_read_bwd_row(const FusedRead<T>& f, int64_t vo, int r, float dxr, float ar,
                                          const float (&row)[DK], float (&drow)[DK], const float (&q)[DK],
                                          float (&dq)[DK]) {
    const float g = f.a ? ar * dxr : dxr;
    float rr = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) {
        rr += row[b] * q[b];
        drow[b] += g * q[b];
        dq[b] += row[b] * g;
    }
    if (f.a) f.prod[vo + r] = from_f<T>(dxr * rr);
}

// Warp read: same outputs as read_thread_kernel (r32 is not written).
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
read_warp_kernel(Dims D, const float* cur, const float* raw, float* Qn, float* Qnrm,
               const float* src32, const float* a, T* x) {
    LDM_WARP_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h);
    const int dk = D.dk;
    float q[DK];
#pragma unroll
    for (int b = 0; b < DK; b++) q[b] = b < dk ? raw[kh + b] : 0.f;
    const float nrm = l2n_reg<DK>(q);
    store_vec_lanes<DK>(Qn + kh, q, dk, lane);
    if (lane == 0) Qnrm[D.tok_off(n, h)] = nrm;
    const float* S = cur + D.state_off(n, h);
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        float s = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) s += row[b] * q[b];
        x[vo + r] = from_f<T>(a ? src32[vo + r] + a[h * D.dv + r] * s : s);
    }
}

// Warp rls write (forward, with forgetting): same math as rls_write, from the state src_state to
// cur (out of place in store mode, so the forward needs no extra copy; in place when equal).
// RECOMP: re-applies a stored write (window / checkpoint recompute): raw is the stored normalised
// key Kn, nothing but the state is written.
template <int DK, bool RECOMP, bool READ, typename T, int PREG, int ROWS, typename V>
__device__ inline void write_rls_warp_body(Dims D, float* cur, const float* src_state, const float* raw, float* Kn,
                                           float* Knrm, const V* v32, const float* lam, const FusedRead<T>& fr) {
    LDM_WARP_INDEX(D)
    float q[DK];
    if (READ) fused_read_q<T, DK>(fr, D, n, h, lane, q);
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h);
    const int dk = D.dk;
    float k[DK], u[DK];
    PMat<DK, 0, PREG> Pl;
#pragma unroll
    for (int b = 0; b < DK; b++) k[b] = b < dk ? raw[kh + b] : 0.f;
    if (!RECOMP) {
        const float nrm = l2n_reg<DK>(k);
        store_vec_lanes<DK>(Kn + kh, k, dk, lane);
        if (lane == 0) Knrm[D.tok_off(n, h)] = nrm;
    }
    float* S = cur + so;  // output state (may alias the input src_state)
    float* P = S + D.SS;
    const float* Si = src_state + so;
    Pl.load(Si + D.SS, dk, lane);
    float kv = 0.f;
#pragma unroll
    for (int a = 0; a < DK; a++) {
        float s = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) s += Pl(a, b) * k[b];
        u[a] = s;
        kv += k[a] * s;
    }
    const float lm = lam[h], gamma = lm + kv, ig = 1.f / gamma, il = 1.f / lm;
    const V* v = v32 + vo;
    float row[ROWS][DK], vr[ROWS], xs[ROWS], xa[ROWS];
    batched_strided_loop<ROWS>(  // ROWS rows of this lane per step (kFwdRows)
        lane, D.dv, 32,
        [&](int i, int r) {
            load_row<DK>(Si + (int64_t)r * dk, row[i], dk);
            vr[i] = to_f(v[r]);
            xs[i] = READ && fr.a ? fr.src32[vo + r] : 0.f;
            xa[i] = READ && fr.a ? fr.a[h * D.dv + r] : 0.f;
        },
        [&](int i, int r) {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += row[i][b] * k[b];
            const float e = vr[i] - s;
#pragma unroll
            for (int b = 0; b < DK; b++) row[i][b] += e * (u[b] * ig);
            store_row<DK>(S + (int64_t)r * dk, row[i], dk);
            if (READ) {  // read j of the new state (read_warp_kernel's expression)
                float rr = 0.f;
#pragma unroll
                for (int b = 0; b < DK; b++) rr += row[i][b] * q[b];
                fr.x[vo + r] = from_f<T>(fr.a ? xs[i] + xa[i] * rr : rr);
            }
        });
    Pl.update(u, u, lane, [&](float pv, float ua, float ub) { return (pv - ua * ub * ig) * il; });
    __syncwarp();
    Pl.store(P, dk, lane);
}
template <int DK, bool RECOMP = false, int PREG = kRegPMax, int ROWS = kFwdRows<DK>>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
write_rls_warp_kernel(Dims D, float* cur, const float* src_state, const float* raw, float* Kn,
                    float* Knrm, const float* v32, const float* lam) {
    write_rls_warp_body<DK, RECOMP, false, float, PREG, ROWS, float>(D, cur, src_state, raw, Kn, Knrm, v32, lam,
                                                                     FusedRead<float>{});
}
// Write i then read i+1 of the new state in the same pass (the forward of unwind / store /
// checkpoint modes): the outputs of write_rls_warp_kernel and of read_warp_kernel. The values v
// are read as stored (O_i, type T) and widened in registers (no fp32 copy of O_i).
template <typename T, int DK, int PREG = kRegPMax, int ROWS = kFwdRows<DK>>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
write_read_rls_warp_kernel(Dims D, float* cur, const float* src_state, const float* raw, float* Kn, float* Knrm,
                           const T* v, const float* lam, FusedRead<T> fr) {
    write_rls_warp_body<DK, false, true, T, PREG, ROWS, T>(D, cur, src_state, raw, Kn, Knrm, v, lam, fr);
}

// Warp fused unwind + VJP of an rls write: same math as rls_unwind (when UNWIND) followed by
// rls_write_vjp (ldm_math.h). One pass over the rows: each lane unwinds its S row in registers,
// stores it, and applies the row's part of the VJP with its dS row; dk-vector sums are warp
// reductions; the P part is computed redundantly by every lane from registers.
template <int DK, bool UNWIND, bool READ, typename T, int PREG, int ROWS, typename V, typename DV = float>
__device__ inline void unwind_vjp_rls_warp_body(Dims D, float* cur, float* dS, const float* Kn, const float* Knrm,
                                                const V* v32, const float* lam, const float* dsrc32, DV* dvacc,
                                                float* draw, float* dtok, const FusedRead<T>& fr) {
    LDM_WARP_INDEX(D)
    float q[DK], dq[DK];
    if (READ) {
#pragma unroll
        for (int b = 0; b < DK; b++) {
            q[b] = b < D.dk ? fr.Qn[D.key_off(n, h) + b] : 0.f;
            dq[b] = 0.f;
        }
    }
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h),
                  nh = D.tok_off(n, h);
    const int dk = D.dk;
    float* S = cur + so;
    float* P = S + D.SS;
    float* dSs = dS + so;
    float* dP = dSs + D.SS;
    const V* v = v32 + vo;
    const float lm = lam[h], il = 1.f / lm;
    float k[DK], u[DK], g[DK], gu[DK], dg[DK], du[DK], dkk[DK];
    PMat<DK, 0, PREG> Pl;
#pragma unroll
    for (int b = 0; b < DK; b++) k[b] = b < dk ? Kn[kh + b] : 0.f;
    Pl.load(P, dk, lane);
    float gl = 0.f;
    if (UNWIND) {
        // gu = P k; a = k.gu; gamma = lam/(1-a); P_prev = lam P + gamma gu gu^T (rows: below)
        float a_ = 0.f;
#pragma unroll
        for (int a = 0; a < DK; a++) {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += Pl(a, b) * k[b];
            gu[a] = s;
            a_ += k[a] * s;
        }
        const float gm = lm / (1.f - a_);
        gl = gm / lm;
        Pl.update(gu, gu, lane, [&](float pv, float xa, float yb) { return lm * pv + gm * (xa * yb); });
    }
    // VJP quantities at the state before the write (S_prev rows, Pl = P_prev).
    float ku = 0.f;
#pragma unroll
    for (int a = 0; a < DK; a++) {
        float s = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) s += Pl(a, b) * k[b];
        u[a] = s;
        ku += k[a] * s;
    }
    const float gamma = lm + ku, ig = 1.f / gamma;
#pragma unroll
    for (int b = 0; b < DK; b++) {
        g[b] = u[b] * ig;
        dg[b] = 0.f;
        dkk[b] = 0.f;
    }
    float row[ROWS][DK], drow[ROWS][DK], vr[ROWS], dsr[ROWS], dxr[ROWS], ar[ROWS];
    batched_strided_loop<ROWS>(  // ROWS rows of this lane per step (kBwdRows)
        lane, D.dv, 32,
        [&](int i, int r) {
            load_row<DK>(S + (int64_t)r * dk, row[i], dk);
            load_row<DK>(dSs + (int64_t)r * dk, drow[i], dk);
            vr[i] = to_f(v[r]);
            dsr[i] = dsrc32 ? dsrc32[vo + r] : 0.f;
            dxr[i] = ar[i] = 0.f;
            if (READ) fused_read_bwd_in<T>(fr, D, h, vo, r, dxr[i], ar[i]);
        },
        [&](int i, int r) {
            if (READ) fused_read_bwd_row<T, DK>(fr, vo, r, dxr[i], ar[i], row[i], drow[i], q, dq);  // state after the write
            if (UNWIND) {  // S_prev = S - (gamma/lam)(v - S k) gu^T
                float s = 0.f;
#pragma unroll
                for (int b = 0; b < DK; b++) s += row[i][b] * k[b];
                const float e = (vr[i] - s) * gl;
#pragma unroll
                for (int b = 0; b < DK; b++) row[i][b] -= e * gu[b];
                store_row<DK>(S + (int64_t)r * dk, row[i], dk);
            }
            // e = v - S k, de = dS' g; dg += dS'^T e; dv += de; dk -= S^T de; dS_prev = dS' - de k^T
            float s = 0.f, t = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) {
                s += row[i][b] * k[b];
                t += drow[i][b] * g[b];
            }
            const float e = vr[i] - s;
#pragma unroll
            for (int b = 0; b < DK; b++) {
                dg[b] += drow[i][b] * e;
                dkk[b] -= row[i][b] * t;
                drow[i][b] -= t * k[b];
            }
            store_row<DK>(dSs + (int64_t)r * dk, drow[i], dk);
            dvacc[vo + r] = from_f<DV>(dsr[i] + t);
        });
    if (READ) fused_read_bwd_finish<T, DK>(fr, D, n, h, lane, q, dq);
#pragma unroll
    for (int b = 0; b < DK; b++) {
        dg[b] = warp_sum(dg[b]);
        dkk[b] = warp_sum(dkk[b]);
    }
    // P part: dP read by every lane (broadcast) into registers (DK <= PREG) or shared memory.
    PMat<DK, 1, PREG> dPl;
    dPl.load(dP, dk, lane);
    float dl = 0.f, uDu = 0.f;
#pragma unroll
    for (int a = 0; a < DK; a++) du[a] = 0.f;
    if constexpr (PMat<DK, 0, PREG>::kShared) {
        // one row a at a time: fully unrolled, the DK² shared loads of this loop stay in flight
        // and spill registers; u[a] by select, du[a]'s terms summed in a scalar (the same terms)
#pragma unroll 1
        for (int a = 0; a < DK; a++) {
            const float ua = reg_select<DK>(u, a);
            float dua = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) {
                const float dPab = dPl(a, b);
                const float Dp = dPab * il;
                const float Pn = (Pl(a, b) - ua * u[b] * ig) * il;
                dl -= dPab * Pn * il;
                dua -= Dp * u[b] * ig;
                du[b] -= Dp * ua * ig;
                uDu += ua * Dp * u[b];
            }
            reg_add<DK>(du, a, dua);
        }
    } else {
#pragma unroll
        for (int a = 0; a < DK; a++)
#pragma unroll
            for (int b = 0; b < DK; b++) {
                const float dPab = dPl(a, b);
                const float Dp = dPab * il;
                const float Pn = (Pl(a, b) - u[a] * u[b] * ig) * il;
                dl -= dPab * Pn * il;
                du[a] -= Dp * u[b] * ig;
                du[b] -= Dp * u[a] * ig;
                uDu += u[a] * Dp * u[b];
            }
    }
    float dgamma = uDu * ig * ig;
    float dgu = 0.f;
#pragma unroll
    for (int a = 0; a < DK; a++) {
        du[a] += dg[a] * ig;
        dgu += dg[a] * u[a];
    }
    dgamma -= dgu * ig * ig;
    dl += dgamma;
#pragma unroll
    for (int a = 0; a < DK; a++) {
        dkk[a] += dgamma * u[a];
        du[a] += dgamma * k[a];
    }
    if constexpr (PMat<DK, 0, PREG>::kShared) {
#pragma unroll 1
        for (int a = 0; a < DK; a++) {  // (same order of the sums as below)
            const float dua = reg_select<DK>(du, a);
#pragma unroll
            for (int b = 0; b < DK; b++) dkk[b] += Pl(a, b) * dua;
        }
    } else {
#pragma unroll
        for (int a = 0; a < DK; a++)
#pragma unroll
            for (int b = 0; b < DK; b++) dkk[b] += Pl(a, b) * du[a];
    }
    dPl.update(du, k, lane, [&](float pv, float xa, float yb) { return pv * il + xa * yb; });
    __syncwarp();
    if (UNWIND) Pl.store(P, dk, lane);
    dPl.store(dP, dk, lane);
    // L2n backward of the key gradient: dx = (dy - y (y.dy)) / nrm
    float yd = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) yd += k[b] * dkk[b];
    const float inv = 1.f / Knrm[nh];
#pragma unroll
    for (int b = 0; b < DK; b++) dkk[b] = (dkk[b] - k[b] * yd) * inv;
    store_vec_lanes<DK>(draw + kh, dkk, dk, lane);
    if (lane == 0) dtok[nh] = dl;
}
template <int DK, bool UNWIND, int PREG = kRegPMax, int ROWS = kBwdRows<DK>>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
unwind_vjp_rls_warp_kernel(Dims D, float* cur, float* dS, const float* Kn, const float* Knrm,
                         const float* v32, const float* lam, const float* dsrc32, float* dvacc,
                         float* draw, float* dtok) {
    unwind_vjp_rls_warp_body<DK, UNWIND, false, float, PREG, ROWS, float>(D, cur, dS, Kn, Knrm, v32, lam, dsrc32,
                                                                           dvacc, draw, dtok, FusedRead<float>{});
}
// Read i+1's backward, then the unwind + VJP of write i, in one pass over S, P, dS, dP (unwind mode
// and checkpoint segments; the state in cur is the one after write i). dsrc32 == nullptr: dvacc
// gets the write's own dv only (the caller adds dsrc once the read's GEMMs have updated it), as
// DV: fp32 where a GEMM accumulates into it, T where the row pass reads it (half the bytes; d_o is
// then rounded a second time in bf16, an error of about 2^-9 |dv| beside the fp32 path). The
// values v are read as stored (O_i, type T) and widened in registers.
template <typename T, int DK, int PREG = kRegPMax, int ROWS = kBwdRows<DK>, typename DV = float>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
read_bwd_unwind_vjp_rls_warp_kernel(Dims D, float* cur, float* dS, const float* Kn, const float* Knrm,
                                    const T* v, const float* lam, const float* dsrc32, DV* dvacc,
                                    float* draw, float* dtok, FusedRead<T> fr) {
    unwind_vjp_rls_warp_body<DK, true, true, T, PREG, ROWS, T, DV>(D, cur, dS, Kn, Knrm, v, lam, dsrc32, dvacc, draw,
                                                                   dtok, fr);
}

// Warp outer / delta write (forward): same math as outer_write / delta_write (in place on cur).
// delta: beta = β_max sigmoid(zraw + bb) -> beta.
// RECOMP: re-applies a stored write (k = raw = Kn, delta: beta read from beta), state only.
template <int RULE, int DK, bool RECOMP, bool READ, typename T, typename V>
__device__ inline void write_od_warp_body(Dims D, float* cur, const float* raw, float* Kn, float* Knrm,
                                          const V* v32, const float* lam, const float* zraw, const float* bb,
                                          float* beta, const FusedRead<T>& fr) {
    LDM_WARP_INDEX(D)
    float q[DK];
    if (READ) fused_read_q<T, DK>(fr, D, n, h, lane, q);
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), nh = D.tok_off(n, h);
    const int dk = D.dk;
    float k[DK];
#pragma unroll
    for (int b = 0; b < DK; b++) k[b] = b < dk ? raw[kh + b] : 0.f;
    float bt = 0.f;
    if (RECOMP) {
        if (RULE == kDelta) bt = beta[nh];
    } else {
        const float nrm = l2n_reg<DK>(k);
        store_vec_lanes<DK>(Kn + kh, k, dk, lane);
        if (RULE == kDelta) bt = kBetaMax * sigmoid(zraw[nh] + bb[h]);
        if (lane == 0) {
            Knrm[nh] = nrm;
            if (RULE == kDelta) beta[nh] = bt;
        }
    }
    float* S = cur + D.state_off(n, h);
    const V* v = v32 + vo;
    const float lm = lam[h];
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        const float vv = to_f(v[r]);
        if (RULE == kOuter) {
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] = lm * row[b] + vv * k[b];
        } else {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += row[b] * k[b];
            const float e = bt * (vv - s);
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] += e * k[b];
        }
        store_row<DK>(S + (int64_t)r * dk, row, dk);
        if (READ) {
            float rr = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) rr += row[b] * q[b];
            fr.x[vo + r] = from_f<T>(fr.a ? fr.src32[vo + r] + fr.a[h * D.dv + r] * rr : rr);
        }
    }
}
template <int RULE, int DK, bool RECOMP = false>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
write_od_warp_kernel(Dims D, float* cur, const float* raw, float* Kn, float* Knrm, const float* v32,
                   const float* lam, const float* zraw, const float* bb, float* beta) {
    write_od_warp_body<RULE, DK, RECOMP, false, float, float>(D, cur, raw, Kn, Knrm, v32, lam, zraw, bb, beta,
                                                              FusedRead<float>{});
}
// Outer / delta write i then read i+1 of the new state in the same pass (in place on cur); v as
// stored (O_i, type T).
template <int RULE, typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
write_read_od_warp_kernel(Dims D, float* cur, const float* raw, float* Kn, float* Knrm, const T* v,
                          const float* lam, const float* zraw, const float* bb, float* beta, FusedRead<T> fr) {
    write_od_warp_body<RULE, DK, false, true, T, T>(D, cur, raw, Kn, Knrm, v, lam, zraw, bb, beta, fr);
}

// Warp VJP of an outer / delta write at the state before it (UNWIND, outer only: first unwinds the
// row in place, S_prev = (S - v kᵀ)/λ). Same math as outer_write_vjp / delta_write_vjp; outputs
// as write_vjp_thread_kernel (dtok = dL/dλ for outer, dL/dz for delta).
template <int RULE, int DK, bool UNWIND, bool READ, typename T, typename V, typename DV = float>
__device__ inline void vjp_od_warp_body(Dims D, float* cur, float* dS, const float* Kn, const float* Knrm,
                                        const V* v32, const float* lam, const float* beta, const float* dsrc32,
                                        DV* dvacc, float* draw, float* dtok, const FusedRead<T>& fr) {
    LDM_WARP_INDEX(D)
    float q[DK], dq[DK];
    if (READ) {
#pragma unroll
        for (int b = 0; b < DK; b++) {
            q[b] = b < D.dk ? fr.Qn[D.key_off(n, h) + b] : 0.f;
            dq[b] = 0.f;
        }
    }
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h),
                  nh = D.tok_off(n, h);
    const int dk = D.dk;
    float* S = cur + so;
    float* dSs = dS + so;
    const V* v = v32 + vo;
    const float lm = lam[h], il = 1.f / lm;
    const float bt = RULE == kDelta ? beta[nh] : 0.f;
    float k[DK], dkk[DK];
#pragma unroll
    for (int b = 0; b < DK; b++) {
        k[b] = b < dk ? Kn[kh + b] : 0.f;
        dkk[b] = 0.f;
    }
    float dsc = 0.f;  // dλ (outer) or dβ (delta), this lane's rows
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK], G[DK];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        load_row<DK>(dSs + (int64_t)r * dk, G, dk);
        const float vv = to_f(v[r]);
        if (READ) {  // on the state after the write
            float dxr, ar;
            fused_read_bwd_in<T>(fr, D, h, vo, r, dxr, ar);
            fused_read_bwd_row<T, DK>(fr, vo, r, dxr, ar, row, G, q, dq);
        }
        if (UNWIND && RULE == kOuter) {
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] = (row[b] - vv * k[b]) * il;
            store_row<DK>(S + (int64_t)r * dk, row, dk);
        }
        float t = 0.f;
        if (RULE == kOuter) {
#pragma unroll
            for (int b = 0; b < DK; b++) {
                dsc += G[b] * row[b];
                t += G[b] * k[b];
                dkk[b] += G[b] * vv;
                G[b] = lm * G[b];
            }
            dvacc[vo + r] = from_f<DV>((dsrc32 ? dsrc32[vo + r] : 0.f) + t);
        } else {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) {
                s += row[b] * k[b];
                t += G[b] * k[b];
            }
            const float e = vv - s;
            dsc += e * t;
            const float de = bt * t;
#pragma unroll
            for (int b = 0; b < DK; b++) {
                dkk[b] += bt * G[b] * e - row[b] * de;
                G[b] -= de * k[b];
            }
            dvacc[vo + r] = from_f<DV>((dsrc32 ? dsrc32[vo + r] : 0.f) + de);
        }
        store_row<DK>(dSs + (int64_t)r * dk, G, dk);
    }
    if (READ) fused_read_bwd_finish<T, DK>(fr, D, n, h, lane, q, dq);
#pragma unroll
    for (int b = 0; b < DK; b++) dkk[b] = warp_sum(dkk[b]);
    dsc = warp_sum(dsc);
    float yd = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) yd += k[b] * dkk[b];
    const float inv = 1.f / Knrm[nh];
#pragma unroll
    for (int b = 0; b < DK; b++) dkk[b] = (dkk[b] - k[b] * yd) * inv;
    store_vec_lanes<DK>(draw + kh, dkk, dk, lane);
    if (lane == 0) dtok[nh] = RULE == kDelta ? dsc * bt * (1.f - bt / kBetaMax) : dsc;
}
template <int RULE, int DK, bool UNWIND>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
vjp_od_warp_kernel(Dims D, float* cur, float* dS, const float* Kn, const float* Knrm, const float* v32,
                 const float* lam, const float* beta, const float* dsrc32, float* dvacc, float* draw,
                 float* dtok) {
    vjp_od_warp_body<RULE, DK, UNWIND, false, float, float>(D, cur, dS, Kn, Knrm, v32, lam, beta, dsrc32, dvacc, draw,
                                                            dtok, FusedRead<float>{});
}
// Read i+1's backward, then the (outer: unwind +) VJP of write i, in one pass (see the rls one); v
// as stored (O_i, type T), dvacc as DV (the rls one's rule).
template <int RULE, typename T, int DK, bool UNWIND, typename DV = float>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
read_bwd_vjp_od_warp_kernel(Dims D, float* cur, float* dS, const float* Kn, const float* Knrm, const T* v,
                            const float* lam, const float* beta, const float* dsrc32, DV* dvacc, float* draw,
                            float* dtok, FusedRead<T> fr) {
    vjp_od_warp_body<RULE, DK, UNWIND, true, T, T, DV>(D, cur, dS, Kn, Knrm, v, lam, beta, dsrc32, dvacc, draw, dtok,
                                                       fr);
}

// Warp unwind of write i alone (cur: after -> before), rls / outer: same math as rls_unwind /
// outer_unwind. Used where the unwound state is compared (drift) before its VJP.
template <int RULE, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
unwind_warp_kernel(Dims D, float* cur, const float* Kn, const float* v32, const float* lam) {
    LDM_WARP_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h);
    const int dk = D.dk;
    float* S = cur + so;
    float* P = S + D.SS;
    const float* v = v32 + vo;
    const float lm = lam[h], il = 1.f / lm;
    float k[DK], g[DK];
#pragma unroll
    for (int b = 0; b < DK; b++) {
        k[b] = b < dk ? Kn[kh + b] : 0.f;
        g[b] = 0.f;
    }
    float gl = 0.f;
    if constexpr (RULE == kRls) {
        PMat<DK> Pl;
        Pl.load(P, dk, lane);
        float a_ = 0.f;
#pragma unroll
        for (int a = 0; a < DK; a++) {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += Pl(a, b) * k[b];
            g[a] = s;
            a_ += k[a] * s;
        }
        const float gm = lm / (1.f - a_);
        gl = gm / lm;
        Pl.update(g, g, lane, [&](float pv, float xa, float yb) { return lm * pv + gm * (xa * yb); });
        __syncwarp();
        Pl.store(P, dk, lane);
    }
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        if (RULE == kRls) {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += row[b] * k[b];
            const float e = (v[r] - s) * gl;
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] -= e * g[b];
        } else {
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] = (row[b] - v[r] * k[b]) * il;
        }
        store_row<DK>(S + (int64_t)r * dk, row, dk);
    }
}

// Warp read backward (rls/outer/delta alike): same outputs as read_bwd_thread_kernel except that dr32
// is not written (dr is formed in registers).
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
read_bwd_warp_kernel(Dims D, const float* cur, const float* Qn, const float* Qnrm, const T* dx,
                   const float* a, float* dS, float* draw, float* prod32) {
    LDM_WARP_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h);
    const int dk = D.dk;
    const float* S = cur + so;
    float* dSs = dS + so;
    float q[DK], dq[DK];
#pragma unroll
    for (int b = 0; b < DK; b++) {
        q[b] = b < dk ? Qn[kh + b] : 0.f;
        dq[b] = 0.f;
    }
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK], drow[DK];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        load_row<DK>(dSs + (int64_t)r * dk, drow, dk);
        const float dxr = to_f(dx[vo + r]);
        const float g = a ? a[h * D.dv + r] * dxr : dxr;
        float rr = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) {
            rr += row[b] * q[b];
            drow[b] += g * q[b];
            dq[b] += row[b] * g;
        }
        store_row<DK>(dSs + (int64_t)r * dk, drow, dk);
        if (a) prod32[vo + r] = dxr * rr;
    }
#pragma unroll
    for (int b = 0; b < DK; b++) dq[b] = warp_sum(dq[b]);
    float yd = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) yd += q[b] * dq[b];
    const float inv = 1.f / Qnrm[D.tok_off(n, h)];
#pragma unroll
    for (int b = 0; b < DK; b++) dq[b] = (dq[b] - q[b] * yd) * inv;
    store_vec_lanes<DK>(draw + kh, dq, dk, lane);
}


// ---- window mode, Woodbury form (spec §2.5; ldm_math.h window_*) --------------------------------
// Pending writes of the current window per (token, head) th = n·Hm + h (the CPU's layout):
//   Kt [N·Hm, w, dk], Lc [N·Hm, w, w], Et [N·Hm, w, dv] (thread path only). lamw = λ of the window's first
// write (lam + s·Hm, s = window start); m = this write's / the read's pending count.
constexpr int kWarpMaxWindow = 8;  // the warp path keeps per-write coefficients in small local arrays

// Append write i = s + m: k = L2n(raw) -> Kn, Knrm; K~/L rows (+ E~ row when WITH_ERR, which
// reads S once). One thread per (token, head).
template <bool WITH_ERR>
__global__ void window_append_kernel(Dims D, const float* cur, const float* raw, float* Kn,
                                        float* Knrm, const float* v32, const float* lamw, int m,
                                        int w, float* Kt, float* Et, float* Lc, float* scratch,
                                        int64_t scr_stride) {
    LDM_TH_INDEX(D)
    const int64_t kh = D.key_off(n, h), nh = D.tok_off(n, h);
    float* k = Kn + kh;
    Knrm[nh] = l2n_forward(raw + kh, k, D.dk);
    const float c = window_decay(lamw + h, m + 1, D.Hm);
    const float isc = 1.f / ldm_sqrt(c);
    const float* S = cur + D.state_off(n, h);
    float* u = scratch + t_ * scr_stride;
    if (WITH_ERR)
        window_append(S, S + D.SS, (const float*)k, v32 + D.val_off(n, h), isc, Kt + t_ * w * D.dk,
                      Et + t_ * w * D.dv, Lc + t_ * w * w, m, w, D.dv, D.dk, u);
    else
        window_append_key(S + D.SS, (const float*)k, isc, Kt + t_ * w * D.dk, Lc + t_ * w * w, m, w, D.dk, u);
}

// Read j with m > 0 pending writes (thread path): as read_thread_kernel plus r += E~ᵀ C_m⁻¹ K~ᵀ P q.
template <typename T>
__global__ void window_read_thread_kernel(Dims D, const float* cur, const float* raw, float* Qn,
                                      float* Qnrm, float* r32, const float* src32, const float* a,
                                      T* x, int m, int w, const float* Kt, const float* Et,
                                      const float* Lc, float* scratch, int64_t scr_stride) {
    LDM_TH_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h);
    float* q = Qn + kh;
    Qnrm[D.tok_off(n, h)] = l2n_forward(raw + kh, q, D.dk);
    float* r = r32 + vo;
    const float* S = cur + D.state_off(n, h);
    ldm_read(S, (const float*)q, r, D.dv, D.dk);
    window_read(S + D.SS, Kt + t_ * w * D.dk, Et + t_ * w * D.dv, Lc + t_ * w * w, m, w, (const float*)q, r,
                D.dv, D.dk, scratch + t_ * scr_stride);
    for (int c = 0; c < D.dv; c++)
        x[vo + c] = from_f<T>(a ? src32[vo + c] + a[h * D.dv + c] * r[c] : r[c]);
}

// Flush the window's m writes (thread path): window_flush on S, P.
__global__ void window_flush_thread_kernel(Dims D, float* cur, const float* lamw, int m, int w,
                                       const float* Kt, const float* Et, const float* Lc,
                                       float* scratch, int64_t scr_stride) {
    LDM_TH_INDEX(D)
    float* S = cur + D.state_off(n, h);
    const float c = window_decay(lamw + h, m, D.Hm);
    window_flush(S, S + D.SS, Kt + t_ * w * D.dk, Et + t_ * w * D.dv, Lc + t_ * w * w, m, w, c, D.dv,
                 D.dk, scratch + t_ * scr_stride);
}

// Read j with m (1..kWarpMaxWindow) pending writes, warp path (one warp per (token, head), no E~):
// z = C_m⁻¹ K~ᵀ P q and qeff = q − K~ z (every lane, redundantly, from global P, K~, L);
// x_r = src + a ⊙ (S_r · qeff + Σ_p z_p v~_p[r]) with v~_p = O_{s+p}[r]/sqrt(c_p) read from the
// saved write inputs O (T). One pass over S. Same outputs as read_warp_kernel.
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
window_read_warp_kernel(Dims D, const float* cur, const float* raw, float* Qn, float* Qnrm,
                      const float* src32, const float* a, T* x, int m, int w, const float* Kt,
                      const float* Lc, const T* O, int64_t ostride, const float* lamw) {
    LDM_WARP_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h);
    const int dk = D.dk;
    float q[DK];
#pragma unroll
    for (int b = 0; b < DK; b++) q[b] = b < dk ? raw[kh + b] : 0.f;
    const float nrm = l2n_reg<DK>(q);
    store_vec_lanes<DK>(Qn + kh, q, dk, lane);
    if (lane == 0) Qnrm[D.tok_off(n, h)] = nrm;
    const float* S = cur + D.state_off(n, h);
    const float* Ktp = Kt + t_ * w * dk;
    float z[kWarpMaxWindow], t[DK], qe[DK], isc[kWarpMaxWindow];
    window_solve(S + D.SS, Ktp, Lc + t_ * w * w, m, w, (const float*)q, z, t, dk);
    window_qeff(Ktp, (const float*)z, m, (const float*)q, qe, dk);
#pragma unroll
    for (int b = 0; b < DK; b++)
        if (b >= dk) qe[b] = 0.f;
    for (int p = 0; p < m; p++) isc[p] = 1.f / ldm_sqrt(window_decay(lamw + h, p + 1, D.Hm));
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        float s = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) s += row[b] * qe[b];
        for (int p = 0; p < m; p++) s += z[p] * (to_f(O[p * ostride + vo + r]) * isc[p]);
        x[vo + r] = from_f<T>(a ? src32[vo + r] + a[h * D.dv + r] * s : s);
    }
}

// Flush the window's m (1..kWarpMaxWindow) writes, warp path (one warp per (token, head), no E~): lane 0
// computes X = G^T and P <- (P - Xᵀ X)/c in place (window_flush_coef, X to this warp's
// scratch); then every lane updates its S rows: S_r += Σ_p (v~_p[r] − S_r · k~_p) X_p
// (window_flush_row). One pass over S (read + write) and P.
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
window_flush_warp_kernel(Dims D, float* cur, const float* lamw, int m, int w, const float* Kt,
                       const float* Lc, const T* O, int64_t ostride, float* scratch,
                       int64_t scr_stride) {
    LDM_WARP_INDEX(D)
    const int64_t vo = D.val_off(n, h);
    const int dk = D.dk;
    float* S = cur + D.state_off(n, h);
    const float* Ktp = Kt + t_ * w * dk;
    float* X = scratch + t_ * scr_stride;  // [m, dk]
    if (lane == 0) {
        const float c = window_decay(lamw + h, m, D.Hm);
        window_flush_coef((const float*)(S + D.SS), Ktp, Lc + t_ * w * w, m, w, c, X, S + D.SS, dk);
    }
    __syncwarp();  // X visible to every lane of the warp
    float Xr[kWarpMaxWindow * DK], Kr[kWarpMaxWindow * DK], isc[kWarpMaxWindow];
    for (int p = 0; p < m; p++) {
        isc[p] = 1.f / ldm_sqrt(window_decay(lamw + h, p + 1, D.Hm));
#pragma unroll
        for (int b = 0; b < DK; b++) {
            Xr[p * DK + b] = b < dk ? X[p * dk + b] : 0.f;
            Kr[p * DK + b] = b < dk ? Ktp[p * dk + b] : 0.f;
        }
    }
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK], vt[kWarpMaxWindow], e[kWarpMaxWindow];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        for (int p = 0; p < m; p++) vt[p] = to_f(O[p * ostride + vo + r]) * isc[p];
        window_flush_row(row, (const float*)Kr, (const float*)Xr, (const float*)vt, m, DK, e);
        store_row<DK>(S + (int64_t)r * dk, row, dk);
    }
}

#undef LDM_TH_INDEX
#undef LDM_WARP_INDEX

}  // namespace ldmk

// ---- memory accounting (doc/cuda.md "LDM kernels") -------------------------------------------

// States (each [N, ST] fp32) kept for backward besides the live one, with checkpoint interval
// ckpt (the configured --ldm-checkpoint-every, or the drift fallback's; same rule as the CPU):
// store D+1; unwind 0; checkpoint-every c: ceil((D+1)/c); window w: 0 (the backward unwinds) or,
// with c > 0 or after a drift fallback, the ceil((D+1)/w) window-start states.
inline int64_t ldm_gpu_kept_states(const ModelConfig& c, int ckpt) {
    const int64_t W = c.n_sublayers() + 1;
    if (c.ldm_mode == "window") return ckpt > 0 ? (W + c.ldm_window - 1) / c.ldm_window : 0;
    if (ckpt > 0) return (W + ckpt - 1) / ckpt;
    return c.ldm_mode == "unwind" ? 0 : W;
}
// Bytes of one LDM state (S and P over all heads, fp32) per token.
inline int64_t ldm_gpu_state_bytes(const ModelConfig& c) {
    const int64_t dv = c.d_model / c.ldm_heads, dk = c.ldm_dk;
    return 4 * c.ldm_heads * (dv * dk + (c.ldm_rule == "rls" ? dk * dk : 0));
}

}  // namespace gpu
}  // namespace ldm
