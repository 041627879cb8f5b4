// dev/cuda/attention_wgmma.cuh — workbench variant "wgmma" of the bf16 causal GQA attention of
// cuda/attention.cuh (same contract: out, lse, dqkv; doc/cuda.md "The wgmma variant"): sm_90a
// warpgroup MMA (dev/cuda/wgmma.cuh) with Q, K, V and dO read by the tensor cores straight from
// 128-byte-swizzled shared tiles and P / dS as register A fragments. Forward: S = Q·Kᵀ, O += P·V
// with an online softmax in log2 units. Backward: D from the production rowdot, then a dK/dV kernel
// over key blocks (Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q) and a dQ kernel over query
// blocks (S, dP, dQ += dS·K): every dqkv element written once, no atomics. Streamed tiles come
// through cp.async pipelines (cuda/cp_async.cuh) as in mma-pipe; the causal mask only on tiles
// that cross the diagonal, fully masked tiles skipped per warpgroup. hd 64 / 128, bf16, compute
// capability 9.0 built for sm_90a. Checked by dev/cuda/attention.cu and, under dev/emu, by
// test/test_emu_attention.cpp.
#pragma once
#include "cuda/attention.cuh"
#include "cuda/cp_async.cuh"
#include "dev/cuda/wgmma.cuh"

