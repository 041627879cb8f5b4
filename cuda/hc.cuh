// cuda/hc.cuh — the kernels of HC (dynamic hyper-connections, spec §2.2) and mHC
// (manifold-constrained hyper-connections, spec §2.3), forward and backward; the scheme that drives
// them is GpuHC in train_gpt_baselines.cu. CPU reference: cpu/scheme_hc.*
// (the per-element math is the same LDM_HD code: hc_coef, mhc_gate, sinkhorn_forward/backward).
//
// State: n streams H_j [N, n, d] (type T, token-major, stream rows of d) for j = 0..D, the
// sublayer outputs o_j [N, d] (T) and, per sublayer, the raw coefficient projection
// P_j = H_{j-1}·W_jᵀ (fp32; HC: [N·n, n+2] = n²+2n per token, mHC: [N, 2n+n²]; rows padded to a
// multiple of 8 values, proj_ld) and the inverse
// RMS of H_{j-1} (fp32; HC per stream row [N, n], mHC per token [N]). The RMS normalisation of
// the projection input is folded into the coefficients: u = rstd·P (HC rows, mHC whole vec(H)),
// so the GEMM reads H directly and no normalised copy is ever written.
//
// Per sublayer j, forward (4 launches; 3 in bf16 for j > 1, where the post-mix formed P_j):
//   input_norm : GEMM P_j = H_{j-1} W_jᵀ (Matmul; HC over [N·n, d] rows, mHC over the flattened
//                [N, n·d]); per-token coefficients in fp32 (HC: A_m, A_r, B via tanh; mHC: sigmoid
//                gates and Sinkhorn-Knopp of Rt) into a scratch; fused pre-mix + RMSNorm_j:
//                x_j = Σ_i a_i H_i, xn = w ⊙ x_j · rstd.
//   output     : fused post-mix H_j[k] = Σ_i Mix[k,i] H_i + b_k o_j (each stream read and written
//                once), o_j stored, inverse RMS of the new rows for sublayer j+1. In bf16
//                (j < D) the same kernel also forms P_{j+1} on the tensor cores
//                (postmix_project_kernel), and input_norm(j+1) skips its GEMM. HC in bf16
//                (where it fits): output(j) is deferred, and one kernel in input_norm(j+1) also
//                forms its pre-mix + RMSNorm from the rows it keeps on chip (postmix_premix_kernel).
// Backward (recomputes the coefficients, Sinkhorn included, from the stored P_j; never stores the
// Sinkhorn iterates): output_backward writes dL/do_j and the n²+n coefficient dot products
// (at n <= 4 for j < D input_backward(j+1)'s combine kernel has written dL/do_j already, and
// input_backward(j) forms all n²+2n dots in one pass; coef_dots_kernel either way);
// input_backward adds the n pre-mix dot products, runs the per-token coefficient backward (fp32),
// reduces the small parameter gradients deterministically (per-token partials, fixed-order column
// sums), and one fused kernel writes dL/dH_{j-1} = Σ_k Mix[k,i] G_k + a_i dx + dZ_i − β_i H_i with
// dZ = dP·W_j formed inside it, never stored (hc_combine_kernel / mhc_combine_kernel: W_j's or
// Φ_j's columns in registers over tiles of tokens), which also accumulates the weight gradient
// dW_j += dPᵀ·H_{j-1} per token slice from the H values it reads (dw_slices_reduce_kernel adds the
// slices). The RMS backward's projection term β_i is a per-row scalar computed from dP and P, no
// d-sized pass.
//
// Parameters: the GEMM matrices (HC W_j [(n+2), d], mHC Φ_j [(2n+n²), n·d]) are read from the
// working copy (type T, like every backbone weight); the small controller parameters (HC s_a, s_b,
// A_m0, A_r0, B0; mHC a_*, b_*) from the fp32 master array, and all coefficient / Sinkhorn
// arithmetic is fp32 (spec §2.3: "φ, a, b and the mixing arithmetic stay fp32" — φ's master and
// its update are fp32; its GEMM operand is the T working copy, accumulation fp32).
// Parameter gradients are fp32 and accumulate (+=); no atomics anywhere (bit-identical run to run).
// The stream gradients dL/dH_j [N, n, d] are type T like the streams (bf16 in bf16 runs: half the
// bytes of the backward's widest tensors; every kernel does its arithmetic in fp32 and rounds once
// per store), the per-token coefficient gradients fp32.
// Supported stream counts: n ∈ {1, 2, 3, 4, 8} (ldm::Error otherwise).
#pragma once
#include <memory>
#include <type_traits>
#include <utility>

#include "core/config.h"
#include "cuda/common.cuh"
#include "cuda/cp_async.cuh"
#include "cuda/matmul.cuh"
#include "cuda/scheme.cuh"
#include "cpu/scheme_hc.h"
#include "math/sinkhorn.h"

namespace ldm {
namespace gpu {
namespace hc_detail {

constexpr int kThreads = 256;  // threads of the per-token kernels (one block per token)
// Channel steps per batch of the per-token kernels' loops (channels c, c + kThreads, ... of one
// thread, batched_strided_loop of cuda/common.cuh: every load of a batch before its first store),
// so a block keeps kSteps steps of loads in flight. Results do not depend on it (same expressions,
// channels in the same order). Fewer at n = 8, where the
// per-step registers are 2-4x larger (doc/cuda.md "HC/mHC/AttnRes kernels").
template <int NS>
constexpr int kSteps = NS <= 4 ? 2 : 1;

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sums of V per-thread values; every thread gets the totals in v. smem >= 32·V floats.
// Fixed reduction order (deterministic). Contains two __syncthreads.
template <int V>
__device__ inline void block_sums(float (&v)[V], float* smem) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int e = 0; e < V; e++) {
        float s = warp_sum(v[e]);
        if (lane == 0) smem[w * V + e] = s;
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < V; e++) {
        float s = 0.f;
        for (int k = 0; k < nw; k++) s += smem[k * V + e];
        v[e] = s;
    }
    __syncthreads();
}

// Coefficient scratch per token (fp32), CW = 2n + n² values: a [n] (pre-mix: HC A_m, mHC H_pre),
// Mix [n, n] (row k = output stream: HC A_r[i,k] at [k][i], mHC H_res[k,i]), b [n] (HC B, mHC
// H_post). The gradient scratch dcoef has the same layout.
LDM_HD inline int coef_width(int n) { return 2 * n + n * n; }

// Row stride (elements) of the projection P and of its gradient dP: the row length m rounded up to
// a multiple of 8 (16-byte aligned rows for the GEMMs; the padding columns are never read).
LDM_HD constexpr int proj_ld(int m) { return (m + 7) / 8 * 8; }

// H0[t, i, :] = e[t, :] for every stream; inverse RMS of the rows (HC: per row over d; mHC: per
// token over n·d). Grid N blocks.
template <typename T, int NS>
__global__ void begin_kernel(T* H0, float* rs0, const T* e, int d, float eps, bool per_row) {
    __shared__ float smem[32];
    const int64_t t = blockIdx.x;
    float ss[1] = {0.f};
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        const T v = e[t * d + c];
#pragma unroll
        for (int i = 0; i < NS; i++) H0[(t * NS + i) * d + c] = v;
        const float f = to_f(v);
        ss[0] += f * f;
    }
    block_sums<1>(ss, smem);
    if (threadIdx.x == 0) {
        if (per_row) {
            for (int i = 0; i < NS; i++) rs0[t * NS + i] = rms_scale(ss[0], d, eps);
        } else {
            rs0[t] = rms_scale(ss[0] * (float)NS, NS * d, eps);
        }
    }
}

// The pre-mix weight a_i of stream i of one token (HC: A_m[i], spec §2.2; mHC: H_pre[i], spec
// §2.3) from the raw projection p (HC: row i's column 0; mHC: column i) and the inverse RMS r of
// the projected row (HC: stream row i's; mHC: the token's); q = the sublayer's fp32 scalars as in
// hc_coef_kernel / mhc_coef_kernel (which use these same functions).
__device__ inline float hc_pre_weight(float p, float r, const float* q, int i) {
    return hc_coef(q[0], ldm_tanh(r * p), q[2 + i]);
}
__device__ inline float mhc_pre_weight(float p, float r, const float* q, int i) {
    return mhc_gate(1.f, q[0] * (r * p) + q[3 + i]);
}

// HC coefficients (spec §2.2) per token from P [N, n, n+2] (raw, row stride proj_ld(n+2)) and row rstd [N, n]; q = the
// sublayer's fp32 scalars (s_a, s_b, A_m0 [n], A_r0 [n,n], B0 [n]). One thread per token.
template <int NS>
__global__ void hc_coef_kernel(float* coef, const float* P, const float* rs, const float* q, int N) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= N) return;
    constexpr int L = proj_ld(NS + 2), CW = 2 * NS + NS * NS;
    const float s_a = q[0], s_b = q[1];
    const float* am0 = q + 2;
    const float* ar0 = am0 + NS;
    const float* b0 = ar0 + NS * NS;
    const float* Pt = P + t * NS * L;
    const float* r = rs + t * NS;
    float* ct = coef + t * CW;
    for (int i = 0; i < NS; i++) ct[i] = hc_pre_weight(Pt[i * L], r[i], q, i);
    for (int k = 0; k < NS; k++)
        for (int i = 0; i < NS; i++)
            ct[NS + k * NS + i] = hc_coef(s_a, ldm_tanh(r[i] * Pt[i * L + 1 + k]), ar0[i * NS + k]);
    for (int k = 0; k < NS; k++) ct[NS + NS * NS + k] = hc_coef(s_b, ldm_tanh(r[k] * Pt[k * L + NS + 1]), b0[k]);
}

