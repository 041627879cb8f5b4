// train_ldm.cu — the GPU trainer for Linear Depth Memory (build/cuda/train_ldm): the spec §1
// backbone (cuda/model.cuh) with the LDM scheme of spec §2.5, whose forward and backward in every
// rule (rls, delta, outer) and training mode (store, unwind, checkpoint-every, window) are the
// LdmGpuScheme below; its kernels are cuda/ldm.cuh. The loop, flags, logs and checkpoints are the
// ones every trainer shares (core/train_loop.h, cuda/trainer.cuh). doc/cuda.md "LDM kernels".
//
//   build/cuda/train_ldm --preset llama-400m --ldm-rule rls --ldm-mode unwind -B 8 -T 2048
//       --steps 1000 --lr 1e-3 --train-data 'data/fineweb/fineweb_train_*.bin' --out-dir runs/ldm
//
// Exit codes: 0 ok, 1 error, 2 no usable CUDA GPU. Tests and workbenches include this file with
// TESTING defined (no main).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/ldm.cuh"
#include "cuda/matmul.cuh"
#include "cuda/rmsnorm.cuh"
#include "cuda/scheme.cuh"
#include "cuda/trainer.cuh"

namespace ldm {
namespace gpu {

// ==== LDM (spec §2.5) ============================================================================
// Mirrors cpu/scheme_ldm.cpp step by step (same modes, same drift check and fallback, same
// metrics). Per token the memory holds writes 0..j-1 before sublayer j:
//   begin(e):        h_0 = e, write 0 (k_0 = L2n(W_k^0 e), v_0 = e)
//   input_norm(j):   q_j = L2n(W_q^j h_{j-1}), x_j = h_{j-1} + a_j ⊙ S q_j  (+ RMSNorm_j)
//   output(j, o_j):  h_j = h_{j-1} + o_j, write j (k_j = L2n(W_k^j o_j), v_j = o_j)
//   readout(y):      y = h_D + a_f ⊙ S q_f
// and the backward walks the same steps in reverse, recovering the state before each write by the
// mode's rule (prev_state_*). Precision: S, P (and dS, dP) fp32 in every mode; the residual stream
// h accumulates in fp32 (src32) with a T copy for the GEMMs; q, k fp32 (GEMMs with fp32 output);
// θ, the gates a and the delta bias b_β read from the fp32 master; gradients fp32, accumulated (+=).
// Kernels: the warp kernels of cuda/ldm.cuh for d_k <= kWarpMaxDk, the thread kernels otherwise.
// Window mode (--ldm-mode window): the writes of a window are deferred and applied at once by the
// Woodbury update (spec §2.5), reads see the pending writes exactly; the backward unwinds like
// unwind mode. Reads and flushes use the warp kernels (no error rows) for w <= kWarpMaxWindow.
template <typename T>
struct LdmGpuScheme : GpuScheme<T> {
    explicit LdmGpuScheme(const ModelConfig& cfg);
    void bind(const T* params, const float* master, float* grads) override;
    void resize(int B, int T_) override;
    void begin(const T* e, cudaStream_t s) override;
    void input_norm(int j, T* x, T* xn, float* rstd, const T* w, float eps, cudaStream_t s) override {
        input(j, x, s);
        rmsnorm_forward<T>(xn, rstd, x, w, N_, d_, eps, s);
    }
    void output(int j, const T* o, cudaStream_t s) override;
    T* output_buffer(int j) override { return O_.ptr + (int64_t)j * N_ * d_; }  // O_j, the value of write j
    void readout(T* y, cudaStream_t s) override { input(D_ + 1, y, s); }
    void readout_backward(const T* dy, cudaStream_t s) override;
    void output_backward(int j, T* d_o, cudaStream_t s) override;
    void input_backward(int j, const T* dx, cudaStream_t s) override;
    // The RMSNorm backward writes dL/dx_j straight into dxT_ when read j's backward is deferred to
    // the fused pass (no copy of dx), then input_backward.
    void input_norm_backward(int j, const T* dln, const T* x, const T* w, const float* rstd, int64_t N, int d,
                             float* dw, float* scratch, T* dx_buf, T* d_o_next, cudaStream_t s) override {
        T* dx = fuse_backward(j - 1) ? dxT_.ptr : dx_buf;
        rmsnorm_backward<T>(dx, dw, scratch, dln, x, w, rstd, N, d, false, s);
        input_backward(j, dx, s);
    }
    void begin_backward(T* de, cudaStream_t s) override;
    bool after_backward(cudaStream_t s) override;
    bool kernels_may_switch() const override {
        // armed until no fallback is expected: none yet, or a fallback interval that can still halve
        // and whose drift has not yet been within the tolerance (after that, a late halving takes
        // effect after the step, so the whole-step graph stays on)
        return !delta_ && (keep() == kNone || keep() == kSegments) &&
               (ckpt_ == 0 || (fell_back_ && !window_ && ckpt_ > 1 && !settled_));
    }
    int64_t extra_bytes_per_token() const override { return N_ > 0 ? allocated_bytes() / N_ : 0; }
    std::vector<std::pair<std::string, double>> metrics() override;
    std::vector<std::pair<std::string, double>> saved_state() const override {
        return ldm_fallback_saved(fell_back_, ckpt_, window_, settled_);
    }
    std::string restore_state(const std::vector<std::pair<std::string, double>>& saved) override;

