// cuda/scheme_ldm.cuh — Linear Depth Memory (spec §2.5) on the GPU: GpuScheme<T> for every
// option of the CPU reference (cpu/scheme_ldm.{h,cpp}): rules rls / delta / outer,
// --no-residual, H_m heads, d_k, ridge δ, forgetting (θ, λ_min, --ldm-no-forget) and the training
// modes store / unwind (+ drift check and fallback to checkpointed segments) / checkpoint-every c /
// window w. See doc/cuda.md "LDM kernels" for the state layout, bytes moved and the modes.
//
// Precision: the memory state S, P (and its gradient dS, dP) is fp32 in every mode; the residual
// stream h is accumulated in fp32 (src32) with a T copy for the GEMMs; projections q, k are fp32
// (GEMM with fp32 output); the forgetting θ, the gates a and the delta bias b_β are read from the
// fp32 master parameters; all parameter gradients are fp32 and accumulate (+=). Deterministic: no
// floating-point atomics (the drift maximum uses an integer atomicMax on non-negative floats).
//
// Kernels: v1 = one thread per (token, head) calling the per token-head math of
// math/ldm_math.h directly on global memory (the reference-identical path); v2 (read, write,
// unwind+VJP, outer/delta write and VJP) = one warp per (token, head), S rows spread over the
// lanes, k/q/P in registers (dk <= 16). Select with LdmGpuScheme::variant (default 2 for
// dk <= 16; the recompute writes of window/checkpoint segments and separate unwinds stay v1).
//
// Window mode (spec §2.5 "window w"), selected by LdmGpuScheme::window_impl (env LDM_LDM_WINDOW):
//   1 (default) Woodbury v1: the forward defers the writes (one thread per (token, head) calling
//     ldm_math.h window_append / window_read / window_flush on global memory: the CPU's exact
//     math) and applies a window's writes at once; the backward UNWINDS like unwind mode (fused
//     unwind + VJP kernels of `variant`, drift check, fallback to keeping the window-start states
//     and recomputing a window from its start); only the final state is kept.
//   2 Woodbury v2: as 1, but without the error rows E~ (ldm_math.h window_append_key /
//     window_qeff / window_read_row / window_flush_row): appending a write never touches S, a read
//     moves S once (one warp per (token, head)), the flush moves S, P once per window.
//     dk <= 16 and w <= 8 (else 1). Compiles; not yet run on a GPU.
//   0 sequential (the path run on an H200 before the Woodbury kernels existed): applies the
//     writes one by one (equal math, other rounding), keeps the state at each window start and
//     recomputes a window's states in backward. Saves memory vs store, not state traffic.
// Paths 1 and 2 compile but have not yet run on a GPU (doc/cuda.md "LDM kernels").
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
#include "cuda/matmul.cuh"
#include "cuda/rmsnorm.cuh"
#include "cuda/scheme.cuh"
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
// Scratch floats per (token, head) for the v1 kernels (rls_write_vjp needs 4 dk + 2 dv).
LDM_HD inline int64_t v1_scratch_per_th(const Dims& D) { return 4 * (int64_t)D.dk + 2 * (int64_t)D.dv; }

inline unsigned th_blocks(const Dims& D) { return (unsigned)ceil_div((int64_t)D.N * D.Hm, kThreads); }
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