// mHC coefficients (spec §2.3) per token from P [N, 2n+n²] (raw: pre, post, res) and rstd [N];
// q = (a_pre, a_post, a_res, b_pre [n], b_post [n], b_res [n,n]) fp32. H_res by Sinkhorn-Knopp
// (iters column+row normalisations) in fp32; work [N, ws] per-token scratch (ws =
// sinkhorn_work_size(n, iters) + 2n²). One thread per token.
template <int NS>
__global__ void mhc_coef_kernel(float* coef, float* work, const float* P, const float* rs,
                                const float* q, int N, int iters, int ws) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= N) return;
    constexpr int L = proj_ld(2 * NS + NS * NS), CW = 2 * NS + NS * NS, nn = NS * NS;
    const float a_post = q[1], a_res = q[2];
    const float* b_post = q + 3 + NS;  // (after a_pre, a_post, a_res, b_pre)
    const float* b_res = b_post + NS;
    const float r = rs[t];
    const float* Pt = P + t * L;
    float* ct = coef + t * CW;
    float* w = work + t * ws;
    float* Rt = w + sinkhorn_work_size(NS, iters);
    float* Hres = Rt + nn;
    for (int i = 0; i < NS; i++) ct[i] = mhc_pre_weight(Pt[i], r, q, i);
    for (int k = 0; k < NS; k++) ct[NS + nn + k] = mhc_gate(2.f, a_post * (r * Pt[NS + k]) + b_post[k]);
    for (int e = 0; e < nn; e++) Rt[e] = a_res * (r * Pt[2 * NS + e]) + b_res[e];
    sinkhorn_forward(Rt, NS, iters, Hres, w);
    for (int e = 0; e < nn; e++) ct[NS + e] = Hres[e];
}

// Fused pre-mix + RMSNorm: x[t] = Σ_i a_i H[t, i] (rounded to T), rstd[t] = 1/sqrt(mean(x²)+eps)
// of the rounded x, xn[t] = w ⊙ (x · rstd). xn == nullptr: x only. Grid N blocks.
template <typename T, int NS>
__global__ void premix_norm_kernel(T* x, T* xn, float* rstd, const T* H, const float* coef,
                                   const T* w, int d, float eps) {
    __shared__ float smem[32];
    const int64_t t = blockIdx.x;
    constexpr int CW = 2 * NS + NS * NS;
    float a[NS];
#pragma unroll
    for (int i = 0; i < NS; i++) a[i] = coef[t * CW + i];
    const T* Ht = H + t * NS * d;
    T* xt = x + t * d;
    float ss[1] = {0.f};
    constexpr int U = kSteps<NS>;
    float h[U][NS];
    batched_strided_loop<U>(
        threadIdx.x, d, blockDim.x,
        [&](int u, int c) {
#pragma unroll
            for (int i = 0; i < NS; i++) h[u][i] = to_f(Ht[(int64_t)i * d + c]);
        },
        [&](int u, int c) {
            float v = 0.f;  // explicit FMAs: the same rounding whatever the compiler contracts
#pragma unroll
            for (int i = 0; i < NS; i++) v = fmaf(a[i], h[u][i], v);
            const T xv = from_f<T>(v);
            xt[c] = xv;
            const float f = to_f(xv);
            ss[0] += f * f;
        });
    if (xn == nullptr) return;
    block_sums<1>(ss, smem);
    const float s = rms_scale(ss[0], d, eps);
    if (threadIdx.x == 0) rstd[t] = s;
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        xn[t * d + c] = from_f<T>(to_f(w[c]) * (to_f(xt[c]) * s));
}

// One value of the post-mix (spec §2.2, §2.3) of output stream k: b_k·o + Σ_i Mix[k, i]·h_i, in
// that order, fp32 (mix_k = row k of Mix, h = the n input streams' values at one channel). Every
// post-mix kernel forms its values with this function.
template <int NS>
LDM_HD inline float postmix_value(const float* mix_k, float b_k, float o, const float (&h)[NS]) {
    float v = b_k * o;
    for (int i = 0; i < NS; i++) v += mix_k[i] * h[i];  // (NS is a constant: the device compiler unrolls it)
    return v;
}

// Fused post-mix: Hn[t, k] = Σ_i Mix[k,i] H[t, i] + b_k o[t] for every stream (each stream read
// and written once), ocopy[t] = o[t] (unless ocopy is nullptr: o is already kept), and the inverse RMS of the new (rounded) rows into rsn
// (per row [N, n] or per token [N]). Grid N blocks.
template <typename T, int NS>
__global__ void postmix_kernel(T* Hn, float* rsn, T* ocopy, const T* H, const T* o,
                               const float* coef, int d, float eps, bool per_row) {
    __shared__ float smem[32 * NS];
    const int64_t t = blockIdx.x;
    constexpr int CW = 2 * NS + NS * NS;
    float mix[NS * NS], b[NS], ss[NS];
#pragma unroll
    for (int e = 0; e < NS * NS; e++) mix[e] = coef[t * CW + NS + e];
#pragma unroll
    for (int k = 0; k < NS; k++) {
        b[k] = coef[t * CW + NS + NS * NS + k];
        ss[k] = 0.f;
    }
    const T* Ht = H + t * NS * d;
    T* Hnt = Hn + t * NS * d;
    constexpr int U = kSteps<NS>;
    T ov[U];
    float h[U][NS];
    batched_strided_loop<U>(
        threadIdx.x, d, blockDim.x,
        [&](int u, int c) {
            ov[u] = o[t * d + c];
#pragma unroll
            for (int i = 0; i < NS; i++) h[u][i] = to_f(Ht[(int64_t)i * d + c]);
        },
        [&](int u, int c) {
            if (ocopy) ocopy[t * d + c] = ov[u];
            const float of = to_f(ov[u]);
#pragma unroll
            for (int k = 0; k < NS; k++) {
                const T hv = from_f<T>(postmix_value<NS>(mix + k * NS, b[k], of, h[u]));
                Hnt[(int64_t)k * d + c] = hv;
                const float f = to_f(hv);
                ss[k] += f * f;
            }
        });
    block_sums<NS>(ss, smem);
    if (threadIdx.x == 0) {
        if (per_row) {
            for (int k = 0; k < NS; k++) rsn[t * NS + k] = rms_scale(ss[k], d, eps);
        } else {
            float tot = 0.f;
            for (int k = 0; k < NS; k++) tot += ss[k];
            rsn[t] = rms_scale(tot, NS * d, eps);
        }
    }
}

// Stages W consecutive coefficients from offset off of the coefficient rows (coef_width(NS) floats
// per token) of tokens t0 .. t0 + rows − 1 into dst [rows, W] (fp32), by the block's nthr threads
// (this one: tid); the caller synchronises before reading dst. TAIL: rows of tokens ≥ N are
// zeros; else the caller guarantees t0 + rows ≤ N (no test per element: in the combine kernels
// that test cost a spill).
template <int NS, int W, bool TAIL>
__device__ inline void stage_coef(float* dst, const float* coef, int64_t t0, int rows, int off, int64_t N, int tid,
                                  int nthr) {
    constexpr int CW = 2 * NS + NS * NS;
    for (int e = tid; e < rows * W; e += nthr) {
        const int64_t t = t0 + e / W;
        dst[e] = !TAIL || t < N ? coef[t * CW + off + e % W] : 0.f;
    }
}

struct alignas(8) Bf16x4 {  // four consecutive bf16 (8-byte loads and stores)
    bf16 v[4];
};

// ---- Post-mix fused with the next sublayer's projection (bf16; doc/cuda.md "HC/mHC") ----
// postmix_project_kernel writes what postmix_kernel writes (H_j, its inverse RMS, the o copy) and
// also the next sublayer's raw projection P_{j+1}, which its GEMM would compute by reading H_j
// back: the rows it has just rounded to bf16 are staged in shared memory and multiplied by the
// next weight on the tensor cores (mma.sync m16n8k16, fp32 accumulation). mHC (PER_ROW false):
// P[t] = vec(H_j[t])·Φᵀ, R = 2n + n² outputs per token over K = n·d; HC (PER_ROW true):
// P[t, k] = H_j[t, k]·Wᵀ, R = n + 2 outputs per stream row over K = d.
// A block takes kPpTokens tokens and walks the channels in chunks of C = kPpChannels<NS>.
constexpr int kPpTokens = 64;    // tokens per block (mHC: 4 m-tiles of 16 tokens; HC: 4·n of 16 rows)
constexpr int kPpThreads = 256;  // 8 warps
template <int NS>
constexpr int kPpChannels = NS <= 2 ? 64 : (NS <= 4 ? 32 : 16);  // n·C = 64 .. 128
// The kernel's shapes: R outputs per projected row, RP = proj_ld(R) (the mma's n-tiles of 8), the
// A tile's row stride LDA (one token's n·C values + 8) and the weight tile's K and stride LDB.
template <int NS, bool PER_ROW>
struct PpShape {
    static constexpr int C = kPpChannels<NS>, R = PER_ROW ? NS + 2 : 2 * NS + NS * NS, RP = proj_ld(R);
    static constexpr int LDA = NS * C + 8, KB = PER_ROW ? C : NS * C, LDB = KB + 8;
    static constexpr int MC = NS * NS + NS;  // mixing coefficients per token: Mix then b
    static constexpr size_t tiles = ((size_t)kPpTokens * LDA + (size_t)RP * LDB) * sizeof(bf16);
    static constexpr size_t red = PER_ROW ? 0 : (size_t)4 * 32 * (RP / 2) * sizeof(float);  // mHC's k-halves
    static constexpr size_t rss_offset = tiles > red ? tiles : red;
    static constexpr size_t rss_floats = (size_t)kPpTokens * (C / 4) * (PER_ROW ? NS : 1);  // squares per slot
    static constexpr size_t coef_offset = rss_offset + rss_floats * sizeof(float);
    // dynamic shared memory (bytes): A tile [kPpTokens, LDA] and weight tile [RP, LDB] (bf16; mHC:
    // after the last chunk the second k-half's products take their place), the squares' sums per
    // (token, 4-channel group[, stream]) slot, the block's mixing coefficients [kPpTokens, MC] (fp32)
    static constexpr size_t smem = coef_offset + (size_t)kPpTokens * MC * sizeof(float);
};