    // x_j [N, d] (j = 1..D; D+1 = the readout y) without the RMSNorm (workbench / tests).
    void input(int j, T* x, cudaStream_t s);
    // Test hooks: live state [N, ST] on the host; checkpoint interval in use (0 = none).
    std::vector<float> state_host() const {
        std::vector<float> h((size_t)N_ * dims_.ST);
        CUDA_CHECK(cudaMemcpy(h.data(), live_, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return h;
    }
    int checkpoint_every() const { return ckpt_; }
    int64_t allocated_bytes() const;
    // Which kernels this configuration runs (doc/cuda.md): warp kernels for d_k <= 16, and the
    // warp window path (no error rows) for w <= 8 as well.
    bool warp_kernels() const { return warp_; }
    bool warp_window() const { return window_ && warp_ && w_ <= ldmk::kWarpMaxWindow && !thread_window_; }

   protected:  // (dev/cuda/ldm.cu derives the thread-kernel paths at small d_k and w to compare)
    bool warp_ = false;          // warp kernels (d_k <= kWarpMaxDk), else thread kernels
    bool thread_window_ = false;  // the thread window path even where the warp one applies

   private:
    // What the forward keeps for the backward (a function of the mode and of ckpt_, which the
    // drift fallback may set during training):
    //   kAll           store: the state after every write;
    //   kSegments      checkpoint-every c: the state after writes 0, c, 2c, ...;
    //   kNone          unwind, and window mode's Woodbury forward: only the final state;
    //   kWindowStarts  window mode with c > 0 or after a fallback: the state at each window start.
    enum Keep { kAll, kSegments, kNone, kWindowStarts };
    Keep keep() const {
        if (window_) return ckpt_ > 0 ? kWindowStarts : kNone;
        if (ckpt_ > 0) return kSegments;
        return unwind_ ? kNone : kAll;
    }

    // forward
    void write_forward(int i, cudaStream_t s);  // write i (its input O_i is stored)
    // Applies write i (store, unwind, checkpoint-every) then what the mode keeps of it; with a
    // FusedRead (fuse_forward()), read i+1 of the new state in the same pass.
    void sequential_write(int i, cudaStream_t s, const ldmk::FusedRead<T>* read = nullptr);
    void window_write(int i, cudaStream_t s);
    // The state passes that are fused (doc/cuda.md "LDM kernels", "Fused passes"): the forward
    // applies write j-1 and read j in one pass (write j-1 waits in pending_write_ for input(j));
    // the backward runs read j's backward and the unwind + VJP of write j-1 in one pass (read j's
    // backward waits in pending_read_bwd_ for output_backward(j-1)).
    bool fuse_forward() const { return warp_ && !window_; }
    bool fuse_backward(int i) const {  // read i+1's backward with write i's unwind + VJP
        if (!warp_ || delta_ || i <= 0) return false;
        if (keep() == kNone) return true;
        return keep() == kSegments && (i - 1) % ckpt_ != 0;
    }
    // After a read's backward kernel, in two parts: its row terms (read_row_grads: dA from the
    // gate's product, the fp32 prod32_ or prodT, the fused kernels' product in T; dsrc += dr·W_q)
    // and its weight gradient (read_weight_grad: dW_q += drᵀ·src). read_backward_gemms runs both;
    // the fused backward's row pass does the row terms itself, and at HK <= 16 the weight gradient.
    // dr: the raw query gradient [N, HK] as T (draw_T).
    void read_row_grads(int j, const T* dr, const T* prodT, cudaStream_t s);
    void read_weight_grad(int j, const T* dr, cudaStream_t s);
    void read_backward_gemms(int j, const float* draw, cudaStream_t s, const T* prodT = nullptr);
    const T* draw_T(const float* draw, cudaStream_t s) { return to_T(draw, (int64_t)N_ * HK_, drawT_.ptr, s); }
    // backward
    // write i's backward: the state before it (prev_state), the VJP kernel (unless vjp_done: it
    // ran fused with read i+1's backward), the GEMMs and column sums of its parameters.
    void write_backward(int i, T* d_o, cudaStream_t s, bool vjp_done = false);
    // After write i's VJP kernel, in three parts: its row term (write_row_grad: dvacc += dr·W_k),
    // its weight gradient (write_weight_grad: dW_k += drᵀ·O_i) and the rest (write_param_grads:
    // delta's β terms, forget's dθ). write_backward_gemms runs all three; the fused backward's row
    // pass does the row term itself, and at HK <= 16 the weight gradient.
    void write_row_grad(int i, const T* dr, float* dvacc, cudaStream_t s);
    void write_weight_grad(int i, const T* dr, cudaStream_t s);
    void write_param_grads(int i, float* dvacc, cudaStream_t s);
    void write_backward_gemms(int i, float* dvacc, cudaStream_t s);
    // The fused backward's row pass also sums the weight gradients dW_q, dW_k (residual, HK <= 16;
    // store mode never fuses the backward).
    bool rows_dw() const { return warp_ && residual_ && !delta_ && keep() != kAll && HK_ <= ldmk::kRowDwMaxK; }
    void read_backward(int j, const T* dx, cudaStream_t s);
    // Make live_ the state before write i. Returns true when it is left to the VJP kernel, which
    // then unwinds cur_ in place itself (fused unwind + VJP).
    bool prev_state(int i, cudaStream_t s);
    bool prev_state_stored(int i, cudaStream_t s);
    bool prev_state_unwind(int i, cudaStream_t s);
    bool prev_state_segment(int i, cudaStream_t s);
    bool prev_state_window(int i, cudaStream_t s);
    void unwind(int i, cudaStream_t s);   // cur_: after write i -> before it (rls / outer)
    void rewrite(int w, cudaStream_t s);  // re-applies stored write w to cur_
    void record_drift(const float* ref, cudaStream_t s);
    void copy_state(float* dst, const float* src, cudaStream_t s) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)N_ * dims_.ST * 4, cudaMemcpyDeviceToDevice, s));
    }
    const float* v32(int i, cudaStream_t s);  // O_i as fp32 (alias for T = float)
    const T* to_T(const float* x, int64_t n, T* buf, cudaStream_t s);
    const T* srcT() const {
        return std::is_same<T, float>::value ? reinterpret_cast<const T*>(src32_.ptr) : srcT_.ptr;
    }
    float* state(int64_t k) const { return stored_.ptr + k * (int64_t)N_ * dims_.ST; }
    // Floats of window scratch per (token, head): K~ row, u = P k and the w coefficients.
    int64_t window_scratch() const { return (int64_t)w_ * dk_ + dk_ + w_; }
    int64_t scr_stride() const {
        return std::max(ldmk::thread_scratch_floats(dims_), window_ ? window_scratch() : 0);
    }
    // store mode with the warp kernels: every state lives in stored_ (state(i) = after write i)
    // and live_ points at the one in use, so neither forward nor backward copies states; with the
    // thread kernels (in-place writes) live_ = cur_ and the states are copied to and from stored_.
    bool slots() const { return warp_ && keep() == kAll; }
    template <typename E>
    static void grow(DeviceBuffer<E>& b, int64_t n) {  // buffers only grow (resize every forward)
        if (b.n < n) b.alloc(n);
    }

    ModelConfig cfg_;
    int d_, D_, Hm_, dk_, dv_, HK_;
    bool rls_, delta_, outer_, residual_, forget_, unwind_, window_ = false;
    int w_ = 1, ckpt_ = 0;
    bool fell_back_ = false, settled_ = false;  // settled_: a fallback interval met the tolerance
    int pending_write_ = -1, pending_read_bwd_ = -1;
    bool dx_add_pending_ = false;  // dsrc += dx of the pending read backward (dxT_) not done yet
    double drift_S_ = 0, drift_P_ = 0;
    bool drift_pending_ = false;
    int N_ = 0;
    ldmk::Dims dims_{};
    Matmul mm_;
    // parameters: working copy (T), fp32 master, fp32 grads; Wq/A indexed 1..D+1 (D+1 = final)
    std::vector<const T*> Wk_, Wq_, Wb_;
    std::vector<const float*> A_, Bb_;
    std::vector<float*> gWk_, gWq_, gA_, gWb_, gBb_;
    const float* theta_ = nullptr;
    float* gtheta_ = nullptr;
    // activations / state (fp32 unless noted)
    DeviceBuffer<float> src32_, cur_, stored_, dS_, dsrc_, tmp32_, prod32_, v32_, raw_, rawq_, draw_, drawq_,
        Qn_, Qnrm_, Kn_, Knrm_, beta_, dtok_, lam_, lgrad_, scratch_, partial_, dwpart_;
    DeviceBuffer<float> Kt_, Et_, Lc_;  // window mode: pending writes per (n, h)
    DeviceBuffer<T> srcT_, O_, drawT_, dtokT_;  // srcT_/drawT_/dtokT_ only for T != float
    DeviceBuffer<T> dxT_;  // dL/dx_j of a read whose backward is deferred (fused backward)
    DeviceBuffer<unsigned> drift_;
    float* live_ = nullptr;  // the state reads and VJPs use (cur_ or a slot of stored_)
};

template <typename T>
LdmGpuScheme<T>::LdmGpuScheme(const ModelConfig& cfg) : cfg_(cfg) {
    cfg.validate();
    if (cfg.scheme != "ldm") throw Error("LdmGpuScheme: scheme is '" + cfg.scheme + "', not 'ldm'");
    if (cfg.ldm_mode == "window" && cfg.ldm_rule != "rls")
        throw Error("ldm_mode 'window' is implemented for the rls rule only, not '" + cfg.ldm_rule +
                    "' (use --ldm-mode store)");
    d_ = cfg.d_model;
    D_ = cfg.n_sublayers();
    Hm_ = cfg.ldm_heads;
    dk_ = cfg.ldm_dk;
    dv_ = d_ / Hm_;
    HK_ = Hm_ * dk_;
    rls_ = cfg.ldm_rule == "rls";
    delta_ = cfg.ldm_rule == "delta";
    outer_ = cfg.ldm_rule == "outer";
    residual_ = cfg.ldm_residual;
    forget_ = cfg.ldm_forget && !delta_;
    unwind_ = cfg.ldm_mode == "unwind";
    ckpt_ = cfg.ldm_checkpoint_every;
    window_ = cfg.ldm_mode == "window";
    w_ = cfg.ldm_window;
    if (window_) ckpt_ = cfg.ldm_checkpoint_every > 0 ? w_ : 0;  // window checkpoints = window starts
    warp_ = dk_ <= ldmk::kWarpMaxDk;
    const int W = D_ + 1;
    lam_.alloc((int64_t)W * Hm_);
    lgrad_.alloc((int64_t)W * Hm_);
    drift_.alloc(2);
}

