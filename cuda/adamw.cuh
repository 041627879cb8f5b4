// cuda/adamw.cuh — the optimizer kernels of the GPU trainers (doc/cuda.md "adamw.cuh"):
// a deterministic global gradient norm, the step's clip factor and divergence guard on the device,
// and the AdamW update on fp32 master weights (scalars read from device memory), with the
// per-element arithmetic of core/optim.cpp (math/optim_math.h adamw_element, shared verbatim),
// so a GPU update is bit-identical to AdamW<float>::step given the same clip factor.
// Spec: model.md §1 "AdamW defaults"; CPU reference: core/optim.h.
#pragma once
#include "cuda/common.cuh"
#include "math/optim_math.h"

namespace ldm {
namespace gpu {

// ---------------------------------------------------------------------------------------------
// Global gradient norm.
// Pass 1 runs a FIXED grid of kNormBlocks blocks (independent of n and of the device): block b
// sums g² over the grid-stride indices it owns (double per thread, fixed-order tree in the block)
// and writes its partial (fp32) to scratch[b]. Pass 2 is one block that adds the kNormBlocks
// partials in a fixed order (double) and writes *out. No atomics: bit-identical run to run.
namespace adamw_detail {
constexpr int kNormBlocks = 1024;
constexpr int kNormThreads = 256;

// Sum over the block of one double per thread, in a fixed order; the result is valid in thread 0.
// blockDim.x must be a multiple of 32 and at most 1024.
__device__ inline double block_sum_double(double x) {
    __shared__ double warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    double s = 0;
    if (warp == 0) {
        const int nw = (int)(blockDim.x >> 5);
        s = lane < nw ? warp_sums[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    }
    __syncthreads();   // warp_sums may be reused by a following call
    return s;
}

__global__ void norm_partials_kernel(float* partials, const float* g, int64_t n) {
    double acc = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        const double x = (double)g[i];
        acc += x * x;
    }
    const double s = block_sum_double(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = (float)s;
}

__global__ void norm_final_kernel(float* out, const float* partials, int count) {
    double acc = 0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += (double)partials[i];
    const double s = block_sum_double(acc);
    if (threadIdx.x == 0) *out = (float)s;
}
}  // namespace adamw_detail

// Floats of scratch that global_norm_squared needs (one partial per block of the fixed grid).
inline int64_t global_norm_scratch() { return adamw_detail::kNormBlocks; }

// *out (device, one float) = Σ_i g[i]² over g [n] fp32 (device). Deterministic two-pass sum (see
// above): the result does not depend on timing, only on n and the values. Accumulation is in
// double except for the fp32 per-block partials (relative error ~1e-7). n = 0 gives 0.
// scratch: >= global_norm_scratch() floats of device memory. The caller takes sqrt on the host
// (or wherever) and derives the clip factor like core/optim.cpp: c = min(1, clip / ||g||).
inline void global_norm_squared(float* out, float* scratch, const float* g, int64_t n,
                                cudaStream_t s) {
    using namespace adamw_detail;
    if (n < 0) throw Error(strprintf("global_norm_squared: n = %lld < 0", (long long)n));
    norm_partials_kernel<<<kNormBlocks, kNormThreads, 0, s>>>(scratch, g, n);
    LDM_LAUNCH_CHECK();
    norm_final_kernel<<<1, 1024, 0, s>>>(out, scratch, kNormBlocks);
    LDM_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
// AdamW update. The kernels read the step's scalars from device memory (AdamWStep), so that a
// CUDA graph captured once replays every step (new lr, bias corrections and clip factor each time)
// and the clip factor and the divergence guard can be computed on the device.

// The scalars of one AdamW step, in device memory. sc: adamw_scalars<float> (sc.clip = the clip
// factor c, sc.wd = weight decay of the decay ranges; the others ignore it); skip != 0: the step
// is not applied (every kernel returns at once: the divergence guard, adamw_step_guard).
struct AdamWStep {
    AdamWScalars<float> sc;
    int skip;
};

// Host: the step's scalars (as core/optim.cpp computes them: double, rounded once to fp32).
inline AdamWStep adamw_step_scalars(double beta1, double beta2, double eps, double weight_decay, double lr,
                                    double clip, int64_t t) {
    AdamWStep st;
    st.sc = adamw_scalars<float>(beta1, beta2, eps, weight_decay, lr, clip, t);
    st.skip = 0;
    return st;
}

namespace adamw_detail {
// v1: one element per thread per grid-stride iteration (any alignment).
template <typename T, bool DECAY>
__global__ void adamw_scalar_kernel(float* p, T* p_copy, float* m, float* v, const float* g,
                                    int64_t n, const AdamWStep* step) {
    if (step->skip) return;
    const AdamWScalars<float> sc = step->sc;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        float pi = p[i], mi = m[i], vi = v[i];
        adamw_element(pi, mi, vi, g[i], sc, DECAY);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (p_copy) p_copy[i] = from_f<T>(pi);
    }
}

// v2: groups of 4 elements with 16-byte loads/stores of p, m, v, g (8-byte stores of a bf16
// p_copy), starting at element `head` (0..3, chosen so that p + head is 16-byte aligned; the
// launcher checks that m, v, g, p_copy are then aligned too). The `head` leading and the
// (n - head) % 4 trailing elements are done as scalars by the first threads of block 0.
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
    T x[4];
};
template <typename T, bool DECAY>
__device__ inline void adamw_one(float* p, T* p_copy, float* m, float* v, const float* g,
                                 int64_t i, const AdamWScalars<float>& sc) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(pi, mi, vi, g[i], sc, DECAY);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (p_copy) p_copy[i] = from_f<T>(pi);
}
template <typename T, bool DECAY>
__global__ void adamw_vec4_kernel(float* p, T* p_copy, float* m, float* v, const float* g,
                                  int64_t n, int head, const AdamWStep* step) {
    if (step->skip) return;
    const AdamWScalars<float> sc = step->sc;
    const int64_t n4 = (n - head) / 4;
    const float4* p4 = reinterpret_cast<const float4*>(p + head);
    const float4* m4 = reinterpret_cast<const float4*>(m + head);
    const float4* v4 = reinterpret_cast<const float4*>(v + head);
    const float4* g4 = reinterpret_cast<const float4*>(g + head);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n4; k += stride) {
        float4 pp = p4[k], mm = m4[k], vv = v4[k];
        const float4 gg = g4[k];
        adamw_element(pp.x, mm.x, vv.x, gg.x, sc, DECAY);
        adamw_element(pp.y, mm.y, vv.y, gg.y, sc, DECAY);
        adamw_element(pp.z, mm.z, vv.z, gg.z, sc, DECAY);
        adamw_element(pp.w, mm.w, vv.w, gg.w, sc, DECAY);
        reinterpret_cast<float4*>(p + head)[k] = pp;
        reinterpret_cast<float4*>(m + head)[k] = mm;
        reinterpret_cast<float4*>(v + head)[k] = vv;
        if (p_copy) {
            Vec4<T> c;
            c.x[0] = from_f<T>(pp.x);
            c.x[1] = from_f<T>(pp.y);
            c.x[2] = from_f<T>(pp.z);
            c.x[3] = from_f<T>(pp.w);
            reinterpret_cast<Vec4<T>*>(p_copy + head)[k] = c;
        }
    }
    if (blockIdx.x == 0) {
        const int tail = (int)(n - head - 4 * n4);
        if ((int)threadIdx.x < head) adamw_one<T, DECAY>(p, p_copy, m, v, g, threadIdx.x, sc);
        if ((int)threadIdx.x < tail)
            adamw_one<T, DECAY>(p, p_copy, m, v, g, head + 4 * n4 + threadIdx.x, sc);
    }
}

// The divergence guard and clip factor of a step on the device (one thread): from the squared
// global norm *norm_sq and the non-finite-loss flag *loss_bad (nullptr: none), sets
// step->sc.clip = adamw_clip_factor(sqrt(*norm_sq), grad_clip) and step->skip = 1 when the norm
// is not finite or *loss_bad != 0.
__global__ void step_guard_kernel(AdamWStep* step, const float* norm_sq, const unsigned* loss_bad,
                                  double grad_clip) {
    const double norm = rn_sqrt((double)*norm_sq);
    step->sc.clip = (float)adamw_clip_factor(norm, grad_clip);
    step->skip = (!isfinite(norm) || (loss_bad && *loss_bad != 0u)) ? 1 : 0;
}

// *flag = 1 when some x[i] is not finite (several threads may store the same 1; nothing else).
__global__ void flag_nonfinite_kernel(unsigned* flag, const float* x, int64_t n) {
    bool bad = false;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        bad = bad || !isfinite(x[i]);
    if (bad) *flag = 1u;
}

inline bool aligned_to(const void* ptr, size_t a) { return ((uintptr_t)ptr % a) == 0; }

constexpr int kAdamThreads = 256;
inline unsigned adamw_grid(int64_t work) {
    int64_t blocks = ceil_div(std::max<int64_t>(work, 1), kAdamThreads);
    return (unsigned)std::min<int64_t>(blocks, 132 * 16);   // grid-stride beyond ~16 blocks/SM
}

// The number of leading elements (0..3) to update as scalars so that p + head is 16-byte
// aligned, when the same head also aligns m, v, g (16 bytes) and p_copy (4 elements) and n >= head:
// the vec4 kernel applies. -1 when it does not (the arrays' alignments differ).
template <typename T>
inline int vec4_head(const float* p, const T* p_copy, const float* m, const float* v,
                     const float* g, int64_t n) {
    int head = 0;
    if (aligned_to(p, sizeof(float))) head = (int)((16 - (uintptr_t)p % 16) % 16 / sizeof(float));
    const bool ok = n >= head && aligned_to(p + head, 16) && aligned_to(m + head, 16) &&
                    aligned_to(v + head, 16) && aligned_to(g + head, 16) &&
                    (p_copy == nullptr || aligned_to(p_copy + head, 4 * sizeof(T)));
    return ok ? head : -1;
}

// The launchers of one kernel each (n >= 1; step: device AdamWStep). adamw_update runs vec4
// whenever vec4_head allows it (launch_vec4 throws ldm::Error otherwise) and the scalar kernel
// else; the workbench also runs the scalar kernel where vec4 applies.
template <typename T>
void launch_scalar(float* p, T* p_copy, float* m, float* v, const float* g, int64_t n,
                   const AdamWStep* step, bool decay, cudaStream_t s) {
    const unsigned grid = adamw_grid(n);
    if (decay) adamw_scalar_kernel<T, true><<<grid, kAdamThreads, 0, s>>>(p, p_copy, m, v, g, n, step);
    else adamw_scalar_kernel<T, false><<<grid, kAdamThreads, 0, s>>>(p, p_copy, m, v, g, n, step);
    LDM_LAUNCH_CHECK();
}
template <typename T>
void launch_vec4(float* p, T* p_copy, float* m, float* v, const float* g, int64_t n,
                 const AdamWStep* step, bool decay, cudaStream_t s) {
    const int head = vec4_head(p, p_copy, m, v, g, n);
    if (head < 0)
        throw Error("adamw_update: the vec4 kernel needs p, m, v, g (and p_copy) equally aligned");
    const unsigned grid = adamw_grid((n - head) / 4);
    if (decay)
        adamw_vec4_kernel<T, true><<<grid, kAdamThreads, 0, s>>>(p, p_copy, m, v, g, n, head, step);
    else
        adamw_vec4_kernel<T, false><<<grid, kAdamThreads, 0, s>>>(p, p_copy, m, v, g, n, head, step);
    LDM_LAUNCH_CHECK();
}
}  // namespace adamw_detail

