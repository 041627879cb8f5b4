// dev/cuda/attnres_fullstage.cuh — the scores kernel of AttnRes-Full's deferred backward as
// production ran it before its rows were staged with cp.async (workbench only,
// "attnres-full-regstage" in dev/cuda/attnres.cu): pass 1 loads each group of G source rows into
// registers (G·d·sizeof(T) bytes in flight per block), reduces its dots and keeps the rows in
// shared memory for pass 2; production (full_scores_backward_kernel, cuda/attnres.cuh) issues
// all j rows of a token as asynchronous copies first. Same arguments, dynamic shared memory
// (full_scores_smem<T>(G, true, K, d)) and sums, in the same order: the results are the same bit
// for bit. Kept to check and time against production (doc/cuda.md "AttnRes-Full, deferred
// backward"). Included by dev/cuda/attnres.cu after train_gpt_baselines.cu.
#pragma once
#include "cuda/attnres.cuh"

namespace ldm {
namespace gpu {
namespace ar_detail {

// full_scores_backward_kernel<T, VPT, G, true> before the cp.async staging: pass 1 loads each
// group's rows into registers (writing them to the stage as well), then reduces; no barrier
// between tokens (each thread reads back only the staged channels it wrote itself).
template <typename T, int VPT, int G>
__global__ void __launch_bounds__(kThreads)
full_scores_regstage_kernel(float* dq_part, float* pa, float* pds, float* psc, T* stash, const T* dx, const T* U,
                            const float* R, int K, const float* w, const float* g, int64_t pair0, int N, int d) {
    extern __shared__ float sm[];
    constexpr int nw = kThreads / 32, HALF = 2 * G * nw;
    float* sc = sm + 2 * HALF;  // [K] s_k
    float* da = sc + K;         // [K] dx·u_k, then dL/ds_k
    float* al = da + K;         // [K] α_k
    float* rr = al + K;         // [K] r_k
    T* stage = (T*)(sm + (2 * HALF + 4 * K + 3) / 4 * 4);  // [K, d]
    float q[VPT], dq[VPT];
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        q[v] = c < d ? w[c] * g[c] : 0.f;
        dq[v] = 0.f;
    }
    int parity = 0;
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        float xd[VPT];
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = threadIdx.x + v * kThreads;
            xd[v] = 0.f;
            if (c < d) {
                const T xv = dx[t * d + c];
                stash[t * d + c] = xv;
                xd[v] = to_f(xv);
            }
        }
        for (int k0 = 0; k0 < K; k0 += G) {  // pass 1: scores and dots
            const int gk = K - k0 < G ? K - k0 : G;
            float uv[G][VPT], dot[2 * G], rk[G];
#pragma unroll
            for (int i = 0; i < G; i++) {  // every load of the group first
                dot[2 * i] = dot[2 * i + 1] = 0.f;
                rk[i] = 0.f;
                if (i >= gk) break;
                const T* u = U + ((int64_t)(k0 + i) * N + t) * d;
                rk[i] = R[(int64_t)(k0 + i) * N + t];
#pragma unroll
                for (int v = 0; v < VPT; v++) {
                    const int c = threadIdx.x + v * kThreads;
                    const T ut = c < d ? u[c] : from_f<T>(0.f);
                    if (c < d) stage[(int64_t)(k0 + i) * d + c] = ut;
                    uv[i][v] = to_f(ut);
                }
            }
#pragma unroll
            for (int i = 0; i < G; i++) {
                if (i >= gk) break;
#pragma unroll
                for (int v = 0; v < VPT; v++) {
                    dot[2 * i] = fmaf(q[v], uv[i][v], dot[2 * i]);
                    dot[2 * i + 1] = fmaf(xd[v], uv[i][v], dot[2 * i + 1]);
                }
            }
            block_sum_db<2 * G>(dot, sm + parity * HALF, 2 * gk);
            parity ^= 1;
            if (threadIdx.x == 0) {
#pragma unroll
                for (int i = 0; i < G; i++) {
                    if (i >= gk) break;
                    sc[k0 + i] = dot[2 * i] * rk[i];
                    al[k0 + i] = sc[k0 + i];
                    da[k0 + i] = dot[2 * i + 1];
                    rr[k0 + i] = rk[i];
                }
            }
        }
        if (threadIdx.x == 0) {  // thread 0 wrote every s_k and dot itself
            attnres_softmax(al, K);
            attnres_softmax_backward(da, al, K);
        }
        __syncthreads();
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            const int64_t o = (pair0 + k) * N + t;
            pa[o] = al[k];
            pds[o] = da[k];
            psc[o] = sc[k];
        }
        for (int k0 = 0; k0 < K; k0 += G) {  // pass 2: dL/dq
            const int gk = K - k0 < G ? K - k0 : G;
            float uv[G][VPT];
#pragma unroll
            for (int i = 0; i < G; i++) {
                if (i >= gk) break;
                const T* u = stage + (int64_t)(k0 + i) * d;
#pragma unroll
                for (int v = 0; v < VPT; v++) {
                    const int c = threadIdx.x + v * kThreads;
                    uv[i][v] = c < d ? to_f(u[c]) : 0.f;
                }
            }
#pragma unroll
            for (int i = 0; i < G; i++) {
                if (i >= gk) break;
                const float f = da[k0 + i] * rr[k0 + i];
#pragma unroll
                for (int v = 0; v < VPT; v++) dq[v] = fmaf(f, uv[i][v], dq[v]);
            }
        }
        // No barrier here: the next token's thread 0 rewrites s, dL/ds, α, r only after its first
        // block_sum_db barrier, which every thread reaches after its reads above, and each thread
        // reads back only the staged channels it wrote itself.
    }
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = threadIdx.x + v * kThreads;
        if (c < d) dq_part[(int64_t)blockIdx.x * d + c] = dq[v];
    }
}

}  // namespace ar_detail
}  // namespace gpu
}  // namespace ldm