template <typename T>
void LdmGpuScheme<T>::bind(const T* params, const float* master, float* grads) {
    std::vector<ParamSpec> ss = scheme_param_specs(cfg_);
    auto find = [&](const std::string& name) -> int64_t {
        for (const auto& s : ss)
            if (s.name == name) return s.offset;
        throw Error("LDM GPU scheme: no parameter '" + name + "'");
    };
    const int W = D_ + 1;
    Wk_.assign(W, nullptr); gWk_.assign(W, nullptr);
    Wb_.assign(W, nullptr); gWb_.assign(W, nullptr);
    Bb_.assign(W, nullptr); gBb_.assign(W, nullptr);
    Wq_.assign(D_ + 2, nullptr); gWq_.assign(D_ + 2, nullptr);
    A_.assign(D_ + 2, nullptr); gA_.assign(D_ + 2, nullptr);
    for (int i = 0; i < W; i++) {
        int64_t o = find("scheme.ldm.wk." + std::to_string(i));
        Wk_[i] = params + o; gWk_[i] = grads + o;
        if (delta_) {
            o = find("scheme.ldm.wbeta." + std::to_string(i));
            Wb_[i] = params + o; gWb_[i] = grads + o;
            o = find("scheme.ldm.bbeta." + std::to_string(i));
            Bb_[i] = master + o; gBb_[i] = grads + o;
        }
    }
    for (int j = 1; j <= D_ + 1; j++) {
        std::string s = j <= D_ ? std::to_string(j) : std::string("f");
        int64_t o = find("scheme.ldm.wq." + s);
        Wq_[j] = params + o; gWq_[j] = grads + o;
        if (residual_) {
            o = find("scheme.ldm.a." + s);
            A_[j] = master + o; gA_[j] = grads + o;
        }
    }
    if (forget_) {
        int64_t o = find("scheme.ldm.theta");
        theta_ = master + o; gtheta_ = grads + o;
    }
}

template <typename T>
void LdmGpuScheme<T>::resize(int B, int T_) {
    // Buffers only grow (the trainer calls resize before every forward, e.g. with a smaller
    // evaluation batch); everything is indexed with N_, never with a buffer's capacity.
    N_ = B * T_;
    dims_ = ldmk::make_dims(cfg_, N_);
    const int64_t N = N_, W = D_ + 1, nd = N * d_, st = N * dims_.ST;
    const bool f32 = std::is_same<T, float>::value;
    grow(src32_, nd);
    if (!f32) grow(srcT_, nd);
    grow(O_, W * nd);
    grow(Qn_, W * N * HK_);
    grow(Kn_, W * N * HK_);
    grow(Qnrm_, W * N * Hm_);
    grow(Knrm_, W * N * Hm_);
    grow(beta_, delta_ ? W * N * Hm_ : 0);
    grow(cur_, st);
    live_ = cur_.ptr;
    // kept states for the interval in use (a drift fallback re-sizes this buffer itself)
    grow(stored_, ldm_gpu_kept_states(cfg_, ckpt_) * st);
    if (window_) {
        const int64_t th = N * Hm_;
        grow(Kt_, th * w_ * dk_);
        grow(Lc_, th * w_ * w_);
        grow(Et_, warp_window() ? 0 : th * w_ * dv_);
    }
    grow(dS_, st);
    grow(dsrc_, nd);
    grow(tmp32_, nd);
    grow(prod32_, residual_ ? nd : 0);
    grow(v32_, f32 ? 0 : nd);
    grow(raw_, N * HK_);
    grow(rawq_, N * HK_);
    grow(draw_, N * HK_);
    grow(drawq_, warp_ ? N * HK_ : 0);
    grow(dxT_, warp_ ? nd : 0);
    if (!f32) {
        grow(drawT_, N * HK_);
        grow(dtokT_, N * Hm_);
    }
    grow(dtok_, N * Hm_);
    grow(scratch_, N * Hm_ * scr_stride());
    grow(partial_, std::max({ldmk::colsum_scratch(N, d_), ldmk::colsum_scratch(N, Hm_),
                             ldmk::row_backward_scratch(N_, d_)}));
    grow(dwpart_, rows_dw() ? ldmk::row_backward_dw_scratch(N_, d_, HK_) : 0);
}

template <typename T>
int64_t LdmGpuScheme<T>::allocated_bytes() const {
    return src32_.bytes() + cur_.bytes() + stored_.bytes() + dS_.bytes() + dsrc_.bytes() +
           tmp32_.bytes() + prod32_.bytes() + v32_.bytes() + raw_.bytes() + rawq_.bytes() + draw_.bytes() +
           drawq_.bytes() + dxT_.bytes() +
           Qn_.bytes() + Qnrm_.bytes() + Kn_.bytes() + Knrm_.bytes() + beta_.bytes() +
           dtok_.bytes() + scratch_.bytes() + partial_.bytes() + dwpart_.bytes() + srcT_.bytes() + O_.bytes() +
           drawT_.bytes() + dtokT_.bytes() + Kt_.bytes() + Et_.bytes() + Lc_.bytes();
}

template <typename T>
const float* LdmGpuScheme<T>::v32(int i, cudaStream_t s) {
    const T* Oi = O_.ptr + (int64_t)i * N_ * d_;
    if (std::is_same<T, float>::value) return reinterpret_cast<const float*>(Oi);
    ldmk::to_f32<T>(Oi, v32_.ptr, (int64_t)N_ * d_, s);
    return v32_.ptr;
}

template <typename T>
const T* LdmGpuScheme<T>::to_T(const float* x, int64_t n, T* buf, cudaStream_t s) {
    if (std::is_same<T, float>::value) return reinterpret_cast<const T*>(x);
    ldmk::from_f32<T>(x, buf, n, s);
    return buf;
}

// ---- forward ----------------------------------------------------------------------------------

template <typename T>
void LdmGpuScheme<T>::begin(const T* e, cudaStream_t s) {
    using namespace ldmk;
    const int W = D_ + 1;
    lambda_kernel<<<(unsigned)ceil_div((int64_t)W * Hm_, 128), 128, 0, s>>>(
        W * Hm_, forget_ ? theta_ : nullptr, (float)cfg_.ldm_lambda_min, lam_.ptr, lgrad_.ptr);
    LDM_LAUNCH_CHECK();
    init_state(dims_, cur_.ptr, (float)cfg_.ldm_delta, s);
    live_ = cur_.ptr;
    pending_write_ = pending_read_bwd_ = -1;
    dx_add_pending_ = false;
    if (keep() == kWindowStarts) copy_state(state(0), cur_.ptr, s);
    const int64_t nd = (int64_t)N_ * d_;
    T* sT = const_cast<T*>(srcT());
    output_kernel<T><<<elem_blocks(nd), 256, 0, s>>>(nd, e, O_.ptr, src32_.ptr, sT, false);
    LDM_LAUNCH_CHECK();
    write_forward(0, s);
}

template <typename T>
void LdmGpuScheme<T>::output(int j, const T* o, cudaStream_t s) {
    using namespace ldmk;
    const int64_t nd = (int64_t)N_ * d_;
    T* sT = const_cast<T*>(srcT());
    T* Oj = O_.ptr + (int64_t)j * nd;
    output_kernel<T><<<elem_blocks(nd), 256, 0, s>>>(nd, o, o == Oj ? nullptr : Oj, src32_.ptr, sT, residual_);
    LDM_LAUNCH_CHECK();
    write_forward(j, s);
}

template <typename T>
void LdmGpuScheme<T>::write_forward(int i, cudaStream_t s) {
    const int64_t N = N_;
    // raw [N, HK] = O_i · W_k^iᵀ (fp32 out)
    mm_.template gemm<T, float>(false, true, N, HK_, d_, 1.f, O_.ptr + (int64_t)i * N * d_, d_, Wk_[i], d_, 0.f,
                                raw_.ptr, HK_, nullptr, s);
    if (window_) window_write(i, s);
    else if (fuse_forward()) pending_write_ = i;  // applied by input(i + 1), fused with its read
    else sequential_write(i, s);
}