// The step's divergence guard and clip factor on the device (adamw_detail::step_guard_kernel):
// step->sc.clip from the squared global norm norm_sq (device, e.g. global_norm_squared's output)
// and grad_clip exactly as the host computes it (adamw_clip_factor); step->skip = 1 when the norm
// is not finite or *loss_bad != 0 (device flag; nullptr = none). step->sc's other fields are left
// as they are (the host writes them: adamw_step_scalars).
inline void adamw_step_guard(AdamWStep* step, const float* norm_sq, const unsigned* loss_bad, double grad_clip,
                             cudaStream_t s) {
    adamw_detail::step_guard_kernel<<<1, 1, 0, s>>>(step, norm_sq, loss_bad, grad_clip);
    LDM_LAUNCH_CHECK();
}

// *flag (device) = 1 when any of x [n] (device fp32, e.g. the per-token losses) is not finite;
// unchanged otherwise (the caller zeroes it once per step). n = 0: nothing.
inline void flag_nonfinite(unsigned* flag, const float* x, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    const unsigned grid = (unsigned)std::min<int64_t>(ceil_div(n, 256), 1024);
    adamw_detail::flag_nonfinite_kernel<<<grid, 256, 0, s>>>(flag, x, n);
    LDM_LAUNCH_CHECK();
}

