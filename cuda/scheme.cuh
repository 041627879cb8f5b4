// cuda/scheme.cuh — the GPU depth-aggregation scheme interface (spec §2), mirroring
// cpu/scheme.h, and the small elementwise kernels the schemes share. The schemes themselves are
// in the trainer files (train_gpt_baselines.cu: PreLN, HC, mHC, AttnRes; train_ldm.cu: LDM).
// Contract: doc/cuda.md "Scheme interface".
//
// The backbone (cuda/transformer.cuh) calls, per forward:
//   begin(e); for j = 1..D: input_norm(j, x_j, xn_j, rstd_j, w_j); ...; output(j, o_j);  readout(y)
// and per backward:
//   readout_backward(dy); for j = D..1: output_backward(j, do_j); ...;
//     input_norm_backward(j, dln_j, x_j, w_j, rstd_j, ..., dx_buf, d_o_next);   begin_backward(de)
// where input_norm_backward's default is rmsnorm_backward into dx_buf, then
// input_backward_next(j, dx_buf, d_o_next) (workbenches may call input_backward(_next) directly).
// All tensors are [N, d] row-major of the activation type T (float or bf16); N = B·T tokens.
// The backbone keeps x_j (the scheme's input of sublayer j) for every j for the RMSNorm backward
// and never overwrites it during a step, so a scheme may read x_j back later (PreLN does).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "cuda/common.cuh"
#include "cuda/rmsnorm.cuh"

namespace ldm {
namespace gpu {

template <typename T>
struct GpuScheme {
    virtual ~GpuScheme() = default;
    // Pointers to the scheme's block of the flat arrays (param_specs order): working copy (T),
    // fp32 master (for fp32-only parameters such as mHC controllers and LDM forgetting) and fp32
    // grads. nullptr when the scheme has no parameters. Called once after allocation.
    virtual void bind(const T* params, const float* master, float* grads) = 0;
    // Allocates the state for up to N = B·T tokens; called before each forward (cheap when the
    // size does not grow).
    virtual void resize(int B, int T_) = 0;
    virtual void begin(const T* e, cudaStream_t) = 0;  // e [N, d]: embedding output
    // Writes x_j [N, d] (the input of sublayer j, 1-based) and xn = RMSNorm_w(x_j) with rstd [N]
    // fp32. Schemes without a fusion compute x_j then call rmsnorm_forward; PreLN fuses the
    // residual add (residual_rmsnorm_forward).
    virtual void input_norm(int j, T* x, T* xn, float* rstd, const T* w, float eps,
                            cudaStream_t) = 0;
    // o_j [N, d], read at the latest by the next input_norm (or readout): o must stay unchanged
    // until that returns (HC in bf16 defers output(j)'s work into input_norm(j+1)).
    virtual void output(int j, const T* o, cudaStream_t) = 0;
    // Where the backbone should write o_j [N, d] for output(j, o_j), j = 1..D (valid after
    // resize()): a buffer in which the scheme keeps o_j for its backward, so that output() need not
    // copy it; nullptr (default): the backbone's own buffer. output(j, o) accepts any buffer.
    virtual T* output_buffer(int j) { (void)j; return nullptr; }
    virtual void readout(T* y, cudaStream_t) = 0;              // y [N, d] (before RMSNorm_f)
    virtual void readout_backward(const T* dy, cudaStream_t) = 0;
    virtual void output_backward(int j, T* d_o, cudaStream_t) = 0;  // writes (=) dL/do_j
    virtual void input_backward(int j, const T* dx, cudaStream_t) = 0;  // dx = dL/dx_j
    // input_backward with d_o_next as in input_norm_backward (the buffer the caller passes to the
    // next output_backward(j-1); nullptr: none; it must not alias dx or any buffer the scheme
    // reads). Default: input_backward(j, dx). A scheme may already write dL/do_{j-1} into
    // d_o_next here (HC / mHC: their combine kernel); its output_backward(j-1) then writes
    // nothing and throws ldm::Error if handed another buffer.
    virtual void input_backward_next(int j, const T* dx, T* d_o_next, cudaStream_t s) {
        (void)d_o_next;
        input_backward(j, dx, s);
    }
    // The backward of sublayer j's input RMSNorm, then the scheme's input backward: dln [N, d] =
    // dL/dxn_j; x = x_j, w [d], rstd [N] as in input_norm; dw [d] += (fp32, deterministic;
    // scratch >= rmsnorm_backward_scratch(N, d) floats). dx_buf [N, d]: buffer for dL/dx_j.
    // d_o_next [N, d] (or nullptr): the buffer the caller passes to the next output_backward(j-1)
    // (no meaning for j == 1). Default: rmsnorm_backward into dx_buf, then
    // input_backward_next(j, dx_buf, d_o_next). A scheme may instead fuse and already write
    // dL/do_{j-1} into d_o_next here; its output_backward(j-1) then writes nothing and throws
    // ldm::Error if handed another buffer (PreLN: rmsnorm_backward_residual).
    virtual void input_norm_backward(int j, const T* dln, const T* x, const T* w, const float* rstd,
                                     int64_t N, int d, float* dw, float* scratch, T* dx_buf,
                                     T* d_o_next, cudaStream_t s) {
        rmsnorm_backward<T>(dx_buf, dw, scratch, dln, x, w, rstd, N, d, false, s);
        input_backward_next(j, dx_buf, d_o_next, s);
    }
    virtual void begin_backward(T* de, cudaStream_t) = 0;            // writes (=) dL/de
    // Host-side bookkeeping after a micro-batch's backward (eager and micro-batch graphs), or once
    // after a whole-step graph (then after AdamW: kernels_may_switch() was false or the step had
    // one micro-batch), outside any CUDA graph (it may read device values back and synchronise;
    // LDM's drift check). Returns true when the scheme now launches different kernels (a captured
    // graph must be captured again). Everything from begin() to begin_backward() must run without
    // host synchronisation or host-memory copies, so that Transformer::enqueue_micro_batch can be
    // captured (train_micro_batch, GpuBackend::train_step).
    virtual bool after_backward(cudaStream_t) { return false; }
    // True while after_backward may still switch kernels (LDM: the drift check is armed). A
    // step of several micro-batches then cannot be one CUDA graph (the eager order switches after
    // the micro-batch that drifted, like the CPU), so the trainer captures each micro-batch alone.
    virtual bool kernels_may_switch() const { return false; }
    // Activation memory (bytes per token) the scheme keeps for backward or as live state, beyond
    // the backbone's own buffers; printed at startup.
    virtual int64_t extra_bytes_per_token() const = 0;
    virtual std::vector<std::pair<std::string, double>> metrics() { return {}; }  // e.g. LDM drift
    // As cpu/scheme.h: the decisions later steps depend on (LDM's drift fallback), saved in the
    // training state and restored on resume (the same entries as the CPU scheme's); and the
    // data-parallel hook: any_rank(flag) is the OR over the ranks (a collective; may synchronise),
    // warns: this rank prints the scheme's warnings.
    virtual std::vector<std::pair<std::string, double>> saved_state() const { return {}; }
    virtual std::string restore_state(const std::vector<std::pair<std::string, double>>&) { return ""; }
    void set_data_parallel(std::function<bool(bool)> any_rank, bool warns) {
        any_rank_ = std::move(any_rank);
        warns_ = warns;
    }

