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
// Two kernel families, chosen by (dtype, hd) (attention_uses_mma):
//   scalar: fp32 math, any T >= 1, any even hd <= 256, float and bf16 (the fp32 trainer and odd
//      head dims). Forward: one warp per query row (32 keys per step, one per lane, online
//      softmax). Backward: one warp per key row for dK/dV (loops over every query of every query
//      head of the GQA group) and one warp per query row for dQ. No atomics: every output element
//      is written by exactly one thread.
//   mma: bf16 tensor cores (mma.sync m16n8k16, fp32 accumulation), 64-row tiles in shared memory,
//      hd in {64, 128}, any T (partial tiles masked), bf16 only; sm_80+. Same deterministic
//      decomposition (a dK/dV kernel over key tiles, a dQ kernel over query tiles). The MMA
//      operand fragments are read from shared memory by ldmatrix (LdsmFrags; .trans for the
//      row-major B operands). The kernels take the fragment loader as a template parameter so
//      that the dev/cuda/attention.cu workbench can run them with plain shared-memory loads too.
// Both families also run on the CPU under dev/emu (mma / ldmatrix per the PTX ISA fragment
// tables) in CI.
#pragma once
#include <cstdlib>
#include <type_traits>

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

// ================================ scalar kernels: one warp per row ===============================
// (b, h, t) of row `row` in [B, H, T] order. Row counts fit in 31 bits (check_shape), so the
// divisions are 32-bit: a 64-bit one is a called subroutine (and its register save a spill).
__host__ __device__ __forceinline__ void split_row(int64_t row, int T_, int H, int& b, int& h, int& t) {
    const unsigned r = (unsigned)row, bh = r / (unsigned)T_;
    t = (int)(r - bh * (unsigned)T_);
    h = (int)(bh % (unsigned)H);
    b = (int)(bh / (unsigned)H);
}
constexpr int kScalarWarps = 4;      // warps per block
constexpr int kScalarMaxHd = 256;    // hd <= 256: each lane owns dims lane + 32·i, i < 8
constexpr int kScalarPerLane = kScalarMaxHd / 32;

// Forward. One warp per (b, h, t), rows ordered like lse ([B, nh, T]). Each step handles 32 keys:
// lane l computes the score of key j0 + l from the whole q row (shared memory), then the warp
// merges them into the running max / sum and accumulates p_j · v_j over the dims each lane owns.
template <typename T>
__global__ void __launch_bounds__(kScalarWarps * 32)
attn_fwd_scalar(T* out, float* lse, const T* qkv, int B, int T_, int nh, int nkv, int hd, float scale) {
    __shared__ float qs[kScalarWarps][kScalarMaxHd];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kScalarWarps + warp;
    if (row >= (int64_t)B * nh * T_) return;               // whole warp leaves together
    int b, h, t;
    split_row(row, T_, nh, b, h, t);
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
    float acc[kScalarPerLane];
#pragma unroll
    for (int i = 0; i < kScalarPerLane; i++) acc[i] = 0.f;
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
        for (int i = 0; i < kScalarPerLane; i++) acc[i] *= alpha;
        const int nj = min(32, t - j0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const T* vr = vbase + (int64_t)(j0 + jj) * C3;
#pragma unroll
            for (int i = 0; i < kScalarPerLane; i++) {
                const int d = lane + 32 * i;
                if (d < hd) acc[i] = fmaf(pj, to_f(vr[d]), acc[i]);
            }
        }
        m = m_new;
    }
    const float inv = 1.f / l;
    T* orow = out + ((int64_t)b * T_ + t) * nh * hd + (int64_t)h * hd;
#pragma unroll
    for (int i = 0; i < kScalarPerLane; i++) {
        const int d = lane + 32 * i;
        if (d < hd) orow[d] = from_f<T>(acc[i] * inv);
    }
    if (lane == 0) lse[row] = m + logf(l);
}

