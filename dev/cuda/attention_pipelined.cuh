// dev/cuda/attention_pipelined.cuh — workbench variant "mma-pipe" of the bf16 tensor-core attention
// of cuda/attention.cuh (same contract, layouts and deterministic dQ / dK-dV decomposition; doc/cuda.md
// "Attention kernels"): global -> shared loads are cp.async multi-stage pipelines (cuda/cp_async.cuh;
// the next K/V tile, or Q/dO tile in dK/dV, lands while the current one is computed, one barrier per
// tile), the causal mask is applied only on the tiles that cross the diagonal (per warp; tiles entirely
// above it are skipped), logits stay unscaled until one FFMA inside exp2 (pre-scaled by scale·log2e),
// and the tile shapes are chosen per head dim (PipeConfig). Reuses the production mma_16816,
// frag_a_from_c and LdsmFrags (ldmatrix fragments). hd 64 / 128, bf16 only, sm_80+.
// Checked by dev/cuda/attention.cu and, under dev/emu, by test/test_emu_attention.cpp.
#pragma once
#include "cuda/attention.cuh"
#include "cuda/cp_async.cuh"

namespace ldm {
namespace gpu {
namespace attn_pipe {

using attn_detail::frag_a_from_c;
using attn_detail::kLn2;
using attn_detail::kLog2e;
using attn_detail::kMmaPad;
using attn_detail::LdsmFrags;
using attn_detail::mma_16816;

constexpr int kBN = 64;  // keys per K/V tile (forward, dQ)

// Tile shapes per head dim. fwd: WARPS warps of MT m-tiles (16 query rows each) per block, STAGES
// K/V stages, Q fragments kept in registers (QREGS) or re-read from shared memory. dq: WARPS warps
// of 16 query rows. dkdv: WARPS warps of 16 keys, BQ queries per Q/dO stage. Why these: doc/cuda.md.
template <int HD>
struct PipeConfig;
template <>
struct PipeConfig<64> {
    static constexpr int fwd_warps = 4, fwd_mt = 2, fwd_stages = 3;
    static constexpr bool fwd_qregs = true;
    static constexpr int dq_warps = 8, dq_stages = 3;
    static constexpr int dkdv_warps = 8, dkdv_bq = 64, dkdv_stages = 2;
};
template <>
struct PipeConfig<128> {
    static constexpr int fwd_warps = 8, fwd_mt = 1, fwd_stages = 2;
    static constexpr bool fwd_qregs = true;
    static constexpr int dq_warps = 4, dq_stages = 2;
    static constexpr int dkdv_warps = 8, dkdv_bq = 32, dkdv_stages = 2;
};

// Issues (does not wait for) the copies of rows [r0, r0 + ROWS) x [0, HD) of a strided global
// bf16 matrix (row stride `ld` elements, base at column 0 of the head) into a shared tile (row
// stride HD + kMmaPad), 16 bytes per copy, by the NTH threads of the block; rows >= T_ are
// zero-filled (source address clamped to row 0, nothing read).
template <int HD, int ROWS, int NTH>
__device__ __forceinline__ void cp_async_tile(bf16* dst, const bf16* src, int r0, int T_, int64_t ld) {
    constexpr int LDS = HD + kMmaPad, CH = HD / 8;
    static_assert((ROWS * CH) % NTH == 0, "tile copies must divide evenly among the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CH / NTH; i++) {
        const int idx = (int)threadIdx.x + i * NTH;
        const int r = idx / CH, c = (idx % CH) * 8;
        const bool ok = r0 + r < T_;
        cp_async_16(dst + r * LDS + c, src + (ok ? (int64_t)(r0 + r) * ld : 0) + c, ok);
    }
}

// Dynamic shared memory (bytes) of each kernel.
template <int HD, int WARPS, int MT, int STAGES, bool QREGS>
__host__ __device__ constexpr bool fwd_q_aliased() {
    // Q is read into registers once, before the first write of the last K/V stage: it may live there.
    return QREGS && WARPS * MT * 16 <= 2 * kBN;
}
template <int HD, int WARPS, int MT, int STAGES, bool QREGS>
__host__ __device__ constexpr int fwd_smem() {
    return (STAGES * 2 * kBN + (fwd_q_aliased<HD, WARPS, MT, STAGES, QREGS>() ? 0 : WARPS * MT * 16)) *
           (HD + kMmaPad) * 2;
}
template <int HD, int WARPS, int STAGES>
__host__ __device__ constexpr int dq_smem() {
    return (2 * WARPS * 16 + STAGES * 2 * kBN) * (HD + kMmaPad) * 2;
}
template <int HD, int BQ>
__host__ __device__ constexpr int dkdv_stage_bytes() {
    return 2 * BQ * (HD + kMmaPad) * 2 + 2 * BQ * 4;  // Q, dO tiles, then lse, D (fp32)
}
template <int HD, int WARPS, int BQ, int STAGES>
__host__ __device__ constexpr int dkdv_smem() {
    return 2 * WARPS * 16 * (HD + kMmaPad) * 2 + STAGES * dkdv_stage_bytes<HD, BQ>();
}

// Forward. Grid (ceil(T/BM), nh, B) with BM = 16·WARPS·MT query rows of head h per block (the
// longest rows first), WARPS·32 threads; warp w owns rows [16·MT·w, 16·MT·(w+1)). K/V tiles of 64
// keys go through STAGES shared stages: at step kt the block waits for tile kt, passes one barrier
// (which also frees the stage of tile kt-1) and issues tile kt+STAGES-1, then computes tile kt.
// Per warp and tile: S = Q Kᵀ (unscaled, fp32), on a diagonal tile keys > query set to -inf, online
// softmax in log2 units (m = running max of S·scale·log2e, P = exp2(S·scale·log2e − m) as one
// FFMA + EX2), O += P V with P from registers. Tiles whose keys all follow the warp's rows are
// skipped. Key tile 0 comes first and has key 0 <= every query, so m is finite after it.
template <int HD, int WARPS, int MT, int STAGES, bool QREGS, class Frags>
__global__ void __launch_bounds__(WARPS * 32)
attn_fwd_pipe(bf16* out, float* lse, const bf16* qkv, int T_, int nh, int nkv, float scale_log2) {
    constexpr int NTH = WARPS * 32, WROWS = 16 * MT, BM = WARPS * WROWS, BN = kBN;
    constexpr int LDS = HD + kMmaPad, NT_D = HD / 8, NT_K = BN / 8, KT = HD / 16;
    constexpr int STAGE = 2 * BN * LDS;  // elements of one stage: K tile, then V tile
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* kv = reinterpret_cast<bf16*>(smem_raw);
    bf16* Qs = kv + (fwd_q_aliased<HD, WARPS, MT, STAGES, QREGS>() ? (STAGES - 1) : STAGES) * STAGE;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const bf16* kg = base + (int64_t)(nh + g) * HD;
    const bf16* vg = base + (int64_t)(nh + nkv + g) * HD;
    const int q0 = qt * BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wr = warp * WROWS;  // warp's first row in the tile
    const int rw = q0 + wr;       // ... and its query index
    const int n_kt = (min(q0 + BM, T_) - 1) / BN + 1;
    auto issue = [&](int kt) {  // tile kt into stage kt % STAGES, then close the group (maybe empty)
        if (kt < n_kt) {
            bf16* st = kv + (kt % STAGES) * STAGE;
            cp_async_tile<HD, BN, NTH>(st, kg, kt * BN, T_, C3);
            cp_async_tile<HD, BN, NTH>(st + BN * LDS, vg, kt * BN, T_, C3);
        }
        cp_async_commit();
    };
    cp_async_tile<HD, BM, NTH>(Qs, base + (int64_t)h * HD, q0, T_, C3);  // joins tile 0's group
    for (int s = 0; s < STAGES - 1; s++) issue(s);

    [[maybe_unused]] uint32_t qf[QREGS ? MT : 1][QREGS ? KT : 1][4];
    if constexpr (QREGS) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < KT; kk++) Frags::template a<LDS>(qf[mt][kk], Qs, wr + 16 * mt, kk * 16, lane);
    }
    float o[MT][NT_D][4];
    float m[MT][2], l[MT][2];  // rows gr, gr + 8 of each m-tile; m in log2 units
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < NT_D; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
    }
    for (int kt = 0; kt < n_kt; kt++) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile kt have landed
        __syncthreads();              // everyone's; and every warp is done with tile kt-1's stage
        issue(kt + STAGES - 1);
        const int k0 = kt * BN;
        if (k0 > rw + WROWS - 1 || rw >= T_) continue;  // all keys after the warp's rows / rows all padding
        const bf16* Ks = kv + (kt % STAGES) * STAGE;
        const bf16* Vs = Ks + BN * LDS;
        float s[MT][NT_K][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < NT_K; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if constexpr (QREGS) {
#pragma unroll
                    for (int e = 0; e < 4; e++) a[mt][e] = qf[mt][kk][e];
                } else {
                    Frags::template a<LDS>(a[mt], Qs, wr + 16 * mt, kk * 16, lane);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT_K; nt += 2) {
                uint32_t b0[2], b1[2];
                Frags::template b_trans2<LDS>(b0, b1, Ks, nt * 8, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(s[mt][nt], a[mt], b0);
                    mma_16816(s[mt][nt + 1], a[mt], b1);
                }
            }
        }
        if (k0 + BN - 1 > rw) {  // the tile crosses the diagonal for this warp: mask key > query
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT_K; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int row = rw + 16 * mt + gr + ((e >> 1) << 3);
                        const int col = k0 + nt * 8 + 2 * tg + (e & 1);
                        if (col > row) s[mt][nt][e] = -INFINITY;
                    }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < NT_K; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][nt][e]);
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float m_new = fmaxf(m[mt][r], mx[r] * scale_log2);  // finite from tile 0 on
                alpha[r] = exp2f(m[mt][r] - m_new);                          // 0 on tile 0 (m = -inf)
                m[mt][r] = m_new;
                l[mt][r] *= alpha[r];
            }
