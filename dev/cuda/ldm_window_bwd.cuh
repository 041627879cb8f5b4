// dev/cuda/ldm_window_bwd.cuh — workbench variant: the windowed backward of rls writes (the
// unwinding backward over a window of w writes, math/ldm_math.h "windowed backward"), one warp
// per (token, head). Each step t (t = m-1 down to 0) reads the window-end rows of S and dL/dS
// once and writes only dv_t and d_k-sized sums; step 0 writes the unwound rows. Not used by the
// trainer: it is checked (test/test_emu_ldm.cpp, dev/cuda/ldm.cu CHECK) against unwinding write
// by write in double and timed by dev/cuda/ldm.cu beside production's fused backward (doc/cuda.md
// "LDM kernels", "The windowed backward (workbench)").
#pragma once
#include <vector>

#include "core/common.h"
#include "cuda/ldm.cuh"

namespace ldm {
namespace gpu {
namespace ldmk {

constexpr int kWbwdMaxWindow = 8;

// One window's per-write inputs; write t (t = 0..m-1, in forward order) is followed by read t.
template <typename T>
struct WbwdIn {
    const float* Kn;   // [m, N, HK] normalised keys of the writes (write t at Kn + t*N*HK)
    const float* Qn;   // [m, N, HK] normalised queries of the reads
    const T* V;        // [m, N, d] values of the writes
    const float* dR;   // [m, N, d] read gradients dL/dr_t (fp32)
    const float* lam;  // [m, Hm] lambda of each write and head
    int m, w;          // writes in this window (1..w), the window length (coefficient capacity)
};
// Step t's outputs (written, not accumulated): dq [N, HK] of read t (= S_after^T dr_t), dkey
// [N, HK] and dv [N, d] of write t (w.r.t. the normalised key and the value), dlam [N, Hm].
struct WbwdOut {
    float* dq;
    float* dkey;
    float* dv;
    float* dlam;
};

// Register width of the warp kernels for d_k (cuda/ldm.cuh dispatch_dk) and the per (token,
// head) coefficient floats at that width: X, Y [DK, DK], y, z, g [w, DK], c [w], zero-padded.
inline int wbwd_width(int dk) { return dk <= 4 ? 4 : dk <= 8 ? 8 : 16; }
LDM_HD inline int wbwd_coef_floats(int DK, int w) { return 2 * DK * DK + 3 * w * DK + w; }

// Step t of the windowed backward for every (token, head): cur holds S_end (rows) and P (after
// write t on entry, before it on exit); dS holds D_end (rows) and dP (likewise); coef [N*Hm,
// wbwd_coef_floats] carries X, Y, y, z, g, c from step t+1 to step t (ldm_math.h wbwd_coef_step;
// read unless t = m-1). At t = 0 the S and dS rows become the window-start state and gradient.
// The coefficient step and the P-side VJP run on lane 0 from the warp's shared memory (d_k^2
// work per (token, head)); the rows are spread over the lanes (lane l: rows l, l+32, ...) and
// the d_k sums are warp reductions. Zero padding to DK keeps the math exact for d_k < DK.
template <typename T, int DK>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
wbwd_rls_warp_kernel(Dims D, float* cur, float* dS, float* coef, WbwdIn<T> in, int t, WbwdOut out) {
    const int64_t t_ = blockIdx.x * (int64_t)kWarpsPerBlock + threadIdx.x / 32;  // (token, head)
    if (t_ >= (int64_t)D.N * D.Hm) return;
    const int lane = threadIdx.x & 31, n = (int)(t_ / D.Hm), h = (int)(t_ % D.Hm);
    extern __shared__ float wbwd_smem[];
    const int CW = wbwd_coef_floats(DK, in.w), m = in.m, dk = D.dk;
    float* sP = wbwd_smem + (threadIdx.x / 32) * (2 * DK * DK + CW);
    float* sdP = sP + DK * DK;
    float* X = sdP + DK * DK;  // the coefficient block, laid out as in global memory
    float* Y = X + DK * DK;
    float* Yv = Y + DK * DK;
    float* Z = Yv + in.w * DK;
    float* G = Z + in.w * DK;
    float* C = G + in.w * DK;
    const int64_t so = D.state_off(n, h), kh = D.key_off(n, h), vo = D.val_off(n, h), nh = D.tok_off(n, h);
    const int64_t NHK = (int64_t)D.N * D.HK, Nd = (int64_t)D.N * D.d;
    float* S = cur + so;
    float* P = S + D.SS;
    float* dSs = dS + so;
    float* dP = dSs + D.SS;
    float* cg = coef + t_ * CW;
    for (int i = lane; i < DK * DK; i += 32) {
        const int a = i / DK, b = i % DK;
        const bool inside = a < dk && b < dk;
        sP[i] = inside ? P[a * dk + b] : 0.f;
        sdP[i] = inside ? dP[a * dk + b] : 0.f;
    }
    if (t < m - 1)
        for (int i = lane; i < CW; i += 32) X[i] = cg[i];
    float k[DK], q[DK], kn[DK], g[DK];
#pragma unroll
    for (int b = 0; b < DK; b++) {
        k[b] = b < dk ? in.Kn[t * NHK + kh + b] : 0.f;
        q[b] = b < dk ? in.Qn[t * NHK + kh + b] : 0.f;
        kn[b] = b < dk && t + 1 < m ? in.Kn[(t + 1) * NHK + kh + b] : 0.f;
    }
    const float lam = in.lam[t * D.Hm + h];
    __syncwarp();
    if (lane == 0) wbwd_coef_step(t, m, sP, k, lam, q, kn, X, Y, Yv, Z, G, C, DK);
    __syncwarp();
    float A[DK], dg[DK], B[DK], alpha = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) {
        g[b] = G[t * DK + b];
        A[b] = dg[b] = B[b] = 0.f;
    }
    for (int r = lane; r < D.dv; r += 32) {
        float Se[DK], De[DK], s[DK], ds[DK];
        load_row<DK>(S + (int64_t)r * dk, Se, dk);
        load_row<DK>(dSs + (int64_t)r * dk, De, dk);
        wbwd_row_base(Se, De, X, Y, s, ds, DK);
        float vt = 0.f, drt = 0.f;
        for (int l = t; l < m; l++) {
            const float vl = to_f(in.V[l * Nd + vo + r]), drl = in.dR[l * Nd + vo + r];
            if (l == t) {
                vt = vl;
                drt = drl;
            }
            wbwd_row_add(vl, drl, Yv + l * DK, Z + l * DK, s, ds, DK);
        }
        float e;
        const float de = wbwd_row_vjp(s, ds, vt, drt, k, g, A, &alpha, dg, B, &e, DK);
        out.dv[vo + r] = de;
        if (t == 0) {  // the window-start rows: S before write 0, dL/dS before it (ds W_0)
#pragma unroll
            for (int b = 0; b < DK; b++) ds[b] -= de * k[b];
            store_row<DK>(S + (int64_t)r * dk, s, dk);
            store_row<DK>(dSs + (int64_t)r * dk, ds, dk);
        }
    }
#pragma unroll
    for (int b = 0; b < DK; b++) {
        A[b] = warp_sum(A[b]);
        dg[b] = warp_sum(dg[b]);
        B[b] = warp_sum(B[b]);
    }
    alpha = warp_sum(alpha);
    if (lane == 0) {
        float dkk[DK], u[DK], du[DK], dl = 0.f;
#pragma unroll
        for (int b = 0; b < DK; b++) dkk[b] = -B[b];
        rls_write_vjp_p((const float*)sP, k, lam, dg, sdP, dkk, &dl, DK, u, du);
        for (int b = 0; b < dk; b++) {
            out.dq[kh + b] = A[b] + alpha * g[b];
            out.dkey[kh + b] = dkk[b];
        }
        out.dlam[nh] = dl;
    }
    __syncwarp();
    for (int i = lane; i < dk * dk; i += 32) {
        P[i] = sP[(i / dk) * DK + i % dk];
        dP[i] = sdP[(i / dk) * DK + i % dk];
    }
    if (t > 0)
        for (int i = lane; i < CW; i += 32) cg[i] = X[i];
}

// Launches step t (ldm::Error for a shape the warp kernel does not take: not rls, d_k > 16,
// w outside 1..kWbwdMaxWindow, m outside 1..w, t outside 0..m-1).
template <typename T>
inline void wbwd_rls_step(const Dims& D, float* cur, float* dS, float* coef, const WbwdIn<T>& in, int t,
                          const WbwdOut& out, cudaStream_t s) {
    if (D.PP == 0 || D.dk < 1 || D.dk > kWarpMaxDk || in.w < 1 || in.w > kWbwdMaxWindow || in.m < 1 ||
        in.m > in.w || t < 0 || t >= in.m)
        throw Error(strprintf("windowed rls backward: unsupported step (rls %d, d_k %d, w %d, m %d, t %d)",
                              D.PP > 0, D.dk, in.w, in.m, t));
    dispatch_dk(D.dk, [&](auto kc) {
        constexpr int DK = decltype(kc)::value;
        const size_t smem = (size_t)kWarpsPerBlock * (2 * DK * DK + wbwd_coef_floats(DK, in.w)) * sizeof(float);
        wbwd_rls_warp_kernel<T, DK><<<warp_blocks(D), 32 * kWarpsPerBlock, smem, s>>>(D, cur, dS, coef, in, t, out);
    });
    LDM_LAUNCH_CHECK();
}

// Host reference for one window over every (token, head), in double, write by write
// (ldm_read_vjp, rls_unwind, rls_write_vjp: the unwinding backward, not the windowed form).
// In: state [N, ST] (S_end, P_end), dstate (D_end, dP_end) and the window's inputs as host arrays
// of the WbwdIn layout (V already in double); out: state, dstate at the window start and per
// write t: dq [m, N, HK], dkey [m, N, HK], dv [m, N, d], dlam [m, N, Hm].
inline void wbwd_reference(const Dims& D, int m, std::vector<double>& state, std::vector<double>& dstate,
                           const std::vector<double>& Kn, const std::vector<double>& Qn,
                           const std::vector<double>& V, const std::vector<double>& dR,
                           const std::vector<double>& lam, std::vector<double>& dq, std::vector<double>& dkey,
                           std::vector<double>& dv, std::vector<double>& dlam) {
    const int64_t NHK = (int64_t)D.N * D.HK, Nd = (int64_t)D.N * D.d, NH = (int64_t)D.N * D.Hm;
    dq.assign((size_t)(m * NHK), 0.0);
    dkey.assign((size_t)(m * NHK), 0.0);
    dv.assign((size_t)(m * Nd), 0.0);
    dlam.assign((size_t)(m * NH), 0.0);
    std::vector<double> scr((size_t)(4 * D.dk + 2 * D.dv));
    for (int n = 0; n < D.N; n++)
        for (int h = 0; h < D.Hm; h++) {
            double* S = state.data() + D.state_off(n, h);
            double* dS = dstate.data() + D.state_off(n, h);
            const int64_t kh = D.key_off(n, h), vo = D.val_off(n, h), nh = D.tok_off(n, h);
            for (int t = m - 1; t >= 0; t--) {
                const double* k = &Kn[(size_t)(t * NHK + kh)];
                const double* v = &V[(size_t)(t * Nd + vo)];
                const double lm = lam[(size_t)(t * D.Hm + h)];
                ldm_read_vjp((const double*)S, &Qn[(size_t)(t * NHK + kh)], &dR[(size_t)(t * Nd + vo)], dS,
                             &dq[(size_t)(t * NHK + kh)], D.dv, D.dk);
                rls_unwind(S, S + D.SS, k, v, lm, D.dv, D.dk, scr.data());
                rls_write_vjp((const double*)S, (const double*)(S + D.SS), k, v, lm, dS, dS + D.SS,
                              &dkey[(size_t)(t * NHK + kh)], &dv[(size_t)(t * Nd + vo)], &dlam[(size_t)(t * NH + nh)],
                              D.dv, D.dk, scr.data());
            }
        }
}

}  // namespace ldmk
}  // namespace gpu
}  // namespace ldm