// Forward residual bookkeeping of output(j, o): Oj = o; src32 = (residual ? src32 : 0) + o;
// srcT = T(src32) (srcT may alias src32 when T = float).
template <typename T>
__global__ void output_kernel(int64_t n, const T* o, T* Oj, float* src32, T* srcT, bool residual) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const T ov = o[i];
        Oj[i] = ov;
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
__global__ void colsum_partial_kernel(const float* A, const float* B, int64_t N, int C, int64_t ld, float* partial) {
    __shared__ float sh[8][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * 32 + tx;
    const int64_t n0 = (int64_t)blockIdx.y * kColRows, n1 = min(N, n0 + kColRows);
    float s = 0.f;
    if (c < C)
        for (int64_t n = n0 + ty; n < n1; n += 8) s += A[n * ld + c] * (B ? B[n * ld + c] : 1.f);
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
inline void colsum(float* out, const float* A, const float* B, int64_t N, int C, int64_t ld,
                   const float* scale, float* partial, cudaStream_t s) {
    const int RB = (int)ceil_div(N, kColRows);
    dim3 grid((unsigned)ceil_div(C, 32), (unsigned)RB);
    colsum_partial_kernel<<<grid, dim3(32, 8), 0, s>>>(A, B, N, C, ld, partial);
    LDM_LAUNCH_CHECK();
    colsum_final_kernel<<<(unsigned)ceil_div(C, 128), 128, 0, s>>>(partial, RB, C, scale, out);
    LDM_LAUNCH_CHECK();
}

// Drift: out[0] = max(out[0], max|S - S_ref|), out[1] = max(out[1], max|δP - δP_ref|) over all
// tokens and heads; ref == nullptr compares with the initial state (0, I/δ). out holds the bits of
// non-negative floats (integer atomicMax is exact and order-independent).
__global__ void drift_kernel(Dims D, const float* cur, const float* ref, float delta, unsigned* out) {
    const int64_t total = (int64_t)D.N * D.ST;
    float ms = 0.f, mp = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int hb = (int)(i % D.ST) % (D.SS + D.PP);
        if (hb < D.SS) {
            ms = fmaxf(ms, fabsf(cur[i] - (ref ? ref[i] : 0.f)));
        } else {
            const int p = hb - D.SS;
            const float r = ref ? delta * ref[i] : (p / D.dk == p % D.dk ? 1.f : 0.f);
            mp = fmaxf(mp, fabsf(delta * cur[i] - r));
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

// ---- v1: one thread per (token, head), ldm_math.h on global memory ---------------------------

// Write i (forward): k = L2n(raw) -> Kn, Knrm; then the rule's write on cur with v = v32.
// delta: z = zraw + bb (fp32 master bias) -> beta = β_max sigmoid(z) -> beta.
template <int RULE>
__global__ void write_v1_kernel(Dims D, float* cur, const float* raw, float* Kn, float* Knrm,
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
__global__ void rewrite_v1_kernel(Dims D, float* cur, const float* Kn, const float* v32,
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
__global__ void read_v1_kernel(Dims D, const float* cur, const float* raw, float* Qn, float* Qnrm,
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
__global__ void read_bwd_v1_kernel(Dims D, const float* cur, const float* Qn, const float* Qnrm,
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
__global__ void unwind_v1_kernel(Dims D, float* cur, const float* Kn, const float* v32,
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
__global__ void write_vjp_v1_kernel(Dims D, float* cur, float* dS, const float* Kn,
                                    const float* Knrm, const float* v32, const float* lam,
                                    const float* beta, const float* dsrc32, float* dvacc,
                                    float* draw, float* dtok, float* scratch) {
    LDM_TH_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h),
                  nh = D.tok_off(n, h);
    float* S = cur + so;
    const float* k = Kn + kh;
    const float* v = v32 + vo;
    float* scr = scratch + t_ * v1_scratch_per_th(D);
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

// ---- v2: one warp per (token, head) ----------------------------------------------------------
// Lane l owns the rows a = l, l+32, ... of S [dv, dk] (row a is dk contiguous floats, loaded and
// stored as float4 when dk is 4, 8 or 16, so a warp moves one contiguous 32·dk·4-byte span per
// row step: coalesced); k, q, u = P k and P itself (dk <= kV2MaxDk) live in registers of every
// lane (P is read once per warp, broadcast). Registers beyond dk hold 0, so the unguarded sums
// equal the dk-term sums. The per-row math is the same expression as ldm_math.h's loops; sums
// over rows (dk-vectors) are warp reductions (fixed butterfly order, deterministic).
constexpr int kV2MaxDk = 16;
constexpr int kWarpsPerBlock = 4;

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
// Lanes write P [dk, dk] from registers (element p by lane p % 32).
template <int DK>
__device__ inline void store_P(float* P, const float (&Pl)[DK * DK], int dk, int lane) {
    for (int p = lane; p < dk * dk; p += 32) {
        const int a = p / dk, b = p % dk;
        float val = 0.f;
#pragma unroll
        for (int c = 0; c < DK * DK; c++)
            if (c == a * DK + b) val = Pl[c];
        P[p] = val;
    }
}

// v2 read: same outputs as read_v1_kernel (r32 is not written).
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
read_v2_kernel(Dims D, const float* cur, const float* raw, float* Qn, float* Qnrm,
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

// v2 rls write (forward, with forgetting): same math as rls_write, from the state src_state to
// cur (out of place in store mode, so the forward needs no extra copy; in place when equal).
// RECOMP: re-applies a stored write (window / checkpoint recompute): raw is the stored normalised
// key Kn, nothing but the state is written.
template <int DK, bool RECOMP = false>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
write_rls_v2_kernel(Dims D, float* cur, const float* src_state, const float* raw, float* Kn,
                    float* Knrm, const float* v32, const float* lam) {
    LDM_WARP_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h);
    const int dk = D.dk;
    float k[DK], u[DK], Pl[DK * DK];
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
    load_P<DK>(Si + D.SS, Pl, dk);
    float kv = 0.f;
#pragma unroll
    for (int a = 0; a < DK; a++) {
        float s = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) s += Pl[a * DK + b] * k[b];
        u[a] = s;
        kv += k[a] * s;
    }
    const float lm = lam[h], gamma = lm + kv, ig = 1.f / gamma, il = 1.f / lm;
    const float* v = v32 + vo;
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK];
        load_row<DK>(Si + (int64_t)r * dk, row, dk);
        float s = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) s += row[b] * k[b];
        const float e = v[r] - s;
#pragma unroll
        for (int b = 0; b < DK; b++) row[b] += e * (u[b] * ig);
        store_row<DK>(S + (int64_t)r * dk, row, dk);
    }
#pragma unroll
    for (int p = 0; p < DK * DK; p++) Pl[p] = (Pl[p] - u[p / DK] * u[p % DK] * ig) * il;
    __syncwarp();
    store_P<DK>(P, Pl, dk, lane);
}

// v2 fused unwind + VJP of an rls write: same math as rls_unwind (when UNWIND) followed by
// rls_write_vjp (ldm_math.h). One pass over the rows: each lane unwinds its S row in registers,
// stores it, and applies the row's part of the VJP with its dS row; dk-vector sums are warp
// reductions; the P part is computed redundantly by every lane from registers.
template <int DK, bool UNWIND>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
unwind_vjp_rls_v2_kernel(Dims D, float* cur, float* dS, const float* Kn, const float* Knrm,
                         const float* v32, const float* lam, const float* dsrc32, float* dvacc,
                         float* draw, float* dtok) {
    LDM_WARP_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h),
                  nh = D.tok_off(n, h);
    const int dk = D.dk;
    float* S = cur + so;
    float* P = S + D.SS;
    float* dSs = dS + so;
    float* dP = dSs + D.SS;
    const float* v = v32 + vo;
    const float lm = lam[h], il = 1.f / lm;
    float k[DK], u[DK], g[DK], gu[DK], dg[DK], du[DK], dkk[DK], Pl[DK * DK];
#pragma unroll
    for (int b = 0; b < DK; b++) k[b] = b < dk ? Kn[kh + b] : 0.f;
    load_P<DK>(P, Pl, dk);
    float gl = 0.f;
    if (UNWIND) {
        // gu = P k; a = k.gu; gamma = lam/(1-a); P_prev = lam P + gamma gu gu^T (rows: below)
        float a_ = 0.f;
#pragma unroll
        for (int a = 0; a < DK; a++) {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += Pl[a * DK + b] * k[b];
            gu[a] = s;
            a_ += k[a] * s;
        }
        const float gm = lm / (1.f - a_);
        gl = gm / lm;
#pragma unroll
        for (int p = 0; p < DK * DK; p++) Pl[p] = lm * Pl[p] + gm * gu[p / DK] * gu[p % DK];
    }
    // VJP quantities at the state before the write (S_prev rows, Pl = P_prev).
    float ku = 0.f;
#pragma unroll
    for (int a = 0; a < DK; a++) {
        float s = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) s += Pl[a * DK + b] * k[b];
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
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK], drow[DK];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        if (UNWIND) {  // S_prev = S - (gamma/lam)(v - S k) gu^T
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += row[b] * k[b];
            const float e = (v[r] - s) * gl;
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] -= e * gu[b];
            store_row<DK>(S + (int64_t)r * dk, row, dk);
        }
        load_row<DK>(dSs + (int64_t)r * dk, drow, dk);
        // e = v - S k, de = dS' g; dg += dS'^T e; dv += de; dk -= S^T de; dS_prev = dS' - de k^T
        float s = 0.f, t = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) {
            s += row[b] * k[b];
            t += drow[b] * g[b];
        }
        const float e = v[r] - s;
#pragma unroll
        for (int b = 0; b < DK; b++) {
            dg[b] += drow[b] * e;
            dkk[b] -= row[b] * t;
            drow[b] -= t * k[b];
        }
        store_row<DK>(dSs + (int64_t)r * dk, drow, dk);
        dvacc[vo + r] = dsrc32[vo + r] + t;
    }
#pragma unroll
    for (int b = 0; b < DK; b++) {
        dg[b] = warp_sum(dg[b]);
        dkk[b] = warp_sum(dkk[b]);
    }
    // P part: dP read by every lane (broadcast) into registers.
    float dPl[DK * DK];
    load_P<DK>(dP, dPl, dk);
    float dl = 0.f, uDu = 0.f;
#pragma unroll
    for (int a = 0; a < DK; a++) du[a] = 0.f;
#pragma unroll
    for (int a = 0; a < DK; a++)
#pragma unroll
        for (int b = 0; b < DK; b++) {
            const float dPab = dPl[a * DK + b];
            const float Dp = dPab * il;
            const float Pn = (Pl[a * DK + b] - u[a] * u[b] * ig) * il;
            dl -= dPab * Pn * il;
            du[a] -= Dp * u[b] * ig;
            du[b] -= Dp * u[a] * ig;
            uDu += u[a] * Dp * u[b];
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
#pragma unroll
    for (int a = 0; a < DK; a++)
#pragma unroll
        for (int b = 0; b < DK; b++) dkk[b] += Pl[a * DK + b] * du[a];
#pragma unroll
    for (int p = 0; p < DK * DK; p++) dPl[p] = dPl[p] * il + du[p / DK] * k[p % DK];
    __syncwarp();
    if (UNWIND) store_P<DK>(P, Pl, dk, lane);
    store_P<DK>(dP, dPl, dk, lane);
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

// v2 outer / delta write (forward): same math as outer_write / delta_write (in place on cur).
// delta: beta = β_max sigmoid(zraw + bb) -> beta.
// RECOMP: re-applies a stored write (k = raw = Kn, delta: beta read from beta), state only.
template <int RULE, int DK, bool RECOMP = false>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
write_od_v2_kernel(Dims D, float* cur, const float* raw, float* Kn, float* Knrm, const float* v32,
                   const float* lam, const float* zraw, const float* bb, float* beta) {
    LDM_WARP_INDEX(D)
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
    const float* v = v32 + vo;
    const float lm = lam[h];
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK];
        load_row<DK>(S + (int64_t)r * dk, row, dk);
        if (RULE == kOuter) {
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] = lm * row[b] + v[r] * k[b];
        } else {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += row[b] * k[b];
            const float e = bt * (v[r] - s);
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] += e * k[b];
        }
        store_row<DK>(S + (int64_t)r * dk, row, dk);
    }
}

// v2 VJP of an outer / delta write at the state before it (UNWIND, outer only: first unwinds the
// row in place, S_prev = (S - v kᵀ)/λ). Same math as outer_write_vjp / delta_write_vjp; outputs
// as write_vjp_v1_kernel (dtok = dL/dλ for outer, dL/dz for delta).
template <int RULE, int DK, bool UNWIND>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
vjp_od_v2_kernel(Dims D, float* cur, float* dS, const float* Kn, const float* Knrm, const float* v32,
                 const float* lam, const float* beta, const float* dsrc32, float* dvacc, float* draw,
                 float* dtok) {
    LDM_WARP_INDEX(D)
    const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), so = D.state_off(n, h),
                  nh = D.tok_off(n, h);
    const int dk = D.dk;
    float* S = cur + so;
    float* dSs = dS + so;
    const float* v = v32 + vo;
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
        if (UNWIND && RULE == kOuter) {
#pragma unroll
            for (int b = 0; b < DK; b++) row[b] = (row[b] - v[r] * k[b]) * il;
            store_row<DK>(S + (int64_t)r * dk, row, dk);
        }
        load_row<DK>(dSs + (int64_t)r * dk, G, dk);
        float t = 0.f;
        if (RULE == kOuter) {
#pragma unroll
            for (int b = 0; b < DK; b++) {
                dsc += G[b] * row[b];
                t += G[b] * k[b];
                dkk[b] += G[b] * v[r];
                G[b] = lm * G[b];
            }
            dvacc[vo + r] = dsrc32[vo + r] + t;
        } else {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) {
                s += row[b] * k[b];
                t += G[b] * k[b];
            }
            const float e = v[r] - s;
            dsc += e * t;
            const float de = bt * t;