namespace ldm {
namespace gpu {
namespace attn_wgmma {

using attn_detail::frag_a_from_c;
using attn_detail::kLn2;
using attn_detail::kLog2e;

// Tile shapes per head dim: WG warpgroups of 64 query rows per block, BN keys per K/V tile,
// STAGES K/V stages.
template <int HD>
struct WgConfig;
template <>
struct WgConfig<64> {
    static constexpr int wg = 2, bn = 128, stages = 2;
};
template <>
struct WgConfig<128> {
    static constexpr int wg = 2, bn = 128, stages = 2;
};

// bf16 A fragments (m16n8k16 layout, one per 16 columns) of a warpgroup's fp32 accumulator tile c
// (the m64nNk16 accumulator layout, N = 16·K), pinned (wgmma::fence_operand) so that the packing
// is complete before the wgmma.fence that precedes the wgmma reading them.
template <int K>
__device__ __forceinline__ void pack_a_frags(uint32_t (&a)[K][4], const float* c) {
#pragma unroll
    for (int kk = 0; kk < K; kk++) frag_a_from_c(a[kk], c + 8 * kk, c + 8 * kk + 4);
    wgmma::fence_operands(a);
}

// Dynamic shared memory: 1 KiB of slack to put the tiles on a 1024-byte boundary, the Q tile
// (BM x HD), then STAGES x (K tile, V tile) of BN x HD, all in the swizzled layout of wgmma.cuh.
template <int HD, int WG, int BN, int STAGES>
__host__ __device__ constexpr int fwd_smem() {
    return 1024 + (64 * WG * HD + STAGES * 2 * BN * HD) * 2;
}

// Issues (does not wait for) the copies of rows [r0, r0 + ROWS) x [0, HD) of a strided global bf16
// matrix (row stride ld elements, base at column 0 of the head) into a swizzled tile of ROWS rows
// (wgmma::sw128_offset), 16 bytes per copy, by the NTH threads of the block; rows >= T_ are
// zero-filled (nothing read; the source address clamped to row 0).
template <int HD, int ROWS, int NTH>
__device__ __forceinline__ void cp_async_tile_sw128(unsigned char* tile, const bf16* src, int r0, int T_, int64_t ld) {
    constexpr int CH = HD / 8;
    static_assert((ROWS * CH) % NTH == 0, "tile copies must divide evenly among the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CH / NTH; i++) {
        const int idx = (int)threadIdx.x + i * NTH;
        const int r = idx / CH, c = idx % CH;
        const bool ok = r0 + r < T_;
        cp_async_16(tile + wgmma::sw128_offset(ROWS, r, c), src + (ok ? (int64_t)(r0 + r) * ld : 0) + c * 8, ok);
    }
}

// Forward. Grid (ceil(T/BM), nh, B), BM = 64·WG query rows of head h per block (longest rows
// first), 128·WG threads; warpgroup wg owns rows [64·wg, 64·wg + 64) of the block, warp w of it
// rows 16(w%4).. of those (the wgmma accumulator layout). Per K/V tile kt (after the block waits
// for it and passes one barrier, which also frees tile kt-1's stage for tile kt+STAGES-1): S =
// Q·Kᵀ as HD/16 wgmma m64nBNk16 (Q and K through descriptors), keys > query set to -inf on a
// tile crossing the warpgroup's diagonal, online softmax (m = running max of S·scale·log2e, P =
// exp2(S·scale·log2e − m)), O·α, then O += P·V as BN/16 wgmma m64nHDk16 with P's bf16 fragments
// from registers. Each batch of wgmma is committed and waited for before its accumulators are
// read. A tile whose keys all follow the warpgroup's rows is skipped by that warpgroup.
template <int HD, int WG, int BN, int STAGES>
__global__ void __launch_bounds__(WG * 128)
attn_fwd_wgmma(bf16* out, float* lse, const bf16* qkv, int T_, int nh, int nkv, float scale_log2) {
    constexpr int NTH = WG * 128, BM = 64 * WG, KT = HD / 16;
    constexpr int SN = BN / 2, ON = HD / 2;  // accumulators per thread: S tile, O tile
    constexpr int QBYTES = BM * HD * 2, TBYTES = BN * HD * 2;
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    static_assert(HD % 64 == 0 && BN % 16 == 0 && (BN == 64 || BN == 128) && (HD == 64 || HD == 128),
                  "tile shapes the wgmma wrappers provide");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // the tiles start at the first 1024-byte boundary of the shared window (128B swizzle atoms)
    const uint32_t raw_s = wgmma::smem_u32(smem_raw);
    unsigned char* smem = smem_raw + (((raw_s + 1023u) & ~1023u) - raw_s);
    const uint32_t q_s = wgmma::smem_u32(smem);
    unsigned char* Qs = smem;
    unsigned char* kv = smem + QBYTES;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const bf16* kg = base + (int64_t)(nh + g) * HD;
    const bf16* vg = base + (int64_t)(nh + nkv + g) * HD;
    const int q0 = qt * BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wg = warp >> 2, wr = 16 * (warp & 3);
    const int rg = q0 + 64 * wg;  // the warpgroup's first query
    const int rw = rg + wr;       // the warp's first query
    const int n_kt = (min(q0 + BM, T_) - 1) / BN + 1;
    auto issue = [&](int kt) {  // tile kt into stage kt % STAGES, then close the group (maybe empty)
        if (kt < n_kt) {
            unsigned char* st = kv + (kt % STAGES) * 2 * TBYTES;
            cp_async_tile_sw128<HD, BN, NTH>(st, kg, kt * BN, T_, C3);
            cp_async_tile_sw128<HD, BN, NTH>(st + TBYTES, vg, kt * BN, T_, C3);
        }
        cp_async_commit();
    };
    cp_async_tile_sw128<HD, BM, NTH>(Qs, base + (int64_t)h * HD, q0, T_, C3);  // joins tile 0's group
    for (int s = 0; s < STAGES - 1; s++) issue(s);

    float o[ON];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows gr, gr + 8; m in log2 units
#pragma unroll
    for (int i = 0; i < ON; i++) o[i] = 0.f;
    for (int kt = 0; kt < n_kt; kt++) {
        cp_async_wait<STAGES - 2>();   // this thread's copies of tile kt have landed
        wgmma::fence_proxy_async();    // ... and are visible to the tensor cores' reads
        __syncthreads();               // everyone's; and every warpgroup is done with tile kt-1's stage
        issue(kt + STAGES - 1);
        const int k0 = kt * BN;
        if (k0 > rg + 63 || rg >= T_) continue;  // all keys after the warpgroup's rows / rows all padding
        const uint32_t k_s = q_s + (uint32_t)(QBYTES + (kt % STAGES) * 2 * TBYTES), v_s = k_s + (uint32_t)TBYTES;
        float s[SN];
        wgmma::fence();
        wgmma::mma_chain_kk<BN, KT>(s, q_s, BM, 64 * wg, k_s, BN);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operands(s);
        if (k0 + BN - 1 > rg) {  // the tile crosses the warpgroup's diagonal: mask key > query
#pragma unroll
            for (int i = 0; i < SN / 4; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = rw + gr + ((e >> 1) << 3), col = k0 + 8 * i + 2 * tg + (e & 1);
                    if (col > row) s[4 * i + e] = -INFINITY;
                }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < SN; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m[r], mx[r] * scale_log2);  // finite from tile 0 on
            alpha[r] = exp2f(m[r] - m_new);                       // 0 on tile 0 (m = -inf)
            m[r] = m_new;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int i = 0; i < SN; i++) {
            const float p = exp2f(fmaf(s[i], scale_log2, -m[(i >> 1) & 1]));
            s[i] = p;
            l[(i >> 1) & 1] += p;  // this thread's columns only
        }
#pragma unroll
        for (int i = 0; i < ON; i++) o[i] *= alpha[(i >> 1) & 1];
        uint32_t pa[BN / 16][4];
        pack_a_frags(pa, s);
        wgmma::fence_operands(o);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) wgmma::mma_rs<HD, 1>(o, pa[kk], wgmma::desc_mnmajor(v_s, BN, 16 * kk), 1);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operands(o);
    }
    // Row sums over the quad (the 4 threads sharing a row), then write out and lse.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const int row = rw + gr + 8 * r;
        if (row >= T_) continue;
        const float inv = 1.f / lr;
        bf16* orow = out + ((int64_t)b * T_ + row) * nh * HD + (int64_t)h * HD;
#pragma unroll
        for (int i = 0; i < ON / 4; i++)
            *reinterpret_cast<__nv_bfloat162*>(orow + 8 * i + 2 * tg) =
                __floats2bfloat162_rn(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
        if (tg == 0) lse[((int64_t)b * nh + h) * T_ + row] = (m[r] + log2f(lr)) * kLn2;
    }
}

// ---- backward ----------------------------------------------------------------------------------
// Tile shapes of the backward per head dim. dkdv: WG warpgroups of 64 keys per block, BQ queries
// per Q/dO stage, STAGES stages. dq: WG warpgroups of 64 query rows per block, BN keys per K/V
// tile, STAGES stages. Register budget (fp32 accumulators per thread): dK/dV HD/2 each plus Sᵀ and
// dPᵀ BQ/2 each; dQ HD/2 plus S and dP BN/2 each (doc/cuda.md "The wgmma variant").
template <int HD>
struct WgBwdConfig;
template <>
struct WgBwdConfig<64> {
    static constexpr int dkdv_wg = 2, dkdv_bq = 64, dkdv_stages = 2;
    static constexpr int dq_wg = 2, dq_bn = 128, dq_stages = 2;
};
template <>
struct WgBwdConfig<128> {
    static constexpr int dkdv_wg = 2, dkdv_bq = 64, dkdv_stages = 2;
    static constexpr int dq_wg = 2, dq_bn = 64, dq_stages = 2;
};

// Dynamic shared memory of the dK/dV kernel: 1 KiB of alignment slack, the K and V tiles (BKV x
// HD each), STAGES x (Q tile, dO tile) of BQ x HD (swizzled), then STAGES x (lse, D) rows of BQ
// floats. Every tile starts on a 1024-byte boundary (BQ·HD·2 is a multiple of 1024).
template <int HD, int WG, int BQ, int STAGES>
__host__ __device__ constexpr int dkdv_smem() {
    return 1024 + (2 * 64 * WG * HD + STAGES * 2 * BQ * HD) * 2 + STAGES * 2 * BQ * 4;
}
// Dynamic shared memory of the dQ kernel: slack, the Q and dO tiles (BM x HD each), STAGES x (K, V)
// tiles of BN x HD.
template <int HD, int WG, int BN, int STAGES>
__host__ __device__ constexpr int dq_smem() {
    return 1024 + (2 * 64 * WG * HD + STAGES * 2 * BN * HD) * 2;
}

// dK, dV. Grid (ceil(T/BKV), nkv, B), BKV = 64·WG keys of kv head g per block (key tile 0, the
// most work, first), 128·WG threads; warpgroup wg owns keys [64·wg, 64·wg + 64) of the block. K
// and V tiles arrive with the first step and stay. The steps are (query head of the GQA group,
// query tile of BQ rows from the key tile on), one sequence across the heads; each step's Q and dO
// tiles and lse, D rows go through STAGES stages (cp.async, one barrier per step, as the forward).
// Per step and warpgroup: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ as HD/16 wgmma m64nBQk16 each (all operands
// through descriptors, one commit group), masked (query < key) on a step crossing the diagonal,
// Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ = Pᵀ (dPᵀ − D), then dV += Pᵀ·dO and dK += dSᵀ·Q as
// BQ/16 wgmma m64nHDk16 each with Pᵀ, dSᵀ from registers and dO, Q as MN-major operands (one
// group, waited for before the step's stage can be refilled). dK·scale and dV written once.
// Query rows >= T arrive as zeros (Q, dO, lse, D) and add exactly 0; keys >= T are not written.
template <int HD, int WG, int BQ, int STAGES>
__global__ void __launch_bounds__(WG * 128)
attn_bwd_dkdv_wgmma(bf16* dqkv, const bf16* dout, const float* lse, const float* D, const bf16* qkv, int T_, int nh,
                    int nkv, float scale, float scale_log2) {
    constexpr int NTH = WG * 128, BKV = 64 * WG, KT = HD / 16, QT = BQ / 16;
    constexpr int SN = BQ / 2, ON = HD / 2;
    constexpr int KVBYTES = BKV * HD * 2, TBYTES = BQ * HD * 2;
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    static_assert((BQ == 64 || BQ == 128) && (HD == 64 || HD == 128), "tile shapes the wgmma wrappers provide");
    static_assert(BQ <= NTH && BKV % BQ == 0, "lse/D copies: one thread per query row; q tiles align with k tiles");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw_s = wgmma::smem_u32(smem_raw);
    unsigned char* smem = smem_raw + (((raw_s + 1023u) & ~1023u) - raw_s);
    const uint32_t k_s = wgmma::smem_u32(smem), v_s = k_s + (uint32_t)KVBYTES;
    unsigned char* stages = smem + 2 * KVBYTES;
    float* lsd = reinterpret_cast<float*>(stages + STAGES * 2 * TBYTES);  // STAGES x (lse[BQ], D[BQ])
    const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    const int G = nh / nkv;
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD, OC = (int64_t)nh * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const int k0 = kt * BKV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wg = warp >> 2;
    const int kg0 = k0 + 64 * wg;               // the warpgroup's first key
    const int kw = kg0 + 16 * (warp & 3);       // the warp's first key
    const int nq = (T_ - k0 + BQ - 1) / BQ;     // query tiles from k0 on (>= 1)
    const int n_steps = G * nq;
    auto issue = [&](int step) {
        if (step < n_steps) {
            const int h = g * G + step / nq, q0 = k0 + (step % nq) * BQ;
            unsigned char* st = stages + (step % STAGES) * 2 * TBYTES;
            cp_async_tile_sw128<HD, BQ, NTH>(st, base + (int64_t)h * HD, q0, T_, C3);
            cp_async_tile_sw128<HD, BQ, NTH>(st + TBYTES, dout + (int64_t)b * T_ * OC + (int64_t)h * HD, q0, T_, OC);
            if ((int)threadIdx.x < BQ) {
                const int i = threadIdx.x;
                const bool ok = q0 + i < T_;
                const int64_t row = ((int64_t)b * nh + h) * T_ + (ok ? q0 + i : 0);
                float* l = lsd + (step % STAGES) * 2 * BQ;
                cp_async_4(l + i, lse + row, ok);
                cp_async_4(l + BQ + i, D + row, ok);
            }
        }
        cp_async_commit();
    };
    cp_async_tile_sw128<HD, BKV, NTH>(smem, base + (int64_t)(nh + g) * HD, k0, T_, C3);  // join step 0's group
    cp_async_tile_sw128<HD, BKV, NTH>(smem + KVBYTES, base + (int64_t)(nh + nkv + g) * HD, k0, T_, C3);
    for (int s = 0; s < STAGES - 1; s++) issue(s);

    float dk[ON], dv[ON];
#pragma unroll
    for (int i = 0; i < ON; i++) dk[i] = dv[i] = 0.f;
    for (int step = 0; step < n_steps; step++) {
        cp_async_wait<STAGES - 2>();
        wgmma::fence_proxy_async();
        __syncthreads();
        issue(step + STAGES - 1);
        const int q0 = k0 + (step % nq) * BQ;
        if (q0 + BQ - 1 < kg0 || kg0 >= T_) continue;  // every query before the warpgroup's keys / keys all padding
        const uint32_t q_s = wgmma::smem_u32(stages + (step % STAGES) * 2 * TBYTES), do_s = q_s + (uint32_t)TBYTES;
        const float* lses = lsd + (step % STAGES) * 2 * BQ;
        const float* Ds = lses + BQ;
        float s[SN], dp[SN];
        wgmma::fence();
        wgmma::mma_chain_kk<BQ, KT>(s, k_s, BKV, 64 * wg, q_s, BQ);
        wgmma::mma_chain_kk<BQ, KT>(dp, v_s, BKV, 64 * wg, do_s, BQ);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operands(s);
        wgmma::fence_operands(dp);
        if (q0 < kg0 + 63) {  // the step crosses the warpgroup's diagonal: mask query < key
#pragma unroll
            for (int i = 0; i < SN / 4; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kw + gr + ((e >> 1) << 3), q = q0 + 8 * i + 2 * tg + (e & 1);
                    if (q < key) s[4 * i + e] = -INFINITY;
                }
        }
#pragma unroll
        for (int i = 0; i < SN; i++) {
            const int qi = 8 * (i >> 2) + 2 * tg + (i & 1);
            const float p = exp2f(fmaf(s[i], scale_log2, -lses[qi] * kLog2e));
            s[i] = p;
            dp[i] = p * (dp[i] - Ds[qi]);
        }
        uint32_t pa[QT][4], sa[QT][4];
        pack_a_frags(pa, s);
        pack_a_frags(sa, dp);
        wgmma::fence_operands(dk);
        wgmma::fence_operands(dv);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < QT; kk++) wgmma::mma_rs<HD, 1>(dv, pa[kk], wgmma::desc_mnmajor(do_s, BQ, 16 * kk), 1);
#pragma unroll
        for (int kk = 0; kk < QT; kk++) wgmma::mma_rs<HD, 1>(dk, sa[kk], wgmma::desc_mnmajor(q_s, BQ, 16 * kk), 1);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operands(dk);
        wgmma::fence_operands(dv);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = kw + gr + 8 * r;
        if (key >= T_) continue;
        bf16* krow = dqkv + ((int64_t)b * T_ + key) * C3 + (int64_t)(nh + g) * HD;
        bf16* vrow = dqkv + ((int64_t)b * T_ + key) * C3 + (int64_t)(nh + nkv + g) * HD;
#pragma unroll
        for (int i = 0; i < ON / 4; i++) {
            *reinterpret_cast<__nv_bfloat162*>(krow + 8 * i + 2 * tg) =
                __floats2bfloat162_rn(dk[4 * i + 2 * r] * scale, dk[4 * i + 2 * r + 1] * scale);
            *reinterpret_cast<__nv_bfloat162*>(vrow + 8 * i + 2 * tg) =
                __floats2bfloat162_rn(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
        }
    }
}

// dQ. Grid (ceil(T/BM), nh, B), BM = 64·WG query rows of head h per block (longest first), 128·WG
// threads; warpgroup wg owns rows [64·wg, 64·wg + 64). Q and dO tiles arrive with K/V tile 0 and
// stay; K/V tiles of BN keys are pipelined as in the forward. Per tile and warpgroup: S = Q·Kᵀ and
// dP = dO·Vᵀ as HD/16 wgmma m64nBNk16 each (one group), masked (key > query) on a tile crossing
// the warpgroup's diagonal, P = exp2(S·scale·log2e − lse·log2e), dS = P (dP − D), dQ += dS·K as
// BN/16 wgmma m64nHDk16 with dS from registers and K as an MN-major operand; dQ·scale written once.
// A tile whose keys all follow the warpgroup's rows is skipped by that warpgroup.
template <int HD, int WG, int BN, int STAGES>
__global__ void __launch_bounds__(WG * 128)
attn_bwd_dq_wgmma(bf16* dqkv, const bf16* dout, const float* lse, const float* D, const bf16* qkv, int T_, int nh,
                  int nkv, float scale, float scale_log2) {
    constexpr int NTH = WG * 128, BM = 64 * WG, KT = HD / 16, NK = BN / 16;
    constexpr int SN = BN / 2, ON = HD / 2;
    constexpr int QBYTES = BM * HD * 2, TBYTES = BN * HD * 2;
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    static_assert((BN == 64 || BN == 128) && (HD == 64 || HD == 128), "tile shapes the wgmma wrappers provide");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw_s = wgmma::smem_u32(smem_raw);
    unsigned char* smem = smem_raw + (((raw_s + 1023u) & ~1023u) - raw_s);
    const uint32_t q_s = wgmma::smem_u32(smem), do_s = q_s + (uint32_t)QBYTES;
    unsigned char* kv = smem + 2 * QBYTES;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (nh / nkv);
    const int64_t C3 = (int64_t)(nh + 2 * nkv) * HD, OC = (int64_t)nh * HD;
    const bf16* base = qkv + (int64_t)b * T_ * C3;
    const bf16* kg = base + (int64_t)(nh + g) * HD;
    const bf16* vg = base + (int64_t)(nh + nkv + g) * HD;
    const int q0 = qt * BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3;
    const int wg = warp >> 2;
    const int rg = q0 + 64 * wg;          // the warpgroup's first query
    const int rw = rg + 16 * (warp & 3);  // the warp's first query
    const int n_kt = (min(q0 + BM, T_) - 1) / BN + 1;
    auto issue = [&](int kt) {
        if (kt < n_kt) {
            unsigned char* st = kv + (kt % STAGES) * 2 * TBYTES;
            cp_async_tile_sw128<HD, BN, NTH>(st, kg, kt * BN, T_, C3);
            cp_async_tile_sw128<HD, BN, NTH>(st + TBYTES, vg, kt * BN, T_, C3);
        }
        cp_async_commit();
    };
    cp_async_tile_sw128<HD, BM, NTH>(smem, base + (int64_t)h * HD, q0, T_, C3);  // join tile 0's group
    cp_async_tile_sw128<HD, BM, NTH>(smem + QBYTES, dout + (int64_t)b * T_ * OC + (int64_t)h * HD, q0, T_, OC);
    for (int s = 0; s < STAGES - 1; s++) issue(s);
    float lse2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = rw + gr + 8 * r;
        const int64_t idx = ((int64_t)b * nh + h) * T_ + row;
        lse2[r] = row < T_ ? lse[idx] * kLog2e : 0.f;
        Dr[r] = row < T_ ? D[idx] : 0.f;
    }
    float dq[ON];
#pragma unroll
    for (int i = 0; i < ON; i++) dq[i] = 0.f;
    for (int kt = 0; kt < n_kt; kt++) {
        cp_async_wait<STAGES - 2>();
        wgmma::fence_proxy_async();
        __syncthreads();
        issue(kt + STAGES - 1);
        const int k0 = kt * BN;
        if (k0 > rg + 63 || rg >= T_) continue;
        const uint32_t k_s = wgmma::smem_u32(kv + (kt % STAGES) * 2 * TBYTES), v_s = k_s + (uint32_t)TBYTES;
        float s[SN], dp[SN];
        wgmma::fence();
        wgmma::mma_chain_kk<BN, KT>(s, q_s, BM, 64 * wg, k_s, BN);
        wgmma::mma_chain_kk<BN, KT>(dp, do_s, BM, 64 * wg, v_s, BN);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operands(s);
        wgmma::fence_operands(dp);
        if (k0 + BN - 1 > rg) {  // the tile crosses the warpgroup's diagonal: mask key > query
#pragma unroll
            for (int i = 0; i < SN / 4; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = rw + gr + ((e >> 1) << 3), col = k0 + 8 * i + 2 * tg + (e & 1);
                    if (col > row) s[4 * i + e] = -INFINITY;
                }
        }
#pragma unroll
        for (int i = 0; i < SN; i++) {
            const int r = (i >> 1) & 1;
            const float p = exp2f(fmaf(s[i], scale_log2, -lse2[r]));
            s[i] = p * (dp[i] - Dr[r]);  // dS (unscaled)
        }
        uint32_t sa[NK][4];
        pack_a_frags(sa, s);
        wgmma::fence_operands(dq);
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < NK; kk++) wgmma::mma_rs<HD, 1>(dq, sa[kk], wgmma::desc_mnmajor(k_s, BN, 16 * kk), 1);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operands(dq);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = rw + gr + 8 * r;
        if (row >= T_) continue;
        bf16* drow = dqkv + ((int64_t)b * T_ + row) * C3 + (int64_t)h * HD;
#pragma unroll
        for (int i = 0; i < ON / 4; i++)
            *reinterpret_cast<__nv_bfloat162*>(drow + 8 * i + 2 * tg) =
                __floats2bfloat162_rn(dq[4 * i + 2 * r] * scale, dq[4 * i + 2 * r + 1] * scale);
    }
}