// D[b, h, t] = Σ_d dout·out (fp32), one warp per row (shared by both backward paths).
template <typename T>
__global__ void __launch_bounds__(kScalarWarps * 32)
attn_bwd_rowdot(float* D, const T* dout, const T* out, int B, int T_, int nh, int hd) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kScalarWarps + warp;
    if (row >= (int64_t)B * nh * T_) return;
    int b, h, t;
    split_row(row, T_, nh, b, h, t);
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
__global__ void __launch_bounds__(kScalarWarps * 32)
attn_bwd_dkdv_scalar(T* dqkv, const T* dout, const float* lse, const float* D, const T* qkv, int B,
                 int T_, int nh, int nkv, int hd, float scale) {
    __shared__ float ks_all[kScalarWarps][kScalarMaxHd];
    __shared__ float vs_all[kScalarWarps][kScalarMaxHd];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kScalarWarps + warp;
    if (row >= (int64_t)B * nkv * T_) return;
    int b, g, j;
    split_row(row, T_, nkv, b, g, j);
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
    float dk[kScalarPerLane], dv[kScalarPerLane];
#pragma unroll
    for (int i = 0; i < kScalarPerLane; i++) dk[i] = dv[i] = 0.f;
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
                for (int d = 0; d < hd; d++) {  // q pre-scaled as in the forward: the same s
                    s = fmaf(to_f(qr[d]) * scale, ks[d], s);
                    dp = fmaf(to_f(dr[d]), vs[d], dp);
                }
                p = expf(s - lse_r[i]);
                ds = p * (dp - D_r[i]);
            }
            const int ni = min(32, T_ - i0);
            for (int ii = 0; ii < ni; ii++) {
                const float pi = __shfl_sync(0xffffffffu, p, ii);
                const float dsi = __shfl_sync(0xffffffffu, ds, ii);
                const T* qr = qb + (int64_t)(i0 + ii) * C3;
                const T* dr = dob + (int64_t)(i0 + ii) * OC;
#pragma unroll
                for (int c = 0; c < kScalarPerLane; c++) {
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
    for (int c = 0; c < kScalarPerLane; c++) {
        const int d = lane + 32 * c;
        if (d < hd) {
            dkrow[d] = from_f<T>(dk[c] * scale);
            dvrow[d] = from_f<T>(dv[c]);
        }
    }
}

// dQ of one query row per warp (rows ordered like lse): over keys j <= i, 32 per step:
//   ds = exp(scale q_i·k_j − lse_i) (dO_i·v_j − D_i), dq_i += scale ds k_j.
// 8 blocks per SM asked for: left free, ptxas aims higher and spills in bf16 (doc/ptxas.md).
template <typename T>
__global__ void __launch_bounds__(kScalarWarps * 32, 8)
attn_bwd_dq_scalar(T* dqkv, const T* dout, const float* lse, const float* D, const T* qkv, int B,
               int T_, int nh, int nkv, int hd, float scale) {
    __shared__ float qs_all[kScalarWarps][kScalarMaxHd];
    __shared__ float ds_all[kScalarWarps][kScalarMaxHd];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * kScalarWarps + warp;
    if (row >= (int64_t)B * nh * T_) return;
    int b, h, i;
    split_row(row, T_, nh, b, h, i);
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
        qs[d] = to_f(qrow[d]) * scale;  // pre-scaled as in the forward: the same s, bit for bit
        dos[d] = to_f(dorow[d]);
    }
    __syncwarp();
    const float lse_i = lse[row], D_i = D[row];
    float dq[kScalarPerLane];
#pragma unroll
    for (int c = 0; c < kScalarPerLane; c++) dq[c] = 0.f;
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
            ds = expf(s - lse_i) * (dp - D_i);
        }
        const int nj = min(32, i - j0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            const float dsj = __shfl_sync(0xffffffffu, ds, jj);
            const T* kr = kbase + (int64_t)(j0 + jj) * C3;
#pragma unroll
            for (int c = 0; c < kScalarPerLane; c++) {
                const int d = lane + 32 * c;
                if (d < hd) dq[c] = fmaf(dsj, to_f(kr[d]), dq[c]);
            }
        }
    }
    T* dqrow = dqkv + ((int64_t)b * T_ + i) * C3 + (int64_t)h * hd;
#pragma unroll
    for (int c = 0; c < kScalarPerLane; c++) {
        const int d = lane + 32 * c;
        if (d < hd) dqrow[d] = from_f<T>(dq[c] * scale);
    }
}

// ================================ mma kernels: bf16 tensor cores =================================
// mma.sync.m16n8k16 (row.col, bf16 in, fp32 accumulate), PTX ISA fragment layout, with
// gr = lane / 4 and tg = lane % 4:
//   A 16x16 (row-major): a0 = A[gr][2tg, 2tg+1], a1 = A[gr+8][2tg..], a2 = A[gr][2tg+8..],
//                        a3 = A[gr+8][2tg+8..]       (two bf16 per register, lower column low)
//   B 16x8  (k x n):     b0 = B[2tg, 2tg+1][gr], b1 = B[2tg+8, 2tg+9][gr]
//   C 16x8  (fp32):      c0, c1 = C[gr][2tg, 2tg+1], c2, c3 = C[gr+8][2tg, 2tg+1]
// So the C fragments of two adjacent n-tiles (columns 16k..16k+15) are, packed to bf16, exactly
// the A fragment of k-tile k: the P (or dS) of one mma feeds the next one from registers.
// Tiles: 64 rows x HD in shared memory with rows padded by 8 bf16 (16 bytes).
constexpr int kMmaRows = 64;      // query rows per block (fwd, dQ) = keys per tile
constexpr int kMmaThreads = 128;  // 4 warps, 16 rows each
constexpr int kMmaPad = 8;