// Fused post-mix and projection, T = bf16: for tokens t < N, Hn[t, k] = Σ_i Mix[k,i] H[t, i] +
// b_k o[t] (postmix_value, rounded to bf16), ocopy[t] = o[t] (unless null),
// rsn = inverse RMS of the new rows (HC per row [N, n] over d, mHC per token [N] over n·d), and
// P = the next projection of the rounded rows (fp32, row stride ldp; padding columns not written):
// mHC P[t, r] = Σ_e vec(Hn[t])_e W[r, e] (W = Φ [R, n·d]), HC P[t·n + k, r] = Σ_c Hn[t, k, c]
// W[r, c] (W [R, d]). H, Hn [N, n, d]; o, ocopy [N, d]; coef: the coefficient scratch
// (coef_width). Requires d % 4 == 0 and H, Hn, o, ocopy 8-byte aligned (8-byte row accesses; W
// may have any alignment). Grid ceil(N / kPpTokens), kPpThreads threads, PpShape<NS, PER_ROW>::smem
// bytes of dynamic shared memory. The products are exact in fp32; the sums run in the mma's order
// (each warp's k-steps in order; mHC: the two k-halves of the block added at the end), not the
// GEMM's. A thread takes U (token, 4-channel group) slots of a chunk, every load before its stores.
template <int NS, bool PER_ROW>
__global__ void __launch_bounds__(kPpThreads, 2) postmix_project_kernel(bf16* Hn, float* rsn, float* P, bf16* ocopy,
                                                                   const bf16* H, const bf16* o, const float* coef,
                                                                   const bf16* W, int N, int d, int ldp, float eps) {
    using S = PpShape<NS, PER_ROW>;
    constexpr int C = S::C, R = S::R, NT = S::RP / 8, LDA = S::LDA, KB = S::KB, LDB = S::LDB, MC = S::MC;
    constexpr int G = C / 4;                        // 4-channel groups per token and chunk
    constexpr int U = kPpTokens * G / kPpThreads;   // (token, group) slots per thread and chunk
    [[maybe_unused]] constexpr int KU = NS <= 4 ? NS : 1;  // output streams unrolled (n = 8 unrolled spills)
    constexpr int KS = KB / 16;                     // k-steps per chunk and projected row
    // mHC: warp (m-tile, k-half) over 4 m-tiles of 16 tokens; HC: the 4·n m-tiles of 16 stream rows
    // (row m = token m / n, stream m % n) dealt to the 8 warps in turn, all k-steps each
    constexpr int MTW = PER_ROW ? (4 * NS + 7) / 8 : 1;  // m-tiles per warp
    static_assert(KB % 16 == 0 && (PER_ROW || KS % 2 == 0), "whole k-steps (mHC: an even number)");
    static_assert(C % 4 == 0 && kPpTokens * G % kPpThreads == 0, "whole slots per thread");
    extern __shared__ __align__(16) unsigned char pp_smem[];
    bf16* sA = reinterpret_cast<bf16*>(pp_smem);
    bf16* sB = sA + kPpTokens * LDA;
    float* racc = reinterpret_cast<float*>(pp_smem);  // mHC, after the last chunk: [4 m-tiles][32 lanes][NT·4]
    float* rss = reinterpret_cast<float*>(pp_smem + S::rss_offset);   // [kPpTokens·C (·n)]
    float* sc = reinterpret_cast<float*>(pp_smem + S::coef_offset);  // [kPpTokens, MC]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gr = lane >> 2, tg = lane & 3;
    const int64_t t0 = (int64_t)blockIdx.x * kPpTokens;
    stage_coef<NS, MC, true>(sc, coef, t0, kPpTokens, NS, N, tid, kPpThreads);  // Mix, then b
    for (int e = tid; e < (int)S::rss_floats; e += kPpThreads) rss[e] = 0.f;  // (before the first chunk's barrier)
    float acc[MTW][NT][4] = {};  // (fp32 mma accumulators)
    const int64_t wld = PER_ROW ? d : (int64_t)NS * d;  // W's row length
    for (int c0 = 0; c0 < d; c0 += C) {
        __syncthreads();  // (the coefficients staged; the previous chunk's tiles read)
        for (int e = tid; e < S::RP * KB; e += kPpThreads) {  // W's chunk: column kk = i·C + cc (mHC) or cc (HC)
            const int r = e / KB, kk = e % KB, i = kk / C, c = c0 + kk % C;
            sB[r * LDB + kk] = (r < R && c < d) ? W[r * wld + (int64_t)i * d + c] : __float2bfloat16_rn(0.f);
        }
        // the post-mix of the chunk: slot idx = tid + u·kPpThreads is (token idx / G, channels
        // 4·(idx % G) .. +3 of the chunk); all U slots' loads before their stores
        Bf16x4 ov[U], hv[U][NS];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int idx = tid + u * kPpThreads, c = c0 + 4 * (idx % G);
            const int64_t t = t0 + idx / G;
            if (t < N && c < d) {  // (d % 4 == 0: a group is wholly in or out)
                ov[u] = *reinterpret_cast<const Bf16x4*>(o + t * d + c);
#pragma unroll
                for (int i = 0; i < NS; i++) hv[u][i] = *reinterpret_cast<const Bf16x4*>(H + (t * NS + i) * d + c);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    ov[u].v[e] = __float2bfloat16_rn(0.f);
#pragma unroll
                    for (int i = 0; i < NS; i++) hv[u][i].v[e] = __float2bfloat16_rn(0.f);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int idx = tid + u * kPpThreads, tt = idx / G, cc = 4 * (idx % G), c = c0 + cc;
            const int64_t t = t0 + tt;
            const bool in = t < N && c < d;
            if (in && ocopy) *reinterpret_cast<Bf16x4*>(ocopy + t * d + c) = ov[u];
            const float* mix = sc + tt * MC;
            float sq = 0.f;
#pragma unroll KU
            for (int k = 0; k < NS; k++) {
                Bf16x4 out;
                float sqk = 0.f;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float hf[NS];
#pragma unroll
                    for (int i = 0; i < NS; i++) hf[i] = __bfloat162float(hv[u][i].v[e]);
                    const float v = postmix_value<NS>(mix + k * NS, mix[NS * NS + k], __bfloat162float(ov[u].v[e]), hf);
                    out.v[e] = in ? __float2bfloat16_rn(v) : __float2bfloat16_rn(0.f);
                    const float f = __bfloat162float(out.v[e]);
                    if constexpr (PER_ROW) sqk += f * f;
                    else sq += f * f;
                }
                if (in) *reinterpret_cast<Bf16x4*>(Hn + (t * NS + k) * d + c) = out;
                *reinterpret_cast<Bf16x4*>(sA + tt * LDA + k * C + cc) = out;
                if constexpr (PER_ROW) rss[idx * NS + k] += sqk;
            }
            if constexpr (!PER_ROW) rss[idx] += sq;
        }
        __syncthreads();
        // P += A·Wᵀ over the chunk
#pragma unroll
        for (int m = 0; m < MTW; m++) {
            const int mt = PER_ROW ? warp + 8 * m : (warp & 3);
            if (PER_ROW && mt >= 4 * NS) continue;  // (warp-uniform)
            // this lane's A rows gr and gr + 8 of the m-tile
            const bf16* ar0 = PER_ROW ? sA + ((mt * 16 + gr) / NS) * LDA + ((mt * 16 + gr) % NS) * C
                                      : sA + (mt * 16 + gr) * LDA;
            const bf16* ar8 = PER_ROW ? sA + ((mt * 16 + gr + 8) / NS) * LDA + ((mt * 16 + gr + 8) % NS) * C
                                      : ar0 + 8 * LDA;
#pragma unroll
            for (int ks = PER_ROW ? 0 : (warp >> 2); ks < KS; ks += PER_ROW ? 1 : 2) {
                const int k0 = ks * 16 + 2 * tg;
                const uint32_t a[4] = {ld_pair(ar0 + k0), ld_pair(ar8 + k0), ld_pair(ar0 + k0 + 8), ld_pair(ar8 + k0 + 8)};
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const bf16* b0 = sB + (nt * 8 + gr) * LDB + k0;
                    const uint32_t b[2] = {ld_pair(b0), ld_pair(b0 + 8)};
                    mma_16816(acc[m][nt], a, b);
                }
            }
        }
    }
    __syncthreads();  // the tiles are free (mHC: the second k-half's products take their place)
    if constexpr (PER_ROW) {
#pragma unroll
        for (int m = 0; m < MTW; m++) {
            const int mt = warp + 8 * m;
            if (mt >= 4 * NS) continue;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int64_t row = t0 * NS + mt * 16 + gr + (e >= 2 ? 8 : 0);  // = t·n + k
                    const int col = nt * 8 + 2 * tg + (e & 1);
                    if (row < (int64_t)N * NS && col < R) P[row * ldp + col] = acc[m][nt][e];
                }
        }
        for (int e = tid; e < kPpTokens * NS; e += kPpThreads) {  // (token e / n, stream e % n)
            const int tt = e / NS, k = e % NS;
            if (t0 + tt >= N) continue;
            float tot = 0.f;
            for (int g = 0; g < G; g++) tot += rss[(tt * G + g) * NS + k];
            rsn[(t0 + tt) * NS + k] = rms_scale(tot, d, eps);
        }
    } else {
        const int mt = warp & 3, kh = warp >> 2;
        if (kh == 1) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) racc[(mt * 32 + lane) * NT * 4 + nt * 4 + e] = acc[0][nt][e];
        }
        __syncthreads();
        if (kh == 0) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float v = acc[0][nt][e] + racc[(mt * 32 + lane) * NT * 4 + nt * 4 + e];
                    const int64_t t = t0 + mt * 16 + gr + (e >= 2 ? 8 : 0);
                    const int col = nt * 8 + 2 * tg + (e & 1);
                    if (t < N && col < R) P[t * ldp + col] = v;
                }
        }
        if (tid < kPpTokens && t0 + tid < N) {
            float tot = 0.f;
            for (int g = 0; g < G; g++) tot += rss[tid * G + g];
            rsn[t0 + tid] = rms_scale(tot, NS * d, eps);
        }
    }
}