#pragma unroll
            for (int b = 0; b < DK; b++) {
                dkk[b] += bt * G[b] * e - row[b] * de;
                G[b] -= de * k[b];
            }
            dvacc[vo + r] = dsrc32[vo + r] + de;
        }
        store_row<DK>(dSs + (int64_t)r * dk, G, dk);
    }
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

// v2 unwind of write i alone (cur: after -> before), rls / outer: same math as rls_unwind /
// outer_unwind. Used where the unwound state is compared (drift) before its VJP.
template <int RULE, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
unwind_v2_kernel(Dims D, float* cur, const float* Kn, const float* v32, const float* lam) {
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
    if (RULE == kRls) {
        float Pl[DK * DK];
        load_P<DK>(P, Pl, dk);
        float a_ = 0.f;
#pragma unroll
        for (int a = 0; a < DK; a++) {
            float s = 0.f;
#pragma unroll
            for (int b = 0; b < DK; b++) s += Pl[a * DK + b] * k[b];
            g[a] = s;
            a_ += k[a] * s;
        }
        const float gm = lm / (1.f - a_);
        gl = gm / lm;
#pragma unroll
        for (int p = 0; p < DK * DK; p++) Pl[p] = lm * Pl[p] + gm * g[p / DK] * g[p % DK];
        __syncwarp();
        store_P<DK>(P, Pl, dk, lane);
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

// v2 read backward (rls/outer/delta alike): same outputs as read_bwd_v1_kernel except that dr32
// is not written (dr is formed in registers).
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
read_bwd_v2_kernel(Dims D, const float* cur, const float* Qn, const float* Qnrm, const T* dx,
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
//   Kt [N·Hm, w, dk], Lc [N·Hm, w, w], Et [N·Hm, w, dv] (v1 only). lamw = λ of the window's first
// write (lam + s·Hm, s = window start); m = this write's / the read's pending count.
constexpr int kWinMaxV2 = 8;  // v2 keeps per-write coefficients in small local arrays

// Append write i = s + m: k = L2n(raw) -> Kn, Knrm; K~/L rows (+ E~ row when WITH_ERR, which
// reads S once). One thread per (token, head).
template <bool WITH_ERR>
__global__ void window_append_v1_kernel(Dims D, const float* cur, const float* raw, float* Kn,
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

// Read j with m > 0 pending writes (v1): as read_v1_kernel plus r += E~ᵀ C_m⁻¹ K~ᵀ P q.
template <typename T>
__global__ void window_read_v1_kernel(Dims D, const float* cur, const float* raw, float* Qn,
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

// Flush the window's m writes (v1): window_flush on S, P.
__global__ void window_flush_v1_kernel(Dims D, float* cur, const float* lamw, int m, int w,
                                       const float* Kt, const float* Et, const float* Lc,
                                       float* scratch, int64_t scr_stride) {
    LDM_TH_INDEX(D)
    float* S = cur + D.state_off(n, h);
    const float c = window_decay(lamw + h, m, D.Hm);
    window_flush(S, S + D.SS, Kt + t_ * w * D.dk, Et + t_ * w * D.dv, Lc + t_ * w * w, m, w, c, D.dv,
                 D.dk, scratch + t_ * scr_stride);
}

// Read j with m (1..kWinMaxV2) pending writes, v2 (one warp per (token, head), no E~):
// z = C_m⁻¹ K~ᵀ P q and qeff = q − K~ z (every lane, redundantly, from global P, K~, L);
// x_r = src + a ⊙ (S_r · qeff + Σ_p z_p v~_p[r]) with v~_p = O_{s+p}[r]/sqrt(c_p) read from the
// saved write inputs O (T). One pass over S. Same outputs as read_v2_kernel.
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
window_read_v2_kernel(Dims D, const float* cur, const float* raw, float* Qn, float* Qnrm,
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
    float z[kWinMaxV2], t[DK], qe[DK], isc[kWinMaxV2];
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

// Flush the window's m (1..kWinMaxV2) writes, v2 (one warp per (token, head), no E~): lane 0
// computes X = G^T and P <- (P - Xᵀ X)/c in place (window_flush_coef, X to this warp's
// scratch); then every lane updates its S rows: S_r += Σ_p (v~_p[r] − S_r · k~_p) X_p
// (window_flush_row). One pass over S (read + write) and P.
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
window_flush_v2_kernel(Dims D, float* cur, const float* lamw, int m, int w, const float* Kt,
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
    float Xr[kWinMaxV2 * DK], Kr[kWinMaxV2 * DK], isc[kWinMaxV2];
    for (int p = 0; p < m; p++) {
        isc[p] = 1.f / ldm_sqrt(window_decay(lamw + h, p + 1, D.Hm));
#pragma unroll
        for (int b = 0; b < DK; b++) {
            Xr[p * DK + b] = b < dk ? X[p * dk + b] : 0.f;
            Kr[p * DK + b] = b < dk ? Ktp[p * dk + b] : 0.f;
        }
    }
    for (int r = lane; r < D.dv; r += 32) {
        float row[DK], vt[kWinMaxV2], e[kWinMaxV2];
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

// Window-mode path (LdmGpuScheme::window_impl): 0 sequential, 1 Woodbury v1 (default), 2 Woodbury
// v2; the environment variable LDM_LDM_WINDOW (0, 1, 2) overrides the default. Throws ldm::Error
// on another value.
constexpr int kWindowImplDefault = 1;
inline int ldm_gpu_window_impl_env() {
    const char* e = std::getenv("LDM_LDM_WINDOW");
    if (!e) return kWindowImplDefault;
    const std::string v = e;
    if (v != "0" && v != "1" && v != "2") throw Error("LDM_LDM_WINDOW must be 0, 1 or 2, got '" + v + "'");
    return std::atoi(e);
}
// States (each [N, ST] fp32) kept for backward besides the live one, in the configured mode
// (same rule as the CPU): store D+1; unwind 0; checkpoint-every c: ceil((D+1)/c); window w:
// 0 (the Woodbury paths unwind) or ceil((D+1)/w) window-start states (the sequential path,
// window_impl 0, always; the Woodbury paths with c > 0 or after a drift fallback).
inline int64_t ldm_gpu_kept_states(const ModelConfig& c, int ckpt, int window_impl = kWindowImplDefault) {
    const int64_t W = c.n_sublayers() + 1;
    if (c.ldm_mode == "window")
        return window_impl == 0 || ckpt > 0 ? (W + c.ldm_window - 1) / c.ldm_window : 0;
    if (ckpt > 0) return (W + ckpt - 1) / ckpt;
    return c.ldm_mode == "unwind" ? 0 : W;
}
// Bytes of one LDM state (S and P over all heads, fp32) per token.
inline int64_t ldm_gpu_state_bytes(const ModelConfig& c) {
    const int64_t dv = c.d_model / c.ldm_heads, dk = c.ldm_dk;
    return 4 * c.ldm_heads * (dv * dk + (c.ldm_rule == "rls" ? dk * dk : 0));
}

// ---- the scheme -------------------------------------------------------------------------------

// LDM (spec §2.5) as a GpuScheme; mirrors cpu/scheme_ldm.cpp step by step (same modes, same
// fallback, same metrics). Throws ldm::Error for window mode with delta/outer (as the CPU).
template <typename T>
struct LdmGpuScheme final : GpuScheme<T> {
    explicit LdmGpuScheme(const ModelConfig& cfg);
    void bind(const T* params, const float* master, float* grads) override;
    void resize(int B, int T_) override;
    void begin(const T* e, cudaStream_t s) override;
    void input_norm(int j, T* x, T* xn, float* rstd, const T* w, float eps, cudaStream_t s) override {
        input(j, x, s);
        rmsnorm_forward<T>(xn, rstd, x, w, N_, d_, eps, s);
    }
    void output(int j, const T* o, cudaStream_t s) override;
    void readout(T* y, cudaStream_t s) override { input(D_ + 1, y, s); }
    void readout_backward(const T* dy, cudaStream_t s) override;
    void output_backward(int j, T* d_o, cudaStream_t s) override;
    void input_backward(int j, const T* dx, cudaStream_t s) override;
    void begin_backward(T* de, cudaStream_t s) override;
    int64_t extra_bytes_per_token() const override { return N_ > 0 ? allocated_bytes() / N_ : 0; }
    std::vector<std::pair<std::string, double>> metrics() override;

    // x_j [N, d] (j = 1..D; D+1 = the readout y) without the RMSNorm (workbench / tests).
    void input(int j, T* x, cudaStream_t s);
    // Test hooks: live state [N, ST] on the host, checkpoint interval in use.
    std::vector<float> state_host() const {
        std::vector<float> h((size_t)N_ * dims_.ST);
        CUDA_CHECK(cudaMemcpy(h.data(), live_, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return h;
    }
    int checkpoint_every() const { return ckpt_; }
    int64_t allocated_bytes() const;
    template <typename E>
    static void grow(DeviceBuffer<E>& b, int64_t n) {
        if (b.n < n) b.alloc(n);
    }
    // 1 = one thread per (token, head) (ldm_math.h on global memory) everywhere.
    // 2 = warp per (token, head) for reads, read backward, rls write and rls (unwind +) VJP
    //     (dk <= 16); the rest v1. Validated on an H200 (dev/cuda/ldm, test/test_gpu_ldm).
    // 3 = 2 plus warp kernels for the outer/delta writes and VJPs, the separate unwinds and the
    //     recompute writes, and store mode without state copies (writes out of place into the
    //     kept slots, backward reads them in place). Passed the workbench and test_gpu_ldm on an
    //     H200 (2026-11-30); the default stays 2 until 3 has been timed against it.
    // The environment variable LDM_LDM_VARIANT (1, 2, 3) overrides the default at construction
    // (so the trainer and test/test_gpu_ldm can run every variant).
    int variant = 2;
    // Window mode only (see the header): 0 sequential writes + window-start states (run on an
    // H200); 1 Woodbury v1 forward + unwinding backward (default); 2 Woodbury v2 forward (warp
    // read and flush, no E~; dk <= 16, w <= 8, else 1) + unwinding backward. Set before resize();
    // env LDM_LDM_WINDOW overrides the default at construction.
    int window_impl = kWindowImplDefault;

   private:
    void write_forward(int i, const T* o, cudaStream_t s);
    void write_backward(int i, T* d_o, cudaStream_t s);
    void read_backward(int j, const T* dx, cudaStream_t s);
    bool prev_state(int i, cudaStream_t s);  // true: cur_ already unwound in place by a fused VJP
    void unwind(int i, cudaStream_t s);
    void rewrite(int w, cudaStream_t s);
    void record_drift(const float* ref, cudaStream_t s);
    const float* v32(int i, cudaStream_t s);  // O_i as fp32 (alias for T = float)
    const T* drawT(const float* draw, int64_t n, T* buf, cudaStream_t s);
    float* state(int64_t k) const { return stored_.ptr + k * (int64_t)N_ * dims_.ST; }
    bool v2() const { return variant >= 2 && dk_ <= ldmk::kV2MaxDk; }
    bool v3() const { return variant >= 3 && dk_ <= ldmk::kV2MaxDk; }
    // window path in use: 0 (not window, or sequential), 1, 2 (see window_impl)
    int wimpl() const {
        if (!window_ || window_impl == 0) return 0;
        if (window_impl == 2 && (w_ > ldmk::kWinMaxV2 || dk_ > ldmk::kV2MaxDk)) return 1;
        return window_impl;
    }
    bool wood() const { return wimpl() > 0; }              // Woodbury forward
    bool wunwind() const { return wood() && ckpt_ == 0; }  // ... with unwinding backward
    bool wstore() const { return window_ && !wunwind(); }  // window-start states kept
    int64_t wscr() const { return (int64_t)w_ * dk_ + dk_ + w_; }  // window scratch per (n, h)
    int64_t scr_stride() const { return std::max(ldmk::v1_scratch_per_th(dims_), window_ ? wscr() : 0); }
    // store mode with variant 3: every state lives in stored_ (state(i) = after write i) and
    // live_ points at the one in use, so neither forward nor backward copies states; otherwise
    // live_ = cur_ and store mode copies cur_ -> state(i) (forward) and back (backward).
    bool slots() const { return v3() && !window_ && ckpt_ == 0 && !unwind_; }

    ModelConfig cfg_;
    int d_, D_, Hm_, dk_, dv_, HK_;
    bool rls_, delta_, outer_, residual_, forget_, unwind_, window_ = false;
    int w_ = 1, ckpt_ = 0;
    bool warned_ = false, fell_back_ = false;
    double drift_S_ = 0, drift_P_ = 0;
    bool drift_pending_ = false;
    int N_ = 0;
    ldmk::Dims dims_{};
    Matmul mm_;
    // parameters: working copy (T), fp32 master, fp32 grads; Wq/A indexed 1..D+1 (D+1 = final)
    std::vector<const T*> Wk_, Wq_, Wb_;
    std::vector<const float*> A_, Bb_;
    std::vector<float*> gWk_, gWq_, gA_, gWb_, gBb_;
    const float* theta_ = nullptr;
    float* gtheta_ = nullptr;
    // activations / state (fp32 unless noted)
    DeviceBuffer<float> src32_, cur_, stored_, dS_, dsrc_, tmp32_, prod32_, v32_, raw_, draw_,
        Qn_, Qnrm_, Kn_, Knrm_, beta_, dtok_, lam_, lgrad_, scratch_, partial_;
    DeviceBuffer<float> Kt_, Et_, Lc_;  // window mode (Woodbury): pending writes per (n, h)
    DeviceBuffer<T> srcT_, O_, drawT_, dtokT_;  // srcT_/drawT_/dtokT_ only for T != float
    DeviceBuffer<unsigned> drift_;
    float* live_ = nullptr;  // the state reads and VJPs use (cur_ or a slot of stored_)
};

template <typename T>
LdmGpuScheme<T>::LdmGpuScheme(const ModelConfig& cfg) : cfg_(cfg) {
    cfg.validate();
    if (cfg.scheme != "ldm") throw Error("LdmGpuScheme: scheme is '" + cfg.scheme + "', not 'ldm'");
    if (cfg.ldm_mode == "window" && cfg.ldm_rule != "rls")
        throw Error("ldm_mode 'window' is implemented for the rls rule only, not '" + cfg.ldm_rule +
                    "' (use --ldm-mode store)");
    d_ = cfg.d_model;
    D_ = cfg.n_sublayers();
    Hm_ = cfg.ldm_heads;
    dk_ = cfg.ldm_dk;
    dv_ = d_ / Hm_;
    HK_ = Hm_ * dk_;
    rls_ = cfg.ldm_rule == "rls";
    delta_ = cfg.ldm_rule == "delta";
    outer_ = cfg.ldm_rule == "outer";
    residual_ = cfg.ldm_residual;
    forget_ = cfg.ldm_forget && !delta_;
    unwind_ = cfg.ldm_mode == "unwind";
    ckpt_ = cfg.ldm_checkpoint_every;
    window_ = cfg.ldm_mode == "window";
    w_ = cfg.ldm_window;
    if (window_) ckpt_ = cfg.ldm_checkpoint_every > 0 ? w_ : 0;  // window checkpoints = window starts
    window_impl = ldm_gpu_window_impl_env();
    const int W = D_ + 1;
    lam_.alloc((int64_t)W * Hm_);
    lgrad_.alloc((int64_t)W * Hm_);
    drift_.alloc(2);
    if (const char* e = std::getenv("LDM_LDM_VARIANT")) {  // trainer runs: 1, 2 or 3
        const int v = std::atoi(e);
        if (v < 1 || v > 3) throw Error(strprintf("LDM_LDM_VARIANT must be 1, 2 or 3, got '%s'", e));
        variant = v;
    }
}

template <typename T>
void LdmGpuScheme<T>::bind(const T* params, const float* master, float* grads) {
    std::vector<ParamSpec> ss = scheme_param_specs(cfg_);
    auto find = [&](const std::string& name) -> int64_t {
        for (const auto& s : ss)
            if (s.name == name) return s.offset;
        throw Error("LDM GPU scheme: no parameter '" + name + "'");
    };
    const int W = D_ + 1;
    Wk_.assign(W, nullptr); gWk_.assign(W, nullptr);
    Wb_.assign(W, nullptr); gWb_.assign(W, nullptr);
    Bb_.assign(W, nullptr); gBb_.assign(W, nullptr);
    Wq_.assign(D_ + 2, nullptr); gWq_.assign(D_ + 2, nullptr);
    A_.assign(D_ + 2, nullptr); gA_.assign(D_ + 2, nullptr);
    for (int i = 0; i < W; i++) {
        int64_t o = find("scheme.ldm.wk." + std::to_string(i));
        Wk_[i] = params + o; gWk_[i] = grads + o;
        if (delta_) {
            o = find("scheme.ldm.wbeta." + std::to_string(i));
            Wb_[i] = params + o; gWb_[i] = grads + o;
            o = find("scheme.ldm.bbeta." + std::to_string(i));
            Bb_[i] = master + o; gBb_[i] = grads + o;
        }
    }
    for (int j = 1; j <= D_ + 1; j++) {
        std::string s = j <= D_ ? std::to_string(j) : std::string("f");
        int64_t o = find("scheme.ldm.wq." + s);
        Wq_[j] = params + o; gWq_[j] = grads + o;
        if (residual_) {
            o = find("scheme.ldm.a." + s);
            A_[j] = master + o; gA_[j] = grads + o;
        }
    }
    if (forget_) {
        int64_t o = find("scheme.ldm.theta");
        theta_ = master + o; gtheta_ = grads + o;
    }
}

template <typename T>
void LdmGpuScheme<T>::resize(int B, int T_) {
    // Buffers only grow (the trainer calls resize before every forward, e.g. with a smaller
    // evaluation batch); everything is indexed with N_, never with a buffer's capacity.
    N_ = B * T_;
    dims_ = ldmk::make_dims(cfg_, N_);
    const int64_t N = N_, W = D_ + 1, nd = N * d_, st = N * dims_.ST;
    const bool f32 = std::is_same<T, float>::value;
    grow(src32_, nd);
    if (!f32) grow(srcT_, nd);
    grow(O_, W * nd);
    grow(Qn_, W * N * HK_);
    grow(Kn_, W * N * HK_);
    grow(Qnrm_, W * N * Hm_);
    grow(Knrm_, W * N * Hm_);
    grow(beta_, delta_ ? W * N * Hm_ : 0);
    grow(cur_, st);
    live_ = cur_.ptr;
    // kept states for the interval in use (a drift fallback re-sizes this buffer itself)
    const int64_t kept = ldm_gpu_kept_states(cfg_, ckpt_, wimpl());
    grow(stored_, kept * st);
    if (wood()) {
        const int64_t th = N * Hm_;
        grow(Kt_, th * w_ * dk_);
        grow(Lc_, th * w_ * w_);
        grow(Et_, wimpl() == 1 ? th * w_ * dv_ : 0);
    }
    grow(dS_, st);
    grow(dsrc_, nd);
    grow(tmp32_, nd);
    grow(prod32_, residual_ ? nd : 0);
    grow(v32_, f32 ? 0 : nd);
    grow(raw_, N * HK_);
    grow(draw_, N * HK_);
    if (!f32) {
        grow(drawT_, N * HK_);
        grow(dtokT_, N * Hm_);
    }
    grow(dtok_, N * Hm_);
    grow(scratch_, N * Hm_ * scr_stride());
    grow(partial_, std::max(ldmk::colsum_scratch(N, d_), ldmk::colsum_scratch(N, Hm_)));
}

template <typename T>
int64_t LdmGpuScheme<T>::allocated_bytes() const {
    return src32_.bytes() + cur_.bytes() + stored_.bytes() + dS_.bytes() + dsrc_.bytes() +
           tmp32_.bytes() + prod32_.bytes() + v32_.bytes() + raw_.bytes() + draw_.bytes() +
           Qn_.bytes() + Qnrm_.bytes() + Kn_.bytes() + Knrm_.bytes() + beta_.bytes() +
           dtok_.bytes() + scratch_.bytes() + partial_.bytes() + srcT_.bytes() + O_.bytes() +
           drawT_.bytes() + dtokT_.bytes() + Kt_.bytes() + Et_.bytes() + Lc_.bytes();
}

template <typename T>
const float* LdmGpuScheme<T>::v32(int i, cudaStream_t s) {
    const T* Oi = O_.ptr + (int64_t)i * N_ * d_;
    if (std::is_same<T, float>::value) return reinterpret_cast<const float*>(Oi);
    ldmk::to_f32<T>(Oi, v32_.ptr, (int64_t)N_ * d_, s);
    return v32_.ptr;
}

template <typename T>
const T* LdmGpuScheme<T>::drawT(const float* draw, int64_t n, T* buf, cudaStream_t s) {
    if (std::is_same<T, float>::value) return reinterpret_cast<const T*>(draw);
    ldmk::from_f32<T>(draw, buf, n, s);
    return buf;
}

// ---- forward ----------------------------------------------------------------------------------

template <typename T>
void LdmGpuScheme<T>::begin(const T* e, cudaStream_t s) {
    using namespace ldmk;
    const int W = D_ + 1;
    lambda_kernel<<<(unsigned)ceil_div((int64_t)W * Hm_, 128), 128, 0, s>>>(
        W * Hm_, forget_ ? theta_ : nullptr, (float)cfg_.ldm_lambda_min, lam_.ptr, lgrad_.ptr);
    LDM_LAUNCH_CHECK();
    init_state(dims_, cur_.ptr, (float)cfg_.ldm_delta, s);
    live_ = cur_.ptr;
    if (wstore())
        CUDA_CHECK(cudaMemcpyAsync(state(0), cur_.ptr, (size_t)N_ * dims_.ST * 4, cudaMemcpyDeviceToDevice, s));
    const int64_t nd = (int64_t)N_ * d_;
    T* srcT = std::is_same<T, float>::value ? reinterpret_cast<T*>(src32_.ptr) : srcT_.ptr;
    output_kernel<T><<<elem_blocks(nd), 256, 0, s>>>(nd, e, O_.ptr, src32_.ptr, srcT, false);
    LDM_LAUNCH_CHECK();
    write_forward(0, e, s);
}

template <typename T>
void LdmGpuScheme<T>::write_forward(int i, const T* /*o (already in O_i)*/, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_, st = N * dims_.ST;
    const T* Oi = O_.ptr + (int64_t)i * N * d_;
    // raw [N, HK] = O_i · W_k^iᵀ (fp32 out)
    mm_.template gemm<T, float>(false, true, N, HK_, d_, 1.f, Oi, d_, Wk_[i], d_, 0.f, raw_.ptr, HK_,
                                nullptr, s);
    float* Kn = Kn_.ptr + (int64_t)i * N * HK_;
    float* Knrm = Knrm_.ptr + (int64_t)i * N * Hm_;
    const float* lam = lam_.ptr + (int64_t)i * Hm_;
    if (wood()) {  // window mode, Woodbury: append write i; flush at the window's end
        const int m = i % w_, s0 = i - m;
        const float* lamw = lam_.ptr + (int64_t)s0 * Hm_;
        const bool v1 = wimpl() == 1;
        const float* v = v1 ? v32(i, s) : nullptr;  // v2 reads O_ in the read / flush kernels
        if (v1)
            window_append_v1_kernel<true><<<th_blocks(dims_), kThreads, 0, s>>>(
                dims_, cur_.ptr, raw_.ptr, Kn, Knrm, v, lamw, m, w_, Kt_.ptr, Et_.ptr, Lc_.ptr, scratch_.ptr, scr_stride());
        else
            window_append_v1_kernel<false><<<th_blocks(dims_), kThreads, 0, s>>>(
                dims_, cur_.ptr, raw_.ptr, Kn, Knrm, nullptr, lamw, m, w_, Kt_.ptr, nullptr, Lc_.ptr, scratch_.ptr, scr_stride());
        LDM_LAUNCH_CHECK();
        if (m + 1 == w_ || i == D_) {
            if (v1) {
                window_flush_v1_kernel<<<th_blocks(dims_), kThreads, 0, s>>>(dims_, cur_.ptr, lamw, m + 1, w_, Kt_.ptr,
                                                                            Et_.ptr, Lc_.ptr, scratch_.ptr, scr_stride());
            } else {
                const T* O0 = O_.ptr + (int64_t)s0 * N * d_;
                const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
                if (dk_ <= 4) window_flush_v2_kernel<T, 4><<<gw, tw, 0, s>>>(dims_, cur_.ptr, lamw, m + 1, w_, Kt_.ptr, Lc_.ptr, O0, N * d_, scratch_.ptr, scr_stride());
                else if (dk_ <= 8) window_flush_v2_kernel<T, 8><<<gw, tw, 0, s>>>(dims_, cur_.ptr, lamw, m + 1, w_, Kt_.ptr, Lc_.ptr, O0, N * d_, scratch_.ptr, scr_stride());
                else window_flush_v2_kernel<T, 16><<<gw, tw, 0, s>>>(dims_, cur_.ptr, lamw, m + 1, w_, Kt_.ptr, Lc_.ptr, O0, N * d_, scratch_.ptr, scr_stride());
            }
            LDM_LAUNCH_CHECK();
            if (wstore() && i < D_)  // fallback / c > 0: state at the start of the next window
                CUDA_CHECK(cudaMemcpyAsync(state((i + 1) / w_), cur_.ptr, (size_t)st * 4, cudaMemcpyDeviceToDevice, s));
        }
        live_ = cur_.ptr;
        return;
    }
    const float* v = v32(i, s);
    // store mode: write from the previous state straight into its slot (no copy)
    float* dst = slots() ? state(i) : cur_.ptr;
    const float* from = live_;
    if (!(rls_ && v2()) && dst != from)
        CUDA_CHECK(cudaMemcpyAsync(dst, from, (size_t)st * 4, cudaMemcpyDeviceToDevice, s));
    if (rls_) {
        if (v2()) {
            switch (dk_ <= 4 ? 4 : dk_ <= 8 ? 8 : 16) {
                case 4: write_rls_v2_kernel<4><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, dst, from, raw_.ptr, Kn, Knrm, v, lam); break;
                case 8: write_rls_v2_kernel<8><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, dst, from, raw_.ptr, Kn, Knrm, v, lam); break;
                default: write_rls_v2_kernel<16><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, dst, from, raw_.ptr, Kn, Knrm, v, lam); break;
            }
        } else {
            write_v1_kernel<kRls><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam,
                                                                    nullptr, nullptr, nullptr, scratch_.ptr);
        }
    } else if (outer_ && v3()) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        if (dk_ <= 4) write_od_v2_kernel<kOuter, 4><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, nullptr, nullptr, nullptr);
        else if (dk_ <= 8) write_od_v2_kernel<kOuter, 8><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, nullptr, nullptr, nullptr);
        else write_od_v2_kernel<kOuter, 16><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, nullptr, nullptr, nullptr);
    } else if (outer_) {
        write_v1_kernel<kOuter><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam,
                                                                  nullptr, nullptr, nullptr, scratch_.ptr);
    } else {
        // z [N, Hm] = O_i · w_βᵀ (bias b_β added in the kernel from the fp32 master)
        mm_.template gemm<T, float>(false, true, N, Hm_, d_, 1.f, Oi, d_, Wb_[i], d_, 0.f, dtok_.ptr, Hm_,
                                    nullptr, s);
        float* beta = beta_.ptr + (int64_t)i * N * Hm_;
        if (v3()) {
            const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
            if (dk_ <= 4) write_od_v2_kernel<kDelta, 4><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, dtok_.ptr, Bb_[i], beta);
            else if (dk_ <= 8) write_od_v2_kernel<kDelta, 8><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, dtok_.ptr, Bb_[i], beta);
            else write_od_v2_kernel<kDelta, 16><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, dtok_.ptr, Bb_[i], beta);
        } else {
            write_v1_kernel<kDelta><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam,
                                                                      dtok_.ptr, Bb_[i], beta, scratch_.ptr);
        }
    }
    live_ = dst;
    LDM_LAUNCH_CHECK();
    if (window_) {
        if ((i + 1) % w_ == 0 && i < D_)  // state at the start of the next window
            CUDA_CHECK(cudaMemcpyAsync(state((i + 1) / w_), cur_.ptr, (size_t)st * 4, cudaMemcpyDeviceToDevice, s));
    } else if (ckpt_ > 0) {
        if (i % ckpt_ == 0)
            CUDA_CHECK(cudaMemcpyAsync(state(i / ckpt_), cur_.ptr, (size_t)st * 4, cudaMemcpyDeviceToDevice, s));
    } else if (!unwind_ && !slots()) {
        CUDA_CHECK(cudaMemcpyAsync(state(i), cur_.ptr, (size_t)st * 4, cudaMemcpyDeviceToDevice, s));
    }
}