using ::ldm::gpu::ld_pair;  // (cuda/common.cuh, shared with the mHC projection kernel)
using ::ldm::gpu::mma_16816;

// Two bf16 (lo in the low half) from separate addresses.
__device__ __forceinline__ uint32_t pack_bf16(bf16 lo, bf16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}
__device__ __forceinline__ uint32_t pack_f32(float lo, float hi) {
    return pack_bf16(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
}

// Copies rows [r0, r0 + ROWS) x [0, HD) of a strided global bf16 matrix (row stride `ld`
// elements, base already at column 0 of the head) into shared memory (row stride HD + kMmaPad);
// rows >= T_ are zero-filled. 16-byte vector loads (HD % 8 == 0, 16-byte aligned rows).
template <int HD, int ROWS>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int r0, int T_, int64_t ld) {
    constexpr int LDS = HD + kMmaPad, CH = HD / 8;
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += kMmaThreads) {
        const int r = idx / CH, c = (idx % CH) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + r < T_) v = *reinterpret_cast<const uint4*>(src + (int64_t)(r0 + r) * ld + c);
        *reinterpret_cast<uint4*>(dst + r * LDS + c) = v;
    }
}

// A fragment of k-tile kk from the fp32 C fragments of n-tiles 2kk and 2kk+1 (rounded to bf16).
__device__ __forceinline__ void frag_a_from_c(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack_f32(c0[0], c0[1]);
    a[1] = pack_f32(c0[2], c0[3]);
    a[2] = pack_f32(c1[0], c1[1]);
    a[3] = pack_f32(c1[2], c1[3]);
}

// ldmatrix: four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix
// l / 8 (16-byte aligned). Register i of lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of
// matrix i; with .trans, rows 2(l%4), 2(l%4)+1 of column l/4 (i.e. of the transposed matrix).
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    __trap();  // host: ldsm
#endif
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const bf16* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    __trap();  // host: ldsm_trans
#endif
}

// The MMA operand fragments of a shared-memory tile, read by ldmatrix. A fragment loader is a
// class with these three static members (the kernels' Frags parameter):
//   a<LDS>(a, tile, row0, col0, lane):        A fragment of rows [row0, row0+16) x [col0, col0+16)
//   b_trans2<LDS>(b0, b1, tile, n0, k0, lane): B fragments of n-tiles n0, n0+8, B[k][n] = tile[n][k0+k]
//   b2<LDS>(b0, b1, tile, k0, n0, lane):       B fragments of n-tiles n0, n0+8, B[k][n] = tile[k0+k][n]
struct LdsmFrags {
    template <int LDS>
    __device__ __forceinline__ static void a(uint32_t a[4], const bf16* tile, int row0, int col0, int lane) {
        const int m = lane >> 3, r = lane & 7;
        ldsm_x4(a, tile + (row0 + (m & 1) * 8 + r) * LDS + col0 + (m >> 1) * 8);
    }
    template <int LDS>
    __device__ __forceinline__ static void b_trans2(uint32_t b0[2], uint32_t b1[2], const bf16* tile, int n0,
                                                    int k0, int lane) {
        const int m = lane >> 3, r = lane & 7;
        uint32_t t[4];
        ldsm_x4(t, tile + (n0 + (m >> 1) * 8 + r) * LDS + k0 + (m & 1) * 8);
        b0[0] = t[0]; b0[1] = t[1]; b1[0] = t[2]; b1[1] = t[3];
    }
    template <int LDS>
    __device__ __forceinline__ static void b2(uint32_t b0[2], uint32_t b1[2], const bf16* tile, int k0, int n0,
                                              int lane) {
        const int m = lane >> 3, r = lane & 7;
        uint32_t t[4];
        ldsm_x4_trans(t, tile + (k0 + (m & 1) * 8 + r) * LDS + n0 + (m >> 1) * 8);
        b0[0] = t[0]; b0[1] = t[1]; b1[0] = t[2]; b1[1] = t[3];
    }
};

template <int HD>
constexpr int mma_fwd_smem() { return 3 * kMmaRows * (HD + kMmaPad) * 2; }