// Write i applied at once (store, unwind, checkpoint-every), then what the mode keeps of it.
template <typename T>
void LdmGpuScheme<T>::sequential_write(int i, cudaStream_t s, const ldmk::FusedRead<T>* read) {
    using namespace ldmk;
    const int64_t N = N_;
    float* Kn = Kn_.ptr + (int64_t)i * N * HK_;
    float* Knrm = Knrm_.ptr + (int64_t)i * N * Hm_;
    const float* lam = lam_.ptr + (int64_t)i * Hm_;
    const T* Oi = O_.ptr + (int64_t)i * N * d_;
    // the fused write + read kernels read O_i as stored; the others take an fp32 copy
    const float* v = warp_ && read ? nullptr : v32(i, s);
    float* beta = delta_ ? beta_.ptr + (int64_t)i * N * Hm_ : nullptr;
    if (delta_)  // z [N, Hm] = O_i · w_βᵀ (the bias b_β is added in the kernel from the fp32 master)
        mm_.template gemm<T, float>(false, true, N, Hm_, d_, 1.f, O_.ptr + (int64_t)i * N * d_, d_, Wb_[i], d_,
                                    0.f, dtok_.ptr, Hm_, nullptr, s);
    // store mode with slots: write from the previous state straight into its slot (no copy)
    float* dst = slots() ? state(i) : cur_.ptr;
    const float* from = live_;
    if (warp_) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        if (!rls_ && dst != from) copy_state(dst, from, s);  // the rls warp write reads `from`
        dispatch_dk(dk_, [&](auto c) {
            constexpr int DK = decltype(c)::value;
            if (read) {  // write i, then read i + 1 of the new state
                const FusedRead<T> fr = *read;
                if (rls_) write_read_rls_warp_kernel<T, DK><<<gw, tw, 0, s>>>(dims_, dst, from, raw_.ptr, Kn, Knrm, Oi, lam, fr);
                else if (outer_) write_read_od_warp_kernel<kOuter, T, DK><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, Oi, lam, nullptr, nullptr, nullptr, fr);
                else write_read_od_warp_kernel<kDelta, T, DK><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, Oi, lam, dtok_.ptr, Bb_[i], beta, fr);
            } else if (rls_) write_rls_warp_kernel<DK><<<gw, tw, 0, s>>>(dims_, dst, from, raw_.ptr, Kn, Knrm, v, lam);
            else if (outer_) write_od_warp_kernel<kOuter, DK><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, nullptr, nullptr, nullptr);
            else write_od_warp_kernel<kDelta, DK><<<gw, tw, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, dtok_.ptr, Bb_[i], beta);
        });
    } else {
        if (dst != from) copy_state(dst, from, s);
        const int rule = rls_ ? kRls : outer_ ? kOuter : kDelta;
        if (rule == kRls)
            write_thread_kernel<kRls><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, nullptr, nullptr, nullptr, scratch_.ptr);
        else if (rule == kOuter)
            write_thread_kernel<kOuter><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, nullptr, nullptr, nullptr, scratch_.ptr);
        else
            write_thread_kernel<kDelta><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, dst, raw_.ptr, Kn, Knrm, v, lam, dtok_.ptr, Bb_[i], beta, scratch_.ptr);
    }
    LDM_LAUNCH_CHECK();
    live_ = dst;
    switch (keep()) {
        case kAll:
            if (!slots()) copy_state(state(i), cur_.ptr, s);
            break;
        case kSegments:
            if (i % ckpt_ == 0) copy_state(state(i / ckpt_), cur_.ptr, s);
            break;
        case kNone:
        case kWindowStarts:  // not reached (window mode writes through window_write)
            break;
    }
}

// Window mode: append write i to the pending writes of its window; at the window's end apply them
// all at once (Woodbury) and, when window-start states are kept, store the state the next window
// starts from.
template <typename T>
void LdmGpuScheme<T>::window_write(int i, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_;
    float* Kn = Kn_.ptr + (int64_t)i * N * HK_;
    float* Knrm = Knrm_.ptr + (int64_t)i * N * Hm_;
    const int m = i % w_, s0 = i - m;
    const float* lamw = lam_.ptr + (int64_t)s0 * Hm_;
    const dim3 gb(thread_blocks(dims_)), tb(kThreads);
    if (warp_window())  // keys only: the warp read / flush take the values from O_
        window_append_kernel<false><<<gb, tb, 0, s>>>(dims_, cur_.ptr, raw_.ptr, Kn, Knrm, nullptr, lamw, m, w_,
                                                      Kt_.ptr, nullptr, Lc_.ptr, scratch_.ptr, scr_stride());
    else  // keys and error rows E~
        window_append_kernel<true><<<gb, tb, 0, s>>>(dims_, cur_.ptr, raw_.ptr, Kn, Knrm, v32(i, s), lamw, m, w_,
                                                     Kt_.ptr, Et_.ptr, Lc_.ptr, scratch_.ptr, scr_stride());
    LDM_LAUNCH_CHECK();
    live_ = cur_.ptr;
    if (m + 1 < w_ && i < D_) return;  // the window is still open
    if (warp_window()) {
        const T* O0 = O_.ptr + (int64_t)s0 * N * d_;
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        dispatch_dk(dk_, [&](auto c) {
            constexpr int DK = decltype(c)::value;
            window_flush_warp_kernel<T, DK><<<gw, tw, 0, s>>>(dims_, cur_.ptr, lamw, m + 1, w_, Kt_.ptr, Lc_.ptr, O0,
                                                              N * d_, scratch_.ptr, scr_stride());
        });
    } else {
        window_flush_thread_kernel<<<gb, tb, 0, s>>>(dims_, cur_.ptr, lamw, m + 1, w_, Kt_.ptr, Et_.ptr, Lc_.ptr,
                                                     scratch_.ptr, scr_stride());
    }
    LDM_LAUNCH_CHECK();
    if (keep() == kWindowStarts && i < D_) copy_state(state((i + 1) / w_), cur_.ptr, s);
}

template <typename T>
void LdmGpuScheme<T>::input(int j, T* x, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_;
    mm_.template gemm<T, float>(false, true, N, HK_, d_, 1.f, srcT(), d_, Wq_[j], d_, 0.f, rawq_.ptr, HK_, nullptr, s);
    float* Qn = Qn_.ptr + (int64_t)(j - 1) * N * HK_;
    float* Qnrm = Qnrm_.ptr + (int64_t)(j - 1) * N * Hm_;
    const float* a = residual_ ? A_[j] : nullptr;
    if (pending_write_ == j - 1) {  // write j-1 and read j in one pass over the state
        FusedRead<T> fr;
        fr.raw = rawq_.ptr;
        fr.Qn = Qn;
        fr.Qnrm = Qnrm;
        fr.src32 = src32_.ptr;
        fr.a = a;
        fr.x = x;
        pending_write_ = -1;
        sequential_write(j - 1, s, &fr);
        return;
    }
    const int m = window_ && j <= D_ ? j % w_ : 0;  // pending writes of the current window
    const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock), gb(thread_blocks(dims_)), tb(kThreads);
    if (m > 0 && warp_window()) {
        const T* O0 = O_.ptr + (int64_t)(j - m) * N * d_;
        const float* lamw = lam_.ptr + (int64_t)(j - m) * Hm_;
        dispatch_dk(dk_, [&](auto c) {
            constexpr int DK = decltype(c)::value;
            window_read_warp_kernel<T, DK><<<gw, tw, 0, s>>>(dims_, cur_.ptr, rawq_.ptr, Qn, Qnrm, src32_.ptr, a, x, m,
                                                             w_, Kt_.ptr, Lc_.ptr, O0, N * d_, lamw);
        });
    } else if (m > 0) {
        window_read_thread_kernel<T><<<gb, tb, 0, s>>>(dims_, cur_.ptr, rawq_.ptr, Qn, Qnrm, tmp32_.ptr, src32_.ptr, a,
                                                       x, m, w_, Kt_.ptr, Et_.ptr, Lc_.ptr, scratch_.ptr, scr_stride());
    } else if (warp_) {
        dispatch_dk(dk_, [&](auto c) {
            constexpr int DK = decltype(c)::value;
            read_warp_kernel<T, DK><<<gw, tw, 0, s>>>(dims_, live_, rawq_.ptr, Qn, Qnrm, src32_.ptr, a, x);
        });
    } else {
        read_thread_kernel<T><<<gb, tb, 0, s>>>(dims_, live_, rawq_.ptr, Qn, Qnrm, tmp32_.ptr, src32_.ptr, a, x);
    }
    LDM_LAUNCH_CHECK();
}

