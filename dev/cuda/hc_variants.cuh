// dev/cuda/hc_variants.cuh — HC's and mHC's earlier stream-gradient paths, workbench only
// (dev/cuda/hc.cu CHECKs and BENCHes them beside production; doc/cuda.md "HC/mHC/AttnRes kernels").
// Each computes the weight gradient with a cuBLASLt GEMM dW_j += dPpᵀ·H_{j-1}, which reads H_{j-1}
// once more (n·d·sizeof(T) bytes per token and sublayer) where production's combine kernels form
// it from the H values they load anyway:
// - "hc-gemm-dw": the per-token HC combine kernel (W_j's n + 2 rows read from cache per token);
// - "mhc-gemm-dw": mHC's tiled combine kernel without the dΦ partial (dZ = dPp·Φ_j in the kernel);
// - "mhc-gemm-dz": a GEMM writes dZ ([N, n·d], type T: rounded once) and a per-token kernel reads
//   it back with G, dx and H_{j-1} (2·n·d·sizeof(T) bytes more); its dZ is a tensor-core GEMM
//   instead of R = 2n + n² fp32 FMAs per element.
// Included by dev/cuda/hc.cu after train_gpt_baselines.cu.
#pragma once
#include "cuda/hc.cuh"

namespace ldm {
namespace gpu {
namespace hc_detail {

// dHp[t, i] = Σ_k Mix[k,i] G[t, k] + a_i dx[t] + dZ[t, i] − β_t H[t, i] (written). All of
// G, dZ, H, dHp [N, n, d]; dx [N, d]; coef [N, 2n + n²]; β [N]. Grid N blocks of kThreads.
template <typename T, int NS>
__global__ void combine_dz_kernel(T* dHp, const T* G, const T* dx, const T* dZ, const T* H, const float* coef,
                                  const float* beta, int d) {
    constexpr int CW = 2 * NS + NS * NS;
    const int64_t t = blockIdx.x, base = t * NS * d;
    float a[NS], mix[NS * NS];
#pragma unroll
    for (int i = 0; i < NS; i++) a[i] = coef[t * CW + i];
#pragma unroll
    for (int e = 0; e < NS * NS; e++) mix[e] = coef[t * CW + NS + e];
    const float bt = beta[t];
    constexpr int U = kSteps<NS>;
    float g[U][NS], dxv[U], zl[U][NS], hl[U][NS];
    batched_strided_loop<U>(
        threadIdx.x, d, blockDim.x,
        [&](int u, int c) {
#pragma unroll
            for (int k = 0; k < NS; k++) {
                g[u][k] = to_f(G[base + (int64_t)k * d + c]);
                zl[u][k] = to_f(dZ[base + (int64_t)k * d + c]);
                hl[u][k] = to_f(H[base + (int64_t)k * d + c]);
            }
            dxv[u] = to_f(dx[t * d + c]);
        },
        [&](int u, int c) {
#pragma unroll
            for (int i = 0; i < NS; i++) {
                float v = a[i] * dxv[u];
#pragma unroll
                for (int k = 0; k < NS; k++) v += mix[k * NS + i] * g[u][k];
                v += zl[u][i] - bt * hl[u][i];
                dHp[base + (int64_t)i * d + c] = from_f<T>(v);
            }
        });
}


// mhc_combine_kernel without the weight gradient (its dZ part, unchanged): dHp[t, i, c] =
// Σ_k Mix[k,i] G[t, k, c] + a_i dx[t, c] + Σ_r dPp[t, r] Φ[r, i·d + c] − β_t H[t, i, c]; same
// layout, geometry and staging (grid: combine_grid's x, one token slice per tile in y).
template <typename T, int NS>
__global__ void __launch_bounds__(kCombineChannels<NS> * NS)
    mhc_combine_nodw_kernel(T* dHp, const T* G, const T* dx, const T* dPp, const T* Phi, const T* H,
                            const float* coef, const float* beta, int N, int d) {
    constexpr int R = 2 * NS + NS * NS, L = proj_ld(R), CW = 2 * NS + NS * NS, NM = NS + NS * NS;
    constexpr int CB = kCombineChannels<NS>, TB = kCombineTokens, U = 2;
    __shared__ float dps[TB][R];
    __shared__ float cfs[TB][NM];
    __shared__ float bts[TB];
    const int i = threadIdx.y, c = blockIdx.x * CB + threadIdx.x;
    const int tid = threadIdx.y * CB + threadIdx.x, nthr = CB * NS;
    const bool live = c < d;
    const int64_t nd = (int64_t)NS * d;
    float phi[R];
#pragma unroll
    for (int r = 0; r < R; r++) phi[r] = live ? to_f(Phi[r * nd + (int64_t)i * d + c]) : 0.f;
    for (int64_t t0 = (int64_t)blockIdx.y * TB; t0 < N; t0 += (int64_t)gridDim.y * TB) {
        const int nt = (int)(N - t0 < TB ? N - t0 : TB);
        __syncthreads();
        for (int e = tid; e < nt * R; e += nthr) dps[e / R][e % R] = to_f(dPp[(t0 + e / R) * L + e % R]);
        for (int e = tid; e < nt * NM; e += nthr) cfs[e / NM][e % NM] = coef[(t0 + e / NM) * CW + e % NM];
        for (int e = tid; e < nt; e += nthr) bts[e] = beta[t0 + e];
        __syncthreads();
        if (!live) continue;
        for (int u0 = 0; u0 < nt; u0 += U) {
            float g[U][NS], dxv[U], hl[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (u0 + u >= nt) break;
                const int64_t t = t0 + u0 + u;
#pragma unroll
                for (int k = 0; k < NS; k++) g[u][k] = to_f(G[t * nd + (int64_t)k * d + c]);
                dxv[u] = to_f(dx[t * d + c]);
                hl[u] = to_f(H[t * nd + (int64_t)i * d + c]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (u0 + u >= nt) break;
                const int tl = u0 + u;
                float v = cfs[tl][i] * dxv[u];
#pragma unroll
                for (int k = 0; k < NS; k++) v += cfs[tl][NS + k * NS + i] * g[u][k];
                float z = 0.f;
#pragma unroll
                for (int r = 0; r < R; r++) z += dps[tl][r] * phi[r];
                v += z - bts[tl] * hl[u];
                dHp[(t0 + tl) * nd + (int64_t)i * d + c] = from_f<T>(v);
            }
        }
    }
}

// HC backward combine per token ("hc-gemm-dw"; production until hc_combine_kernel):
// dHp[t, i] = Σ_k Mix[k,i] G[t, k] + a_i dx[t] + dZ[t, i] − β_i H[t, i] (written), with
// dZ[t, i] = Σ_e dPp[t, i, e] W[e] computed here from dPp [N, n, n+2] and W [(n+2), d] (W is small
// and stays in cache); β per row [N, n]. Grid N blocks of kThreads; dW_j by the GEMM beside it.
template <typename T, int NS>
__global__ void combine_token_kernel(T* dHp, const T* G, const T* dx, const T* dPp, const T* W, const T* H,
                               const float* coef, const float* beta, int d) {
    constexpr int CW = 2 * NS + NS * NS, m = NS + 2, L = proj_ld(NS + 2);
    const int64_t t = blockIdx.x;
    float a[NS], mix[NS * NS], bt[NS], dp[NS * m];
#pragma unroll
    for (int i = 0; i < NS; i++)
#pragma unroll
        for (int e = 0; e < m; e++) dp[i * m + e] = to_f(dPp[(t * NS + i) * L + e]);
#pragma unroll
    for (int i = 0; i < NS; i++) {
        a[i] = coef[t * CW + i];
        bt[i] = beta[t * NS + i];
    }
#pragma unroll
    for (int e = 0; e < NS * NS; e++) mix[e] = coef[t * CW + NS + e];
    const int64_t base = t * NS * d;
    // Every load of a batch (G, dx, W, H) before its first store: the stores of stream i
    // would otherwise hold back the loads of stream i + 1 (one round trip per stream).
    constexpr int U = kSteps<NS>;
    float g[U][NS], dxv[U], hl[U][NS], wl[U][m];
    batched_strided_loop<U>(
        threadIdx.x, d, blockDim.x,
        [&](int u, int c) {
#pragma unroll
            for (int k = 0; k < NS; k++) g[u][k] = to_f(G[base + (int64_t)k * d + c]);
            dxv[u] = to_f(dx[t * d + c]);
#pragma unroll
            for (int i = 0; i < NS; i++) hl[u][i] = to_f(H[base + (int64_t)i * d + c]);
#pragma unroll
            for (int e = 0; e < m; e++) wl[u][e] = to_f(W[(int64_t)e * d + c]);
        },
        [&](int u, int c) {
#pragma unroll
            for (int i = 0; i < NS; i++) {
                float v = a[i] * dxv[u];
#pragma unroll
                for (int k = 0; k < NS; k++) v += mix[k * NS + i] * g[u][k];
                float z = 0.f;
#pragma unroll
                for (int e = 0; e < m; e++) z += dp[i * m + e] * wl[u][e];
                v += z - bt[i] * hl[u][i];
                dHp[base + (int64_t)i * d + c] = from_f<T>(v);
            }
        });
}

}  // namespace hc_detail

// GpuHC with the weight gradient by a GEMM (the base of the variants below).
template <typename T>
struct HcGemmDwBase : GpuHC<T> {
    HcGemmDwBase(const ModelConfig& cfg, bool manifold) : GpuHC<T>(cfg, manifold) {}