// ---- Post-mix, next projection and next pre-mix + RMSNorm in one kernel (bf16; doc/cuda.md "HC/mHC") ----
// postmix_premix_kernel writes what postmix_project_kernel writes (H_j, its inverse RMS, the o
// copy, P_{j+1}) and also what premix_norm_kernel writes for sublayer j+1 (x_{j+1}, its rstd and
// xn_{j+1}), which read H_j back once more: a block keeps the whole rounded rows H_j of its M
// tokens in shared memory until their projection, and so their pre-mix weights, are known. Only
// the pre-mix weights a_i of sublayer j+1 are formed here (the other coefficients, mHC's Sinkhorn
// among them, are not needed before output(j+1); the coefficient kernel makes all of them, a_i
// with the same expression). Layout of the staged rows: [M·n rows (token, stream), LDH] bf16, a
// row's d channels then zeros up to DP = d rounded up to 16 (whole k-steps), then 8 more elements
// (a bank offset between rows, so the mma's A-fragment loads are conflict-free).
constexpr int kPnThreads = 256;  // 8 warps
template <bool PER_ROW>
constexpr int kPnTokens = PER_ROW ? 8 : 16;  // tokens per block (HC: 8·n projected rows; mHC: 16)
template <int NS, bool PER_ROW>
struct PnShape {
    static constexpr int M = kPnTokens<PER_ROW>, R = PER_ROW ? NS + 2 : 2 * NS + NS * NS, RP = proj_ld(R);
    static constexpr int NT = RP / 8, ROWS = PER_ROW ? M * NS : M, MT = (ROWS + 15) / 16;  // mma n-, m-tiles
    static constexpr int MC = NS * NS + NS;  // mixing coefficients per token of sublayer j: Mix then b
    static constexpr size_t red_floats = (size_t)8 * MT * 16 * RP;  // the 8 warps' partial P
    LDM_HD static int dp(int d) { return (d + 15) / 16 * 16; }
    LDM_HD static int ldh(int d) { return dp(d) + 8; }
    LDM_HD static size_t red_offset(int d) { return ((size_t)M * NS * ldh(d) * sizeof(bf16) + 15) / 16 * 16; }
    // dynamic shared memory (bytes): the rows, the warps' partial P (warp 0's slot then holds the
    // block's P), Mix and b of sublayer j [M, MC], the pre-mix weights [M, n] and the inverse RMS
    // of the new rows [M, n] (mHC: [M])
    LDM_HD static size_t smem(int d) { return red_offset(d) + (red_floats + (size_t)M * MC + 2 * (size_t)M * NS) * sizeof(float); }
};
// Two bf16 as one mma operand register (the first in the low half), from any address.
__device__ __forceinline__ uint32_t pack_pair(bf16 lo, bf16 hi) {
    uint16_t l, h;
    memcpy(&l, &lo, 2);
    memcpy(&h, &hi, 2);
    return (uint32_t)l | (uint32_t)h << 16;
}

// Fused post-mix of sublayer j, projection of sublayer j+1 and its pre-mix + RMSNorm, T = bf16:
// Hn, rsn, ocopy and P as postmix_project_kernel (the same expressions and roundings; P's sums in
// another order), then for tokens t < N the pre-mix weights a_i of sublayer j+1 (hc_pre_weight /
// mhc_pre_weight of P and rsn, q = that sublayer's fp32 scalars as in hc_coef_kernel /
// mhc_coef_kernel), x[t] = Σ_i a_i Hn[t, i] (explicit FMAs in i order, rounded to bf16),
// rstd[t] = rms_scale of the rounded x (eps_n), xn[t] = wn ⊙ (x · rstd) (unless xn is null: x
// only, as premix_norm_kernel). Requires d % 4 == 0 and H, Hn, o, ocopy, x, xn 8-byte aligned
// (8-byte row accesses; W and wn may have any alignment). W: HC [R, d], mHC
// [R, n·d]. Grid ceil(N / M), kPnThreads threads, PnShape::smem(d) bytes of dynamic shared memory.
// A warp takes a token at a time, its lanes 4 channels each (loads of U groups before their
// stores); the projection's k-steps are dealt to the 8 warps and their partials added in warp order.
template <int NS, bool PER_ROW>
__global__ void __launch_bounds__(kPnThreads, PER_ROW && NS <= 4 ? 3 : 2) postmix_premix_kernel(
    bf16* Hn, float* rsn, float* P, bf16* ocopy, bf16* x, bf16* xn, float* rstd, const bf16* H, const bf16* o,
    const float* coef, const bf16* W, const float* q, const bf16* wn, int N, int d, int ldp, float eps, float eps_n) {
    using S = PnShape<NS, PER_ROW>;
    constexpr int M = S::M, R = S::R, RP = S::RP, NT = S::NT, MT = S::MT, ROWS = S::ROWS, MC = S::MC;
    constexpr int U = NS <= 4 ? 2 : 1;
    const int DP = S::dp(d), LDH = DP + 8;
    extern __shared__ __align__(16) unsigned char pn_smem[];
    bf16* sH = reinterpret_cast<bf16*>(pn_smem);
    float* red = reinterpret_cast<float*>(pn_smem + S::red_offset(d));
    float* sc = red + S::red_floats;
    float* sa = sc + M * MC;
    float* sr = sa + M * NS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gr = lane >> 2, tg = lane & 3;
    const int64_t t0 = (int64_t)blockIdx.x * M;
    stage_coef<NS, MC, true>(sc, coef, t0, M, NS, N, tid, kPnThreads);  // Mix, then b
    for (int e = tid; e < M * NS * (DP - d); e += kPnThreads)  // the k-steps' padding channels
        sH[(e / (DP - d)) * LDH + d + e % (DP - d)] = __float2bfloat16_rn(0.f);
    __syncthreads();
    // 1. post-mix (rows of tokens >= N are staged as zeros)
    for (int tt = warp; tt < M; tt += 8) {
        const int64_t t = t0 + tt;
        const bool tok = t < N;  // (warp-uniform)
        const float* mix = sc + tt * MC;
        float ss[NS];
#pragma unroll
        for (int k = 0; k < NS; k++) ss[k] = 0.f;
        for (int g0 = 0; g0 < d; g0 += 128 * U) {
            Bf16x4 ov[U], hv[U][NS];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = g0 + 128 * u + 4 * lane;
                if (tok && c < d) {
                    ov[u] = *reinterpret_cast<const Bf16x4*>(o + t * d + c);
#pragma unroll
                    for (int i = 0; i < NS; i++) hv[u][i] = *reinterpret_cast<const Bf16x4*>(H + (t * NS + i) * d + c);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        ov[u].v[e] = __float2bfloat16_rn(0.f);
#pragma unroll
                        for (int i = 0; i < NS; i++) hv[u][i].v[e] = __float2bfloat16_rn(0.f);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = g0 + 128 * u + 4 * lane;
                if (c >= d) continue;
                if (tok && ocopy) *reinterpret_cast<Bf16x4*>(ocopy + t * d + c) = ov[u];
#pragma unroll
                for (int k = 0; k < NS; k++) {
                    Bf16x4 out;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float hf[NS];
#pragma unroll
                        for (int i = 0; i < NS; i++) hf[i] = __bfloat162float(hv[u][i].v[e]);
                        out.v[e] = __float2bfloat16_rn(
                            postmix_value<NS>(mix + k * NS, mix[NS * NS + k], __bfloat162float(ov[u].v[e]), hf));
                        const float f = __bfloat162float(out.v[e]);
                        ss[k] += f * f;
                    }
                    if (tok) *reinterpret_cast<Bf16x4*>(Hn + (t * NS + k) * d + c) = out;
                    *reinterpret_cast<Bf16x4*>(sH + (tt * NS + k) * LDH + c) = out;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < NS; k++) ss[k] = warp_sum(ss[k]);
        if (lane == 0) {
            if constexpr (PER_ROW) {
#pragma unroll
                for (int k = 0; k < NS; k++) {
                    const float r = rms_scale(ss[k], d, eps);
                    sr[tt * NS + k] = r;
                    if (tok) rsn[t * NS + k] = r;
                }
            } else {
                float tot = 0.f;
#pragma unroll
                for (int k = 0; k < NS; k++) tot += ss[k];
                const float r = rms_scale(tot, NS * d, eps);
                sr[tt] = r;
                if (tok) rsn[t] = r;
            }
        }
    }
    __syncthreads();
    // 2. P = A·Wᵀ: mHC A rows = tokens over K = n·DP (stream by stream), HC A rows = (token,
    // stream) over K = DP; warp w takes the k-steps w, w + 8, ... for every m-tile
    const int KSR = DP / 16, KS = PER_ROW ? KSR : NS * KSR;
    const int64_t wld = PER_ROW ? d : (int64_t)NS * d;
    float acc[MT][NT][4] = {};  // (fp32 mma accumulators)
    for (int ks = warp; ks < KS; ks += 8) {
        const int i = PER_ROW ? 0 : ks / KSR, ca = (ks % KSR) * 16 + 2 * tg;
        uint32_t b[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int r = nt * 8 + gr;
            const bf16* wr = W + r * wld + (int64_t)i * d;  // (a sublayer's W need not be 4-byte aligned)
            b[nt][0] = r < R && ca < d ? pack_pair(wr[ca], wr[ca + 1]) : 0u;  // (ca even, d even: ca + 1 < d too)
            b[nt][1] = r < R && ca + 8 < d ? pack_pair(wr[ca + 8], wr[ca + 9]) : 0u;
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const int r0 = m * 16 + gr, r8 = r0 + 8;
            const bf16* a0 = sH + (PER_ROW ? r0 : r0 * NS + i) * LDH + ca;
            const bf16* a8 = sH + (PER_ROW ? r8 : r8 * NS + i) * LDH + ca;
            const uint32_t a[4] = {r0 < ROWS ? ld_pair(a0) : 0u, r8 < ROWS ? ld_pair(a8) : 0u,
                                   r0 < ROWS ? ld_pair(a0 + 8) : 0u, r8 < ROWS ? ld_pair(a8 + 8) : 0u};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mma_16816(acc[m][nt], a, b[nt]);
        }
    }
    float* rw = red + warp * (MT * 16 * RP);
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                rw[(m * 16 + gr + (e >= 2 ? 8 : 0)) * RP + nt * 8 + 2 * tg + (e & 1)] = acc[m][nt][e];
    __syncthreads();
    for (int e = tid; e < ROWS * RP; e += kPnThreads) {  // warps in order; the block's P into warp 0's slot
        float v = red[e];
        for (int w = 1; w < 8; w++) v += red[w * (MT * 16 * RP) + e];
        red[e] = v;
        const int row = e / RP, col = e % RP;
        if (t0 + (PER_ROW ? row / NS : row) < N && col < R) P[(t0 * (PER_ROW ? NS : 1) + row) * ldp + col] = v;
    }
    __syncthreads();
    // 3. the pre-mix weights of sublayer j+1
    for (int e = tid; e < M * NS; e += kPnThreads) {
        const int tt = e / NS, i = e % NS;
        if constexpr (PER_ROW) sa[e] = hc_pre_weight(red[(tt * NS + i) * RP], sr[tt * NS + i], q, i);
        else sa[e] = mhc_pre_weight(red[tt * RP + i], sr[tt], q, i);
    }
    __syncthreads();
    // 4. pre-mix + RMSNorm of sublayer j+1 from the staged rows
    for (int tt = warp; tt < M; tt += 8) {
        const int64_t t = t0 + tt;
        if (t >= N) break;  // (warp-uniform; later tokens too)
        float a[NS];
#pragma unroll
        for (int i = 0; i < NS; i++) a[i] = sa[tt * NS + i];
        auto premix4 = [&](int c, Bf16x4& xv) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = 0.f;  // explicit FMAs: premix_norm_kernel's expression
#pragma unroll
                for (int i = 0; i < NS; i++) v = fmaf(a[i], __bfloat162float(sH[(tt * NS + i) * LDH + c + e]), v);
                xv.v[e] = __float2bfloat16_rn(v);
            }
        };
        float ss = 0.f;
        for (int c = 4 * lane; c < d; c += 128) {
            Bf16x4 xv;
            premix4(c, xv);
            *reinterpret_cast<Bf16x4*>(x + t * d + c) = xv;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float f = __bfloat162float(xv.v[e]);
                ss += f * f;
            }
        }
        if (xn == nullptr) continue;
        ss = warp_sum(ss);
        const float s = rms_scale(ss, d, eps_n);
        if (lane == 0) rstd[t] = s;
        for (int c = 4 * lane; c < d; c += 128) {
            Bf16x4 xv, out;
            premix4(c, xv);
#pragma unroll
            for (int e = 0; e < 4; e++)  // (wn: a norm weight of the parameter array, any alignment)
                out.v[e] = __float2bfloat16_rn(__bfloat162float(wn[c + e]) * (__bfloat162float(xv.v[e]) * s));
            *reinterpret_cast<Bf16x4*>(xn + t * d + c) = out;
        }
    }
}