template <typename T>
void LdmGpuScheme<T>::input(int j, T* x, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_;
    const T* srcT = std::is_same<T, float>::value ? reinterpret_cast<const T*>(src32_.ptr) : srcT_.ptr;
    mm_.template gemm<T, float>(false, true, N, HK_, d_, 1.f, srcT, d_, Wq_[j], d_, 0.f, raw_.ptr, HK_,
                                nullptr, s);
    float* Qn = Qn_.ptr + (int64_t)(j - 1) * N * HK_;
    float* Qnrm = Qnrm_.ptr + (int64_t)(j - 1) * N * Hm_;
    const float* a = residual_ ? A_[j] : nullptr;
    const int m = wood() && j <= D_ ? j % w_ : 0;  // pending writes of the current window
    if (m > 0 && wimpl() == 1) {
        window_read_v1_kernel<T><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, cur_.ptr, raw_.ptr, Qn, Qnrm, tmp32_.ptr,
                                                                      src32_.ptr, a, x, m, w_, Kt_.ptr, Et_.ptr, Lc_.ptr,
                                                                      scratch_.ptr, scr_stride());
    } else if (m > 0) {
        const T* O0 = O_.ptr + (int64_t)(j - m) * N * d_;
        const float* lamw = lam_.ptr + (int64_t)(j - m) * Hm_;
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        if (dk_ <= 4) window_read_v2_kernel<T, 4><<<gw, tw, 0, s>>>(dims_, cur_.ptr, raw_.ptr, Qn, Qnrm, src32_.ptr, a, x, m, w_, Kt_.ptr, Lc_.ptr, O0, N * d_, lamw);
        else if (dk_ <= 8) window_read_v2_kernel<T, 8><<<gw, tw, 0, s>>>(dims_, cur_.ptr, raw_.ptr, Qn, Qnrm, src32_.ptr, a, x, m, w_, Kt_.ptr, Lc_.ptr, O0, N * d_, lamw);
        else window_read_v2_kernel<T, 16><<<gw, tw, 0, s>>>(dims_, cur_.ptr, raw_.ptr, Qn, Qnrm, src32_.ptr, a, x, m, w_, Kt_.ptr, Lc_.ptr, O0, N * d_, lamw);
    } else if (v2()) {
        switch (dk_ <= 4 ? 4 : dk_ <= 8 ? 8 : 16) {
            case 4: read_v2_kernel<T, 4><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, live_, raw_.ptr, Qn, Qnrm, src32_.ptr, a, x); break;
            case 8: read_v2_kernel<T, 8><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, live_, raw_.ptr, Qn, Qnrm, src32_.ptr, a, x); break;
            default: read_v2_kernel<T, 16><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, live_, raw_.ptr, Qn, Qnrm, src32_.ptr, a, x); break;
        }
    } else {
        read_v1_kernel<T><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, live_, raw_.ptr, Qn, Qnrm, tmp32_.ptr,
                                                               src32_.ptr, a, x);
    }
    LDM_LAUNCH_CHECK();
}