// ---- backward ---------------------------------------------------------------------------------

template <typename T>
void LdmGpuScheme<T>::readout_backward(const T* dy, cudaStream_t s) {
    drift_S_ = drift_P_ = 0;
    CUDA_CHECK(cudaMemsetAsync(drift_.ptr, 0, 2 * sizeof(unsigned), s));
    drift_pending_ = false;
    CUDA_CHECK(cudaMemsetAsync(dS_.ptr, 0, (size_t)N_ * dims_.ST * 4, s));
    const int64_t nd = (int64_t)N_ * d_;
    if (residual_) {
        ldmk::add_grad_kernel<T><<<ldmk::elem_blocks(nd), 256, 0, s>>>(nd, dy, dsrc_.ptr, false);
        LDM_LAUNCH_CHECK();
    } else {
        CUDA_CHECK(cudaMemsetAsync(dsrc_.ptr, 0, (size_t)nd * 4, s));
    }
    pending_read_bwd_ = -1;
    dx_add_pending_ = false;
    if (fuse_backward(D_)) {  // read D+1's backward waits for write D's unwind + VJP
        CUDA_CHECK(cudaMemcpyAsync(dxT_.ptr, dy, (size_t)nd * sizeof(T), cudaMemcpyDeviceToDevice, s));
        pending_read_bwd_ = D_ + 1;
    } else {
        read_backward(D_ + 1, dy, s);
    }
}

template <typename T>
void LdmGpuScheme<T>::output_backward(int j, T* d_o, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_, nd = N * d_;
    const T* Oj = O_.ptr + (int64_t)j * nd;
    T* sT = const_cast<T*>(srcT());
    if (pending_read_bwd_ == j + 1) {
        // One pass over S, P, dS, dP: read j+1's backward on the state after write j, then write j
        // unwound and its VJP; the write's dv goes out alone (dsrc is added once h_j has been read
        // for dW_q: by the row pass, or above HK = 32 after read j+1's GEMMs), in T into d_o where
        // the row pass runs, else into the fp32 dvacc.
        pending_read_bwd_ = -1;
        FusedRead<T> fr;
        fr.Qn = Qn_.ptr + (int64_t)j * N * HK_;
        fr.Qnrm = Qnrm_.ptr + (int64_t)j * N * Hm_;
        fr.a = residual_ ? A_[j + 1] : nullptr;
        fr.dx = dxT_.ptr;
        fr.draw = drawq_.ptr;
        // the gate's product dx ⊙ r goes out as T (in prod32_'s memory): the row pass below sums it
        // (or, above HK = 32, a column sum in read_backward_gemms)
        T* prodT = reinterpret_cast<T*>(prod32_.ptr);
        fr.prod = prodT;
        const bool rows = HK_ <= kRowMaxK;  // the row pass takes the rest of the rows
        const bool f32 = std::is_same<T, float>::value;
        // the write's dv: for the row pass in T straight into d_o (the pass reads it there and
        // overwrites it with d_o); above HK = 32 an fp32 accumulator of the key GEMM (d_o itself in fp32)
        float* dvacc = f32 ? reinterpret_cast<float*>(d_o) : tmp32_.ptr;
        const float* Kn = Kn_.ptr + (int64_t)j * N * HK_;
        const float* Knrm = Knrm_.ptr + (int64_t)j * N * Hm_;
        const float* lam = lam_.ptr + (int64_t)j * Hm_;
        live_ = cur_.ptr;
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        dispatch_dk(dk_, [&](auto c) {
            constexpr int DK = decltype(c)::value;
            if (rows && rls_) read_bwd_unwind_vjp_rls_warp_kernel<T, DK, kRegPMax, kBwdRows<DK>, T><<<gw, tw, 0, s>>>(dims_, cur_.ptr, dS_.ptr, Kn, Knrm, Oj, lam, nullptr, d_o, draw_.ptr, dtok_.ptr, fr);
            else if (rows) read_bwd_vjp_od_warp_kernel<kOuter, T, DK, true, T><<<gw, tw, 0, s>>>(dims_, cur_.ptr, dS_.ptr, Kn, Knrm, Oj, lam, nullptr, nullptr, d_o, draw_.ptr, dtok_.ptr, fr);
            else if (rls_) read_bwd_unwind_vjp_rls_warp_kernel<T, DK><<<gw, tw, 0, s>>>(dims_, cur_.ptr, dS_.ptr, Kn, Knrm, Oj, lam, nullptr, dvacc, draw_.ptr, dtok_.ptr, fr);
            else read_bwd_vjp_od_warp_kernel<kOuter, T, DK, true><<<gw, tw, 0, s>>>(dims_, cur_.ptr, dS_.ptr, Kn, Knrm, Oj, lam, nullptr, nullptr, dvacc, draw_.ptr, dtok_.ptr, fr);
        });
        LDM_LAUNCH_CHECK();
        if (rows) {
            // The GEMMs keep the weight gradients only (dW_q's src is still h_j); the rest of the
            // rows, dsrc += dq·W_q (+ dx_{j+1}), d_o = T(dv + dk·W_k + dsrc), h_{j-1} and the gate's
            // gradient Σ dx ⊙ r, is one pass. At HK <= 16 with the residual (rows_dw) that pass also
            // sums dW_q, dW_k and no GEMM runs.
            const bool dw = rows_dw();
            if (!dw) {
                read_weight_grad(j + 1, draw_T(drawq_.ptr, s), s);
                write_weight_grad(j, draw_T(draw_.ptr, s), s);
            }
            write_param_grads(j, nullptr, s);  // (rls / outer: forget's dθ only, no dvacc)
            RowBackward<T> rb;
            rb.N = (int)N;
            rb.d = d_;
            rb.HK = HK_;
            rb.dq = drawq_.ptr;
            rb.dk = draw_.ptr;
            rb.Wq = Wq_[j + 1];
            rb.Wk = Wk_[j];
            rb.dx = dx_add_pending_ ? dxT_.ptr : nullptr;
            rb.dv = d_o;
            rb.dsrc = dsrc_.ptr;
            rb.d_o = d_o;
            rb.O = residual_ ? Oj : Oj - nd;
            rb.src32 = src32_.ptr;
            rb.srcT = f32 ? nullptr : sT;
            rb.residual = residual_;
            if (residual_) {
                rb.prod = prodT;
                rb.gpart = partial_.ptr;
                rb.gA = gA_[j + 1];
            }
            if (dw) {
                rb.dwpart = dwpart_.ptr;
                rb.gWq = gWq_[j + 1];
                rb.gWk = gWk_[j];
            }
            row_backward<T>(rb, s);  // without residual it also restarts dsrc at 0
            dx_add_pending_ = false;
            return;
        }
        read_backward_gemms(j + 1, drawq_.ptr, s, prodT);  // src is still h_j
        restore_src_kernel<T><<<elem_blocks(nd), 256, 0, s>>>(nd, Oj, Oj - nd, src32_.ptr, sT, residual_);
        LDM_LAUNCH_CHECK();
        if (f32) {  // dvacc is d_o itself: (dsrc += dx_{j+1}), dvacc += dsrc (bf16: in write_backward)
            resid_sum_kernel<float><<<elem_blocks(nd), 256, 0, s>>>(
                dvacc, dsrc_.ptr, dx_add_pending_ ? reinterpret_cast<const float*>(dxT_.ptr) : nullptr, dvacc, nd);
            LDM_LAUNCH_CHECK();
            dx_add_pending_ = false;
        }
        write_backward(j, d_o, s, /*vjp_done=*/true);
    } else {
        restore_src_kernel<T><<<elem_blocks(nd), 256, 0, s>>>(nd, Oj, Oj - nd, src32_.ptr, sT, residual_);
        LDM_LAUNCH_CHECK();
        // d_o = dsrc (+ the write's VJP, inside write_backward)
        write_backward(j, d_o, s);
    }
    // without residual dsrc restarts at 0 after being handed to d_o
    if (!residual_) CUDA_CHECK(cudaMemsetAsync(dsrc_.ptr, 0, (size_t)nd * 4, s));
}

