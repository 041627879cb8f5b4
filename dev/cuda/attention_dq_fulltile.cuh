// dev/cuda/attention_dq_fulltile.cuh — workbench-only: the mma dQ kernel as it was before the
// production kernel (cuda/attention.cuh, attn_bwd_dq_mma) moved to half tiles. This one keeps the
// S and dP accumulators of a whole 64-key tile live (64 fp32 registers) and re-reads the Q and dO
// fragments every tile; at hd 64 ptxas holds it at 128 registers by spilling 4 bytes, at hd 128 it
// takes 200 (2 blocks per SM). Same MMAs in the same order as production, so its dQ is bitwise
// equal to production's (dev/cuda/attention.cu checks that); kept so the first GPU run times both
// (doc/cuda.md "Attention kernels"). Variant "mma-dqfull": production dK/dV, then this dQ.
#pragma once
#include "cuda/attention.cuh"

namespace ldm {
namespace gpu {
namespace attn_detail {

// dQ. Grid (ceil(T/64), nh, B), 128 threads; block = 64 query rows of head h, warp = 16 rows.
// Per key tile: S = Q Kᵀ, P = exp2(S·scale·log2e − lse·log2e) (masked to 0), dP = dO Vᵀ,
// dS = P (dP − D), dQ += dS K; dQ·scale written once at the end.
template <int HD, class Frags>
__global__ void __launch_bounds__(kMmaThreads)
attn_bwd_dq_fulltile(bf16* dqkv, const bf16* dout, const float* lse, const float* D, const bf16* qkv,
                     int T_, int nh, int nkv, float scale, float scale_log2) {
    constexpr int LDS = HD + kMmaPad, NT_D = HD / 8, NT_K = kMmaRows / 8;
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
    float dq[NT_D][4];
#pragma unroll
    for (int i = 0; i < NT_D; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
    const int n_kt = (min(q0 + kMmaRows, T_) - 1) / kMmaRows + 1;
    for (int kt = 0; kt < n_kt; kt++) {
        const int k0 = kt * kMmaRows;
        __syncthreads();
        load_tile<HD, kMmaRows>(Ks, base + (int64_t)(nh + g) * HD, k0, T_, C3);
        load_tile<HD, kMmaRows>(Vs, base + (int64_t)(nh + nkv + g) * HD, k0, T_, C3);
        __syncthreads();
        float s[NT_K][4], dp[NT_K][4];
#pragma unroll
        for (int i = 0; i < NT_K; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
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
#pragma unroll
        for (int nt = 0; nt < NT_K; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const int row = row_lo + 8 * r;
                const int col = k0 + nt * 8 + 2 * tg + (e & 1);
                const float p = (col > row || col >= T_)
                                    ? 0.f
                                    : exp2f(fmaf(s[nt][e], scale_log2, -lse2[r]));
                s[nt][e] = p * (dp[nt][e] - Dr[r]);         // dS (unscaled)
            }
        // dQ += dS K
#pragma unroll
        for (int kk = 0; kk < kMmaRows / 16; kk++) {
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

// mma_backward with this dQ kernel: same arguments (D = rowdot's output), hd 64 or 128, bf16.
template <int HD>
inline void dqfull_backward(bf16* dqkv, const float* D, const bf16* dout, const float* lse, const bf16* qkv,
                            int B, int T_, int nh, int nkv, float scale, cudaStream_t s) {
    constexpr int smem_kv = mma_dkdv_smem<HD>(), smem_q = mma_dq_smem<HD>();
    ensure_dynamic_smem(attn_bwd_dkdv_mma<HD, LdsmFrags>, smem_kv);
    ensure_dynamic_smem(attn_bwd_dq_fulltile<HD, LdsmFrags>, smem_q);
    dim3 gkv((unsigned)ceil_div(T_, kMmaRows), (unsigned)nkv, (unsigned)B);
    attn_bwd_dkdv_mma<HD, LdsmFrags><<<gkv, kMmaThreads, smem_kv, s>>>(dqkv, dout, lse, D, qkv, T_, nh, nkv,
                                                                       scale, scale * kLog2e);
    LDM_LAUNCH_CHECK();
    dim3 gq((unsigned)ceil_div(T_, kMmaRows), (unsigned)nh, (unsigned)B);
    attn_bwd_dq_fulltile<HD, LdsmFrags><<<gq, kMmaThreads, smem_q, s>>>(dqkv, dout, lse, D, qkv, T_, nh, nkv,
                                                                        scale, scale * kLog2e);
    LDM_LAUNCH_CHECK();
}

}  // namespace attn_detail
}  // namespace gpu
}  // namespace ldm