// Readout: y[t] = (Σ_i H[t, i]) / n. Grid-stride over N·d.
template <typename T, int NS>
__global__ void mean_kernel(T* y, const T* H, int64_t N, int d) {
    const float inv = 1.f / (float)NS;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < N * d;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / d, c = k % d;
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < NS; i++) v += to_f(H[(t * NS + i) * d + c]);
        y[k] = from_f<T>(v * inv);
    }
}

// Readout backward: dH[t, i] = dy[t] / n (written; type T like every stream gradient).
template <typename T, int NS>
__global__ void mean_backward_kernel(T* dH, const T* dy, int64_t N, int d) {
    const float inv = 1.f / (float)NS;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < N * d;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / d, c = k % d;
        const T v = from_f<T>(to_f(dy[k]) * inv);
#pragma unroll
        for (int i = 0; i < NS; i++) dH[(t * NS + i) * d + c] = v;
    }
}

// begin_backward: de[t] = Σ_i dH[t, i] (written).
template <typename T, int NS>
__global__ void stream_sum_kernel(T* de, const T* dH, int64_t N, int d) {
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < N * d;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / d, c = k % d;
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < NS; i++) v += to_f(dH[(t * NS + i) * d + c]);
        de[k] = from_f<T>(v);
    }
}

// The coefficient dot products of sublayer j per token, in one pass over what they read (G =
// dL/dH_j [N, n, d], O = o_j, H = H_{j-1}, dx = dL/dx_j); dcoef[t] in the coefficient layout:
// <dx, H_i> at i, <G_k, H_i> at n + k·n + i, <G_k, o> at n + n² + k. What:
//   Dots::Post (output_backward): the Mix and b dots, and d_o[t] = Σ_k b_k G[t, k] (explicit FMAs
//              in k order: combine_do_tile forms the same sum); dx is not read;
//   Dots::Pre  (input_backward after Dots::Post): the a dots; G, O, d_o, coef are not used;
//   Dots::All  (input_backward where the combine kernel of sublayer j+1 wrote d_o already): all.
// Each dot is its own per-thread sum in channel order and block sum (block_sums), so the three
// give the same bits for the same dot. Grid N blocks.
enum class Dots { Post, Pre, All };
template <typename T, int NS, Dots W>
__global__ void coef_dots_kernel(float* dcoef, T* d_o, const float* coef, const T* dx, const T* G, const T* O,
                                 const T* H, int d) {
    constexpr int CW = 2 * NS + NS * NS;
    constexpr int E0 = W == Dots::Post ? NS : 0;                         // first dot written
    constexpr int V = W == Dots::Pre ? NS : (W == Dots::Post ? CW - NS : CW);  // dots written
    constexpr bool kPre = W != Dots::Post, kPost = W != Dots::Pre;
    __shared__ float smem[32 * V];
    const int64_t t = blockIdx.x;
    float b[NS], acc[V];
    if constexpr (W == Dots::Post) {
#pragma unroll
        for (int k = 0; k < NS; k++) b[k] = coef[t * CW + NS + NS * NS + k];
    }
#pragma unroll
    for (int e = 0; e < V; e++) acc[e] = 0.f;
    const T* Gt = G + t * NS * d;
    const T* Ht = H + t * NS * d;
    constexpr int U = kSteps<NS>;
    float g[U][NS], h[U][NS], of[U], xv[U];
    batched_strided_loop<U>(
        threadIdx.x, d, blockDim.x,
        [&](int u, int c) {
#pragma unroll
            for (int i = 0; i < NS; i++) {
                if constexpr (kPost) g[u][i] = to_f(Gt[(int64_t)i * d + c]);
                h[u][i] = to_f(Ht[(int64_t)i * d + c]);
            }
            if constexpr (kPost) of[u] = to_f(O[t * d + c]);
            if constexpr (kPre) xv[u] = to_f(dx[t * d + c]);
        },
        [&](int u, int c) {
            (void)c;
            if constexpr (kPre) {
#pragma unroll
                for (int i = 0; i < NS; i++) acc[i] += xv[u] * h[u][i];
            }
            if constexpr (kPost) {
                float v = 0.f;
#pragma unroll
                for (int k = 0; k < NS; k++) {
                    if constexpr (W == Dots::Post) v = fmaf(b[k], g[u][k], v);
#pragma unroll
                    for (int i = 0; i < NS; i++) acc[NS + k * NS + i - E0] += g[u][k] * h[u][i];
                    acc[NS + NS * NS + k - E0] += g[u][k] * of[u];
                }
                if constexpr (W == Dots::Post) d_o[t * d + c] = from_f<T>(v);
            }
        });
    block_sums<V>(acc, smem);
    for (int e = threadIdx.x; e < V; e += blockDim.x) dcoef[t * CW + E0 + e] = acc[e];
}