#pragma unroll
            for (int nt = 0; nt < NT_K; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = exp2f(fmaf(s[mt][nt][e], scale_log2, -m[mt][e >> 1]));
                    s[mt][nt][e] = p;
                    l[mt][e >> 1] += p;  // this thread's columns only
                }
#pragma unroll
            for (int i = 0; i < NT_D; i++) {
                o[mt][i][0] *= alpha[0];
                o[mt][i][1] *= alpha[0];
                o[mt][i][2] *= alpha[1];
                o[mt][i][3] *= alpha[1];
            }
        }
        // O += P V
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) frag_a_from_c(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < NT_D; nt += 2) {
                uint32_t b0[2], b1[2];
                Frags::template b2<LDS>(b0, b1, Vs, kk * 16, nt * 8, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(o[mt][nt], a[mt], b0);
                    mma_16816(o[mt][nt + 1], a[mt], b1);
                }
            }
        }
    }
    // Row sums over the quad (the 4 threads sharing a row), then write out and lse.
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = rw + 16 * mt + gr + 8 * r;
            if (row >= T_) continue;
            const float inv = 1.f / lr;
            bf16* orow = out + ((int64_t)b * T_ + row) * nh * HD + (int64_t)h * HD;
#pragma unroll
            for (int nt = 0; nt < NT_D; nt++)
                *reinterpret_cast<__nv_bfloat162*>(orow + nt * 8 + 2 * tg) =
                    __floats2bfloat162_rn(o[mt][nt][2 * r] * inv, o[mt][nt][2 * r + 1] * inv);
            if (tg == 0) lse[((int64_t)b * nh + h) * T_ + row] = (m[mt][r] + log2f(lr)) * kLn2;
        }
}