   protected:
    // The earlier paths' combine kernels do not write dL/do_{j-1}: output_backward keeps
    // coef_dots_kernel<Dots::Post> (as production did when these were production).
    bool combine_writes_d_o() const override { return false; }
    // dW_j += dPpᵀ · H_{j-1}   ([wrows, N·prow] x [N·prow, kdim], Matmul; fp32 gW).
    void weight_gradient_gemm(int j, float* gW, cudaStream_t s) {
        this->mm_.template gemm<T, float>(true, false, this->wrows_, this->kdim_, (int64_t)this->N_ * this->prow_,
                                          1.f, this->dPp_.ptr, this->ldp_, this->H(j - 1), this->kdim_, 1.f, gW,
                                          this->kdim_, nullptr, s);
    }
};

// HC with the per-token combine kernel and the dW GEMM ("hc-gemm-dw").
template <typename T>
struct HcGemmDw : HcGemmDwBase<T> {
    explicit HcGemmDw(const ModelConfig& cfg) : HcGemmDwBase<T>(cfg, false) {}

   protected:
    void stream_gradient(int j, const T* dx, const T* W, float* gW, cudaStream_t s) override {
        this->weight_gradient_gemm(j, gW, s);
        this->dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::combine_token_kernel<T, NS><<<this->N_, hc_detail::kThreads, 0, s>>>(
                this->dHp_.ptr, this->dH_.ptr, dx, this->dPp_.ptr, W, this->H(j - 1), this->coef_.ptr,
                this->beta_.ptr, this->d_);
        });
        LDM_LAUNCH_CHECK();
    }
};

// mHC with the GEMM-dZ stream gradient and the dΦ GEMM ("mhc-gemm-dz").
template <typename T>
struct MhcGemmDz : HcGemmDwBase<T> {
    using Base = HcGemmDwBase<T>;
    explicit MhcGemmDz(const ModelConfig& cfg) : Base(cfg, true) {}

