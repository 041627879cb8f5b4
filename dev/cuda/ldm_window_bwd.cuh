// dev/cuda/ldm_window_bwd.cuh — workbench variant: the windowed backward of rls writes (the
// unwinding backward over a window of w writes, math/ldm_math.h "windowed backward"), one warp
// per (token, head). Each step t (t = m-1 down to 0) reads the window-end rows of S and dL/dS
// once and writes only dv_t and d_k-sized sums; step 0 writes the unwound rows. Not used by the
// trainer: it is checked (test/test_emu_ldm.cpp, dev/cuda/ldm.cu CHECK) against unwinding write
// by write in double and timed by dev/cuda/ldm.cu beside production's fused backward (doc/cuda.md
// "The windowed backward").
#pragma once
#include <type_traits>
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

// The coefficient step on lane 0, out of line (its unrolled d_k^2 loops would otherwise share
// the register allocation of the row loop).
template <int DK>
__device__ __noinline__ void wbwd_lane0_coef(int t, int m, float* sP, const float* Kt, const float* Qt,
                                             const float* Kn1, int dk, float lam, float* X, int w) {
    float k[DK], q[DK], kn[DK];
#pragma unroll
    for (int b = 0; b < DK; b++) {
        k[b] = b < dk ? Kt[b] : 0.f;
        q[b] = b < dk ? Qt[b] : 0.f;
        kn[b] = b < dk && Kn1 ? Kn1[b] : 0.f;
    }
    float* Y = X + DK * DK;
    float* Yv = Y + DK * DK;
    float* Z = Yv + w * DK;
    float* G = Z + w * DK;
    wbwd_coef_step(t, m, sP, k, lam, q, kn, X, Y, Yv, Z, G, G + w * DK, DK);
}
// The step's sums (wbwd_step_sums) and the P-side VJP on lane 0, out of line, from the warp's
// reduced row sums in shared memory (red: aS, aD, bS [DK], pv, pe, pd [W], alpha); writes read
// t's dq, write t's dkey and dlam.
template <int DK, int W>
__device__ __noinline__ void wbwd_lane0_finish(int t, int m, const float* X, int w, float* sP, float* sdP,
                                               const float* Kt, float lam, const float* red, int dk, float* dq,
                                               float* dkey, float* dlam) {
    const float* Y = X + DK * DK;
    const float* Yv = Y + DK * DK;
    const float* Z = Yv + w * DK;
    const float* g = Z + w * DK + t * DK;  // G[t]
    float k[DK], A[DK], dg[DK], B[DK], u[DK], du[DK], dl = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) k[b] = b < dk ? Kt[b] : 0.f;
    wbwd_step_sums(t, m, W, X, Y, Yv, Z, red, red + DK, red + 2 * DK, red + 3 * DK, red + 3 * DK + W,
                   red + 3 * DK + 2 * W, A, dg, B, DK);
    const float alpha = red[3 * DK + 3 * W];
#pragma unroll
    for (int b = 0; b < DK; b++) B[b] = -B[b];
    const float ku = rls_write_u(sP, k, u, DK);
    rls_write_vjp_p(sP, k, (const float*)u, ku, lam, (const float*)dg, sdP, B, &dl, DK, du);
#pragma unroll
    for (int b = 0; b < DK; b++)
        if (b < dk) {
            dq[b] = A[b] + alpha * g[b];
            dkey[b] = B[b];
        }
    *dlam = dl;
}

// Shared floats per warp: P, dP [DK, DK], the coefficient block, the reduced row sums.
LDM_HD inline int wbwd_smem_floats(int DK, int W, int w) {
    return 2 * DK * DK + wbwd_coef_floats(DK, w) + 3 * DK + 3 * W + 1;
}

// Blocks per SM the kernel asks for (ptxas, sm_90, doc/cuda.md: the largest count at which at
// most a few bytes spill, around the out-of-line lane-0 calls): 4 (128 registers) for the steps
// t > 0 at d_k <= 8 and W <= 4, 3 (168) for W = 8 and for the start step (its full rows), 2 at
// d_k 16.
constexpr int wbwd_min_blocks(int DK, int W, bool start) { return DK > 8 ? 2 : (start || W > 4) ? 3 : 4; }