template <typename T>
void LdmGpuScheme<T>::output(int j, const T* o, cudaStream_t s) {
    using namespace ldmk;
    const int64_t nd = (int64_t)N_ * d_;
    T* srcT = std::is_same<T, float>::value ? reinterpret_cast<T*>(src32_.ptr) : srcT_.ptr;
    output_kernel<T><<<elem_blocks(nd), 256, 0, s>>>(nd, o, O_.ptr + (int64_t)j * nd, src32_.ptr, srcT, residual_);
    LDM_LAUNCH_CHECK();
    write_forward(j, o, s);
}

// ---- backward ---------------------------------------------------------------------------------

template <typename T>
void LdmGpuScheme<T>::read_backward(int j, const T* dx, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_;
    const float* Qn = Qn_.ptr + (int64_t)(j - 1) * N * HK_;
    const float* Qnrm = Qnrm_.ptr + (int64_t)(j - 1) * N * Hm_;
    const float* a = residual_ ? A_[j] : nullptr;
    if (v2()) {
        switch (dk_ <= 4 ? 4 : dk_ <= 8 ? 8 : 16) {
            case 4: read_bwd_v2_kernel<T, 4><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, live_, Qn, Qnrm, dx, a, dS_.ptr, draw_.ptr, prod32_.ptr); break;
            case 8: read_bwd_v2_kernel<T, 8><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, live_, Qn, Qnrm, dx, a, dS_.ptr, draw_.ptr, prod32_.ptr); break;
            default: read_bwd_v2_kernel<T, 16><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(dims_, live_, Qn, Qnrm, dx, a, dS_.ptr, draw_.ptr, prod32_.ptr); break;
        }
    } else {
        read_bwd_v1_kernel<T><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, live_, Qn, Qnrm, dx, a, dS_.ptr,
                                                                   draw_.ptr, tmp32_.ptr, prod32_.ptr);
    }
    LDM_LAUNCH_CHECK();
    if (residual_) colsum(gA_[j], prod32_.ptr, nullptr, N, d_, d_, nullptr, partial_.ptr, s);
    const T* dr = drawT(draw_.ptr, N * HK_, drawT_.ptr, s);
    const T* srcT = std::is_same<T, float>::value ? reinterpret_cast<const T*>(src32_.ptr) : srcT_.ptr;
    // dsrc [N, d] += draw · W_q ; dW_q [HK, d] += drawᵀ · src
    mm_.template gemm<T, float>(false, false, N, d_, HK_, 1.f, dr, HK_, Wq_[j], d_, 1.f, dsrc_.ptr, d_, nullptr, s);
    mm_.template gemm<T, float>(true, false, HK_, d_, N, 1.f, dr, HK_, srcT, d_, 1.f, gWq_[j], d_, nullptr, s);
}

