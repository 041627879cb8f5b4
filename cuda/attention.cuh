// cuda/attention.cuh — causal GQA attention, flash style (online softmax, no T x T buffer),
// forward and deterministic backward on the packed qkv buffer. Contract: doc/cuda.md
// ("attention.cuh"); math: spec §1 (softmax(scale · q kᵀ) v with scale = 1/sqrt(hd), query head h
// reads kv head h / (nh/nkv)); CPU reference: cpu::attention_forward / attention_backward.
//
// Layouts (N = B·T tokens in (b, t) order):
//   qkv  [N, (nh + 2·nkv)·hd]  q heads, then k heads, then v heads
//   out  [N, nh·hd]
//   lse  [B, nh, T] fp32: natural log of Σ_{j<=t} exp(scale · q_t·k_j) (kept for the backward)
//   dqkv [N, (nh + 2·nkv)·hd]  fully overwritten (q, k and v parts)
//   backward scratch: D [B, nh, T] fp32, D_t = Σ_d dout[t,d]·out[t,d]
//
// Variants (argument `variant`; -1 = best supported for (dtype, hd); the environment variable
// LDM_ATTN_VARIANT=<n> overrides what -1 picks, as a safety valve):
//   1: scalar fp32 math, any T >= 1, any even hd <= 256, float and bf16. Forward: one warp per
//      query row (32 keys per step, one per lane, online softmax). Backward: one warp per key row
//      for dK/dV (loops over every query of every query head of the GQA group) and one warp per
//      query row for dQ. No atomics: every output element is written by exactly one thread.
//   2: bf16 tensor cores (mma.sync m16n8k16, fp32 accumulation), 64-row tiles in shared memory,
//      hd in {64, 128}, any T (partial tiles masked), bf16 only; sm_80+. Same deterministic
//      decomposition as 1 (a dK/dV kernel over key tiles, a dQ kernel over query tiles).
// Unsupported (variant, dtype, hd) combinations throw ldm::Error.
#pragma once
#include <cstdlib>

#include "cuda/common.cuh"