// Whether this variant can run: bf16 at hd 64 / 128 on a compute capability 9.0 device (the
// workbench is built for sm_90a there; elsewhere the kernel is a trap).
inline bool wgmma_supported(int hd) {
    if (hd != 64 && hd != 128) return false;
    static const int cc = [] {
        int dev = 0;
        cudaDeviceProp p;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return 0;
        return p.major * 10 + p.minor;
    }();
    return cc == 90;
}

template <int HD>
constexpr int wgmma_fwd_smem() {
    using C = WgConfig<HD>;
    return fwd_smem<HD, C::wg, C::bn, C::stages>();
}

// out, lse as attention_forward (bf16, hd = HD); scale = 1/sqrt(HD). Only where wgmma_supported.
template <int HD>
inline void wgmma_forward(bf16* out, float* lse, const bf16* qkv, int B, int T_, int nh, int nkv, float scale,
                          cudaStream_t s) {
    using C = WgConfig<HD>;
    constexpr int smem = wgmma_fwd_smem<HD>();
    static_assert(smem <= 227 * 1024, "forward shared memory above 227 KiB");
    auto kern = attn_fwd_wgmma<HD, C::wg, C::bn, C::stages>;
    ensure_dynamic_smem(kern, smem);
    dim3 grid((unsigned)ceil_div(T_, 64 * C::wg), (unsigned)nh, (unsigned)B);
    kern<<<grid, C::wg * 128, smem, s>>>(out, lse, qkv, T_, nh, nkv, scale * kLog2e);
    LDM_LAUNCH_CHECK();
}