template <typename T>
void LdmGpuScheme<T>::record_drift(const float* ref, cudaStream_t s) {
    ldmk::drift_kernel<<<ldmk::elem_blocks((int64_t)N_ * dims_.ST), 256, 0, s>>>(
        dims_, cur_.ptr, ref, (float)cfg_.ldm_delta, drift_.ptr);
    LDM_LAUNCH_CHECK();
    drift_pending_ = true;
}

template <typename T>
void LdmGpuScheme<T>::unwind(int i, cudaStream_t s) {
    using namespace ldmk;
    const float* Kn = Kn_.ptr + (int64_t)i * N_ * HK_;
    const float* v = v32(i, s);
    const float* lam = lam_.ptr + (int64_t)i * Hm_;
    if (v3()) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        float* c = cur_.ptr;
#define LDM_V2_UW(DK)                                                                                   \
    if (rls_) unwind_v2_kernel<kRls, DK><<<gw, tw, 0, s>>>(dims_, c, Kn, v, lam);                      \
    else unwind_v2_kernel<kOuter, DK><<<gw, tw, 0, s>>>(dims_, c, Kn, v, lam);
        if (dk_ <= 4) { LDM_V2_UW(4) } else if (dk_ <= 8) { LDM_V2_UW(8) } else { LDM_V2_UW(16) }
#undef LDM_V2_UW
    } else if (rls_) unwind_v1_kernel<kRls><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, cur_.ptr, Kn, v, lam, scratch_.ptr);
    else unwind_v1_kernel<kOuter><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, cur_.ptr, Kn, v, lam, scratch_.ptr);
    LDM_LAUNCH_CHECK();
}