// Step t of the windowed backward for every (token, head): cur holds S_end (rows) and P (after
// write t on entry, before it on exit); dS holds D_end (rows) and dP (likewise); coef [N*Hm,
// wbwd_coef_floats] carries X, Y, y, z, g, c from step t+1 to step t (ldm_math.h wbwd_coef_step;
// read unless t = m-1). START (t = 0): the S and dS rows become the window-start state and
// gradient. Lane 0 runs the coefficient step and, after the rows, the step's sums and the
// P-side VJP (d_k^2 work per (token, head), out of line, from the warp's shared memory); the
// rows are spread over the lanes (lane l: rows l, l+32, ...) with O(d_k + W) work each
// (ldm_math.h wbwd_row), the row sums are warp reductions. W (>= w) is the compile-time bound of
// the per-write loops. Zero padding to DK keeps the math exact for d_k < DK.
template <typename T, int DK, int W, bool START>
__global__ void __launch_bounds__(32 * kWarpsPerBlock, wbwd_min_blocks(DK, W, START))
wbwd_rls_warp_kernel(Dims D, float* cur, float* dS, float* coef, WbwdIn<T> in, int t, WbwdOut out) {
    const int64_t t_ = blockIdx.x * (int64_t)kWarpsPerBlock + threadIdx.x / 32;  // (token, head)
    if (t_ >= (int64_t)D.N * D.Hm) return;
    const int lane = threadIdx.x & 31, n = (int)(t_ / D.Hm), h = (int)(t_ % D.Hm);
    extern __shared__ float wbwd_smem[];
    const int CW = wbwd_coef_floats(DK, in.w), m = in.m, dk = D.dk;
    float* sP = wbwd_smem + (threadIdx.x / 32) * wbwd_smem_floats(DK, W, in.w);
    float* sdP = sP + DK * DK;
    float* X = sdP + DK * DK;  // the coefficient block, laid out as in global memory
    const float* Y = X + DK * DK;
    const float* Yv = Y + DK * DK;
    const float* Z = Yv + in.w * DK;
    const float* G = Z + in.w * DK;
    float* red = X + CW;
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
    const float lam = in.lam[t * D.Hm + h];
    __syncwarp();
    if (lane == 0)
        wbwd_lane0_coef<DK>(t, m, sP, in.Kn + t * NHK + kh, in.Qn + t * NHK + kh,
                            t + 1 < m ? in.Kn + (t + 1) * NHK + kh : nullptr, dk, lam, X, in.w);
    __syncwarp();
    float k[DK], g[DK], xk[DK], yg[DK], ykl[W], zgl[W], aS[DK], aD[DK], bS[DK], pv[W], pe[W], pd[W];
    float alpha = 0.f;
#pragma unroll
    for (int b = 0; b < DK; b++) {
        k[b] = b < dk ? in.Kn[t * NHK + kh + b] : 0.f;
        g[b] = G[t * DK + b];
        aS[b] = aD[b] = bS[b] = 0.f;
    }
#pragma unroll
    for (int l = 0; l < W; l++) ykl[l] = zgl[l] = pv[l] = pe[l] = pd[l] = 0.f;
    wbwd_step_vectors(t, m, W, (const float*)X, Y, Yv, Z, k, g, xk, yg, ykl, zgl, DK);
    for (int r = lane; r < D.dv; r += 32) {
        float Se[DK], De[DK], vr[W], drr[W];
        load_row<DK>(S + (int64_t)r * dk, Se, dk);
        load_row<DK>(dSs + (int64_t)r * dk, De, dk);
#pragma unroll
        for (int l = 0; l < W; l++) {
            const bool live = l >= t && l < m;
            vr[l] = live ? to_f(in.V[l * Nd + vo + r]) : 0.f;
            drr[l] = live ? in.dR[l * Nd + vo + r] : 0.f;
        }
        const float vt = to_f(in.V[t * Nd + vo + r]), drt = in.dR[t * Nd + vo + r];  // = vr[t], drr[t] (L1)
        float e;
        const float de = wbwd_row(t, m, W, Se, De, vr, drr, vt, drt, xk, yg, ykl, zgl, aS, aD, bS, pv, pe, pd, &alpha,
                                  &e, DK);
        out.dv[vo + r] = de;
        if (START) {  // the window-start rows: S before write 0, dL/dS before it (ds W_0)
            float s[DK], ds[DK];
            // the coefficient pointers laundered per row: without it nvcc keeps X and Y (2 DK^2
            // values) in registers across the row loop and spills
            const float *Xr = X, *Yr = Y, *Yvr = Yv, *Zr = Z;
#ifdef __CUDA_ARCH__
            asm volatile("" : "+l"(Xr), "+l"(Yr), "+l"(Yvr), "+l"(Zr));
#endif
            wbwd_row_full(t, m, W, Se, De, vr, drr, Xr, Yr, Yvr, Zr, s, ds, DK);
#pragma unroll
            for (int b = 0; b < DK; b++) ds[b] -= de * k[b];
            store_row<DK>(S + (int64_t)r * dk, s, dk);
            store_row<DK>(dSs + (int64_t)r * dk, ds, dk);
        }
    }
#pragma unroll
    for (int b = 0; b < DK; b++) {
        aS[b] = warp_sum(aS[b]);
        aD[b] = warp_sum(aD[b]);
        bS[b] = warp_sum(bS[b]);
    }
#pragma unroll
    for (int l = 0; l < W; l++) {
        pv[l] = warp_sum(pv[l]);
        pe[l] = warp_sum(pe[l]);
        pd[l] = warp_sum(pd[l]);
    }
    alpha = warp_sum(alpha);
    if (lane == 0) {
#pragma unroll
        for (int b = 0; b < DK; b++) {
            red[b] = aS[b];
            red[DK + b] = aD[b];
            red[2 * DK + b] = bS[b];
        }
#pragma unroll
        for (int l = 0; l < W; l++) {
            red[3 * DK + l] = pv[l];
            red[3 * DK + W + l] = pe[l];
            red[3 * DK + 2 * W + l] = pd[l];
        }
        red[3 * DK + 3 * W] = alpha;
        wbwd_lane0_finish<DK, W>(t, m, X, in.w, sP, sdP, in.Kn + t * NHK + kh, lam, red, dk, out.dq + kh,
                                 out.dkey + kh, out.dlam + nh);
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
        auto go = [&](auto wc) {
            constexpr int W = decltype(wc)::value;
            const size_t smem = (size_t)kWarpsPerBlock * wbwd_smem_floats(DK, W, in.w) * sizeof(float);
            if (t == 0)
                wbwd_rls_warp_kernel<T, DK, W, true><<<warp_blocks(D), 32 * kWarpsPerBlock, smem, s>>>(D, cur, dS, coef, in, t, out);
            else
                wbwd_rls_warp_kernel<T, DK, W, false><<<warp_blocks(D), 32 * kWarpsPerBlock, smem, s>>>(D, cur, dS, coef, in, t, out);
        };
        if (in.w <= 2) go(std::integral_constant<int, 2>{});
        else if (in.w <= 4) go(std::integral_constant<int, 4>{});
        else go(std::integral_constant<int, kWbwdMaxWindow>{});
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