template <typename T>
void LdmGpuScheme<T>::input_backward(int j, const T* dx, cudaStream_t s) {
    const int64_t nd = (int64_t)N_ * d_;
    if (fuse_backward(j - 1)) {  // read j's backward waits for write j-1's unwind + VJP
        if (dx != dxT_.ptr)  // (input_norm_backward wrote it there)
            CUDA_CHECK(cudaMemcpyAsync(dxT_.ptr, dx, (size_t)nd * sizeof(T), cudaMemcpyDeviceToDevice, s));
        pending_read_bwd_ = j;
        dx_add_pending_ = residual_;  // dsrc += dx in the pass that forms d_o_{j-1} (row pass; resid_sum_kernel above HK = 32)
        return;
    }
    if (residual_) {
        ldmk::add_grad_kernel<T><<<ldmk::elem_blocks(nd), 256, 0, s>>>(nd, dx, dsrc_.ptr, true);
        LDM_LAUNCH_CHECK();
    }
    read_backward(j, dx, s);
}

template <typename T>
void LdmGpuScheme<T>::read_backward(int j, const T* dx, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_;
    const float* Qn = Qn_.ptr + (int64_t)(j - 1) * N * HK_;
    const float* Qnrm = Qnrm_.ptr + (int64_t)(j - 1) * N * Hm_;
    const float* a = residual_ ? A_[j] : nullptr;
    if (warp_) {
        dispatch_dk(dk_, [&](auto c) {
            constexpr int DK = decltype(c)::value;
            read_bwd_warp_kernel<T, DK><<<warp_blocks(dims_), 32 * kWarpsPerBlock, 0, s>>>(
                dims_, live_, Qn, Qnrm, dx, a, dS_.ptr, draw_.ptr, prod32_.ptr);
        });
    } else {
        read_bwd_thread_kernel<T><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, live_, Qn, Qnrm, dx, a, dS_.ptr,
                                                                           draw_.ptr, tmp32_.ptr, prod32_.ptr);
    }
    LDM_LAUNCH_CHECK();
    read_backward_gemms(j, draw_.ptr, s);
}

// The rest of read j's backward once its kernel has run: the gate's gradient from the product
// (prodT, or the fp32 prod32_ where it is null) and dsrc [N, d] += draw · W_q, then
// dW_q [HK, d] += drawᵀ · src (src = h_{j-1}, read j's input).
template <typename T>
void LdmGpuScheme<T>::read_backward_gemms(int j, const float* draw, cudaStream_t s, const T* prodT) {
    const T* dr = draw_T(draw, s);
    read_row_grads(j, dr, prodT, s);
    read_weight_grad(j, dr, s);
}

// dA_j from the gate's product dx ⊙ r summed over the tokens (prodT in T, or the fp32 prod32_
// where it is null; residual only) and dsrc [N, d] += dr · W_q^j (dr [N, HK] in T).
template <typename T>
void LdmGpuScheme<T>::read_row_grads(int j, const T* dr, const T* prodT, cudaStream_t s) {
    const int64_t N = N_;
    if (residual_) {
        if (prodT) ldmk::colsum(gA_[j], prodT, nullptr, N, d_, d_, nullptr, partial_.ptr, s);
        else ldmk::colsum(gA_[j], prod32_.ptr, nullptr, N, d_, d_, nullptr, partial_.ptr, s);
    }
    mm_.template gemm<T, float>(false, false, N, d_, HK_, 1.f, dr, HK_, Wq_[j], d_, 1.f, dsrc_.ptr, d_, nullptr, s);
}

// dW_q^j [HK, d] += drᵀ · src (src = h_{j-1}, read j's input, as T; dr [N, HK] in T).
template <typename T>
void LdmGpuScheme<T>::read_weight_grad(int j, const T* dr, cudaStream_t s) {
    mm_.template gemm<T, float>(true, false, HK_, d_, N_, 1.f, dr, HK_, srcT(), d_, 1.f, gWq_[j], d_, nullptr, s);
}

template <typename T>
void LdmGpuScheme<T>::write_backward(int i, T* d_o, cudaStream_t s, bool vjp_done) {
    using namespace ldmk;
    const int64_t N = N_, nd = N * d_;
    const bool fused = vjp_done || prev_state(i, s);
    const float* Kn = Kn_.ptr + (int64_t)i * N * HK_;
    const float* Knrm = Knrm_.ptr + (int64_t)i * N * Hm_;
    const float* lam = lam_.ptr + (int64_t)i * Hm_;
    const float* beta = delta_ ? beta_.ptr + (int64_t)i * N * Hm_ : nullptr;
    const float* v = vjp_done ? nullptr : v32(i, s);  // (the fused kernel read O_i as stored)
    const bool f32 = std::is_same<T, float>::value;
    float* dvacc = f32 ? reinterpret_cast<float*>(d_o) : tmp32_.ptr;
    float* L = live_;
    if (vjp_done) {
        // the unwind + VJP ran with the previous read's backward (output_backward)
    } else if (warp_) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        dispatch_dk(dk_, [&](auto c) {
            constexpr int DK = decltype(c)::value;
            if (rls_ && fused) unwind_vjp_rls_warp_kernel<DK, true><<<gw, tw, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr);
            else if (rls_) unwind_vjp_rls_warp_kernel<DK, false><<<gw, tw, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr);
            else if (delta_) vjp_od_warp_kernel<kDelta, DK, false><<<gw, tw, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr);
            else if (fused) vjp_od_warp_kernel<kOuter, DK, true><<<gw, tw, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr);
            else vjp_od_warp_kernel<kOuter, DK, false><<<gw, tw, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr);
        });
    } else {
        const dim3 gb(thread_blocks(dims_)), tb(kThreads);
        float* scr = scratch_.ptr;
        if (rls_ && fused) write_vjp_thread_kernel<kRls, true><<<gb, tb, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
        else if (rls_) write_vjp_thread_kernel<kRls, false><<<gb, tb, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
        else if (outer_ && fused) write_vjp_thread_kernel<kOuter, true><<<gb, tb, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
        else if (outer_) write_vjp_thread_kernel<kOuter, false><<<gb, tb, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
        else write_vjp_thread_kernel<kDelta, false><<<gb, tb, 0, s>>>(dims_, L, dS_.ptr, Kn, Knrm, v, lam, beta, dsrc_.ptr, dvacc, draw_.ptr, dtok_.ptr, scr);
    }
    LDM_LAUNCH_CHECK();
    write_backward_gemms(i, dvacc, s);
    if (f32) return;
    if (vjp_done) {  // d_o = T(dv + key GEMM + dsrc): the fused pass left dsrc (and dx) out of dvacc
        resid_sum_kernel<T><<<elem_blocks(nd), 256, 0, s>>>(dvacc, dsrc_.ptr, dx_add_pending_ ? dxT_.ptr : nullptr,
                                                            d_o, nd);
        LDM_LAUNCH_CHECK();
        dx_add_pending_ = false;
    } else {
        from_f32<T>(dvacc, d_o, nd, s);
    }
}

