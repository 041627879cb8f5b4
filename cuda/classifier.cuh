// cuda/classifier.cuh — fused softmax + cross-entropy + dlogits over padded logits, in place
// (doc/cuda.md "classifier.cuh"), and a deterministic sum of the per-token losses.
// Spec: model.md §1 (LM head over the real V columns, mean next-token cross-entropy).
// CPU reference: cpu/ops.h cross_entropy_forward (lse, loss) and
// cross_entropy_backward_inplace (dlogits = scale·(softmax − onehot)).
#pragma once
#include <cfloat>

#include "cuda/common.cuh"

namespace ldm {
namespace gpu {

namespace classifier_detail {

constexpr int kThreads = 512;   // one block per row

// Running softmax statistics of a set of values: m = max, s = Σ exp(x − m).
struct MaxSum {
    float m, s;
};
__device__ inline MaxSum ms_combine(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    // m = -FLT_MAX (empty sets) gives exp(0)·0 = 0; a finite gap below -87 underflows to 0.
    return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
// Adds one value x to the statistics (online softmax).
__device__ inline void ms_add(MaxSum& a, float x) {
    if (x > a.m) {
        a.s *= __expf(a.m - x);
        a.m = x;
    }
    a.s += __expf(x - a.m);
}

// Block-wide reduction of the softmax statistics in a fixed order (shuffle tree in each warp, then
// warp 0 over the warp results); the result is returned to EVERY thread. blockDim.x must be a
// multiple of 32.
__device__ inline MaxSum warp_ms(MaxSum a) {
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
        a = ms_combine(a, b);
    }
    return a;
}
__device__ inline MaxSum block_ms(MaxSum a) {
    __shared__ float shm[32], shs[32];
    __shared__ MaxSum result;
    a = warp_ms(a);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        shm[warp] = a.m;
        shs[warp] = a.s;
    }
    __syncthreads();
    if (warp == 0) {
        MaxSum b = lane < nw ? MaxSum{shm[lane], shs[lane]} : MaxSum{-FLT_MAX, 0.0f};
        b = warp_ms(b);
        if (lane == 0) result = b;
    }
    __syncthreads();
    return result;
}

// The target's logit (read before any thread overwrites the row) or NaN for an invalid target.
template <typename T>
__device__ inline float target_logit(const T* row, int t, int V) {
    return (t >= 0 && t < V) ? to_f(row[t]) : __int_as_float(0x7fc00000);
}

// dlogit of column v (fp32): dscale·(exp(x − m)·inv_s − [v == t]) for v < V, 0 for v >= V.
__device__ inline float dlogit(float x, int v, int t, int V, float m, float inv_s, float dscale) {
    if (v >= V) return 0.0f;
    const float p = __expf(x - m) * inv_s;
    return dscale * (v == t ? p - 1.0f : p);
}

// 16-byte pack of W = 16 / sizeof(T) values.
template <typename T>
struct alignas(16) Pack {
    static constexpr int W = 16 / (int)sizeof(T);
    T x[W];
};

// One online-softmax statistics pass, then the write pass (the workbench's "v2"). VEC: 16-byte
// loads and stores (needs the row start 16-byte aligned, i.e. logits aligned and
// Vp·sizeof(T) % 16 == 0, which also makes Vp a multiple of W); the last V % W real columns are
// read as scalars. !VEC: scalar accesses, any alignment.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    classifier_kernel(T* logits, float* losses, const int32_t* targets, int V, int Vp,
                      float dscale, bool write) {
    using P = Pack<T>;
    constexpr int W = P::W;
    T* row = logits + (int64_t)blockIdx.x * Vp;
    const int t = targets[blockIdx.x];
    const float xt = target_logit(row, t, V);
    MaxSum st{-FLT_MAX, 0.0f};
    if (VEC) {
        const int nv = V / W;
        const P* prow = reinterpret_cast<const P*>(row);
        for (int k = threadIdx.x; k < nv; k += blockDim.x) {
            const P pk = prow[k];
            float x[W];
            float mv = -FLT_MAX;
#pragma unroll
            for (int j = 0; j < W; j++) {
                x[j] = to_f(pk.x[j]);
                mv = fmaxf(mv, x[j]);
            }
            if (mv > st.m) {
                st.s *= __expf(st.m - mv);
                st.m = mv;
            }
#pragma unroll
            for (int j = 0; j < W; j++) st.s += __expf(x[j] - st.m);
        }
        for (int v = nv * W + threadIdx.x; v < V; v += blockDim.x) ms_add(st, to_f(row[v]));
    } else {
        for (int v = threadIdx.x; v < V; v += blockDim.x) ms_add(st, to_f(row[v]));
    }
    st = block_ms(st);   // ends with __syncthreads: every read above is done before any write
    if (threadIdx.x == 0 && losses) losses[blockIdx.x] = st.m + logf(st.s) - xt;
    if (!write) return;
    const float inv_s = 1.0f / st.s;
    if (VEC) {
        P* prow = reinterpret_cast<P*>(row);
        const int nv = Vp / W;
        for (int k = threadIdx.x; k < nv; k += blockDim.x) {
            P pk = prow[k];
#pragma unroll
            for (int j = 0; j < W; j++) {
                const int v = k * W + j;
                pk.x[j] = from_f<T>(dlogit(to_f(pk.x[j]), v, t, V, st.m, inv_s, dscale));
            }
            prow[k] = pk;
        }
    } else {
        for (int v = threadIdx.x; v < Vp; v += blockDim.x)
            row[v] = from_f<T>(v < V ? dlogit(to_f(row[v]), v, t, V, st.m, inv_s, dscale) : 0.0f);
    }
}

__global__ void sum_losses_kernel(float* out, const float* losses, int64_t N) {
    __shared__ double sh[32];
    double acc = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += (double)losses[i];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        double s = lane < nw ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) *out = (float)s;
    }
}

