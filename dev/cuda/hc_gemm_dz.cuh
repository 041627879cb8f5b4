// dev/cuda/hc_gemm_dz.cuh — the mHC stream-gradient step production ran before mhc_combine_kernel
// (workbench only, "mhc-gemm-dz" in dev/cuda/hc.cu): a cuBLASLt GEMM writes dZ = dPp·Φ_j
// ([N, n·d], type T: rounded once) and a per-token kernel reads it back with G, dx and H_{j-1}.
// It moves 2·n·d·sizeof(T) bytes more per token and sublayer than the fused kernel (dZ written
// and read) and runs one launch more, but its dZ is a tensor-core GEMM instead of R = 2n + n²
// fp32 FMAs per stream element. Kept to check and time against production (doc/cuda.md
// "HC/mHC/AttnRes kernels"). Included by dev/cuda/hc.cu after train_gpt_baselines.cu.
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

}  // namespace hc_detail

// mHC with the GEMM-dZ stream gradient (the path before mhc_combine_kernel).
template <typename T>
struct MhcGemmDz : GpuHC<T> {
    using Base = GpuHC<T>;
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
    void stream_gradient(int j, const T* dx, const T* W, cudaStream_t s) override {
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

}  // namespace gpu
}  // namespace ldm
