// cuda/scheme.cuh — the GPU depth-aggregation scheme interface (spec §2), mirroring
// cpu/scheme.h, and PreLN (spec §2.1). Contract: doc/cuda.md "Scheme interface".
//
// The backbone (cuda/gpt.cuh) calls, per forward:
//   begin(e); for j = 1..D: input_norm(j, x_j, xn_j, rstd_j, w_j); ...; output(j, o_j);  readout(y)
// and per backward:
//   readout_backward(dy); for j = D..1: output_backward(j, do_j); ...; input_backward(j, dx_j);
//   begin_backward(de)
// All tensors are [N, d] row-major of the activation type T (float or bf16); N = B·T tokens.
// The backbone keeps x_j (the scheme's input of sublayer j) for every j for the RMSNorm backward
// and never overwrites it during a step, so a scheme may read x_j back later (PreLN does).
#pragma once
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
    virtual void output(int j, const T* o, cudaStream_t) = 0;  // o_j [N, d] (read before the next input_norm)
    virtual void readout(T* y, cudaStream_t) = 0;              // y [N, d] (before RMSNorm_f)
    virtual void readout_backward(const T* dy, cudaStream_t) = 0;
    virtual void output_backward(int j, T* d_o, cudaStream_t) = 0;  // writes (=) dL/do_j
    virtual void input_backward(int j, const T* dx, cudaStream_t) = 0;
    virtual void begin_backward(T* de, cudaStream_t) = 0;            // writes (=) dL/de
    // Activation memory (bytes per token) the scheme keeps for backward or as live state, beyond
    // the backbone's own buffers; printed at startup.
    virtual int64_t extra_bytes_per_token() const = 0;
    virtual std::vector<std::pair<std::string, double>> metrics() { return {}; }  // e.g. LDM drift
};

// ---- small elementwise kernels used by PreLN ---------------------------------------------------
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

// ---- PreLN (spec §2.1) ------------------------------------------------------------------------
// h_0 = e; x_j = h_{j-1}; h_j = h_{j-1} + o_j; readout h_D. The stream h is never stored on its
// own: h_{j-1} IS the backbone's stored x_j, so x_{j+1} = x_j + o_j is computed by the fused
// residual_rmsnorm_forward straight into the backbone's x_{j+1} buffer (one read of x_j and o_j,
// one write of x_{j+1} and xn_{j+1}). Backward keeps dh = dL/dh_j in fp32 (like the CPU's dh, but
// fp32 even in bf16 runs, so 2·n_layer additions do not lose bf16 bits): readout_backward sets
// dh = dy; output_backward writes do_j = dh; input_backward adds dh += dx_j; begin_backward
// writes de = dh.
template <typename T>
struct GpuPreLN final : GpuScheme<T> {
    explicit GpuPreLN(const ModelConfig& cfg) : d_(cfg.d_model) {}
    void bind(const T*, const float*, float*) override {}
    void resize(int B, int T_) override {
        n_ = (int64_t)B * T_ * d_;
        if (dh_.n < n_) dh_.alloc(n_);
    }
    void begin(const T* e, cudaStream_t) override {
        e_ = e;
        prev_x_ = nullptr;
        prev_o_ = nullptr;
    }
    void input_norm(int j, T* x, T* xn, float* rstd, const T* w, float eps,
                    cudaStream_t s) override {
        const int64_t N = n_ / d_;
        if (j == 1) {
            CUDA_CHECK(cudaMemcpyAsync(x, e_, (size_t)n_ * sizeof(T), cudaMemcpyDeviceToDevice, s));
            rmsnorm_forward<T>(xn, rstd, x, w, N, d_, eps, s);
        } else {
            if (!prev_x_ || !prev_o_)
                throw Error("GpuPreLN::input_norm: sublayers must run in order 1..D with output()");
            residual_rmsnorm_forward<T>(x, xn, rstd, prev_x_, prev_o_, w, N, d_, eps, s);
        }
        prev_x_ = x;
        prev_o_ = nullptr;
    }
    void output(int, const T* o, cudaStream_t) override { prev_o_ = o; }
    void readout(T* y, cudaStream_t s) override {
        if (!prev_x_ || !prev_o_) throw Error("GpuPreLN::readout: no sublayer output");
        add_arrays<T>(y, prev_x_, prev_o_, n_, s);
    }
    void readout_backward(const T* dy, cudaStream_t s) override {
        accumulate_f32<T>(dh_.ptr, dy, n_, false, s);
    }
    void output_backward(int, T* d_o, cudaStream_t s) override { convert_f32<T>(d_o, dh_.ptr, n_, s); }
    void input_backward(int, const T* dx, cudaStream_t s) override {
        accumulate_f32<T>(dh_.ptr, dx, n_, true, s);
    }
    void begin_backward(T* de, cudaStream_t s) override { convert_f32<T>(de, dh_.ptr, n_, s); }
    // Only the fp32 gradient stream dh (x_j itself is the backbone's).
    int64_t extra_bytes_per_token() const override { return 4 * (int64_t)d_; }

   private:
    int d_;
    int64_t n_ = 0;
    const T* e_ = nullptr;
    const T* prev_x_ = nullptr;
    const T* prev_o_ = nullptr;
    DeviceBuffer<float> dh_;
};

}  // namespace gpu
}  // namespace ldm