    void resize(int B, int T_) override {
        Base::resize(B, T_);
        const int64_t n = (int64_t)this->N_ * this->n_ * this->d_;
        if (dZ_.n < n) dZ_.alloc(n);
    }
    int64_t extra_bytes_per_token() const override {
        return Base::extra_bytes_per_token() + (int64_t)this->n_ * this->d_ * sizeof(T);
    }

   protected:
    void stream_gradient(int j, const T* dx, const T* W, float* gW, cudaStream_t s) override {
        this->weight_gradient_gemm(j, gW, s);
        const int64_t nd = (int64_t)this->n_ * this->d_;
        // dZ = dPp · Φ_j   ([N, R] x [R, n·d], type T)
        this->mm_.template gemm<T, T>(false, false, this->N_, nd, this->wrows_, 1.f, this->dPp_.ptr, this->ldp_, W,
                                      nd, 0.f, dZ_.ptr, nd, nullptr, s);
        this->dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::combine_dz_kernel<T, NS><<<this->N_, hc_detail::kThreads, 0, s>>>(
                this->dHp_.ptr, this->dH_.ptr, dx, dZ_.ptr, this->H(j - 1), this->coef_.ptr, this->beta_.ptr,
                this->d_);
        });
        LDM_LAUNCH_CHECK();
    }

   private:
    DeviceBuffer<T> dZ_;
};

// mHC with dZ in the combine kernel and the dΦ GEMM ("mhc-gemm-dw").
template <typename T>
struct MhcGemmDw : HcGemmDwBase<T> {
    explicit MhcGemmDw(const ModelConfig& cfg) : HcGemmDwBase<T>(cfg, true) {}

   protected:
    void stream_gradient(int j, const T* dx, const T* W, float* gW, cudaStream_t s) override {
        this->weight_gradient_gemm(j, gW, s);
        this->dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            const int N = this->N_, d = this->d_;
            const dim3 grid((unsigned)ceil_div(d, hc_detail::kCombineChannels<NS>),
                            (unsigned)std::min<int64_t>(std::max<int64_t>(ceil_div(N, hc_detail::kCombineTokens), 1), 65535));
            hc_detail::mhc_combine_nodw_kernel<T, NS><<<grid, dim3(hc_detail::kCombineChannels<NS>, NS), 0, s>>>(
                this->dHp_.ptr, this->dH_.ptr, dx, this->dPp_.ptr, W, this->H(j - 1), this->coef_.ptr,
                this->beta_.ptr, N, d);
        });
        LDM_LAUNCH_CHECK();
    }
};

}  // namespace gpu
}  // namespace ldm
