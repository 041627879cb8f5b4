// cuda/embedding.cuh — token embedding (spec §1: e = E[token], no scaling), forward and a
// deterministic backward without atomics (tokens bucketed by id on the host). Contract:
// doc/cuda.md (embedding.cuh). CPU reference: cpu::embedding_forward / embedding_backward.
#pragma once
#include <algorithm>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/pack16.cuh"

namespace ldm {
namespace gpu {

// Kernels (by shape, not a choice): "v2" (16-byte packs) when C % Pack<T>::n == 0 and the bases
// are 16-byte aligned, else "v1" (scalar, any C and alignment); the launchers of each kernel are
// in embedding_detail (the workbench also runs v1 where v2 applies).
namespace embedding_detail {

// ---- forward: out[N, C] = wte[tokens[n], :], wte [Vp, C]; token ids must lie in [0, Vp) ----
// v1: one thread per element.
template <typename T>
__global__ void forward_scalar_kernel(T* out, const int32_t* tokens, const T* wte, int64_t N,
                                      int C) {
    const int64_t total = N * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / C;
        const int c = (int)(i - n * C);
        out[i] = wte[(int64_t)tokens[n] * C + c];
    }
}
// v2: one warp per row, 16-byte packs (needs C % Pack<T>::n == 0 and 16-byte aligned bases).
template <typename T>
__global__ void forward_packed_kernel(T* out, const int32_t* tokens, const T* wte, int64_t N,
                                      int C) {
    const int64_t n = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (n >= N) return;
    const int4* src = reinterpret_cast<const int4*>(wte + (int64_t)tokens[n] * C);
    int4* dst = reinterpret_cast<int4*>(out + n * C);
    const int packs = C / Pack<T>::n;
    for (int p = lane; p < packs; p += 32) dst[p] = src[p];
}

// Whether the packed (v2) kernels apply to rows of C values at these bases.
template <typename T>
inline bool packed_ok(int C, const void* p0, const void* p1) {
    return C % Pack<T>::n == 0 && aligned16(p0) && aligned16(p1);
}

// The forward launchers (N, C >= 1; forward_packed throws ldm::Error unless packed_ok).
template <typename T>
void forward_scalar(T* out, const int32_t* tokens, const T* wte, int64_t N, int C,
                    cudaStream_t s) {
    const int64_t blocks = std::min<int64_t>(ceil_div(N * C, 256), 65535LL * 16);
    forward_scalar_kernel<T><<<(unsigned)blocks, 256, 0, s>>>(out, tokens, wte, N, C);
    LDM_LAUNCH_CHECK();
}
template <typename T>
void forward_packed(T* out, const int32_t* tokens, const T* wte, int64_t N, int C,
                    cudaStream_t s) {
    if (!packed_ok<T>(C, out, wte))
        throw Error(strprintf("embedding_forward: the packed kernel needs C %% %d == 0 (C = %d) "
                              "and 16-byte aligned buffers", Pack<T>::n, C));
    const int warps = 8;
    forward_packed_kernel<T><<<(unsigned)ceil_div(N, warps), warps * 32, 0, s>>>(out, tokens, wte,
                                                                                N, C);
    LDM_LAUNCH_CHECK();
}

}  // namespace embedding_detail

// out [N, C] = wte[tokens[n], :] (wte [Vp, C]; token ids on the device, in [0, Vp)). A copy:
// exact in any dtype.
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t N, int C,
                       cudaStream_t s) {
    using namespace embedding_detail;
    if (N <= 0 || C <= 0) return;
    if (packed_ok<T>(C, out, wte)) forward_packed<T>(out, tokens, wte, N, C, s);
    else forward_scalar<T>(out, tokens, wte, N, C, s);
}

// ---- backward -----------------------------------------------------------------------------
// Buckets of the batch's token ids, built on the host: uniq [U] the distinct ids (increasing),
// start [U+1] CSR offsets into pos, pos [N] the positions n of each id in increasing n.
// Counting sort over the ids (O(N + max id), about 10x faster than a comparison sort at
// llama-400m's N = 16,384; the whole-step CUDA graph waits for it). Ids must be >= 0
// (ldm::Error otherwise; the trainer checks them first); N = 0 gives U = 0 and start = {0}.
struct EmbeddingBuckets {
    std::vector<int32_t> uniq, start, pos;
    static EmbeddingBuckets build(const int32_t* tokens_host, int64_t N) {
        EmbeddingBuckets b;
        b.start.push_back(0);
        if (N <= 0) return b;
        int32_t max_id = 0;
        for (int64_t n = 0; n < N; n++) {
            if (tokens_host[n] < 0) throw Error(strprintf("EmbeddingBuckets: token id %d < 0", tokens_host[n]));
            max_id = std::max(max_id, tokens_host[n]);
        }
        std::vector<int32_t> next((size_t)max_id + 1, 0);  // count per id, then its next slot in pos
        for (int64_t n = 0; n < N; n++) next[(size_t)tokens_host[n]]++;
        int32_t at = 0;
        for (int32_t id = 0; id <= max_id; id++) {
            const int32_t c = next[(size_t)id];
            next[(size_t)id] = at;
            if (c == 0) continue;
            b.uniq.push_back(id);
            at += c;
            b.start.push_back(at);
        }
        b.pos.resize((size_t)N);
        for (int64_t n = 0; n < N; n++) b.pos[(size_t)next[(size_t)tokens_host[n]]++] = (int32_t)n;  // increasing n
        return b;
    }
    int U() const { return (int)uniq.size(); }
};