// Forward. Grid (ceil(T/64), nh, B), 128 threads; block = 64 query rows of head h (the longest
// rows first), warp w = rows 16w..16w+15. Loops over the key tiles 0..(last query)/64: S = Q Kᵀ
// (tensor cores), scaled to log2 units, causal / length mask (the diagonal tile only, which
// also skips each warp's fully masked 16-key groups), online softmax in fp32, O += P V.
template <int HD, class Frags>
__global__ void __launch_bounds__(kMmaThreads)
attn_fwd_mma(bf16* out, float* lse, const bf16* qkv, int T_, int nh, int nkv, float scale_log2) {
    constexpr int LDS = HD + kMmaPad, NT_D = HD / 8, NT_K = kMmaRows / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* Ks = Qs + kMmaRows * LDS;
    bf16* Vs = Ks + kMmaRows * LDS;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const int q0 = qt * kMmaRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wr = warp * 16;                               // warp's first row in the tile
    load_tile<HD, kMmaRows>(Qs, base + (int64_t)h * HD, q0, T_, C3);

    float o[NT_D][4];
#pragma unroll
    for (int i = 0; i < NT_D; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};   // rows gr, gr + 8 (log2 units)
    const int row_lo = q0 + wr + gr;                          // query index of rows gr, gr+8
    const int n_kt = (min(q0 + kMmaRows, T_) - 1) / kMmaRows + 1;
    for (int kt = 0; kt < n_kt; kt++) {
        const int k0 = kt * kMmaRows;
        __syncthreads();                                      // previous K/V tile consumed
        load_tile<HD, kMmaRows>(Ks, base + (int64_t)(nh + g) * HD, k0, T_, C3);
        load_tile<HD, kMmaRows>(Vs, base + (int64_t)(nh + nkv + g) * HD, k0, T_, C3);
        __syncthreads();
        // The tile's math; DIAG (the last, diagonal tile: the only one holding keys after a row or
        // at or beyond T) masks, and skips the 16-key groups whose keys all follow the warp's last
        // row (their P is 0). Earlier tiles need no mask: every key precedes every row.
        const auto tile = [&](auto diag) {
            constexpr bool DIAG = decltype(diag)::value;
            const int live = min(q0 + wr + 15, T_ - 1) - k0;  // last key offset any warp row sees
            float s[NT_K][4];
#pragma unroll
            for (int i = 0; i < NT_K; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t a[4];
                Frags::template a<LDS>(a, Qs, wr, kk * 16, lane);
#pragma unroll
                for (int nt = 0; nt < NT_K; nt += 2) {
                    if (DIAG && nt * 8 > live) continue;          // 16 keys all masked for the warp
                    uint32_t b0[2], b1[2];
                    Frags::template b_trans2<LDS>(b0, b1, Ks, nt * 8, kk * 16, lane);
                    mma_16816(s[nt], a, b0);
                    mma_16816(s[nt + 1], a, b1);
                }
            }
            // Scale to log2 units and (diagonal tile) mask key > query or key >= T to -inf.
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < NT_K; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = row_lo + ((e >> 1) << 3);
                    const int col = k0 + nt * 8 + 2 * tg + (e & 1);
                    const float x = (DIAG && (col > row || col >= T_)) ? -INFINITY : s[nt][e] * scale_log2;
                    s[nt][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            float alpha[2], mu[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float m_new = fmaxf(m[r], mx[r]);
                mu[r] = (m_new == -INFINITY) ? 0.f : m_new;     // all masked so far: keep p = 0
                alpha[r] = exp2f(m[r] - mu[r]);                  // 0 while m = -inf
                m[r] = m_new;
                l[r] *= alpha[r];
            }
#pragma unroll
            for (int nt = 0; nt < NT_K; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = exp2f(s[nt][e] - mu[e >> 1]);
                    s[nt][e] = p;
                    l[e >> 1] += p;                              // this thread's columns only
                }
#pragma unroll
            for (int i = 0; i < NT_D; i++) {
                o[i][0] *= alpha[0];
                o[i][1] *= alpha[0];
                o[i][2] *= alpha[1];
                o[i][3] *= alpha[1];
            }
            // O += P V
#pragma unroll
            for (int kk = 0; kk < kMmaRows / 16; kk++) {
                if (DIAG && kk * 16 > live) continue;             // P = 0 for these 16 keys
                uint32_t a[4];
                frag_a_from_c(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int nt = 0; nt < NT_D; nt += 2) {
                    uint32_t b0[2], b1[2];
                    Frags::template b2<LDS>(b0, b1, Vs, kk * 16, nt * 8, lane);
                    mma_16816(o[nt], a, b0);
                    mma_16816(o[nt + 1], a, b1);
                }
            }
        };
        if (kt == n_kt - 1) tile(std::true_type{});
        else tile(std::false_type{});
    }
    // Row sums over the quad (the 4 threads sharing a row), then write.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = row_lo + 8 * r;
        if (row >= T_) continue;
        const float inv = 1.f / l[r];
        bf16* orow = out + ((int64_t)b * T_ + row) * nh * HD + (int64_t)h * HD;
#pragma unroll
        for (int nt = 0; nt < NT_D; nt++) {
            __nv_bfloat162 v2 = __floats2bfloat162_rn(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
            *reinterpret_cast<__nv_bfloat162*>(orow + nt * 8 + 2 * tg) = v2;
        }
        if (tg == 0) lse[((int64_t)b * nh + h) * T_ + row] = (m[r] + log2f(l[r])) * kLn2;
    }
}

template <int HD>
constexpr int mma_dq_smem() { return 4 * kMmaRows * (HD + kMmaPad) * 2; }

// dQ. Grid (ceil(T/64), nh, B), 128 threads; block = 64 query rows of head h, warp = 16 rows.
// Per key tile, in two halves of 32 keys: S = Q Kᵀ, P = exp2(S·scale·log2e − lse·log2e)
// (masked to 0), dP = dO Vᵀ, dS = P (dP − D), dQ += dS K; dQ·scale written once at the end.
// The warp's Q fragments stay in registers; dO's are re-read per half. Halves keep S and dP at
// 32 registers (no spill at hd 64, doc/cuda.md) and skip a half whose keys all follow the warp's
// rows; dQ's MMAs run in the same order as over whole tiles.
template <int HD, class Frags>
__global__ void __launch_bounds__(kMmaThreads)
attn_bwd_dq_mma(bf16* dqkv, const bf16* dout, const float* lse, const float* D, const bf16* qkv,
               int T_, int nh, int nkv, float scale, float scale_log2) {
    constexpr int LDS = HD + kMmaPad, NT_D = HD / 8, kHalf = kMmaRows / 2, NT_H = kHalf / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* dOs = Qs + kMmaRows * LDS;
    bf16* Ks = dOs + kMmaRows * LDS;
    bf16* Vs = Ks + kMmaRows * LDS;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD, OC = (int64_t)nh * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const int q0 = qt * kMmaRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wr = warp * 16;
    load_tile<HD, kMmaRows>(Qs, base + (int64_t)h * HD, q0, T_, C3);
    load_tile<HD, kMmaRows>(dOs, dout + (int64_t)b * T_ * OC + (int64_t)h * HD, q0, T_, OC);
    const int row_lo = q0 + wr + gr;
    float lse2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_lo + 8 * r;
        const int64_t idx = ((int64_t)b * nh + h) * T_ + row;
        lse2[r] = row < T_ ? lse[idx] * kLog2e : 0.f;
        Dr[r] = row < T_ ? D[idx] : 0.f;
    }
    __syncthreads();                                     // Q tile complete: read its fragments once
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) Frags::template a<LDS>(qf[kk], Qs, wr, kk * 16, lane);
    float dq[NT_D][4];