// HC coefficient backward per token (one thread per token). From dcoef (dA_m, dMix, dB), P and
// row rstd: dPp[t, i, c] = r_i · dL/du[i, c] (T, the GEMM operand), beta[t, i] =
// r_i²/d · Σ_c dPp·P (the RMS backward's per-row projection term), and the token's contribution
// to the scalar gradients part[t] (NP = 2+2n+n² values in the q layout: s_a, s_b, A_m0, A_r0, B0).
template <typename T, int NS>
__global__ void hc_coef_backward_kernel(T* dPp, float* beta, float* part, const float* dcoef,
                                        const float* P, const float* rs, const float* q, int N, int d) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= N) return;
    constexpr int m = NS + 2, L = proj_ld(NS + 2), CW = 2 * NS + NS * NS, NP = 2 + 2 * NS + NS * NS;
    const float s_a = q[0], s_b = q[1];
    const float* Pt = P + t * NS * L;
    const float* r = rs + t * NS;
    const float* dct = dcoef + t * CW;
    float* pt = part + t * NP;
    float du[NS * m];
    float dsa = 0.f, dsb = 0.f;
    for (int i = 0; i < NS; i++) {
        const float dc = dct[i];
        pt[2 + i] = dc;
        du[i * m] = hc_coef_backward(dc, s_a, ldm_tanh(r[i] * Pt[i * L]), &dsa);
    }
    for (int k = 0; k < NS; k++)
        for (int i = 0; i < NS; i++) {
            const float dc = dct[NS + k * NS + i];
            pt[2 + NS + i * NS + k] = dc;
            du[i * m + 1 + k] = hc_coef_backward(dc, s_a, ldm_tanh(r[i] * Pt[i * L + 1 + k]), &dsa);
        }
    for (int k = 0; k < NS; k++) {
        const float dc = dct[NS + NS * NS + k];
        pt[2 + NS + NS * NS + k] = dc;
        du[k * m + NS + 1] = hc_coef_backward(dc, s_b, ldm_tanh(r[k] * Pt[k * L + NS + 1]), &dsb);
    }
    pt[0] = dsa;
    pt[1] = dsb;
    for (int i = 0; i < NS; i++) {
        float bs = 0.f;
        for (int c = 0; c < m; c++) {
            const T v = from_f<T>(r[i] * du[i * m + c]);
            dPp[(t * NS + i) * L + c] = v;
            bs += to_f(v) * Pt[i * L + c];  // the dP the combine kernels read: β cancels their dZ's radial part
        }
        beta[t * NS + i] = r[i] * r[i] / (float)d * bs;
    }
}

// mHC coefficient backward per token: gate backward, Sinkhorn recomputed (work: same scratch as
// mhc_coef_kernel) and unrolled backward, pre-activation c = a·p + b backward. dPp[t, e] =
// r · a_grp · dc_e (T), beta[t] = r²/(n·d) · Σ_e dPp·P, part[t] = (da_pre, da_post, da_res, db [m]).
template <typename T, int NS>
__global__ void mhc_coef_backward_kernel(T* dPp, float* beta, float* part, float* work,
                                         const float* dcoef, const float* P, const float* rs,
                                         const float* q, int N, int d, int iters, int ws) {
    const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (t >= N) return;
    constexpr int m = 2 * NS + NS * NS, L = proj_ld(m), CW = 2 * NS + NS * NS, nn = NS * NS, NP = 3 + m;
    const float a_pre = q[0], a_post = q[1], a_res = q[2];
    const float* b_pre = q + 3;
    const float* b_post = b_pre + NS;
    const float* b_res = b_post + NS;
    const float r = rs[t];
    const float* Pt = P + t * L;
    const float* dct = dcoef + t * CW;
    float* pt = part + t * NP;
    float* w = work + t * ws;
    float* Rt = w + sinkhorn_work_size(NS, iters);
    float* Hres = Rt + nn;  // then reused as dL/dH_res (scratch of sinkhorn_backward)
    float dc[m];
    for (int i = 0; i < NS; i++) {
        const float g = mhc_gate(1.f, a_pre * (r * Pt[i]) + b_pre[i]);
        dc[i] = mhc_gate_backward(dct[i], 1.f, g);
    }
    for (int k = 0; k < NS; k++) {
        const float g = mhc_gate(2.f, a_post * (r * Pt[NS + k]) + b_post[k]);
        dc[NS + k] = mhc_gate_backward(dct[NS + nn + k], 2.f, g);
    }
    for (int e = 0; e < nn; e++) Rt[e] = a_res * (r * Pt[2 * NS + e]) + b_res[e];
    sinkhorn_forward(Rt, NS, iters, Hres, w);
    for (int e = 0; e < nn; e++) Hres[e] = dct[NS + e];
    sinkhorn_backward(Hres, NS, iters, w, dc + 2 * NS);
    float da[3] = {0.f, 0.f, 0.f};
    const float a_grp[3] = {a_pre, a_post, a_res};
    float bs = 0.f;
    for (int e = 0; e < m; e++) {
        const int grp = e < NS ? 0 : (e < 2 * NS ? 1 : 2);
        da[grp] += dc[e] * (r * Pt[e]);
        pt[3 + e] = dc[e];
        const T v = from_f<T>(r * a_grp[grp] * dc[e]);
        dPp[t * L + e] = v;
        bs += to_f(v) * Pt[e];  // as stored (see hc_coef_backward_kernel's β)
    }
    pt[0] = da[0];
    pt[1] = da[1];
    pt[2] = da[2];
    beta[t] = r * r / (float)(NS * d) * bs;
}

// grads[e] += Σ_t part[t, e] for e < NP: one block per column, fixed-order strided partial sums
// and a fixed tree (deterministic).
template <typename F = float>
__global__ void column_sums_kernel(F* grads, const F* part, int N, int NP) {
    __shared__ float smem[32];
    const int e = blockIdx.x;
    float s[1] = {0.f};
    for (int t = threadIdx.x; t < N; t += blockDim.x) s[0] += part[(int64_t)t * NP + e];
    block_sums<1>(s, smem);
    if (threadIdx.x == 0) grads[e] += s[0];
}

// Combine geometry (hc_combine_kernel, mhc_combine_kernel): a block is kCombineChannels<NS>
// channels × NS streams of threads (256 at n = 4 and 8, 192 at n = 3) and walks tiles of
// kCombineTokens tokens; about kCombineBlocks blocks in all (grid.y, the token slices,
// = ceil(kCombineBlocks / grid.x), at most one per tile), so that each block's weight-gradient
// partial covers many tokens.
template <int NS>
constexpr int kCombineChannels = NS <= 4 ? 64 : 32;
constexpr int kCombineTokens = 32;
constexpr int kCombineBlocks = 256;
// Whether the combine kernels can also write dL/do_{j-1} (d_o, from the stream gradient they write
// and the previous sublayer's H_post / B): n <= 4, where the tile's staged values (kCombineTokens ×
// n × kCombineChannels floats, 32 KiB) fit the static shared memory beside the rest.
LDM_HD constexpr bool combine_do_fits(int n) { return n <= 4; }
template <int NS>
constexpr bool kCombineDo = combine_do_fits(NS);

// The combine kernels' d_o staging (kCombineDo<NS>) for one tile: the previous sublayer's b_k of
// each token and the tile's dHp values as stored (channels of the block).
template <int NS, int CB>
struct CombineDoStage {
    float b[kCombineTokens][NS];
    float o[kCombineTokens][NS][CB];
};
// The block's d_o staging: static shared memory where kCombineDo<NS>; else nullptr, and no shared
// memory declared (so that neither ptxas nor the emulation counts an array no thread uses).
template <int NS, int CB>
__device__ inline CombineDoStage<NS, CB>* combine_do_stage() {
    if constexpr (kCombineDo<NS>) {
        using Stage = CombineDoStage<NS, CB>;
        __shared__ Stage stage;
        return &stage;
    } else {
        return nullptr;
    }
}

// The combine kernels' d_o for one tile of nt tokens and the block's channels c0 .. c0 + CB − 1:
// d_o[t, c] = Σ_k b_k dHp[t, k, c] in k order (coef_dots_kernel<Dots::Post>'s expression), from the
// staged b and stored dHp values (st); after a barrier that every thread of the block reaches (the
// next tile's first barrier protects the staging). kCombineDo<NS> only.
template <typename T, int NS, int CB>
__device__ inline void combine_do_tile(T* d_o, const CombineDoStage<NS, CB>& st, int64_t t0, int nt, int c0, int d,
                                       int tid, int nthr) {
    static_assert(kCombineDo<NS>, "d_o is formed in the combine kernels only where its staging fits");
    __syncthreads();
#pragma unroll 1
    for (int x = tid; x < nt * CB; x += nthr) {
        const int tl = x / CB, cl = x % CB, c = c0 + cl;
        if (c >= d) continue;
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < NS; k++) v = fmaf(st.b[tl][k], st.o[tl][k][cl], v);  // (explicit: as coef_dots_kernel<Dots::Post>)
        d_o[(t0 + tl) * d + c] = from_f<T>(v);
    }
}