template <typename T>
void LdmGpuScheme<T>::rewrite(int w, cudaStream_t s) {
    using namespace ldmk;
    const float* Kn = Kn_.ptr + (int64_t)w * N_ * HK_;
    const float* v = v32(w, s);
    const float* lam = lam_.ptr + (int64_t)w * Hm_;
    const float* beta = delta_ ? beta_.ptr + (int64_t)w * N_ * Hm_ : nullptr;
    if (v3()) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        float* c = cur_.ptr;
        float* bw = const_cast<float*>(beta);  // read only with RECOMP
#define LDM_V2_RE(DK)                                                                                        \
    if (rls_) write_rls_v2_kernel<DK, true><<<gw, tw, 0, s>>>(dims_, c, c, Kn, nullptr, nullptr, v, lam);     \
    else if (outer_) write_od_v2_kernel<kOuter, DK, true><<<gw, tw, 0, s>>>(dims_, c, Kn, nullptr, nullptr, v, lam, nullptr, nullptr, nullptr); \
    else write_od_v2_kernel<kDelta, DK, true><<<gw, tw, 0, s>>>(dims_, c, Kn, nullptr, nullptr, v, lam, nullptr, nullptr, bw);
        if (dk_ <= 4) { LDM_V2_RE(4) } else if (dk_ <= 8) { LDM_V2_RE(8) } else { LDM_V2_RE(16) }
#undef LDM_V2_RE
    } else if (rls_) rewrite_v1_kernel<kRls><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, cur_.ptr, Kn, v, lam, beta, scratch_.ptr);
    else if (outer_) rewrite_v1_kernel<kOuter><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, cur_.ptr, Kn, v, lam, beta, scratch_.ptr);
    else rewrite_v1_kernel<kDelta><<<th_blocks(dims_), kThreads, 0, s>>>(dims_, cur_.ptr, Kn, v, lam, beta, scratch_.ptr);
    LDM_LAUNCH_CHECK();
}

// cur_: state after write i -> state before write i (mirrors the CPU's prev_state). Returns true
// when the caller's VJP kernel must unwind cur_ itself first (fused unwind + VJP).
template <typename T>
bool LdmGpuScheme<T>::prev_state(int i, cudaStream_t s) {
    const int64_t st = (int64_t)N_ * dims_.ST;
    auto set_init = [&]() { ldmk::init_state(dims_, cur_.ptr, (float)cfg_.ldm_delta, s); };
    auto copy_from = [&](const float* src) {
        CUDA_CHECK(cudaMemcpyAsync(cur_.ptr, src, (size_t)st * 4, cudaMemcpyDeviceToDevice, s));
    };
    if (wstore()) {  // window-start states: recompute write i's window up to write i
        live_ = cur_.ptr;
        const int start = i / w_ * w_;
        copy_from(state(i / w_));
        for (int w = start; w < i; w++) rewrite(w, s);
        return false;
    }
    if (ckpt_ == 0 && !unwind_ && !window_) {  // store mode
        if (i == 0) {
            set_init();
            live_ = cur_.ptr;
        } else if (slots()) {
            live_ = state(i - 1);  // point at the stored state (no copy)
        } else {
            live_ = cur_.ptr;
            copy_from(state(i - 1));
        }
        return false;
    }
    live_ = cur_.ptr;
    if (i == 0) {
        if (!delta_) {
            unwind(0, s);
            record_drift(nullptr, s);
        }
        set_init();
        return false;
    }
    const int p = i - 1;
    if (ckpt_ > 0 && p % ckpt_ == 0) {
        const float* ref = state(p / ckpt_);
        if (!delta_) {
            unwind(i, s);
            record_drift(ref, s);
        }
        copy_from(ref);
        return false;
    }
    if (!delta_) return true;  // fused: the VJP kernel unwinds write i first
    const int start = p / ckpt_ * ckpt_;
    copy_from(state(start / ckpt_));
    for (int w = start + 1; w <= p; w++) rewrite(w, s);
    return false;
}