namespace ldm {
namespace gpu {

namespace attn_detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ================================ variant 1: scalar, one warp per row ===========================
constexpr int kV1Warps = 4;      // warps per block
constexpr int kV1MaxHd = 256;    // hd <= 256: each lane owns dims lane + 32·i, i < 8
constexpr int kV1PerLane = kV1MaxHd / 32;

// Forward. One warp per (b, h, t), rows ordered like lse ([B, nh, T]). Each step handles 32 keys:
// lane l computes the score of key j0 + l from the whole q row (shared memory), then the warp
// merges them into the running max / sum and accumulates p_j · v_j over the dims each lane owns.
template <typename T>
__global__ void __launch_bounds__(kV1Warps * 32)
attn_fwd_v1(T* out, float* lse, const T* qkv, int B, int T_, int nh, int nkv, int hd, float scale) {
    __shared__ float qs[kV1Warps][kV1MaxHd];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kV1Warps + warp;
    if (row >= (int64_t)B * nh * T_) return;               // whole warp leaves together
    const int t = (int)(row % T_);
    const int h = (int)((row / T_) % nh);
    const int b = (int)(row / ((int64_t)T_ * nh));
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * hd;
    const T* base = qkv + (int64_t)b * T_ * C3;
    const T* qrow = base + (int64_t)t * C3 + (int64_t)h * hd;
    const T* kbase = base + (int64_t)(nh + g) * hd;
    const T* vbase = base + (int64_t)(nh + nkv + g) * hd;
    float* q = qs[warp];
    for (int d = lane; d < hd; d += 32) q[d] = to_f(qrow[d]) * scale;
    __syncwarp();

    float m = -INFINITY, l = 0.f;
    float acc[kV1PerLane];
#pragma unroll
    for (int i = 0; i < kV1PerLane; i++) acc[i] = 0.f;
    for (int j0 = 0; j0 <= t; j0 += 32) {
        const int j = j0 + lane;
        float s = -INFINITY;
        if (j <= t) {
            const T* kr = kbase + (int64_t)j * C3;
            float dot = 0.f;
            for (int d = 0; d < hd; d++) dot = fmaf(q[d], to_f(kr[d]), dot);
            s = dot;
        }
        const float m_new = fmaxf(m, warp_max(s));          // finite: lane 0 always has j0 <= t
        const float p = (j <= t) ? expf(s - m_new) : 0.f;
        const float alpha = expf(m - m_new);                 // 0 on the first step (m = -inf)
        l = l * alpha + warp_sum(p);
#pragma unroll
        for (int i = 0; i < kV1PerLane; i++) acc[i] *= alpha;
        const int nj = min(32, t - j0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const T* vr = vbase + (int64_t)(j0 + jj) * C3;
#pragma unroll
            for (int i = 0; i < kV1PerLane; i++) {
                const int d = lane + 32 * i;
                if (d < hd) acc[i] = fmaf(pj, to_f(vr[d]), acc[i]);
            }
        }
        m = m_new;
    }
    const float inv = 1.f / l;
    T* orow = out + ((int64_t)b * T_ + t) * nh * hd + (int64_t)h * hd;
#pragma unroll
    for (int i = 0; i < kV1PerLane; i++) {
        const int d = lane + 32 * i;
        if (d < hd) orow[d] = from_f<T>(acc[i] * inv);
    }
    if (lane == 0) lse[row] = m + logf(l);
}

// D[b, h, t] = Σ_d dout·out (fp32), one warp per row (shared by every variant's backward).
template <typename T>
__global__ void __launch_bounds__(kV1Warps * 32)
attn_bwd_rowdot(float* D, const T* dout, const T* out, int B, int T_, int nh, int hd) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kV1Warps + warp;
    if (row >= (int64_t)B * nh * T_) return;
    const int t = (int)(row % T_);
    const int h = (int)((row / T_) % nh);
    const int b = (int)(row / ((int64_t)T_ * nh));
    const int64_t off = ((int64_t)b * T_ + t) * nh * hd + (int64_t)h * hd;
    float s = 0.f;
    for (int d = lane; d < hd; d += 32) s = fmaf(to_f(dout[off + d]), to_f(out[off + d]), s);
    s = warp_sum(s);
    if (lane == 0) D[row] = s;
}

// dK, dV of one key row per warp: rows ordered (b, kv head g, key j). Loops over the query heads
// of the group, and over queries i >= j in steps of 32 (one per lane):
//   p = exp(scale q_i·k_j − lse_i), dv_j += p dO_i, ds = p (dO_i·v_j − D_i), dk_j += scale ds q_i.
template <typename T>
__global__ void __launch_bounds__(kV1Warps * 32)
attn_bwd_dkdv_v1(T* dqkv, const T* dout, const float* lse, const float* D, const T* qkv, int B,
                 int T_, int nh, int nkv, int hd, float scale) {
    __shared__ float ks_all[kV1Warps][kV1MaxHd];
    __shared__ float vs_all[kV1Warps][kV1MaxHd];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kV1Warps + warp;
    if (row >= (int64_t)B * nkv * T_) return;
    const int j = (int)(row % T_);
    const int g = (int)((row / T_) % nkv);
    const int b = (int)(row / ((int64_t)T_ * nkv));
    const int G = nh / nkv;
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * hd;
    const int64_t OC = (int64_t)nh * hd;
    const T* base = qkv + (int64_t)b * T_ * C3;
    const T* krow = base + (int64_t)j * C3 + (int64_t)(nh + g) * hd;
    const T* vrow = base + (int64_t)j * C3 + (int64_t)(nh + nkv + g) * hd;
    float* ks = ks_all[warp];
    float* vs = vs_all[warp];
    for (int d = lane; d < hd; d += 32) {
        ks[d] = to_f(krow[d]);
        vs[d] = to_f(vrow[d]);
    }
    __syncwarp();
    float dk[kV1PerLane], dv[kV1PerLane];
#pragma unroll
    for (int i = 0; i < kV1PerLane; i++) dk[i] = dv[i] = 0.f;
    for (int hh = 0; hh < G; hh++) {
        const int h = g * G + hh;
        const T* qb = base + (int64_t)h * hd;
        const T* dob = dout + (int64_t)b * T_ * OC + (int64_t)h * hd;
        const float* lse_r = lse + ((int64_t)b * nh + h) * T_;
        const float* D_r = D + ((int64_t)b * nh + h) * T_;
        for (int i0 = j; i0 < T_; i0 += 32) {
            const int i = i0 + lane;
            float p = 0.f, ds = 0.f;
            if (i < T_) {
                const T* qr = qb + (int64_t)i * C3;
                const T* dr = dob + (int64_t)i * OC;
                float s = 0.f, dp = 0.f;
                for (int d = 0; d < hd; d++) {
                    s = fmaf(to_f(qr[d]), ks[d], s);
                    dp = fmaf(to_f(dr[d]), vs[d], dp);
                }
                p = expf(s * scale - lse_r[i]);
                ds = p * (dp - D_r[i]);
            }
            const int ni = min(32, T_ - i0);
            for (int ii = 0; ii < ni; ii++) {
                const float pi = __shfl_sync(0xffffffffu, p, ii);
                const float dsi = __shfl_sync(0xffffffffu, ds, ii);
                const T* qr = qb + (int64_t)(i0 + ii) * C3;
                const T* dr = dob + (int64_t)(i0 + ii) * OC;
#pragma unroll
                for (int c = 0; c < kV1PerLane; c++) {
                    const int d = lane + 32 * c;
                    if (d < hd) {
                        dv[c] = fmaf(pi, to_f(dr[d]), dv[c]);
                        dk[c] = fmaf(dsi, to_f(qr[d]), dk[c]);
                    }
                }
            }
        }
    }
    T* dkrow = dqkv + ((int64_t)b * T_ + j) * C3 + (int64_t)(nh + g) * hd;
    T* dvrow = dqkv + ((int64_t)b * T_ + j) * C3 + (int64_t)(nh + nkv + g) * hd;
#pragma unroll
    for (int c = 0; c < kV1PerLane; c++) {
        const int d = lane + 32 * c;
        if (d < hd) {
            dkrow[d] = from_f<T>(dk[c] * scale);
            dvrow[d] = from_f<T>(dv[c]);
        }
    }
}

// dQ of one query row per warp (rows ordered like lse): over keys j <= i, 32 per step:
//   ds = exp(scale q_i·k_j − lse_i) (dO_i·v_j − D_i), dq_i += scale ds k_j.
template <typename T>
__global__ void __launch_bounds__(kV1Warps * 32)
attn_bwd_dq_v1(T* dqkv, const T* dout, const float* lse, const float* D, const T* qkv, int B,
               int T_, int nh, int nkv, int hd, float scale) {
    __shared__ float qs_all[kV1Warps][kV1MaxHd];
    __shared__ float ds_all[kV1Warps][kV1MaxHd];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kV1Warps + warp;
    if (row >= (int64_t)B * nh * T_) return;
    const int i = (int)(row % T_);
    const int h = (int)((row / T_) % nh);
    const int b = (int)(row / ((int64_t)T_ * nh));
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * hd;
    const int64_t OC = (int64_t)nh * hd;
    const T* base = qkv + (int64_t)b * T_ * C3;
    const T* qrow = base + (int64_t)i * C3 + (int64_t)h * hd;
    const T* dorow = dout + ((int64_t)b * T_ + i) * OC + (int64_t)h * hd;
    const T* kbase = base + (int64_t)(nh + g) * hd;
    const T* vbase = base + (int64_t)(nh + nkv + g) * hd;
    float* qs = qs_all[warp];
    float* dos = ds_all[warp];
    for (int d = lane; d < hd; d += 32) {
        qs[d] = to_f(qrow[d]);
        dos[d] = to_f(dorow[d]);
    }
    __syncwarp();
    const float lse_i = lse[row], D_i = D[row];
    float dq[kV1PerLane];
#pragma unroll
    for (int c = 0; c < kV1PerLane; c++) dq[c] = 0.f;
    for (int j0 = 0; j0 <= i; j0 += 32) {
        const int j = j0 + lane;
        float ds = 0.f;
        if (j <= i) {
            const T* kr = kbase + (int64_t)j * C3;
            const T* vr = vbase + (int64_t)j * C3;
            float s = 0.f, dp = 0.f;
            for (int d = 0; d < hd; d++) {
                s = fmaf(qs[d], to_f(kr[d]), s);
                dp = fmaf(dos[d], to_f(vr[d]), dp);
            }
            ds = expf(s * scale - lse_i) * (dp - D_i);
        }
        const int nj = min(32, i - j0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            const float dsj = __shfl_sync(0xffffffffu, ds, jj);
            const T* kr = kbase + (int64_t)(j0 + jj) * C3;
#pragma unroll
            for (int c = 0; c < kV1PerLane; c++) {
                const int d = lane + 32 * c;
                if (d < hd) dq[c] = fmaf(dsj, to_f(kr[d]), dq[c]);
            }
        }
    }
    T* dqrow = dqkv + ((int64_t)b * T_ + i) * C3 + (int64_t)h * hd;
#pragma unroll
    for (int c = 0; c < kV1PerLane; c++) {
        const int d = lane + 32 * c;
        if (d < hd) dqrow[d] = from_f<T>(dq[c] * scale);
    }
}

// ---- variant selection -------------------------------------------------------------------------
template <typename T>
inline bool variant_supported(int variant, int hd) {
    if (variant == 1) return hd >= 2 && hd <= kV1MaxHd && hd % 2 == 0;
    return false;
}

// -1 -> best supported variant for (T, hd); LDM_ATTN_VARIANT overrides when it is supported.
template <typename T>
inline int resolve_variant(int variant, int hd) {
    if (variant < 0) {
        if (const char* env = std::getenv("LDM_ATTN_VARIANT")) {
            int v = std::atoi(env);
            if (variant_supported<T>(v, hd)) return v;
        }
        for (int v : {2, 1})
            if (variant_supported<T>(v, hd)) return v;
    }
    if (!variant_supported<T>(variant, hd))
        throw Error(strprintf("attention: variant %d does not support dtype %s, hd=%d", variant,
                              dtype_name<T>(), hd));
    return variant;
}

inline void check_shape(int B, int T_, int nh, int nkv, int hd) {
    if (B < 1 || T_ < 1 || nh < 1 || nkv < 1 || nh % nkv != 0 || hd < 2 || hd % 2 != 0)
        throw Error(strprintf("attention: bad shape B=%d T=%d nh=%d nkv=%d hd=%d", B, T_, nh, nkv,
                              hd));
}

}  // namespace attn_detail