// dQ. Grid (ceil(T/BM), nh, B), BM = 16·WARPS query rows per block (longest first), warp = 16 rows.
// Q and dO tiles arrive with K/V tile 0 and stay; K/V tiles are pipelined as in the forward. Per
// tile: S = Q Kᵀ, dP = dO Vᵀ, masked on a diagonal tile, P = exp2(S·scale·log2e − lse·log2e),
// dS = P (dP − D), dQ += dS K; dQ·scale is written once at the end.
template <int HD, int WARPS, int STAGES, class Frags>
__global__ void __launch_bounds__(WARPS * 32)
attn_bwd_dq_pipe(bf16* dqkv, const bf16* dout, const float* lse, const float* D, const bf16* qkv, int T_, int nh,
                 int nkv, float scale, float scale_log2) {
    constexpr int NTH = WARPS * 32, BM = WARPS * 16, BN = kBN;
    constexpr int LDS = HD + kMmaPad, NT_D = HD / 8, NT_K = BN / 8, KT = HD / 16;
    constexpr int STAGE = 2 * BN * LDS;
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* dOs = Qs + BM * LDS;
    bf16* kv = dOs + BM * LDS;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD, OC = (int64_t)nh * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const bf16* kg = base + (int64_t)(nh + g) * HD;
    const bf16* vg = base + (int64_t)(nh + nkv + g) * HD;
    const int q0 = qt * BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wr = warp * 16, rw = q0 + wr, row_lo = rw + gr;
    const int n_kt = (min(q0 + BM, T_) - 1) / BN + 1;
    auto issue = [&](int kt) {
        if (kt < n_kt) {
            bf16* st = kv + (kt % STAGES) * STAGE;
            cp_async_tile<HD, BN, NTH>(st, kg, kt * BN, T_, C3);
            cp_async_tile<HD, BN, NTH>(st + BN * LDS, vg, kt * BN, T_, C3);
        }
        cp_async_commit();
    };
    cp_async_tile<HD, BM, NTH>(Qs, base + (int64_t)h * HD, q0, T_, C3);
    cp_async_tile<HD, BM, NTH>(dOs, dout + (int64_t)b * T_ * OC + (int64_t)h * HD, q0, T_, OC);
    for (int s = 0; s < STAGES - 1; s++) issue(s);
    float lse2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_lo + 8 * r;
        const int64_t idx = ((int64_t)b * nh + h) * T_ + row;
        lse2[r] = row < T_ ? lse[idx] * kLog2e : 0.f;
        Dr[r] = row < T_ ? D[idx] : 0.f;
    }
    float dq[NT_D][4];