template <typename T>
void LdmGpuScheme<T>::write_backward(int i, T* d_o, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_, nd = N * d_;
    const bool fused = prev_state(i, s);
    const T* Oi = O_.ptr + (int64_t)i * nd;
    const float* Kn = Kn_.ptr + (int64_t)i * N * HK_;
    const float* Knrm = Knrm_.ptr + (int64_t)i * N * Hm_;
    const float* lam = lam_.ptr + (int64_t)i * Hm_;
    const float* beta = delta_ ? beta_.ptr + (int64_t)i * N * Hm_ : nullptr;
    const float* v = v32(i, s);
    const bool f32 = std::is_same<T, float>::value;
    float* dvacc = f32 ? reinterpret_cast<float*>(d_o) : tmp32_.ptr;
    const dim3 gb(th_blocks(dims_)), tb(kThreads);
    float* scr = scratch_.ptr;
    if (rls_ && v2()) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
#define LDM_V2_VJP(DK)                                                                                     \
    if (fused) unwind_vjp_rls_v2_kernel<DK, true><<<gw, tw, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr); \
    else unwind_vjp_rls_v2_kernel<DK, false><<<gw, tw, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr);
        if (dk_ <= 4) { LDM_V2_VJP(4) } else if (dk_ <= 8) { LDM_V2_VJP(8) } else { LDM_V2_VJP(16) }
#undef LDM_V2_VJP
    } else if (!rls_ && v3()) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
#define LDM_V2_OD(DK)                                                                                     \
    if (delta_) vjp_od_v2_kernel<kDelta, DK, false><<<gw, tw, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr); \
    else if (fused) vjp_od_v2_kernel<kOuter, DK, true><<<gw, tw, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr); \
    else vjp_od_v2_kernel<kOuter, DK, false><<<gw, tw, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr);
        if (dk_ <= 4) { LDM_V2_OD(4) } else if (dk_ <= 8) { LDM_V2_OD(8) } else { LDM_V2_OD(16) }
#undef LDM_V2_OD
    } else if (rls_) {
        if (fused) write_vjp_v1_kernel<kRls, true><<<gb, tb, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
        else write_vjp_v1_kernel<kRls, false><<<gb, tb, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
    } else if (outer_) {
        if (fused) write_vjp_v1_kernel<kOuter, true><<<gb, tb, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
        else write_vjp_v1_kernel<kOuter, false><<<gb, tb, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
    } else {
        write_vjp_v1_kernel<kDelta, false><<<gb, tb, 0, s>>>(dims_, live_, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
    }
    LDM_LAUNCH_CHECK();
    // d_o += draw · W_k ; dW_k += drawᵀ · O_i (fp32 accumulation in dvacc)
    const T* dr = drawT(draw_.ptr, N * HK_, drawT_.ptr, s);
    mm_.template gemm<T, float>(false, false, N, d_, HK_, 1.f, dr, HK_, Wk_[i], d_, 1.f, dvacc, d_, nullptr, s);
    mm_.template gemm<T, float>(true, false, HK_, d_, N, 1.f, dr, HK_, Oi, d_, 1.f, gWk_[i], d_, nullptr, s);
    if (delta_) {
        const T* dz = drawT(dtok_.ptr, N * Hm_, dtokT_.ptr, s);
        mm_.template gemm<T, float>(false, false, N, d_, Hm_, 1.f, dz, Hm_, Wb_[i], d_, 1.f, dvacc, d_, nullptr, s);
        mm_.template gemm<T, float>(true, false, Hm_, d_, N, 1.f, dz, Hm_, Oi, d_, 1.f, gWb_[i], d_, nullptr, s);
        colsum(gBb_[i], dtok_.ptr, nullptr, N, Hm_, Hm_, nullptr, partial_.ptr, s);
    }
    if (forget_)
        colsum(gtheta_ + (int64_t)i * Hm_, dtok_.ptr, nullptr, N, Hm_, Hm_, lgrad_.ptr + (int64_t)i * Hm_,
               partial_.ptr, s);
    if (!f32) from_f32<T>(dvacc, d_o, nd, s);
}

template <typename T>
void LdmGpuScheme<T>::readout_backward(const T* dy, cudaStream_t s) {
    drift_S_ = drift_P_ = 0;
    CUDA_CHECK(cudaMemsetAsync(drift_.ptr, 0, 2 * sizeof(unsigned), s));
    drift_pending_ = false;
    CUDA_CHECK(cudaMemsetAsync(dS_.ptr, 0, (size_t)N_ * dims_.ST * 4, s));
    const int64_t nd = (int64_t)N_ * d_;
    if (residual_) {
        ldmk::add_grad_kernel<T><<<ldmk::elem_blocks(nd), 256, 0, s>>>(nd, dy, dsrc_.ptr, false);
        LDM_LAUNCH_CHECK();
    } else {
        CUDA_CHECK(cudaMemsetAsync(dsrc_.ptr, 0, (size_t)N_ * d_ * 4, s));
    }
    read_backward(D_ + 1, dy, s);
}

template <typename T>
void LdmGpuScheme<T>::output_backward(int j, T* d_o, cudaStream_t s) {
    const int64_t nd = (int64_t)N_ * d_;
    const T* Oj = O_.ptr + (int64_t)j * nd;
    T* srcT = std::is_same<T, float>::value ? reinterpret_cast<T*>(src32_.ptr) : srcT_.ptr;
    ldmk::restore_src_kernel<T><<<ldmk::elem_blocks(nd), 256, 0, s>>>(nd, Oj, Oj - nd, src32_.ptr, srcT, residual_);
    LDM_LAUNCH_CHECK();
    // d_o = dsrc (+ the write's VJP, inside write_backward); without residual dsrc restarts at 0
    // after being handed to d_o.
    write_backward(j, d_o, s);
    if (!residual_) CUDA_CHECK(cudaMemsetAsync(dsrc_.ptr, 0, (size_t)N_ * d_ * 4, s));
}

template <typename T>
void LdmGpuScheme<T>::input_backward(int j, const T* dx, cudaStream_t s) {
    const int64_t nd = (int64_t)N_ * d_;
    if (residual_) {
        ldmk::add_grad_kernel<T><<<ldmk::elem_blocks(nd), 256, 0, s>>>(nd, dx, dsrc_.ptr, true);
        LDM_LAUNCH_CHECK();
    }
    read_backward(j, dx, s);
}

template <typename T>
void LdmGpuScheme<T>::begin_backward(T* de, cudaStream_t s) {
    write_backward(0, de, s);
    if (drift_pending_) {
        unsigned bits[2];
        CUDA_CHECK(cudaMemcpyAsync(bits, drift_.ptr, sizeof bits, cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        float f[2];
        std::memcpy(f, bits, sizeof f);
        drift_S_ = f[0];
        drift_P_ = f[1];
    }
    const bool unwinding = !delta_ && (unwind_ || (ckpt_ > 0 && !window_) || wunwind());
    if (unwinding && ckpt_ == 0 && std::max(drift_S_, drift_P_) > cfg_.ldm_drift_tol) {
        ckpt_ = window_ ? w_  // window mode: keep the window-start states from the next step on
                : cfg_.ldm_checkpoint_every > 0 ? cfg_.ldm_checkpoint_every
                                                : std::max(1, (int)std::lround(std::sqrt((double)(D_ + 1))));
        fell_back_ = true;
        grow(stored_, ldm_gpu_kept_states(cfg_, ckpt_, wimpl()) * (int64_t)N_ * dims_.ST);
        if (!warned_) {
            std::fprintf(stderr,
                         "warning: LDM unwind drift %.3g (S) / %.3g (P) exceeds %.3g: falling back "
                         "to checkpointed segments every %d writes from the next step on\n",
                         drift_S_, drift_P_, cfg_.ldm_drift_tol, ckpt_);
            warned_ = true;
        }
    }
}

template <typename T>
std::vector<std::pair<std::string, double>> LdmGpuScheme<T>::metrics() {
    if (delta_ || (!unwind_ && ckpt_ == 0 && !wunwind()) || (window_ && !wood())) return {};
    return {{"ldm_drift_S", drift_S_}, {"ldm_drift_P", drift_P_},
            {"ldm_fallback", fell_back_ ? 1.0 : 0.0}, {"ldm_ckpt", (double)ckpt_}};
}

}  // namespace gpu
}  // namespace ldm