// The rest of write i's backward once its VJP kernel has run (draw_: the raw key gradient):
// dvacc [N, d] += draw · W_k, dW_k [HK, d] += drawᵀ · O_i, then write_param_grads.
template <typename T>
void LdmGpuScheme<T>::write_backward_gemms(int i, float* dvacc, cudaStream_t s) {
    const T* dr = draw_T(draw_.ptr, s);
    write_row_grad(i, dr, dvacc, s);
    write_weight_grad(i, dr, s);
    write_param_grads(i, dvacc, s);
}

// dvacc [N, d] += dr · W_k^i (dr [N, HK] in T).
template <typename T>
void LdmGpuScheme<T>::write_row_grad(int i, const T* dr, float* dvacc, cudaStream_t s) {
    mm_.template gemm<T, float>(false, false, N_, d_, HK_, 1.f, dr, HK_, Wk_[i], d_, 1.f, dvacc, d_, nullptr, s);
}

// dW_k^i [HK, d] += drᵀ · O_i (the stored values, T; dr [N, HK] in T).
template <typename T>
void LdmGpuScheme<T>::write_weight_grad(int i, const T* dr, cudaStream_t s) {
    const T* Oi = O_.ptr + (int64_t)i * N_ * d_;
    mm_.template gemm<T, float>(true, false, HK_, d_, N_, 1.f, dr, HK_, Oi, d_, 1.f, gWk_[i], d_, nullptr, s);
}

// write i's remaining gradients: for delta dvacc += dz · w_β, dw_β, db_β (dvacc: [N, d] fp32, not
// null for delta); for forget dθ from the per-token dλ terms.
template <typename T>
void LdmGpuScheme<T>::write_param_grads(int i, float* dvacc, cudaStream_t s) {
    using namespace ldmk;
    const int64_t N = N_;
    const T* Oi = O_.ptr + (int64_t)i * N * d_;
    if (delta_) {
        const T* dz = to_T(dtok_.ptr, N * Hm_, dtokT_.ptr, s);
        mm_.template gemm<T, float>(false, false, N, d_, Hm_, 1.f, dz, Hm_, Wb_[i], d_, 1.f, dvacc, d_, nullptr, s);
        mm_.template gemm<T, float>(true, false, Hm_, d_, N, 1.f, dz, Hm_, Oi, d_, 1.f, gWb_[i], d_, nullptr, s);
        colsum(gBb_[i], dtok_.ptr, nullptr, N, Hm_, Hm_, nullptr, partial_.ptr, s);
    }
    if (forget_)
        colsum(gtheta_ + (int64_t)i * Hm_, dtok_.ptr, nullptr, N, Hm_, Hm_, lgrad_.ptr + (int64_t)i * Hm_,
               partial_.ptr, s);
}

// The state before write i, by what the forward kept (mirrors the CPU's prev_state).
template <typename T>
bool LdmGpuScheme<T>::prev_state(int i, cudaStream_t s) {
    switch (keep()) {
        case kAll: return prev_state_stored(i, s);
        case kSegments: return prev_state_segment(i, s);
        case kNone: return prev_state_unwind(i, s);
        case kWindowStarts: return prev_state_window(i, s);
    }
    return false;
}

// store: the state after write i-1 was kept (in place as a slot, or copied back into cur_).
template <typename T>
bool LdmGpuScheme<T>::prev_state_stored(int i, cudaStream_t s) {
    if (i == 0) {
        ldmk::init_state(dims_, cur_.ptr, (float)cfg_.ldm_delta, s);
        live_ = cur_.ptr;
    } else if (slots()) {
        live_ = state(i - 1);
    } else {
        live_ = cur_.ptr;
        copy_state(cur_.ptr, state(i - 1), s);
    }
    return false;
}

// unwind (and window mode's unwinding backward): write i is undone in place by the fused unwind +
// VJP kernel; the last unwind (write 0) is separate so that the recovered initial state can be
// compared with (0, I/δ) (the drift), then replaced by the exact initial state.
template <typename T>
bool LdmGpuScheme<T>::prev_state_unwind(int i, cudaStream_t s) {
    live_ = cur_.ptr;
    if (i > 0) return true;
    unwind(0, s);
    record_drift(nullptr, s);
    ldmk::init_state(dims_, cur_.ptr, (float)cfg_.ldm_delta, s);
    return false;
}

// checkpoint-every c: the states after writes 0, c, 2c, ... were kept. Inside a segment rls and
// outer unwind (fused); at a kept state the unwound one is compared with it (drift) and replaced
// by it; delta (not invertible) recomputes the segment forward from its kept start.
template <typename T>
bool LdmGpuScheme<T>::prev_state_segment(int i, cudaStream_t s) {
    live_ = cur_.ptr;
    if (i == 0) {
        if (!delta_) {
            unwind(0, s);
            record_drift(nullptr, s);
        }
        ldmk::init_state(dims_, cur_.ptr, (float)cfg_.ldm_delta, s);
        return false;
    }
    const int p = i - 1;
    if (p % ckpt_ == 0) {
        const float* ref = state(p / ckpt_);
        if (!delta_) {
            unwind(i, s);
            record_drift(ref, s);
        }
        copy_state(cur_.ptr, ref, s);
        return false;
    }
    if (!delta_) return true;
    const int start = p / ckpt_ * ckpt_;
    copy_state(cur_.ptr, state(start / ckpt_), s);
    for (int w = start + 1; w <= p; w++) rewrite(w, s);
    return false;
}

// window-start states: recompute write i's window from its start up to write i (sequential writes,
// equal to the Woodbury update up to rounding).
template <typename T>
bool LdmGpuScheme<T>::prev_state_window(int i, cudaStream_t s) {
    live_ = cur_.ptr;
    const int start = i / w_ * w_;
    copy_state(cur_.ptr, state(i / w_), s);
    for (int w = start; w < i; w++) rewrite(w, s);
    return false;
}

template <typename T>
void LdmGpuScheme<T>::unwind(int i, cudaStream_t s) {
    using namespace ldmk;
    const float* Kn = Kn_.ptr + (int64_t)i * N_ * HK_;
    const float* v = v32(i, s);
    const float* lam = lam_.ptr + (int64_t)i * Hm_;
    float* c = cur_.ptr;
    if (warp_) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        dispatch_dk(dk_, [&](auto k) {
            constexpr int DK = decltype(k)::value;
            if (rls_) unwind_warp_kernel<kRls, DK><<<gw, tw, 0, s>>>(dims_, c, Kn, v, lam);
            else unwind_warp_kernel<kOuter, DK><<<gw, tw, 0, s>>>(dims_, c, Kn, v, lam);
        });
    } else if (rls_) {
        unwind_thread_kernel<kRls><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, c, Kn, v, lam, scratch_.ptr);
    } else {
        unwind_thread_kernel<kOuter><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, c, Kn, v, lam, scratch_.ptr);
    }
    LDM_LAUNCH_CHECK();
}

template <typename T>
void LdmGpuScheme<T>::rewrite(int w, cudaStream_t s) {
    using namespace ldmk;
    const float* Kn = Kn_.ptr + (int64_t)w * N_ * HK_;
    const float* v = v32(w, s);
    const float* lam = lam_.ptr + (int64_t)w * Hm_;
    float* beta = delta_ ? beta_.ptr + (int64_t)w * N_ * Hm_ : nullptr;  // read only (RECOMP)
    float* c = cur_.ptr;
    if (warp_) {
        const dim3 gw(warp_blocks(dims_)), tw(32 * kWarpsPerBlock);
        dispatch_dk(dk_, [&](auto k) {
            constexpr int DK = decltype(k)::value;
            if (rls_) write_rls_warp_kernel<DK, true><<<gw, tw, 0, s>>>(dims_, c, c, Kn, nullptr, nullptr, v, lam);
            else if (outer_) write_od_warp_kernel<kOuter, DK, true><<<gw, tw, 0, s>>>(dims_, c, Kn, nullptr, nullptr, v, lam, nullptr, nullptr, nullptr);
            else write_od_warp_kernel<kDelta, DK, true><<<gw, tw, 0, s>>>(dims_, c, Kn, nullptr, nullptr, v, lam, nullptr, nullptr, beta);
        });
    } else if (rls_) {
        rewrite_thread_kernel<kRls><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, c, Kn, v, lam, beta, scratch_.ptr);
    } else if (outer_) {
        rewrite_thread_kernel<kOuter><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, c, Kn, v, lam, beta, scratch_.ptr);
    } else {
        rewrite_thread_kernel<kDelta><<<thread_blocks(dims_), kThreads, 0, s>>>(dims_, c, Kn, v, lam, beta, scratch_.ptr);
    }
    LDM_LAUNCH_CHECK();
}