   protected:
    std::function<bool(bool)> any_rank_ = [](bool flag) { return flag; };
    bool warns_ = true;
};

// ---- small elementwise kernels shared by the schemes ---------------------------------------------------
// y[i] = a[i] + b[i] (fp32 arithmetic), n values.
template <typename T>
__global__ void add_kernel(T* y, const T* a, const T* b, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}
// acc[i] (fp32) = (accumulate ? acc[i] : 0) + x[i]
template <typename T>
__global__ void accum_f32_kernel(float* acc, const T* x, int64_t n, bool accumulate) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        acc[i] = (accumulate ? acc[i] : 0.0f) + to_f(x[i]);
}
// y[i] = (T) x[i]
template <typename T>
__global__ void convert_f32_kernel(T* y, const float* x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = from_f<T>(x[i]);
}
inline unsigned elementwise_blocks(int64_t n) {
    int64_t b = ceil_div(n, 256);
    return (unsigned)std::max<int64_t>(1, std::min<int64_t>(b, 65535 * 8));
}
// y = a + b over n values of T.
template <typename T>
void add_arrays(T* y, const T* a, const T* b, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    add_kernel<T><<<elementwise_blocks(n), 256, 0, s>>>(y, a, b, n);
    LDM_LAUNCH_CHECK();
}
// acc (fp32) = x, or acc += x when accumulate.
template <typename T>
void accumulate_f32(float* acc, const T* x, int64_t n, bool accumulate, cudaStream_t s) {
    if (n <= 0) return;
    accum_f32_kernel<T><<<elementwise_blocks(n), 256, 0, s>>>(acc, x, n, accumulate);
    LDM_LAUNCH_CHECK();
}
// y (T) = x (fp32), rounded to nearest even for bf16.
template <typename T>
void convert_f32(T* y, const float* x, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    convert_f32_kernel<T><<<elementwise_blocks(n), 256, 0, s>>>(y, x, n);
    LDM_LAUNCH_CHECK();
}

}  // namespace gpu
}  // namespace ldm