namespace embedding_detail {

// Both backward kernels: U buckets, or, when count != nullptr, *count (<= U) buckets read on the
// device (the launch is then sized for the bound U, so a CUDA graph can replay it for any batch).
// v1: one thread per (bucket, column), positions summed in increasing n.
template <typename T>
__global__ void backward_scalar_kernel(float* dwte, const T* dout, const int32_t* uniq,
                                       const int32_t* start, const int32_t* pos, int U, int C,
                                       const int32_t* count) {
    const int64_t total = (int64_t)(count ? *count : U) * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int u = (int)(i / C);
        const int c = (int)(i - (int64_t)u * C);
        float acc = 0.f;
        for (int j = start[u]; j < start[u + 1]; j++) acc += to_f(dout[(int64_t)pos[j] * C + c]);
        dwte[(int64_t)uniq[u] * C + c] += acc;
    }
}
// v2: one block per bucket; each thread owns Pack<T>::n consecutive columns (16-byte loads of
// dout, fp32 accumulation in registers, float4 read-modify-write of dwte). Needs
// C % Pack<T>::n == 0 and 16-byte aligned bases.
template <typename T>
__global__ void backward_packed_kernel(float* dwte, const T* dout, const int32_t* uniq,
                                       const int32_t* start, const int32_t* pos, int C,
                                       const int32_t* count) {
    constexpr int P = Pack<T>::n;
    const int u = blockIdx.x;
    if (count && u >= *count) return;
    const int j0 = start[u], j1 = start[u + 1];
    float* drow = dwte + (int64_t)uniq[u] * C;
    for (int c0 = threadIdx.x * P; c0 < C; c0 += blockDim.x * P) {
        float acc[P];
#pragma unroll
        for (int k = 0; k < P; k++) acc[k] = 0.f;
#pragma unroll 4
        for (int j = j0; j < j1; j++) {  // unrolled: several rows' loads in flight (hot ids)
            float v[P];
            load_pack(v, dout + (int64_t)pos[j] * C + c0);
#pragma unroll
            for (int k = 0; k < P; k++) acc[k] += v[k];
        }
#pragma unroll
        for (int k = 0; k < P; k += 4) {
            float4 d = *reinterpret_cast<float4*>(drow + c0 + k);
            d.x += acc[k];
            d.y += acc[k + 1];
            d.z += acc[k + 2];
            d.w += acc[k + 3];
            *reinterpret_cast<float4*>(drow + c0 + k) = d;
        }
    }
}

// The backward launchers (U, C >= 1; backward_packed throws ldm::Error unless packed_ok for
// dout and dwte; count_dev: see the kernels).
template <typename T>
void backward_scalar(float* dwte, const T* dout, const int32_t* uniq_dev, const int32_t* start_dev,
                     const int32_t* pos_dev, int U, int C, cudaStream_t s,
                     const int32_t* count_dev = nullptr) {
    const int64_t blocks = std::min<int64_t>(ceil_div((int64_t)U * C, 256), 65535LL * 16);
    backward_scalar_kernel<T><<<(unsigned)blocks, 256, 0, s>>>(dwte, dout, uniq_dev, start_dev,
                                                               pos_dev, U, C, count_dev);
    LDM_LAUNCH_CHECK();
}
template <typename T>
void backward_packed(float* dwte, const T* dout, const int32_t* uniq_dev, const int32_t* start_dev,
                     const int32_t* pos_dev, int U, int C, cudaStream_t s,
                     const int32_t* count_dev = nullptr) {
    if (!packed_ok<T>(C, dout, dwte))
        throw Error(strprintf("embedding_backward: the packed kernel needs C %% %d == 0 (C = %d) "
                              "and 16-byte aligned buffers", Pack<T>::n, C));
    const int threads = (int)std::min<int64_t>(256, ceil_div(ceil_div(C, Pack<T>::n), 32) * 32);
    backward_packed_kernel<T><<<(unsigned)U, threads, 0, s>>>(dwte, dout, uniq_dev, start_dev,
                                                              pos_dev, C, count_dev);
    LDM_LAUNCH_CHECK();
}

}  // namespace embedding_detail

// dwte[uniq[u]] += Σ_{n in bucket u, increasing n} dout[n] (fp32; deterministic, no atomics;
// rows of ids not in the batch untouched). dout [N, C]; uniq/start/pos on the device, from
// EmbeddingBuckets::build. count_dev (device int32, optional): the number of buckets is *count_dev,
// read by the kernel, and U only bounds it (e.g. U = N): the launch then does not depend on the
// batch, which is what a CUDA graph replaying the backward for every batch needs.
template <typename T>
void embedding_backward(float* dwte, const T* dout, const int32_t* uniq_dev,
                        const int32_t* start_dev, const int32_t* pos_dev, int U, int C,
                        cudaStream_t s, const int32_t* count_dev = nullptr) {
    using namespace embedding_detail;
    if (U <= 0 || C <= 0) return;
    if (packed_ok<T>(C, dout, dwte))
        backward_packed<T>(dwte, dout, uniq_dev, start_dev, pos_dev, U, C, s, count_dev);
    else
        backward_scalar<T>(dwte, dout, uniq_dev, start_dev, pos_dev, U, C, s, count_dev);
}

}  // namespace gpu
}  // namespace ldm