template <typename T>
void LdmGpuScheme<T>::record_drift(const float* ref, cudaStream_t s) {
    ldmk::drift_kernel<<<ldmk::elem_blocks((int64_t)N_ * dims_.ST), 256, 0, s>>>(dims_, cur_.ptr, ref,
                                                                                (float)cfg_.ldm_delta, drift_.ptr);
    LDM_LAUNCH_CHECK();
    drift_pending_ = true;
}

// Embedding write's backward (the drift check of this step follows in after_backward).
template <typename T>
void LdmGpuScheme<T>::begin_backward(T* de, cudaStream_t s) {
    write_backward(0, de, s);
}

// The drift check of this micro-batch (host side, after its backward): above --ldm-drift-tol the
// next steps keep checkpointed segments (window mode: window-start states), like the CPU. Returns
// true when it switched (the next forward and backward launch other kernels).
template <typename T>
bool LdmGpuScheme<T>::after_backward(cudaStream_t s) {
    const int before = ckpt_;
    if (drift_pending_) {
        unsigned bits[2];
        CUDA_CHECK(cudaMemcpyAsync(bits, drift_.ptr, sizeof bits, cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        float f[2];
        std::memcpy(f, bits, sizeof f);
        drift_S_ = f[0];
        drift_P_ = f[1];
    }
    const bool unwinding = !delta_ && (keep() == kNone || keep() == kSegments);
    // (the same on every rank: same flags, same restored state, the same decisions before)
    const bool mine = ldm_drift_exceeds(std::max(drift_S_, drift_P_), cfg_.ldm_drift_tol);
    // data parallel: every rank switches together; asked only while the interval can still change
    const bool can_change = ldm_fallback_interval(unwinding, ckpt_, fell_back_, window_, w_, D_, true) != ckpt_;
    const bool exceeded = can_change && this->any_rank_(mine);
    const int next = ldm_fallback_interval(unwinding, ckpt_, fell_back_, window_, w_, D_, exceeded);
    if (fell_back_ && next == ckpt_) settled_ = true;
    if (next != ckpt_) {
        const bool first = !fell_back_;
        ckpt_ = next;
        fell_back_ = true;
        settled_ = false;
        grow(stored_, ldm_gpu_kept_states(cfg_, ckpt_) * (int64_t)N_ * dims_.ST);
        if (this->warns_) ldm_warn_fallback(first, drift_S_, drift_P_, cfg_.ldm_drift_tol, ckpt_, !mine);
    }
    return ckpt_ != before;
}

// A checkpoint's drift fallback (math/ldm_math.h ldm_restore_fallback), before the first step:
// the kept-states buffer is sized for the restored interval.
template <typename T>
std::string LdmGpuScheme<T>::restore_state(const std::vector<std::pair<std::string, double>>& saved) {
    const bool unwinding = !delta_ && (keep() == kNone || keep() == kSegments);
    const std::string line = ldm_restore_fallback(saved, unwinding, window_, w_, D_, ckpt_, fell_back_, settled_);
    if (N_ > 0) grow(stored_, ldm_gpu_kept_states(cfg_, ckpt_) * (int64_t)N_ * dims_.ST);
    return line;
}

// The drift of the unwinding modes (logged every step, as train_cpu does).
template <typename T>
std::vector<std::pair<std::string, double>> LdmGpuScheme<T>::metrics() {
    if (delta_ || (!unwind_ && ckpt_ == 0 && !window_)) return {};
    return {{"ldm_drift_S", drift_S_}, {"ldm_drift_P", drift_P_},
            {"ldm_fallback", fell_back_ ? 1.0 : 0.0}, {"ldm_ckpt", (double)ckpt_}};
}

// ==== the trainer ================================================================================

// Memory per token of the LDM scheme in the configured mode (printed once at startup).
inline void print_ldm_memory(const ModelConfig& c, int64_t act_bytes) {
    const int64_t W = c.n_sublayers() + 1, HK = (int64_t)c.ldm_heads * c.ldm_dk;
    const int ckpt = c.ldm_mode == "window" && c.ldm_checkpoint_every > 0 ? c.ldm_window : c.ldm_checkpoint_every;
    const int64_t st = ldm_gpu_state_bytes(c), kept = ldm_gpu_kept_states(c, ckpt);
    const int64_t saved = W * c.d_model * act_bytes            // v of every write (o_j, e)
                          + 2 * W * (HK + c.ldm_heads) * 4      // normalised q, k and their norms
                          + (c.ldm_rule == "delta" ? W * c.ldm_heads * 4 : 0);
    const bool warp = c.ldm_dk <= ldmk::kWarpMaxDk;
    std::string mode = c.ldm_mode;
    if (c.ldm_mode == "window")
        mode += strprintf(" w=%d (Woodbury forward, %s backward)", c.ldm_window,
                          c.ldm_checkpoint_every > 0 ? "window-start states" : "unwinding");
    if (c.ldm_mode != "window" && c.ldm_checkpoint_every > 0)
        mode += " checkpoint-every " + std::to_string(c.ldm_checkpoint_every);
    std::printf("LDM: rule %s%s%s, H_m %d, d_k %d, delta %g, lambda_min %g, D+1 = %lld writes, mode %s, %s kernels\n",
                c.ldm_rule.c_str(), c.ldm_residual ? "" : " (no residual)", c.ldm_forget ? "" : " (no forget)",
                c.ldm_heads, c.ldm_dk, c.ldm_delta, c.ldm_lambda_min, (long long)W, mode.c_str(),
                warp ? "warp" : "thread");
    std::printf("LDM memory per token: state S,P %.1f KiB (fp32); backward keeps %lld state(s) + the live one "
                "= %.1f KiB, plus saved v/q/k %.1f KiB (store mode would keep %.1f KiB of states)\n",
                st / 1024.0, (long long)kept, (kept + 1) * st / 1024.0, saved / 1024.0, (W + 1) * st / 1024.0);
    std::fflush(stdout);
}

void check_gpu_scheme(const ModelConfig& cfg) {
    if (cfg.scheme != "ldm")
        throw Error("train_ldm trains --scheme ldm only (got '" + cfg.scheme +
                    "'); use train_gpt_baselines for preln / hc / mhc / attnres-*");
}

template <typename T>
std::unique_ptr<GpuScheme<T>> make_gpu_scheme(const ModelConfig& cfg) {
    check_gpu_scheme(cfg);
    static bool printed = false;
    if (!printed) {
        print_ldm_memory(cfg, (int64_t)sizeof(T));
        printed = true;
    }
    return std::make_unique<LdmGpuScheme<T>>(cfg);
}

}  // namespace gpu
}  // namespace ldm

#ifndef TESTING
int main(int argc, char** argv) {
    // --scheme defaults to ldm; any other scheme is refused (check_gpu_scheme) before GPU work.
    return ldm::gpu::trainer_main(argc, argv, "train_ldm",
                                  "Train the spec §1 backbone with Linear Depth Memory (spec §2.5) on one "
                                  "or many GPUs (mpirun; doc/distributed.md). See doc/cuda.md \"LDM kernels\".",
                                  "ldm");
}
#endif