// Where the combine kernels' per-token values G[t, k, c] (k < n), dx[t, c] and H[t, i, c] come from.
// STAGED (d·sizeof(T) % 16 == 0 and G, dx, H 16-byte aligned: combine_staged): the block's
// channels of them are copied to shared memory with cp.async, kCombineStages − 1 sub-tiles of
// kCombineSub tokens ahead of the one being combined, so that a block keeps about 18 KiB (bf16,
// n = 4) of loads in flight without holding them in registers (the direct loads, U tokens at a
// time, kept about 2.3 KiB per block in flight). Else: direct loads from global memory. The values,
// and so the results, are the same either way.
// Ring layout (dynamic shared memory, ring_bytes): [kCombineStages][kCombineSub tokens][2n + 1
// rows: G_0 .. G_{n-1}, dx, H_0 .. H_{n-1}][kCombineChannels] of T. Sub-tile s of a block is part
// s % SPT of its tile s / SPT (the tiles of slice blockIdx.y, as the kernels walk them).
constexpr int kCombineSub = 8;     // tokens per sub-tile (a multiple of the kernels' U = 2)
constexpr int kCombineStages = 3;  // ring slots: 2 sub-tiles in flight while one is combined
template <typename T, int NS, bool STAGED>
struct CombineSource {
    static constexpr int CB = kCombineChannels<NS>, ROWS = 2 * NS + 1, ST = kCombineSub, S = kCombineStages;
    static constexpr int V = 16 / (int)sizeof(T), CH = CB / V, SPT = kCombineTokens / ST;
    static_assert(kCombineTokens % ST == 0 && CB % V == 0, "whole sub-tiles and 16-byte chunks");
    static constexpr size_t slot_elems = (size_t)ST * ROWS * CB;
    static constexpr size_t ring_bytes = STAGED ? S * slot_elems * sizeof(T) : 0;
    T* ring;
    const T *G, *dx, *H;
    int64_t N, nd;
    int d, c0, tid, nthr;
    const T* cur = nullptr;  // the slot of the sub-tile being combined (STAGED)

    // The first token of sub-tile s of this block.
    __device__ int64_t sub_start(int64_t s) const {
        return ((int64_t)blockIdx.y + s / SPT * (int64_t)gridDim.y) * kCombineTokens + s % SPT * ST;
    }
    // Issues sub-tile s's copies into slot s % S (none past token N or channel d) and commits them.
    __device__ void prefetch(int64_t s) {
        const int64_t tok0 = sub_start(s);
        T* slot = ring + (s % S) * slot_elems;
        for (int e = tid; e < ST * ROWS * CH; e += nthr) {
            const int u = e / (ROWS * CH), r = e / CH % ROWS, q = e % CH, c = c0 + q * V;
            const int64_t t = tok0 + u;
            if (t >= N || c >= d) continue;  // (d % V == 0: a chunk is wholly in or out; never read)
            const T* src = r < NS ? G + t * nd + (int64_t)r * d + c
                                  : (r == NS ? dx + t * d + c : H + t * nd + (int64_t)(r - NS - 1) * d + c);
            cp_async_16(slot + ((size_t)u * ROWS + r) * CB + q * V, src, true);
        }
        cp_async_commit();
    }
    // Before the block's first tile: the first S − 1 sub-tiles in flight.
    __device__ void begin() {
        if constexpr (STAGED)
            for (int s = 0; s < S - 1; s++) prefetch(s);
    }
    // Before combining sub-tile s (every thread of the block; a barrier): waits for its copies,
    // then issues sub-tile s + S − 1's into the slot that sub-tile s − 1 used.
    __device__ void enter(int64_t s) {
        if constexpr (STAGED) {
            cp_async_wait<S - 2>();
            __syncthreads();  // every thread's copies of s landed; every reader of s − 1 done
            prefetch(s + S - 1);
            cur = ring + (s % S) * slot_elems;
        }
    }
    // Token t (tl within its tile) at this thread's channel c (lane x of the block's channels), stream i.
    __device__ void load(int64_t t, int tl, int x, int c, int i, float (&g)[NS], float& dxv, float& h) const {
        if constexpr (STAGED) {
            const T* b = cur + (size_t)(tl % ST) * ROWS * CB + x;
#pragma unroll
            for (int k = 0; k < NS; k++) g[k] = to_f(b[k * CB]);
            dxv = to_f(b[NS * CB]);
            h = to_f(b[(NS + 1 + i) * CB]);
        } else {
#pragma unroll
            for (int k = 0; k < NS; k++) g[k] = to_f(G[t * nd + (int64_t)k * d + c]);
            dxv = to_f(dx[t * d + c]);
            h = to_f(H[t * nd + (int64_t)i * d + c]);
        }
    }
    // The combine of one tile (tokens t0 .. t0 + nt − 1; sub0: the block's index of its first
    // sub-tile): sub-tile by sub-tile (every thread enters each: a barrier where STAGED), then where
    // live (this thread's channel c < d) in batches of U tokens, every load of a batch before the
    // first store, body(tl, g, dx, h) for each token tl of the batch in order (x: the thread's lane
    // in the block's channels, i: its stream).
    template <int U, typename Body>
    __device__ __forceinline__ void walk_tile(int64_t t0, int nt, int64_t sub0, bool live, int x, int c, int i,
                                              Body&& body) {
        for (int s0 = 0; s0 < nt; s0 += ST) {
            enter(sub0 + s0 / ST);
            const int se = nt - s0 < ST ? nt : s0 + ST;
            for (int u0 = s0; live && u0 < se; u0 += U) {
                float g[U][NS], dxv[U], hl[U];  // (the pointers may alias as far as the compiler knows)
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (u0 + u >= se) break;
                    load(t0 + u0 + u, u0 + u, x, c, i, g[u], dxv[u], hl[u]);
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (u0 + u >= se) break;
                    body(u0 + u, g[u], dxv[u], hl[u]);
                }
            }
        }
    }
    // After the last tile: no copy left pending at exit (the ring's trailing sub-tiles are empty).
    __device__ void end() {
        if constexpr (STAGED) cp_async_wait<0>();
    }
};
// Whether the combine kernels can stage through cp.async at this d and these operands.
template <typename T>
inline bool combine_staged(int d, const void* G, const void* dx, const void* H) {
    auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return (int64_t)d * (int64_t)sizeof(T) % 16 == 0 && a16(G) && a16(dx) && a16(H);
}

// mHC backward combine (input_backward) with the stream projection's input and weight gradients
// formed in the kernel:
//   dHp[t, i, c] = Σ_k Mix[k,i] G[t, k, c] + a_i dx[t, c] + dZ[t, i, c] − β_t H[t, i, c]  (written, T),
//   dZ[t, i, c] = Σ_r dPp[t, r] Φ[r, i·d + c]  (R = 2n + n² rows, fp32 sum, never stored),
//   dWp[y, r, i·d + c] = Σ_{t in slice y} dPp[t, r] H[t, i, c]  (fp32 partial of dΦ_j, written;
//   dw_slices_reduce_kernel adds the slices into the gradient in a fixed order).
// A GEMM writing dZ [N, n·d] and this kernel reading it back cost 4·n·d bytes per token; a GEMM
// dΦ += dPpᵀ·H read H_{j-1} once more (2·n·d bytes per token in bf16). dPp [N, proj_ld(R)] (T),
// Φ [R, n·d] (T), coef [N, 2n + n²], β [N] (fp32), dWp [grid.y, R, n·d] (fp32). Thread (c, i)
// keeps its Φ column and its dΦ column's partial (R floats each) in registers for the whole
// block, so Φ is read once per block; the tiles' dP rows, a, Mix and β are staged in shared
// memory (read as broadcasts). The NS threads of one channel share G and dx through L1.
// d_o (kCombineDo<NS>; else nullptr): also d_o[t, c] = Σ_k b_k dHp[t, k, c] (written, T; b = the
// previous sublayer's H_post from coefp, its coefficient scratch): dL/do_{j-1} from the values of
// dHp as stored, with coef_dots_kernel<Dots::Post>'s expression and order, so that output_backward(j-1)
// need not read dHp back (combine_do_tile).
// Grid combine_grid (grid.y strides over the token tiles); block (kCombineChannels<NS>, NS).
template <typename T, int NS, bool STAGED>
__global__ void __launch_bounds__(kCombineChannels<NS> * NS, NS <= 4 ? 2 : 1)
    mhc_combine_kernel(T* dHp, float* dWp, const T* G, const T* dx, const T* dPp, const T* Phi, const T* H,
                       const float* coef, const float* beta, T* d_o, const float* coefp, int N, int d) {
    constexpr int R = 2 * NS + NS * NS, L = proj_ld(R), NM = NS + NS * NS;
    constexpr int CB = kCombineChannels<NS>, TB = kCombineTokens, U = 2;
    constexpr int R4 = (R + 3) / 4 * 4;  // dps rows padded to whole float4 (zeros)
    __shared__ __align__(16) float dps[TB][R4];
    __shared__ float cfs[TB][NM];  // a_i, then Mix[k,i] at NS + k·NS + i
    __shared__ float bts[TB];
    [[maybe_unused]] CombineDoStage<NS, CB>* const dst = combine_do_stage<NS, CB>();  // d_o staging, or nullptr
    const int i = threadIdx.y, c = blockIdx.x * CB + threadIdx.x;
    const int tid = threadIdx.y * CB + threadIdx.x, nthr = CB * NS;
    const bool live = c < d;
    const int64_t nd = (int64_t)NS * d;
    float phi[R], dw[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        phi[r] = live ? to_f(Phi[r * nd + (int64_t)i * d + c]) : 0.f;
        dw[r] = 0.f;
    }
    using Src = CombineSource<T, NS, STAGED>;
    extern __shared__ __align__(16) unsigned char comb_ring[];
    Src src{reinterpret_cast<T*>(comb_ring), G, dx, H, N, nd, d, (int)blockIdx.x * CB, tid, nthr};
    src.begin();
    int64_t sub0 = 0;  // the block's sub-tile index of this tile's first token
    for (int64_t t0 = (int64_t)blockIdx.y * TB; t0 < N; t0 += (int64_t)gridDim.y * TB, sub0 += Src::SPT) {
        const int nt = (int)(N - t0 < TB ? N - t0 : TB);
        __syncthreads();  // the previous tile's readers are done with the staging arrays
        for (int e = tid; e < nt * R4; e += nthr)
            dps[e / R4][e % R4] = e % R4 < R ? to_f(dPp[(t0 + e / R4) * L + e % R4]) : 0.f;
        stage_coef<NS, NM, false>(&cfs[0][0], coef, t0, nt, 0, N, tid, nthr);
        for (int e = tid; e < nt; e += nthr) bts[e] = beta[t0 + e];
        if constexpr (kCombineDo<NS>)
            if (d_o) stage_coef<NS, NS, false>(&dst->b[0][0], coefp, t0, nt, NS + NS * NS, N, tid, nthr);
        __syncthreads();
        src.template walk_tile<U>(t0, nt, sub0, live, threadIdx.x, c, i,
                                  [&](int tl, const float (&g)[NS], float dxv, float hl) {
            float v = cfs[tl][i] * dxv;
#pragma unroll
            for (int k = 0; k < NS; k++) v += cfs[tl][NS + k * NS + i] * g[k];
            float z = 0.f;
#pragma unroll
            for (int r4 = 0; r4 < R4; r4 += 4) {  // (dP read 4 at a time: one broadcast each)
                const float4 p4 = *reinterpret_cast<const float4*>(&dps[tl][r4]);
                const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    if (r4 + q >= R) break;
                    z += pv[q] * phi[r4 + q];
                    dw[r4 + q] += pv[q] * hl;
                }
            }
            v += z - bts[tl] * hl;
            const T hv = from_f<T>(v);
            dHp[(t0 + tl) * nd + (int64_t)i * d + c] = hv;
            if constexpr (kCombineDo<NS>) dst->o[tl][i][threadIdx.x] = to_f(hv);  // (read only when d_o is set)
            });
        if constexpr (kCombineDo<NS>)
            if (d_o) combine_do_tile<T, NS, CB>(d_o, *dst, t0, nt, blockIdx.x * CB, d, tid, nthr);
    }
    src.end();
    if (live) {
        float* out = dWp + (int64_t)blockIdx.y * R * nd + (int64_t)i * d + c;
#pragma unroll
        for (int r = 0; r < R; r++) out[r * nd] = dw[r];
    }
}