// True when every row of logits [N, Vp] starts 16-byte aligned (the kernel's VEC path).
template <typename T>
inline bool rows_aligned16(const T* logits, int Vp) {
    return ((uintptr_t)logits % 16 == 0) && ((int64_t)Vp * (int64_t)sizeof(T)) % 16 == 0;
}

// Enqueues classifier_kernel over N >= 1 rows (sizes checked by the caller): vec = the 16-byte
// path (ldm::Error unless rows_aligned16), else the scalar path. fused_classifier picks vec
// whenever the rows allow it; dev/cuda/classifier.cu also runs the scalar path on aligned rows.
template <typename T>
void launch(bool vec, T* logits, float* losses, const int32_t* targets, int64_t N, int V, int Vp,
            float dscale, bool write_dlogits, cudaStream_t s) {
    const unsigned grid = (unsigned)N;
    if (vec) {
        if (!rows_aligned16(logits, Vp))
            throw Error(strprintf("fused_classifier: the 16-byte path needs 16-byte aligned rows "
                                  "(Vp = %d)", Vp));
        classifier_kernel<T, true><<<grid, kThreads, 0, s>>>(logits, losses, targets, V, Vp,
                                                             dscale, write_dlogits);
    } else {
        classifier_kernel<T, false><<<grid, kThreads, 0, s>>>(logits, losses, targets, V, Vp,
                                                              dscale, write_dlogits);
    }
    LDM_LAUNCH_CHECK();
}

}  // namespace classifier_detail

// Fused classifier on logits [N, Vp] (row stride Vp, T = float or bf16), over the V real
// columns (V <= Vp; columns >= V are never read for the statistics, so they may hold anything):
//   losses[n] = lse_n − logits[n, t_n],  lse_n = log Σ_{v<V} exp(logits[n, v])     (fp32 [N])
// and, when write_dlogits, the row is REPLACED in place by
//   dlogits[n, v] = dscale·(softmax_n(v) − [v == t_n]) for v < V,  0 for V <= v < Vp
// (dscale is the per-token weight, e.g. loss scale / N). Probabilities are never stored.
// targets: int32 [N] on the device, expected in [0, V); an out-of-range target gives
// losses[n] = NaN and no one-hot term (never an out-of-bounds read). losses may be nullptr.
// One block per row; arithmetic in fp32: an online-softmax statistics pass, then the write pass,
// with 16-byte accesses when the rows are 16-byte aligned (scalar otherwise). Deterministic
// (fixed-order reductions, no atomics). Throws ldm::Error on bad sizes (N < 0, N >= 2^31, V < 1,
// Vp < V).
template <typename T>
void fused_classifier(T* logits, float* losses, const int32_t* targets, int64_t N, int V, int Vp,
                      float dscale, bool write_dlogits, cudaStream_t s) {
    if (N < 0 || N >= (int64_t(1) << 31) || V < 1 || Vp < V)
        throw Error(strprintf("fused_classifier: bad sizes N=%lld V=%d Vp=%d", (long long)N, V, Vp));
    if (N == 0) return;
    classifier_detail::launch<T>(classifier_detail::rows_aligned16(logits, Vp), logits, losses,
                                 targets, N, V, Vp, dscale, write_dlogits, s);
}

// *out (device, one float) = Σ_{n<N} losses[n] (fp32 [N] on the device), accumulated in double
// by one block in a fixed order: deterministic. The mean loss is *out / N. N = 0 gives 0.
inline void sum_losses(float* out, const float* losses, int64_t N, cudaStream_t s) {
    if (N < 0) throw Error(strprintf("sum_losses: N = %lld < 0", (long long)N));
    classifier_detail::sum_losses_kernel<<<1, 1024, 0, s>>>(out, losses, N);
    LDM_LAUNCH_CHECK();
}

}  // namespace gpu
}  // namespace ldm