#pragma unroll
    for (int i = 0; i < NT_D; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
    const int n_kt = (min(q0 + kMmaRows, T_) - 1) / kMmaRows + 1;
    for (int kt = 0; kt < n_kt; kt++) {
        const int k0 = kt * kMmaRows;
        if (kt > 0) __syncthreads();                      // previous K/V tile consumed
        load_tile<HD, kMmaRows>(Ks, base + (int64_t)(nh + g) * HD, k0, T_, C3);
        load_tile<HD, kMmaRows>(Vs, base + (int64_t)(nh + nkv + g) * HD, k0, T_, C3);
        __syncthreads();
#pragma unroll
        for (int hk = 0; hk < kMmaRows; hk += kHalf) {
            if (k0 + hk > q0 + wr + 15) break;              // every key of the half is masked (warp-uniform)
            float s[NT_H][4], dp[NT_H][4];
#pragma unroll
            for (int i = 0; i < NT_H; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t dof[4];
                Frags::template a<LDS>(dof, dOs, wr, kk * 16, lane);
#pragma unroll
                for (int nt = 0; nt < NT_H; nt += 2) {
                    uint32_t b0[2], b1[2];
                    Frags::template b_trans2<LDS>(b0, b1, Ks, hk + nt * 8, kk * 16, lane);
                    mma_16816(s[nt], qf[kk], b0);
                    mma_16816(s[nt + 1], qf[kk], b1);
                    Frags::template b_trans2<LDS>(b0, b1, Vs, hk + nt * 8, kk * 16, lane);
                    mma_16816(dp[nt], dof, b0);
                    mma_16816(dp[nt + 1], dof, b1);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT_H; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1;
                    const int row = row_lo + 8 * r;
                    const int col = k0 + hk + nt * 8 + 2 * tg + (e & 1);
                    const float p = (col > row || col >= T_)
                                        ? 0.f
                                        : exp2f(fmaf(s[nt][e], scale_log2, -lse2[r]));
                    s[nt][e] = p * (dp[nt][e] - Dr[r]);     // dS (unscaled)
                }
            // dQ += dS K
#pragma unroll
            for (int kk = 0; kk < kHalf / 16; kk++) {
                uint32_t a[4];
                frag_a_from_c(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int nt = 0; nt < NT_D; nt += 2) {
                    uint32_t b0[2], b1[2];
                    Frags::template b2<LDS>(b0, b1, Ks, hk + kk * 16, nt * 8, lane);
                    mma_16816(dq[nt], a, b0);
                    mma_16816(dq[nt + 1], a, b1);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_lo + 8 * r;
        if (row >= T_) continue;
        bf16* drow = dqkv + ((int64_t)b * T_ + row) * C3 + (int64_t)h * HD;
#pragma unroll
        for (int nt = 0; nt < NT_D; nt++)
            *reinterpret_cast<__nv_bfloat162*>(drow + nt * 8 + 2 * tg) =
                __floats2bfloat162_rn(dq[nt][2 * r] * scale, dq[nt][2 * r + 1] * scale);
    }
}

// Query rows per step of the dK/dV kernel (fewer for hd 128 to keep the accumulators in registers).
template <int HD>
__host__ __device__ constexpr int mma_dkdv_bq() { return HD <= 64 ? 64 : 32; }
template <int HD>
constexpr int mma_dkdv_smem() {
    return (2 * kMmaRows + 2 * mma_dkdv_bq<HD>()) * (HD + kMmaPad) * 2 + 2 * mma_dkdv_bq<HD>() * 4;
}

// dK, dV. Grid (ceil(T/64), nkv, B), 128 threads; block = 64 keys of kv head g (K, V tiles stay in
// shared memory), warp = 16 keys. Loops over the query heads of the group and the query tiles
// from the key tile on (BQ rows each): Sᵀ = K Qᵀ, Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e) masked,
// dPᵀ = V dOᵀ, dSᵀ = Pᵀ (dPᵀ − D); dV += Pᵀ dO, dK += dSᵀ Q; written once (dK·scale) at the end.
template <int HD, class Frags>
__global__ void __launch_bounds__(kMmaThreads)
attn_bwd_dkdv_mma(bf16* dqkv, const bf16* dout, const float* lse, const float* D, const bf16* qkv,
                 int T_, int nh, int nkv, float scale, float scale_log2) {
    constexpr int LDS = HD + kMmaPad, NT_D = HD / 8, BQ = mma_dkdv_bq<HD>(), NT_Q = BQ / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
    bf16* Vs = Ks + kMmaRows * LDS;
    bf16* Qs = Vs + kMmaRows * LDS;
    bf16* dOs = Qs + BQ * LDS;
    float* lse2s = reinterpret_cast<float*>(dOs + BQ * LDS);
    float* Ds = lse2s + BQ;
    const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    const int G = nh / nkv;
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD, OC = (int64_t)nh * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const int k0 = kt * kMmaRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wr = warp * 16;
    const int key_lo = k0 + wr + gr;                         // key index of rows gr, gr+8
    load_tile<HD, kMmaRows>(Ks, base + (int64_t)(nh + g) * HD, k0, T_, C3);
    load_tile<HD, kMmaRows>(Vs, base + (int64_t)(nh + nkv + g) * HD, k0, T_, C3);
    float dk[NT_D][4], dv[NT_D][4];
#pragma unroll
    for (int i = 0; i < NT_D; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;
    for (int hh = 0; hh < G; hh++) {
        const int h = g * G + hh;
        const float* lse_r = lse + ((int64_t)b * nh + h) * T_;
        const float* D_r = D + ((int64_t)b * nh + h) * T_;
        for (int q0 = k0; q0 < T_; q0 += BQ) {
            __syncthreads();                                 // previous Q/dO tile consumed
            load_tile<HD, BQ>(Qs, base + (int64_t)h * HD, q0, T_, C3);
            load_tile<HD, BQ>(dOs, dout + (int64_t)b * T_ * OC + (int64_t)h * HD, q0, T_, OC);
            for (int i = threadIdx.x; i < BQ; i += kMmaThreads) {
                const bool ok = q0 + i < T_;
                lse2s[i] = ok ? lse_r[q0 + i] * kLog2e : 0.f;
                Ds[i] = ok ? D_r[q0 + i] : 0.f;
            }
            __syncthreads();
            float st[NT_Q][4], dpt[NT_Q][4];
#pragma unroll
            for (int i = 0; i < NT_Q; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t a[4], av[4];
                Frags::template a<LDS>(a, Ks, wr, kk * 16, lane);
                Frags::template a<LDS>(av, Vs, wr, kk * 16, lane);
#pragma unroll
                for (int nt = 0; nt < NT_Q; nt += 2) {
                    uint32_t b0[2], b1[2];
                    Frags::template b_trans2<LDS>(b0, b1, Qs, nt * 8, kk * 16, lane);
                    mma_16816(st[nt], a, b0);
                    mma_16816(st[nt + 1], a, b1);
                    Frags::template b_trans2<LDS>(b0, b1, dOs, nt * 8, kk * 16, lane);
                    mma_16816(dpt[nt], av, b0);
                    mma_16816(dpt[nt + 1], av, b1);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT_Q; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = key_lo + ((e >> 1) << 3);
                    const int qi = nt * 8 + 2 * tg + (e & 1);
                    const int q = q0 + qi;
                    const float p = (q < key || q >= T_)
                                        ? 0.f
                                        : exp2f(fmaf(st[nt][e], scale_log2, -lse2s[qi]));
                    st[nt][e] = p;
                    dpt[nt][e] = p * (dpt[nt][e] - Ds[qi]);
                }
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                uint32_t ap[4], as[4];
                frag_a_from_c(ap, st[2 * kk], st[2 * kk + 1]);
                frag_a_from_c(as, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
                for (int nt = 0; nt < NT_D; nt += 2) {
                    uint32_t b0[2], b1[2];
                    Frags::template b2<LDS>(b0, b1, dOs, kk * 16, nt * 8, lane);
                    mma_16816(dv[nt], ap, b0);
                    mma_16816(dv[nt + 1], ap, b1);
                    Frags::template b2<LDS>(b0, b1, Qs, kk * 16, nt * 8, lane);
                    mma_16816(dk[nt], as, b0);
                    mma_16816(dk[nt + 1], as, b1);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key_lo + 8 * r;
        if (key >= T_) continue;
        bf16* krow = dqkv + ((int64_t)b * T_ + key) * C3 + (int64_t)(nh + g) * HD;
        bf16* vrow = dqkv + ((int64_t)b * T_ + key) * C3 + (int64_t)(nh + nkv + g) * HD;
#pragma unroll
        for (int nt = 0; nt < NT_D; nt++) {
            *reinterpret_cast<__nv_bfloat162*>(krow + nt * 8 + 2 * tg) =
                __floats2bfloat162_rn(dk[nt][2 * r] * scale, dk[nt][2 * r + 1] * scale);
            *reinterpret_cast<__nv_bfloat162*>(vrow + nt * 8 + 2 * tg) =
                __floats2bfloat162_rn(dv[nt][2 * r], dv[nt][2 * r + 1]);
        }
    }
}

template <int HD, class Frags>
inline void mma_forward(bf16* out, float* lse, const bf16* qkv, int B, int T_, int nh, int nkv,
                       float scale, cudaStream_t s) {
    constexpr int smem = mma_fwd_smem<HD>();
    ensure_dynamic_smem(attn_fwd_mma<HD, Frags>, smem);
    dim3 grid((unsigned)ceil_div(T_, kMmaRows), (unsigned)nh, (unsigned)B);
    attn_fwd_mma<HD, Frags><<<grid, kMmaThreads, smem, s>>>(out, lse, qkv, T_, nh, nkv, scale * kLog2e);
    LDM_LAUNCH_CHECK();
}

template <int HD, class Frags>
inline void mma_backward(bf16* dqkv, const float* D, const bf16* dout, const float* lse,
                        const bf16* qkv, int B, int T_, int nh, int nkv, float scale,
                        cudaStream_t s) {
    constexpr int smem_kv = mma_dkdv_smem<HD>(), smem_q = mma_dq_smem<HD>();
    ensure_dynamic_smem(attn_bwd_dkdv_mma<HD, Frags>, smem_kv);
    ensure_dynamic_smem(attn_bwd_dq_mma<HD, Frags>, smem_q);
    dim3 gkv((unsigned)ceil_div(T_, kMmaRows), (unsigned)nkv, (unsigned)B);
    attn_bwd_dkdv_mma<HD, Frags><<<gkv, kMmaThreads, smem_kv, s>>>(dqkv, dout, lse, D, qkv, T_, nh, nkv,
                                                          scale, scale * kLog2e);
    LDM_LAUNCH_CHECK();
    dim3 gq((unsigned)ceil_div(T_, kMmaRows), (unsigned)nh, (unsigned)B);
    attn_bwd_dq_mma<HD, Frags><<<gq, kMmaThreads, smem_q, s>>>(dqkv, dout, lse, D, qkv, T_, nh, nkv, scale,
                                                      scale * kLog2e);
    LDM_LAUNCH_CHECK();
}

// ---- dispatch ----------------------------------------------------------------------------------
template <typename T>
inline bool scalar_supported(int hd) { return hd >= 2 && hd <= kScalarMaxHd && hd % 2 == 0; }
template <typename T>
inline bool mma_supported(int hd) { return std::is_same<T, bf16>::value && (hd == 64 || hd == 128); }

// Building blocks (the dispatch below; the workbench calls them directly).
template <typename T>
inline void scalar_forward(T* out, float* lse, const T* qkv, int B, int T_, int nh, int nkv, int hd, float scale,
                           cudaStream_t s) {
    const int64_t rows = (int64_t)B * nh * T_;
    attn_fwd_scalar<T><<<(unsigned)ceil_div(rows, kScalarWarps), kScalarWarps * 32, 0, s>>>(out, lse, qkv, B, T_, nh,
                                                                                           nkv, hd, scale);
    LDM_LAUNCH_CHECK();
}
template <typename T>
inline void rowdot(float* D, const T* dout, const T* out, int B, int T_, int nh, int hd, cudaStream_t s) {
    const int64_t qrows = (int64_t)B * nh * T_;
    attn_bwd_rowdot<T><<<(unsigned)ceil_div(qrows, kScalarWarps), kScalarWarps * 32, 0, s>>>(D, dout, out, B, T_, nh, hd);
    LDM_LAUNCH_CHECK();
}
template <typename T>
inline void scalar_backward(T* dqkv, const float* D, const T* dout, const float* lse, const T* qkv, int B, int T_,
                            int nh, int nkv, int hd, float scale, cudaStream_t s) {
    const int64_t qrows = (int64_t)B * nh * T_, krows = (int64_t)B * nkv * T_;
    attn_bwd_dkdv_scalar<T><<<(unsigned)ceil_div(krows, kScalarWarps), kScalarWarps * 32, 0, s>>>(
        dqkv, dout, lse, D, qkv, B, T_, nh, nkv, hd, scale);
    LDM_LAUNCH_CHECK();
    attn_bwd_dq_scalar<T><<<(unsigned)ceil_div(qrows, kScalarWarps), kScalarWarps * 32, 0, s>>>(
        dqkv, dout, lse, D, qkv, B, T_, nh, nkv, hd, scale);
    LDM_LAUNCH_CHECK();
}

inline void check_shape(int B, int T_, int nh, int nkv, int hd) {
    if (B < 1 || T_ < 1 || nh < 1 || nkv < 1 || nh % nkv != 0 || hd < 2 || hd % 2 != 0)
        throw Error(strprintf("attention: bad shape B=%d T=%d nh=%d nkv=%d hd=%d", B, T_, nh, nkv,
                              hd));
    if ((int64_t)B * nh * T_ > INT32_MAX)  // the kernels index rows [B, nh, T] in 31 bits
        throw Error(strprintf("attention: B*n_head*T = %lld rows exceeds 2^31 - 1 (B=%d T=%d nh=%d)",
                              (long long)B * nh * T_, B, T_, nh));
}

}  // namespace attn_detail

// D scratch of the backward: B·nh·T floats.
inline int64_t attention_backward_scratch(int B, int T_, int nh, int nkv, int hd) {
    return (int64_t)B * nh * T_;
}

// True when attention of activation type T and head dim hd runs on the tensor-core (mma) kernels
// (bf16, hd 64 or 128); else the scalar kernels. ldm::Error when neither supports hd.
template <typename T>
inline bool attention_uses_mma(int hd) {
    if (attn_detail::mma_supported<T>(hd)) return true;
    if (attn_detail::scalar_supported<T>(hd)) return false;
    throw Error(strprintf("attention: head_dim %d is not supported (even, <= %d)", hd, attn_detail::kScalarMaxHd));
}

// out [N, nh·hd] = causal softmax(scale q kᵀ) v per head; lse [B, nh, T] fp32 (natural log).
template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int nh, int nkv, int hd,
                       cudaStream_t s) {
    using namespace attn_detail;
    check_shape(B, T_, nh, nkv, hd);
    const float scale = 1.f / sqrtf((float)hd);
    if (!attention_uses_mma<T>(hd)) return scalar_forward<T>(out, lse, qkv, B, T_, nh, nkv, hd, scale, s);
    if constexpr (std::is_same<T, bf16>::value) {
        if (hd == 64) mma_forward<64, LdsmFrags>(out, lse, qkv, B, T_, nh, nkv, scale, s);
        else mma_forward<128, LdsmFrags>(out, lse, qkv, B, T_, nh, nkv, scale, s);
    }
}

// dqkv [N, (nh+2nkv)·hd] = ∂L/∂qkv (overwritten), from dout [N, nh·hd] and the forward's out and
// lse. scratch >= attention_backward_scratch(...) floats.
template <typename T>
void attention_backward(T* dqkv, float* scratch, const T* dout, const T* out, const float* lse,
                        const T* qkv, int B, int T_, int nh, int nkv, int hd, cudaStream_t s) {
    using namespace attn_detail;
    check_shape(B, T_, nh, nkv, hd);
    const float scale = 1.f / sqrtf((float)hd);
    float* D = scratch;
    rowdot<T>(D, dout, out, B, T_, nh, hd, s);
    if (!attention_uses_mma<T>(hd)) return scalar_backward<T>(dqkv, D, dout, lse, qkv, B, T_, nh, nkv, hd, scale, s);
    if constexpr (std::is_same<T, bf16>::value) {
        if (hd == 64) mma_backward<64, LdsmFrags>(dqkv, D, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        else mma_backward<128, LdsmFrags>(dqkv, D, dout, lse, qkv, B, T_, nh, nkv, scale, s);
    }
}

}  // namespace gpu
}  // namespace ldm