#pragma unroll
    for (int i = 0; i < NT_D; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
    for (int kt = 0; kt < n_kt; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        issue(kt + STAGES - 1);
        const int k0 = kt * BN;
        if (k0 > rw + 15 || rw >= T_) continue;
        const bf16* Ks = kv + (kt % STAGES) * STAGE;
        const bf16* Vs = Ks + BN * LDS;
        float s[NT_K][4], dp[NT_K][4];
#pragma unroll
        for (int i = 0; i < NT_K; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            uint32_t a[4], ad[4];
            Frags::template a<LDS>(a, Qs, wr, kk * 16, lane);
            Frags::template a<LDS>(ad, dOs, wr, kk * 16, lane);
#pragma unroll
            for (int nt = 0; nt < NT_K; nt += 2) {
                uint32_t b0[2], b1[2];
                Frags::template b_trans2<LDS>(b0, b1, Ks, nt * 8, kk * 16, lane);
                mma_16816(s[nt], a, b0);
                mma_16816(s[nt + 1], a, b1);
                Frags::template b_trans2<LDS>(b0, b1, Vs, nt * 8, kk * 16, lane);
                mma_16816(dp[nt], ad, b0);
                mma_16816(dp[nt + 1], ad, b1);
            }
        }
        if (k0 + BN - 1 > rw) {
#pragma unroll
            for (int nt = 0; nt < NT_K; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = row_lo + ((e >> 1) << 3);
                    const int col = k0 + nt * 8 + 2 * tg + (e & 1);
                    if (col > row) s[nt][e] = -INFINITY;
                }
        }
#pragma unroll
        for (int nt = 0; nt < NT_K; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const float p = exp2f(fmaf(s[nt][e], scale_log2, -lse2[r]));
                s[nt][e] = p * (dp[nt][e] - Dr[r]);  // dS (unscaled)
            }
        // dQ += dS K
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[4];
            frag_a_from_c(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int nt = 0; nt < NT_D; nt += 2) {
                uint32_t b0[2], b1[2];
                Frags::template b2<LDS>(b0, b1, Ks, kk * 16, nt * 8, lane);
                mma_16816(dq[nt], a, b0);
                mma_16816(dq[nt + 1], a, b1);
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

// dK, dV. Grid (ceil(T/BKV), nkv, B), BKV = 16·WARPS keys of kv head g per block (key tile 0, the
// most work, first), warp = 16 keys; K, V tiles arrive with the first step and stay. The steps are
// (query head of the group, query tile of BQ rows from the key tile on), one sequence across the
// heads; each step's Q, dO tiles and lse, D rows go through STAGES stages (cp.async; 4-byte copies for
// lse and D). Per step: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, masked (query < key) on a diagonal step,
// Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ = Pᵀ (dPᵀ − D), dV += Pᵀ dO, dK += dSᵀ Q; written once
// (dK·scale) at the end. Query rows >= T arrive as zeros (Q, dO, lse, D), so they add exactly 0.
template <int HD, int WARPS, int BQ, int STAGES, class Frags>
__global__ void __launch_bounds__(WARPS * 32)
attn_bwd_dkdv_pipe(bf16* dqkv, const bf16* dout, const float* lse, const float* D, const bf16* qkv, int T_, int nh,
                   int nkv, float scale, float scale_log2) {
    constexpr int NTH = WARPS * 32, BKV = WARPS * 16;
    constexpr int LDS = HD + kMmaPad, NT_D = HD / 8, NT_Q = BQ / 8, KT = HD / 16;
    constexpr int SB = dkdv_stage_bytes<HD, BQ>();
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    static_assert(BQ <= NTH && BKV % BQ == 0, "lse/D copies: one thread per query row; q tiles align with k tiles");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
    bf16* Vs = Ks + BKV * LDS;
    unsigned char* stages = reinterpret_cast<unsigned char*>(Vs + BKV * LDS);
    const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    const int G = nh / nkv;
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD, OC = (int64_t)nh * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const int k0 = kt * BKV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wr = warp * 16, kw = k0 + wr, key_lo = kw + gr;
    const int nq = (T_ - k0 + BQ - 1) / BQ;  // query tiles from k0 on (>= 1)
    const int n_steps = G * nq;
    auto issue = [&](int step) {
        if (step < n_steps) {
            const int h = g * G + step / nq, q0 = k0 + (step % nq) * BQ;
            unsigned char* st = stages + (step % STAGES) * SB;
            bf16* Qst = reinterpret_cast<bf16*>(st);
            bf16* dOst = Qst + BQ * LDS;
            float* lst = reinterpret_cast<float*>(dOst + BQ * LDS);
            cp_async_tile<HD, BQ, NTH>(Qst, base + (int64_t)h * HD, q0, T_, C3);
            cp_async_tile<HD, BQ, NTH>(dOst, dout + (int64_t)b * T_ * OC + (int64_t)h * HD, q0, T_, OC);
            if ((int)threadIdx.x < BQ) {
                const int i = threadIdx.x;
                const bool ok = q0 + i < T_;
                const int64_t row = ((int64_t)b * nh + h) * T_ + (ok ? q0 + i : 0);
                cp_async_4(lst + i, lse + row, ok);
                cp_async_4(lst + BQ + i, D + row, ok);
            }
        }
        cp_async_commit();
    };
    cp_async_tile<HD, BKV, NTH>(Ks, base + (int64_t)(nh + g) * HD, k0, T_, C3);  // join step 0's group
    cp_async_tile<HD, BKV, NTH>(Vs, base + (int64_t)(nh + nkv + g) * HD, k0, T_, C3);
    for (int s = 0; s < STAGES - 1; s++) issue(s);
    float dk[NT_D][4], dv[NT_D][4];
#pragma unroll
    for (int i = 0; i < NT_D; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;
    for (int step = 0; step < n_steps; step++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        issue(step + STAGES - 1);
        const int q0 = k0 + (step % nq) * BQ;
        if (q0 + BQ - 1 < kw || kw >= T_) continue;  // every query before the warp's keys / keys all padding
        const unsigned char* st = stages + (step % STAGES) * SB;
        const bf16* Qs = reinterpret_cast<const bf16*>(st);
        const bf16* dOs = Qs + BQ * LDS;
        const float* lses = reinterpret_cast<const float*>(dOs + BQ * LDS);
        const float* Ds = lses + BQ;
        float s[NT_Q][4], dp[NT_Q][4];
#pragma unroll
        for (int i = 0; i < NT_Q; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            uint32_t a[4], av[4];
            Frags::template a<LDS>(a, Ks, wr, kk * 16, lane);
            Frags::template a<LDS>(av, Vs, wr, kk * 16, lane);
#pragma unroll
            for (int nt = 0; nt < NT_Q; nt += 2) {
                uint32_t b0[2], b1[2];
                Frags::template b_trans2<LDS>(b0, b1, Qs, nt * 8, kk * 16, lane);
                mma_16816(s[nt], a, b0);
                mma_16816(s[nt + 1], a, b1);
                Frags::template b_trans2<LDS>(b0, b1, dOs, nt * 8, kk * 16, lane);
                mma_16816(dp[nt], av, b0);
                mma_16816(dp[nt + 1], av, b1);
            }
        }
        if (q0 < kw + 15) {  // the step crosses the diagonal for this warp: mask query < key
#pragma unroll
            for (int nt = 0; nt < NT_Q; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = key_lo + ((e >> 1) << 3);
                    const int q = q0 + nt * 8 + 2 * tg + (e & 1);
                    if (q < key) s[nt][e] = -INFINITY;
                }
        }
#pragma unroll
        for (int nt = 0; nt < NT_Q; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = nt * 8 + 2 * tg + (e & 1);
                const float p = exp2f(fmaf(s[nt][e], scale_log2, -lses[qi] * kLog2e));
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - Ds[qi]);
            }
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t ap[4], as[4];
            frag_a_from_c(ap, s[2 * kk], s[2 * kk + 1]);
            frag_a_from_c(as, dp[2 * kk], dp[2 * kk + 1]);
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

// ---- launchers (the shapes of PipeConfig<HD>) ----------------------------------------------------
inline bool pipe_supported(int hd) { return hd == 64 || hd == 128; }

// Dynamic shared memory per block (bytes) of the forward, dQ and dK/dV kernels at PipeConfig<HD>.
template <int HD>
constexpr int pipe_fwd_smem() {
    using C = PipeConfig<HD>;
    return fwd_smem<HD, C::fwd_warps, C::fwd_mt, C::fwd_stages, C::fwd_qregs>();
}
template <int HD>
constexpr int pipe_dq_smem() {
    using C = PipeConfig<HD>;
    return dq_smem<HD, C::dq_warps, C::dq_stages>();
}
template <int HD>
constexpr int pipe_dkdv_smem() {
    using C = PipeConfig<HD>;
    return dkdv_smem<HD, C::dkdv_warps, C::dkdv_bq, C::dkdv_stages>();
}

// out, lse as attention_forward (bf16, hd = HD); scale = 1/sqrt(HD).
template <int HD>
inline void pipe_forward(bf16* out, float* lse, const bf16* qkv, int B, int T_, int nh, int nkv, float scale,
                         cudaStream_t s) {
    using C = PipeConfig<HD>;
    constexpr int smem = pipe_fwd_smem<HD>();
    static_assert(smem <= 227 * 1024, "forward shared memory above 227 KiB");
    auto kern = attn_fwd_pipe<HD, C::fwd_warps, C::fwd_mt, C::fwd_stages, C::fwd_qregs, LdsmFrags>;
    ensure_dynamic_smem(kern, smem);
    dim3 grid((unsigned)ceil_div(T_, C::fwd_warps * C::fwd_mt * 16), (unsigned)nh, (unsigned)B);
    kern<<<grid, C::fwd_warps * 32, smem, s>>>(out, lse, qkv, T_, nh, nkv, scale * kLog2e);
    LDM_LAUNCH_CHECK();
}

// dK/dV then dQ into dqkv (overwritten), from D (attn_detail::rowdot) and the forward's lse.
template <int HD>
inline void pipe_backward(bf16* dqkv, const float* D, const bf16* dout, const float* lse, const bf16* qkv, int B,
                          int T_, int nh, int nkv, float scale, cudaStream_t s) {
    using C = PipeConfig<HD>;
    constexpr int smem_kv = pipe_dkdv_smem<HD>(), smem_q = pipe_dq_smem<HD>();
    static_assert(smem_kv <= 227 * 1024 && smem_q <= 227 * 1024, "backward shared memory above 227 KiB");
    auto kkv = attn_bwd_dkdv_pipe<HD, C::dkdv_warps, C::dkdv_bq, C::dkdv_stages, LdsmFrags>;
    auto kq = attn_bwd_dq_pipe<HD, C::dq_warps, C::dq_stages, LdsmFrags>;
    ensure_dynamic_smem(kkv, smem_kv);
    ensure_dynamic_smem(kq, smem_q);
    dim3 gkv((unsigned)ceil_div(T_, C::dkdv_warps * 16), (unsigned)nkv, (unsigned)B);
    kkv<<<gkv, C::dkdv_warps * 32, smem_kv, s>>>(dqkv, dout, lse, D, qkv, T_, nh, nkv, scale, scale * kLog2e);
    LDM_LAUNCH_CHECK();
    dim3 gq((unsigned)ceil_div(T_, C::dq_warps * 16), (unsigned)nh, (unsigned)B);
    kq<<<gq, C::dq_warps * 32, smem_q, s>>>(dqkv, dout, lse, D, qkv, T_, nh, nkv, scale, scale * kLog2e);
    LDM_LAUNCH_CHECK();
}

}  // namespace attn_pipe
}  // namespace gpu
}  // namespace ldm