// Grid of the combine kernels for N tokens of d channels: x over channel blocks, y = the token
// slices (about kCombineBlocks blocks in all; at most one slice per tile of kCombineTokens). A function of
// the shape only, so the weight gradient's summation order does not depend on the device.
template <int NS>
inline dim3 combine_grid(int N, int d) {
    return slice_grid(d, kCombineChannels<NS>, ceil_div(N, kCombineTokens), kCombineBlocks);
}

// HC backward combine (input_backward) with the weight gradient formed in the kernel:
//   dHp[t, i, c] = Σ_k Mix[k,i] G[t, k, c] + a_i dx[t, c] + dZ[t, i, c] − β[t, i] H[t, i, c]  (written, T),
//   dZ[t, i, c] = Σ_e dPp[t, i, e] W[e, c]  (e < m = n + 2; fp32 sum, never stored),
//   dWp[y, e, c] = Σ_{t in slice y} Σ_i dPp[t, i, e] H[t, i, c]  (fp32 partial of dW_j, written;
//   dw_slices_reduce_kernel adds the slices into the gradient in a fixed order).
// dPp [N, n, proj_ld(m)] (T), W [m, d] (T), coef [N, 2n + n²], β [N, n] (fp32), dWp [grid.y, m, d]
// (fp32). Thread (c, i) keeps W[:, c] and its stream's share of the dW_j column partial (m floats
// each) in registers for the whole block; the n stream shares of a column are added in stream
// order at the block's end (shared memory). The tiles' dP rows, a, Mix and β are staged in shared
// memory (broadcast reads); the NS threads of one channel share G and dx through L1. This replaces
// a Matmul GEMM dW_j += dPpᵀ·H_{j-1}, which read H_{j-1} once more. d_o, coefp: as in
// mhc_combine_kernel (b = the previous sublayer's B). Grid combine_grid (grid.y strides over the
// token tiles); block (kCombineChannels<NS>, NS).
template <typename T, int NS, bool STAGED>
__global__ void __launch_bounds__(kCombineChannels<NS> * NS)
    hc_combine_kernel(T* dHp, float* dWp, const T* G, const T* dx, const T* dPp, const T* W, const T* H,
                      const float* coef, const float* beta, T* d_o, const float* coefp, int N, int d) {
    constexpr int m = NS + 2, L = proj_ld(m), NM = NS + NS * NS;
    constexpr int CB = kCombineChannels<NS>, TB = kCombineTokens, U = 2;
    __shared__ float dps[TB][NS][m];
    __shared__ float cfs[TB][NM];  // a_i, then Mix[k,i] at NS + k·NS + i
    __shared__ float bts[TB][NS];
    __shared__ float red[NS][m][CB];  // the stream shares of the block's dW columns, at the end
    [[maybe_unused]] CombineDoStage<NS, CB>* const dst = combine_do_stage<NS, CB>();  // d_o staging, or nullptr
    const int i = threadIdx.y, c = blockIdx.x * CB + threadIdx.x;
    const int tid = threadIdx.y * CB + threadIdx.x, nthr = CB * NS;
    const bool live = c < d;
    const int64_t nd = (int64_t)NS * d;
    float w[m], dw[m];
#pragma unroll
    for (int e = 0; e < m; e++) {
        w[e] = live ? to_f(W[(int64_t)e * d + c]) : 0.f;
        dw[e] = 0.f;
    }
    using Src = CombineSource<T, NS, STAGED>;
    extern __shared__ __align__(16) unsigned char comb_ring[];
    Src src{reinterpret_cast<T*>(comb_ring), G, dx, H, N, nd, d, (int)blockIdx.x * CB, tid, nthr};
    src.begin();
    int64_t sub0 = 0;  // the block's sub-tile index of this tile's first token
    for (int64_t t0 = (int64_t)blockIdx.y * TB; t0 < N; t0 += (int64_t)gridDim.y * TB, sub0 += Src::SPT) {
        const int nt = (int)(N - t0 < TB ? N - t0 : TB);
        __syncthreads();  // the previous tile's readers are done with the staging arrays
        for (int x = tid; x < nt * NS * m; x += nthr) {
            const int tl = x / (NS * m), k = x / m % NS, e = x % m;
            dps[tl][k][e] = to_f(dPp[((t0 + tl) * NS + k) * L + e]);
        }
        stage_coef<NS, NM, false>(&cfs[0][0], coef, t0, nt, 0, N, tid, nthr);
        for (int x = tid; x < nt * NS; x += nthr) bts[x / NS][x % NS] = beta[t0 * NS + x];
        if constexpr (kCombineDo<NS>)
            if (d_o) stage_coef<NS, NS, false>(&dst->b[0][0], coefp, t0, nt, NS + NS * NS, N, tid, nthr);
        __syncthreads();
        src.template walk_tile<U>(t0, nt, sub0, live, threadIdx.x, c, i,
                                  [&](int tl, const float (&g)[NS], float dxv, float hl) {
            float v = cfs[tl][i] * dxv;
#pragma unroll
            for (int k = 0; k < NS; k++) v += cfs[tl][NS + k * NS + i] * g[k];
            float z = 0.f;
#pragma unroll
            for (int e = 0; e < m; e++) {
                z += dps[tl][i][e] * w[e];
                dw[e] += dps[tl][i][e] * hl;
            }
            v += z - bts[tl][i] * hl;
            const T hv = from_f<T>(v);
            dHp[(t0 + tl) * nd + (int64_t)i * d + c] = hv;
            if constexpr (kCombineDo<NS>) dst->o[tl][i][threadIdx.x] = to_f(hv);  // (read only when d_o is set)
            });
        if constexpr (kCombineDo<NS>)
            if (d_o) combine_do_tile<T, NS, CB>(d_o, *dst, t0, nt, blockIdx.x * CB, d, tid, nthr);
    }
    src.end();
#pragma unroll
    for (int e = 0; e < m; e++) red[i][e][threadIdx.x] = dw[e];
    __syncthreads();
    for (int x = tid; x < m * CB; x += nthr) {
        const int e = x / CB, cl = x % CB, cc = blockIdx.x * CB + cl;
        if (cc >= d) continue;
        float sum = red[0][e][cl];
#pragma unroll
        for (int k = 1; k < NS; k++) sum += red[k][e][cl];
        dWp[((int64_t)blockIdx.y * m + e) * d + cc] = sum;
    }
}

// grad[e] += Σ_y part[y, e] for e < E (y = 0 .. Y−1 in order): the slices of hc_combine_kernel's
// or mhc_combine_kernel's weight-gradient partials into the fp32 gradient (dW_j [n+2, d] or
// dΦ_j [R, n·d]; deterministic, no atomics).
__global__ void dw_slices_reduce_kernel(float* grad, const float* part, int64_t E, int Y) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < E; e += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int y = 0; y < Y; y++) s += part[(int64_t)y * E + e];
        grad[e] += s;
    }
}

// Calls f(std::integral_constant<int, n>) for the supported stream counts.
template <typename F>
inline void dispatch_streams(int n, F&& f) {
    switch (n) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 8: f(std::integral_constant<int, 8>{}); break;
        default: throw Error(strprintf("hc/mhc on the GPU: hc_streams = %d is not supported (1, 2, 3, 4, 8)", n));
    }
}

inline unsigned grid_1d(int64_t n, int threads) {
    int64_t b = ceil_div(n, threads);
    return (unsigned)std::min<int64_t>(std::max<int64_t>(b, 1), 65535 * 16);
}

}  // namespace hc_detail

}  // namespace gpu
}  // namespace ldm