template <int HD>
constexpr int wgmma_dkdv_smem() {
    using C = WgBwdConfig<HD>;
    return dkdv_smem<HD, C::dkdv_wg, C::dkdv_bq, C::dkdv_stages>();
}
template <int HD>
constexpr int wgmma_dq_smem() {
    using C = WgBwdConfig<HD>;
    return dq_smem<HD, C::dq_wg, C::dq_bn, C::dq_stages>();
}

// dK/dV then dQ into dqkv (overwritten; bf16, hd = HD), from D (attn_detail::rowdot) and the
// forward's lse; scale = 1/sqrt(HD). Only where wgmma_supported.
template <int HD>
inline void wgmma_backward(bf16* dqkv, const float* D, const bf16* dout, const float* lse, const bf16* qkv, int B,
                           int T_, int nh, int nkv, float scale, cudaStream_t s) {
    using C = WgBwdConfig<HD>;
    constexpr int smem_kv = wgmma_dkdv_smem<HD>(), smem_q = wgmma_dq_smem<HD>();
    static_assert(smem_kv <= 227 * 1024 && smem_q <= 227 * 1024, "backward shared memory above 227 KiB");
    auto kkv = attn_bwd_dkdv_wgmma<HD, C::dkdv_wg, C::dkdv_bq, C::dkdv_stages>;
    auto kq = attn_bwd_dq_wgmma<HD, C::dq_wg, C::dq_bn, C::dq_stages>;
    ensure_dynamic_smem(kkv, smem_kv);
    ensure_dynamic_smem(kq, smem_q);
    dim3 gkv((unsigned)ceil_div(T_, 64 * C::dkdv_wg), (unsigned)nkv, (unsigned)B);
    kkv<<<gkv, C::dkdv_wg * 128, smem_kv, s>>>(dqkv, dout, lse, D, qkv, T_, nh, nkv, scale, scale * kLog2e);
    LDM_LAUNCH_CHECK();
    dim3 gq((unsigned)ceil_div(T_, 64 * C::dq_wg), (unsigned)nh, (unsigned)B);
    kq<<<gq, C::dq_wg * 128, smem_q, s>>>(dqkv, dout, lse, D, qkv, T_, nh, nkv, scale, scale * kLog2e);
    LDM_LAUNCH_CHECK();
}

}  // namespace attn_wgmma
}  // namespace gpu
}  // namespace ldm