// D scratch of the backward: B·nh·T floats.
inline int64_t attention_backward_scratch(int B, int T_, int nh, int nkv, int hd) {
    return (int64_t)B * nh * T_;
}

// Which variant `variant` (-1 = auto) resolves to for (T, hd); throws when unsupported.
template <typename T>
inline int attention_variant(int hd, int variant = -1) {
    return attn_detail::resolve_variant<T>(variant, hd);
}

// out [N, nh·hd] = causal softmax(scale q kᵀ) v per head; lse [B, nh, T] fp32 (natural log).
template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int nh, int nkv, int hd,
                       cudaStream_t s, int variant = -1) {
    using namespace attn_detail;
    check_shape(B, T_, nh, nkv, hd);
    const int v = resolve_variant<T>(variant, hd);
    const float scale = 1.f / sqrtf((float)hd);
    if (v == 1) {
        const int64_t rows = (int64_t)B * nh * T_;
        attn_fwd_v1<T><<<(unsigned)ceil_div(rows, kV1Warps), kV1Warps * 32, 0, s>>>(
            out, lse, qkv, B, T_, nh, nkv, hd, scale);
        LDM_LAUNCH_CHECK();
    }
}

// dqkv [N, (nh+2nkv)·hd] = ∂L/∂qkv (overwritten), from dout [N, nh·hd] and the forward's out and
// lse. scratch >= attention_backward_scratch(...) floats.
template <typename T>
void attention_backward(T* dqkv, float* scratch, const T* dout, const T* out, const float* lse,
                        const T* qkv, int B, int T_, int nh, int nkv, int hd, cudaStream_t s,
                        int variant = -1) {
    using namespace attn_detail;
    check_shape(B, T_, nh, nkv, hd);
    const int v = resolve_variant<T>(variant, hd);
    const float scale = 1.f / sqrtf((float)hd);
    const int64_t qrows = (int64_t)B * nh * T_, krows = (int64_t)B * nkv * T_;
    float* D = scratch;
    attn_bwd_rowdot<T><<<(unsigned)ceil_div(qrows, kV1Warps), kV1Warps * 32, 0, s>>>(
        D, dout, out, B, T_, nh, hd);
    LDM_LAUNCH_CHECK();
    if (v == 1) {
        attn_bwd_dkdv_v1<T><<<(unsigned)ceil_div(krows, kV1Warps), kV1Warps * 32, 0, s>>>(
            dqkv, dout, lse, D, qkv, B, T_, nh, nkv, hd, scale);
        LDM_LAUNCH_CHECK();
        attn_bwd_dq_v1<T><<<(unsigned)ceil_div(qrows, kV1Warps), kV1Warps * 32, 0, s>>>(
            dqkv, dout, lse, D, qkv, B, T_, nh, nkv, hd, scale);
        LDM_LAUNCH_CHECK();
    }
}

}  // namespace gpu
}  // namespace ldm