// One AdamW step (core/optim.h formula, bit-compatible) on the n values of one contiguous range:
//   p [n] fp32 master weights, m, v [n] fp32 moments (updated in place), g [n] fp32 gradients
//   (read only) multiplied by the clip factor step->sc.clip, step: the step's scalars in device
//   memory (adamw_step_scalars, uploaded; the clip factor from the host or adamw_step_guard).
//   p_copy [n] (the bf16 working copy, or nullptr — always nullptr for fp32 runs, whose working
//   copy is p itself) receives the new p rounded to T. step->skip != 0: nothing changes.
// Weight decay (p -= lr·wd·p, decoupled) iff decay; the trainer calls this once per contiguous
// range of equal ParamSpec.decay (core/optim.cpp's per-element decay flag). With the scalars of
// adamw_step_scalars the update is bit-identical to AdamW<float>::step. Kernel: groups of 4
// elements with 16-byte accesses after 0..3 scalar leading elements, or one element per thread
// when the arrays' alignments differ (same arithmetic). n = 0 is a no-op; n < 0 throws ldm::Error.
template <typename T>
void adamw_update(float* p, T* p_copy, float* m, float* v, const float* g, int64_t n, const AdamWStep* step,
                  bool decay, cudaStream_t s) {
    if (n < 0) throw Error(strprintf("adamw_update: n = %lld < 0", (long long)n));
    if (n == 0) return;
    if (adamw_detail::vec4_head(p, p_copy, m, v, g, n) >= 0)
        adamw_detail::launch_vec4<T>(p, p_copy, m, v, g, n, step, decay, s);
    else
        adamw_detail::launch_scalar<T>(p, p_copy, m, v, g, n, step, decay, s);
}

}  // namespace gpu
}  // namespace ldm
