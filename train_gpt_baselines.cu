// train_gpt_baselines.cu — the GPU trainer for the baseline depth schemes
// (build/cuda/train_gpt_baselines): the spec §1 backbone (cuda/model.cuh) with PreLN (spec §2.1),
// HC / mHC (§2.2-2.3) or AttnRes Full / Block (§2.4). This file is those schemes: their forward
// and backward orchestration over the kernels of cuda/hc.cuh and cuda/attnres.cuh, then the
// factory the trainer calls. The loop, flags, logs and checkpoints are the ones every trainer
// shares (core/train_loop.h, cuda/trainer.cuh). doc/cuda.md "Schemes".
//
//   build/cuda/train_gpt_baselines --preset llama-400m -B 8 -T 2048 --steps 1000 --lr 3e-4
//       --warmup-steps 100 --train-data 'data/fineweb/fineweb_train_*.bin' --out-dir runs/gpu --log runs/gpu/log.jsonl
//
// Exit codes: 0 ok, 1 error, 2 no usable CUDA GPU. Tests and workbenches include this file with
// TESTING defined (no main).
#include <algorithm>
#include <memory>
#include <type_traits>
#include <utility>

#include "cuda/attnres.cuh"
#include "cuda/hc.cuh"
#include "cuda/matmul.cuh"
#include "cuda/rmsnorm.cuh"
#include "cuda/scheme.cuh"
#include "cuda/trainer.cuh"

namespace ldm {
namespace gpu {

// ==== PreLN (spec §2.1) ==========================================================================
// h_0 = e; x_j = h_{j-1}; h_j = h_{j-1} + o_j; readout h_D. The stream h is never stored on its
// own: h_{j-1} IS the backbone's stored x_j, so x_{j+1} = x_j + o_j is computed by the fused
// residual_rmsnorm_forward straight into the backbone's x_{j+1} buffer (one read of x_j and o_j,
// one write of x_{j+1} and xn_{j+1}). Backward keeps dh = dL/dh_j in fp32 (like the CPU's dh, but
// fp32 even in bf16 runs, so 2·n_layer additions do not lose bf16 bits): readout_backward sets
// dh = dy; output_backward writes do_j = dh; input_backward adds dh += dx_j; begin_backward
// writes de = dh. The backbone's path is fused: input_norm_backward(j) runs
// rmsnorm_backward_residual (dh += (T) dx_j and do_{j-1} = (T) dh in the RMSNorm backward's pass,
// bit-identical to the three kernels), so output_backward(j-1) finds do_{j-1} already written.
// For j = 1 begin_backward keeps its own conversion (de = dh: one unfused pass per backward).
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
        written_d_o_ = nullptr;
    }
    void output_backward(int j, T* d_o, cudaStream_t s) override {
        if (written_d_o_) {  // input_norm_backward(j+1) wrote do_j = dh already
            if (d_o != written_d_o_ || j != written_j_)
                throw Error(strprintf("GpuPreLN::output_backward(%d): input_norm_backward(%d) wrote dL/do_%d "
                                      "into another buffer (d_o must be its d_o_next)", j, written_j_ + 1,
                                      written_j_));
            written_d_o_ = nullptr;
            return;
        }
        convert_f32<T>(d_o, dh_.ptr, n_, s);
    }
    void input_backward(int, const T* dx, cudaStream_t s) override {
        accumulate_f32<T>(dh_.ptr, dx, n_, true, s);
    }
    // dh += (T) RMSNorm-backward(dln) and, for j > 1, d_o_next = (T) dh in one pass.
    void input_norm_backward(int j, const T* dln, const T* x, const T* w, const float* rstd, int64_t N,
                             int d, float* dw, float* scratch, T* dx_buf, T* d_o_next,
                             cudaStream_t s) override {
        (void)dx_buf;
        if (d != d_ || N * d != n_)
            throw Error(strprintf("GpuPreLN::input_norm_backward: [%lld, %d] does not match the resized "
                                  "[%lld, %d]", (long long)N, d, (long long)(n_ / d_), d_));
        if (written_d_o_) throw Error("GpuPreLN::input_norm_backward: the previous output_backward did not run");
        T* next = j > 1 ? d_o_next : nullptr;
        rmsnorm_backward_residual<T>(dh_.ptr, next, dw, scratch, dln, x, w, rstd, N, d, s);
        written_d_o_ = next;
        written_j_ = j - 1;
    }
    void begin_backward(T* de, cudaStream_t s) override {
        if (written_d_o_)
            throw Error(strprintf("GpuPreLN::begin_backward: output_backward(%d) did not run", written_j_));
        convert_f32<T>(de, dh_.ptr, n_, s);
    }
    // Only the fp32 gradient stream dh (x_j itself is the backbone's).
    int64_t extra_bytes_per_token() const override { return 4 * (int64_t)d_; }

   private:
    int d_;
    int64_t n_ = 0;
    const T* e_ = nullptr;
    const T* prev_x_ = nullptr;
    const T* prev_o_ = nullptr;
    DeviceBuffer<float> dh_;
    T* written_d_o_ = nullptr;  // set by input_norm_backward(j > 1): do_{j-1} is in this buffer
    int written_j_ = 0;
};

// ==== HC and mHC (spec §2.2, §2.3) ===============================================================
// HC (manifold = false, spec §2.2) and mHC (manifold = true, spec §2.3) behind GpuScheme<T>.
// Parameter block per sublayer (core/config.cpp, same as the CPU): HC W [(n+2), d], then
// s_a, s_b, A_m0 [n], A_r0 [n,n], B0 [n]; mHC Φ [(2n+n²), n·d], then a_pre, a_post, a_res,
// b_pre [n], b_post [n], b_res [n,n]. Owns a Matmul (cuBLASLt handle, small workspace) and all
// its device buffers (allocated in resize()).
template <typename T>
struct GpuHC : GpuScheme<T> {
    GpuHC(const ModelConfig& cfg, bool manifold)
        : mhc_(manifold),
          d_(cfg.d_model),
          n_(cfg.hc_streams),
          D_(cfg.n_sublayers()),
          iters_(cfg.sinkhorn_iters),
          eps_((float)cfg.norm_eps),
          mm_(4 << 20) {
        hc_detail::dispatch_streams(n_, [](auto) {});  // validates n
        if (mhc_ && iters_ < 1) throw Error("mhc: sinkhorn_iters must be >= 1");
        wrows_ = mhc_ ? 2 * n_ + n_ * n_ : n_ + 2;
        ldp_ = hc_detail::proj_ld(wrows_);
        kdim_ = mhc_ ? n_ * d_ : d_;
        prow_ = mhc_ ? 1 : n_;
        np_ = mhc_ ? 3 + wrows_ : 2 + 2 * n_ + n_ * n_;
        block_ = (int64_t)wrows_ * kdim_ + np_;
        cw_ = hc_detail::coef_width(n_);
        ws_ = mhc_ ? sinkhorn_work_size(n_, iters_) + 2 * n_ * n_ : 0;
    }

    void bind(const T* params, const float* master, float* grads) override {
        P_ = params;
        M_ = master;
        G_ = grads;
    }

    // Allocates for N = B·T tokens (buffers only grow; contents undefined).
    void resize(int B, int T_) override {
        N_ = B * T_;
        const int64_t N = N_, n = n_, d = d_, D = D_;
        grow(Hs_, (D + 1) * N * n * d);
        grow(Os_, D * N * d);
        grow(Ps_, D * N * prow_ * ldp_);
        grow(rs_, (D + 1) * N * nr());
        grow(coef_, N * cw_);
        grow(coefp_, N * cw_);
        grow(dcoef_, N * cw_);
        grow(work_, mhc_ ? N * ws_ : 0);
        grow(dPp_, N * prow_ * ldp_);
        grow(beta_, N * n);
        grow(part_, N * np_);
        grow(dH_, N * n * d);
        grow(dHp_, N * n * d);
        if (optin_ == 0) optin_ = max_dynamic_smem_optin();  // (a device query: once)
        premix_ok_ = premix_fits();
        dispatch([&](auto NSC) {  // the combine kernel's per-slice partials of dW_j / dΦ_j
            grow(dWp_, (int64_t)hc_detail::combine_grid<decltype(NSC)::value>(N_, d_).y * wrows_ * kdim_);
        });
    }

    void begin(const T* e, cudaStream_t s) override {
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::begin_kernel<T, NS><<<N_, hc_detail::kThreads, 0, s>>>(H(0), RS(0), e, d_, eps_, !mhc_);
        });
        LDM_LAUNCH_CHECK();
        proj_ready_ = 0;
        pend_j_ = 0;
    }

    // x_j (and, when xn != nullptr, xn = RMSNorm_w(x_j) with rstd) — see the file comment. P_j comes
    // from the projection GEMM, or from output(j-1) where that ran the fused post-mix + projection.
    // Where output(j-1) was deferred (fused_premix), one kernel does output(j-1)'s post-mix, P_j
    // and this pre-mix + RMSNorm; then the coefficients of sublayer j for output(j).
    void input_norm(int j, T* x, T* xn, float* rstd, const T* w, float eps, cudaStream_t s) override {
        if (pend_j_) {
            if (pend_j_ != j - 1)
                throw Error(strprintf("hc: input_norm(%d) after output(%d) (expected input_norm(%d))", j, pend_j_,
                                      pend_j_ + 1));
            if (aligned8(x) && aligned8(xn) && aligned8(pend_o_)) {
                postmix_premix(j, x, xn, rstd, w, eps, s);
                coefficients(j, s);
                return;
            }
            const int jo = pend_j_;  // (a caller's buffer without the 8-byte alignment: the split path)
            pend_j_ = 0;
            output_now(jo, pend_o_, s);
        }
        if (proj_ready_ != j) project(j, s);
        coefficients(j, s);
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::premix_norm_kernel<T, NS><<<N_, hc_detail::kThreads, 0, s>>>(
                x, xn, rstd, H(j - 1), coef_.ptr, w, d_, eps);
        });
        LDM_LAUNCH_CHECK();
    }

    // output(j < D) in bf16 where premix_fits() (premix_ok_): deferred into input_norm(j+1) (o must stay
    // unchanged until then; the backbone writes it into O(j) and does not touch it).
    void output(int j, const T* o, cudaStream_t s) override {
        no_pending("output");
        if (j < D_ && premix_ok_) {
            pend_j_ = j;
            pend_o_ = o;
            return;
        }
        output_now(j, o, s);
    }
    T* output_buffer(int j) override { return O(j); }  // o_j is kept for the backward

    void readout(T* y, cudaStream_t s) override {
        no_pending("readout");
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::mean_kernel<T, NS><<<hc_detail::grid_1d((int64_t)N_ * d_, 256), 256, 0, s>>>(y, H(D_), N_, d_);
        });
        LDM_LAUNCH_CHECK();
    }

    void readout_backward(const T* dy, cudaStream_t s) override {
        no_pending("readout_backward");
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::mean_backward_kernel<T, NS><<<hc_detail::grid_1d((int64_t)N_ * d_, 256), 256, 0, s>>>(
                dH_.ptr, dy, N_, d_);
        });
        LDM_LAUNCH_CHECK();
        coef_j_ = 0;  // (output_backward(D) recomputes its coefficients)
        do_j_ = 0;
    }

    // d_o = dL/do_j. Where input_backward(j+1)'s combine kernel already wrote it (into the d_o_next
    // it was given, which must be this d_o), only the coefficients of sublayer j are left (made
    // there too) and the coefficient dots move to input_backward(j) (coef_dots_kernel<Dots::All>);
    // else coef_dots_kernel<Dots::Post> writes d_o and the dots, reading dL/dH_j, o_j and H_{j-1}.
    void output_backward(int j, T* d_o, cudaStream_t s) override {
        if (coef_j_ != j) coefficients(j, s);  // recomputed from the stored P_j (Sinkhorn included)
        if (do_j_ == j) {
            if (d_o != do_buf_)
                throw Error(strprintf("hc: output_backward(%d): input_backward(%d) wrote dL/do_%d into another buffer "
                                      "(d_o must be its d_o_next)", j, j + 1, j));
            do_j_ = 0;
            dots_done_ = false;
            return;
        }
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::coef_dots_kernel<T, NS, hc_detail::Dots::Post><<<N_, hc_detail::kThreads, 0, s>>>(
                dcoef_.ptr, d_o, coef_.ptr, nullptr, dH_.ptr, O(j), H(j - 1), d_);
        });
        LDM_LAUNCH_CHECK();
        dots_done_ = true;
    }

    void input_backward(int j, const T* dx, cudaStream_t s) override { input_backward_next(j, dx, nullptr, s); }
    // With d_o_next (j > 1, n <= 4, production's combine): the combine kernel also writes
    // dL/do_{j-1} into it from the dL/dH_{j-1} it forms (coefficients of sublayer j-1 made here,
    // after sublayer j's coefficient backward has used the Sinkhorn scratch): output_backward(j-1)
    // then reads neither dL/dH_{j-1} nor o_{j-1} nor H_{j-2}, and its dots are formed with the
    // pre-mix dots of input_backward(j-1) in one pass (coef_dots_kernel<Dots::All>): one read of
    // H fewer.
    void input_backward_next(int j, const T* dx, T* d_o_next, cudaStream_t s) override {
        const bool fuse = d_o_next && j > 1 && combine_writes_d_o() && hc_detail::combine_do_fits(n_);
        const int tpb = 128;
        const unsigned tb = (unsigned)ceil_div(N_, tpb);
        const float* q = M_ + (int64_t)(j - 1) * block_ + (int64_t)wrows_ * kdim_;
        float* gW = G_ + (int64_t)(j - 1) * block_;
        float* gq = gW + (int64_t)wrows_ * kdim_;
        const T* W = P_ + (int64_t)(j - 1) * block_;
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            if (dots_done_) {  // output_backward(j) formed the post-mix dots
                hc_detail::coef_dots_kernel<T, NS, hc_detail::Dots::Pre><<<N_, hc_detail::kThreads, 0, s>>>(
                    dcoef_.ptr, nullptr, nullptr, dx, nullptr, nullptr, H(j - 1), d_);
            } else if constexpr (hc_detail::kCombineDo<NS>) {  // (dots_done_ always holds otherwise)
                hc_detail::coef_dots_kernel<T, NS, hc_detail::Dots::All><<<N_, hc_detail::kThreads, 0, s>>>(
                    dcoef_.ptr, nullptr, nullptr, dx, dH_.ptr, O(j), H(j - 1), d_);
            }
            LDM_LAUNCH_CHECK();
            if (mhc_)
                hc_detail::mhc_coef_backward_kernel<T, NS><<<tb, tpb, 0, s>>>(
                    dPp_.ptr, beta_.ptr, part_.ptr, work_.ptr, dcoef_.ptr, Pj(j), RS(j - 1), q, N_, d_, iters_, ws_);
            else
                hc_detail::hc_coef_backward_kernel<T, NS><<<tb, tpb, 0, s>>>(
                    dPp_.ptr, beta_.ptr, part_.ptr, dcoef_.ptr, Pj(j), RS(j - 1), q, N_, d_);
            LDM_LAUNCH_CHECK();
        });
        hc_detail::column_sums_kernel<float><<<np_, 256, 0, s>>>(gq, part_.ptr, N_, np_);
        LDM_LAUNCH_CHECK();
        if (fuse) coefficients(j - 1, s, coefp_.ptr);
        comb_do_ = fuse ? d_o_next : nullptr;
        stream_gradient(j, dx, W, gW, s);
        comb_do_ = nullptr;
        std::swap(dH_, dHp_);
        if (fuse) {  // sublayer j-1's coefficients are now coef_'s; dL/do_{j-1} is in d_o_next
            std::swap(coef_, coefp_);
            coef_j_ = j - 1;
            do_j_ = j - 1;
            do_buf_ = d_o_next;
        }
    }

    void begin_backward(T* de, cudaStream_t s) override {
        if (do_j_ != 0)
            throw Error(strprintf("hc: begin_backward: output_backward(%d) did not run after input_backward(%d) wrote "
                                  "its dL/do", do_j_, do_j_ + 1));
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::stream_sum_kernel<T, NS><<<hc_detail::grid_1d((int64_t)N_ * d_, 256), 256, 0, s>>>(
                de, dH_.ptr, N_, d_);
        });
        LDM_LAUNCH_CHECK();
    }

    // Every byte per token this scheme allocates in resize(): kept for backward (H_0..H_D, o_j,
    // P_j, inverse RMS) plus backward/scratch buffers (coefficients of two sublayers, dcoef, dP, β, partials,
    // dH, dH_prev (type T like the streams themselves; see cuda/hc.cuh), mHC Sinkhorn work). (The
    // weight-gradient partials are per token slice of the combine kernel, not per token: at most
    // ceil(kCombineBlocks / grid.x) slices of the weight's size, 6 MiB for mHC at llama-400m.)
    int64_t extra_bytes_per_token() const override {
        const int64_t n = n_, d = d_, D = D_, tb = sizeof(T);
        const int64_t kept = (D + 1) * n * d * tb + D * d * tb + D * prow_ * ldp_ * 4 + (D + 1) * nr() * 4;
        const int64_t scratch =
            3 * (int64_t)cw_ * 4 + (int64_t)ws_ * 4 + prow_ * ldp_ * tb + n * 4 + np_ * 4 + 2 * n * d * tb;
        return kept + scratch;
    }
    // Only the part kept for backward (for documentation / tests).
    int64_t kept_bytes_per_token() const {
        const int64_t n = n_, d = d_, D = D_, tb = sizeof(T);
        return (D + 1) * n * d * tb + D * d * tb + D * prow_ * ldp_ * 4 + (D + 1) * nr() * 4;
    }

   protected:  // (dev/cuda/hc.cu derives the workbench's earlier mHC paths to compare)
    // Whether stream_gradient's kernel writes dL/do_{j-1} when comb_do_ is set (production's
    // combine; the workbench's earlier paths do not).
    virtual bool combine_writes_d_o() const { return true; }
    // Whether the combine kernel stages G, dx and H through cp.async where combine_staged() allows
    // (production; the workbench's "*-combine-direct" variants load them directly).
    virtual bool staged_combine() const { return true; }
    // Whether output(j < D) runs the post-mix fused with sublayer j+1's projection (bf16: the
    // tensor-core kernel needs bf16 operands; fp32 runs keep post-mix + GEMM).
    virtual bool fused_projection() const { return std::is_same<T, bf16>::value; }
    // Whether output(j < D) is deferred into input_norm(j+1) for postmix_premix_kernel (which also
    // forms sublayer j+1's pre-mix + RMSNorm from the rows it keeps on chip: H_j is not read back),
    // where premix_fits(). Production: HC in bf16 where two blocks fit in an SM's shared memory
    // (the kernel's phases, stream / mma / pre-mix, overlap only across blocks; at llama-400m
    // three fit). Its W_{j+1} is n+2 rows of d, read from L2 once per 8 tokens. mHC would read its
    // Φ_{j+1} (2n+n² rows of n·d, 192 KiB at llama-400m) from L2 once per 16 tokens with one block
    // per SM; whether that pays is not measured: workbench "mhc-premix-fused".
    virtual bool fused_premix() const {
        return std::is_same<T, bf16>::value && !mhc_ && 2 * premix_smem() + 1024 <= optin_;
    }
    // Dynamic shared memory of postmix_premix_kernel at this n and d (bytes).
    size_t premix_smem() const {
        size_t smem = 0;
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            smem = mhc_ ? hc_detail::PnShape<NS, false>::smem(d_) : hc_detail::PnShape<NS, true>::smem(d_);
        });
        return smem;
    }
    // fused_premix() and the kernel applies: d % 4 == 0 (8-byte row accesses) and its shared
    // memory (the block's rows: 8 or 16 tokens × n·d bf16) fits the device's opt-in limit optin_
    // (resize() caches the answer in premix_ok_).
    bool premix_fits() const {
        return fused_premix() && d_ % 4 == 0 && premix_smem() <= optin_;
    }
    // output(j) now: the post-mix, fused with sublayer j+1's projection where fused_projection()
    // and the kernel's 8-byte row accesses apply (d % 4 == 0, o 8-byte aligned; else input_norm(j+1)
    // runs the projection GEMM).
    void output_now(int j, const T* o, cudaStream_t s) {
        if (fused_projection() && j < D_ && d_ % 4 == 0 && aligned8(o)) {
            postmix_project(j, o, s);
            return;
        }
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            hc_detail::postmix_kernel<T, NS><<<N_, hc_detail::kThreads, 0, s>>>(
                H(j), RS(j), o == O(j) ? nullptr : O(j), H(j - 1), o, coef_.ptr, d_, eps_, !mhc_);
        });
        LDM_LAUNCH_CHECK();
    }
    static bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }
    void no_pending(const char* what) const {
        if (pend_j_)
            throw Error(strprintf("hc: %s after output(%d) (expected input_norm(%d))", what, pend_j_, pend_j_ + 1));
    }
    // The deferred output(j - 1) and input_norm(j): postmix_premix_kernel writes H_{j-1}, its
    // inverse RMS, the o_{j-1} copy (unless o is O(j-1) already), P_j, x_j, rstd and xn.
    void postmix_premix(int j, T* x, T* xn, float* rstd, const T* w, float eps, cudaStream_t s) {
        const int jo = pend_j_;
        const T* o = pend_o_;
        pend_j_ = 0;
        if constexpr (std::is_same<T, bf16>::value) {
            const float* q = M_ + (int64_t)(j - 1) * block_ + (int64_t)wrows_ * kdim_;
            dispatch([&](auto NSC) {
                constexpr int NS = decltype(NSC)::value;
                auto launch = [&](auto kern, size_t smem, int M) {
                    ensure_dynamic_smem(kern, smem);
                    kern<<<(unsigned)ceil_div(N_, M), hc_detail::kPnThreads, smem, s>>>(
                        H(jo), RS(jo), Pj(j), o == O(jo) ? nullptr : O(jo), x, xn, rstd, H(jo - 1), o, coef_.ptr,
                        P_ + (int64_t)(j - 1) * block_, q, w, N_, d_, ldp_, eps_, eps);
                };
                if (mhc_)
                    launch(hc_detail::postmix_premix_kernel<NS, false>, hc_detail::PnShape<NS, false>::smem(d_),
                           hc_detail::PnShape<NS, false>::M);
                else
                    launch(hc_detail::postmix_premix_kernel<NS, true>, hc_detail::PnShape<NS, true>::smem(d_),
                           hc_detail::PnShape<NS, true>::M);
            });
            LDM_LAUNCH_CHECK();
            proj_ready_ = j;
        } else {
            (void)j, (void)x, (void)xn, (void)rstd, (void)w, (void)eps, (void)s, (void)jo, (void)o;
            throw Error("hc: the fused post-mix + pre-mix is bf16 only");
        }
    }
    // output(j) for j < D with the projection of sublayer j+1: postmix_project_kernel writes H_j,
    // its inverse RMS, the o_j copy (unless o is O(j) already) and P_{j+1}, so that
    // input_norm(j+1) skips its GEMM (which would read H_j once more: n·d·2 bytes per token).
    void postmix_project(int j, const T* o, cudaStream_t s) {
        if constexpr (std::is_same<T, bf16>::value) {
            dispatch([&](auto NSC) {
                constexpr int NS = decltype(NSC)::value;
                auto launch = [&](auto kern, size_t smem) {
                    ensure_dynamic_smem(kern, smem);
                    kern<<<(unsigned)ceil_div(N_, hc_detail::kPpTokens), hc_detail::kPpThreads, smem, s>>>(
                        H(j), RS(j), Pj(j + 1), o == O(j) ? nullptr : O(j), H(j - 1), o, coef_.ptr,
                        P_ + (int64_t)j * block_, N_, d_, ldp_, eps_);
                };
                if (mhc_) launch(hc_detail::postmix_project_kernel<NS, false>, hc_detail::PpShape<NS, false>::smem);
                else launch(hc_detail::postmix_project_kernel<NS, true>, hc_detail::PpShape<NS, true>::smem);
            });
            LDM_LAUNCH_CHECK();
            proj_ready_ = j + 1;
        } else {
            (void)j, (void)o, (void)s;
            throw Error("hc: the fused post-mix + projection is bf16 only");
        }
    }
    // The last step of input_backward: dL/dH_{j-1} into dHp_ from dH_ (= dL/dH_j), dx, dPp_, the
    // coefficients and β of sublayer j, and dW_j += dPpᵀ·H_{j-1} into gW (fp32 [wrows, kdim];
    // W = W_j / Φ_j, the working copy).
    virtual void stream_gradient(int j, const T* dx, const T* W, float* gW, cudaStream_t s) {
        combine(j, dx, W, gW, 0, s);
    }
    // The combine kernel writes dL/dH_{j-1} (and, when comb_do_ is set, dL/do_{j-1} into it from
    // the coefficients of sublayer j-1 in coefp_) and the weight gradient's partial per token slice
    // (combine_grid's slices, at most max_slices when > 0: the workbench's multi-tile check), then
    // the fixed-order sum of the slices into gW.
    void combine(int j, const T* dx, const T* W, float* gW, unsigned max_slices, cudaStream_t s) {
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            dim3 grid = hc_detail::combine_grid<NS>(N_, d_);
            if (max_slices > 0) grid.y = std::min(grid.y, max_slices);
            const dim3 block(hc_detail::kCombineChannels<NS>, NS);
            auto launch = [&](auto kern, size_t ring) {
                ensure_dynamic_smem(kern, ring);
                kern<<<grid, block, ring, s>>>(dHp_.ptr, dWp_.ptr, dH_.ptr, dx, dPp_.ptr, W, H(j - 1), coef_.ptr,
                                               beta_.ptr, comb_do_, coefp_.ptr, N_, d_);
            };
            constexpr size_t ring = hc_detail::CombineSource<T, NS, true>::ring_bytes;
            if (staged_combine() && hc_detail::combine_staged<T>(d_, dH_.ptr, dx, H(j - 1))) {
                if (mhc_) launch(hc_detail::mhc_combine_kernel<T, NS, true>, ring);
                else launch(hc_detail::hc_combine_kernel<T, NS, true>, ring);
            } else {
                if (mhc_) launch(hc_detail::mhc_combine_kernel<T, NS, false>, 0);
                else launch(hc_detail::hc_combine_kernel<T, NS, false>, 0);
            }
            LDM_LAUNCH_CHECK();
            const int64_t E = (int64_t)wrows_ * kdim_;
            hc_detail::dw_slices_reduce_kernel<<<hc_detail::grid_1d(E, 256), 256, 0, s>>>(gW, dWp_.ptr, E,
                                                                                         (int)grid.y);
        });
        LDM_LAUNCH_CHECK();
    }

    bool mhc_;
    int d_, n_, D_, iters_;
    float eps_;
    int wrows_ = 0, ldp_ = 0, kdim_ = 0, prow_ = 0, np_ = 0, cw_ = 0, ws_ = 0;
    int64_t block_ = 0;
    int N_ = 0;
    int proj_ready_ = 0;  // P_j of this sublayer j is already written (by output(j-1)); 0: none
    bool premix_ok_ = false;  // premix_fits() (set by resize())
    size_t optin_ = 0;        // max_dynamic_smem_optin() (set by the first resize())
    int pend_j_ = 0;      // output(pend_j_) deferred into input_norm(pend_j_ + 1) (0: none), with o = pend_o_
    const T* pend_o_ = nullptr;
    // backward: coef_ holds sublayer coef_j_'s coefficients (0: none); dL/do_{do_j_} is already in
    // do_buf_ (0: none; written by the combine kernel); dots_done_: output_backward(j) formed the
    // post-mix dots; comb_do_: the combine kernel's d_o target during input_backward
    int coef_j_ = 0, do_j_ = 0;
    T* do_buf_ = nullptr;
    T* comb_do_ = nullptr;
    bool dots_done_ = true;
    Matmul mm_;
    const T* P_ = nullptr;
    const float* M_ = nullptr;
    float* G_ = nullptr;
    DeviceBuffer<T> Hs_, Os_, dPp_, dH_, dHp_;
    DeviceBuffer<float> Ps_, rs_, coef_, coefp_, dcoef_, work_, beta_, part_, dWp_;

    template <typename E>
    static void grow(DeviceBuffer<E>& b, int64_t n) {  // allocations only grow (resize per step)
        if (b.n < n) b.alloc(n);
    }
    int nr() const { return mhc_ ? 1 : n_; }
    T* H(int j) const { return Hs_.ptr + (int64_t)j * N_ * n_ * d_; }
    T* O(int j) const { return Os_.ptr + (int64_t)(j - 1) * N_ * d_; }
    float* Pj(int j) const { return Ps_.ptr + (int64_t)(j - 1) * N_ * prow_ * ldp_; }
    float* RS(int j) const { return rs_.ptr + (int64_t)j * N_ * nr(); }
    template <typename F>
    void dispatch(F&& f) const { hc_detail::dispatch_streams(n_, std::forward<F>(f)); }

    // P_j = H_{j-1} · W_jᵀ (fp32 out): HC rows = N·n of d, mHC rows = N of n·d.
    void project(int j, cudaStream_t s) {
        const T* W = P_ + (int64_t)(j - 1) * block_;
        mm_.gemm<T, float>(false, true, (int64_t)N_ * prow_, wrows_, kdim_, 1.f, H(j - 1), kdim_, W, kdim_, 0.f,
                           Pj(j), ldp_, nullptr, s);
    }
    // Per-token coefficients of sublayer j into out (coef_ by default; from P_j and the inverse RMS
    // of H_{j-1}; mHC's Sinkhorn iterates into work_).
    void coefficients(int j, cudaStream_t s, float* out = nullptr) {
        if (!out) {
            out = coef_.ptr;
            coef_j_ = j;
        }
        const float* q = M_ + (int64_t)(j - 1) * block_ + (int64_t)wrows_ * kdim_;
        const int tpb = 128;
        const unsigned tb = (unsigned)ceil_div(N_, tpb);
        dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            if (mhc_)
                hc_detail::mhc_coef_kernel<NS><<<tb, tpb, 0, s>>>(out, work_.ptr, Pj(j), RS(j - 1), q, N_, iters_, ws_);
            else
                hc_detail::hc_coef_kernel<NS><<<tb, tpb, 0, s>>>(out, Pj(j), RS(j - 1), q, N_);
        });
        LDM_LAUNCH_CHECK();
    }
};

// ==== AttnRes Full and Block (spec §2.4) =========================================================
// AttnRes Full (block = false) and Block (block = true) behind GpuScheme<T>. Parameter block
// (core/config.cpp): per sublayer j = 1..D: w [d], g [d]; then w_f [d], g_f [d] (readout, j = D+1).
// Buffers (resize): sources src [K, N, d] (T; Full K = D+1: v_0..v_D, Block K = N_b+1:
// b_0..b_N), their r [K, N] and fp32 gradients [K, N, d]; Block also pv [D, N, d] (T) and r [D, N].
// Full aggregates per sublayer over all of its sources; its backward is deferred (cuda/attnres.cuh,
// doc/cuda.md "AttnRes-Full, deferred backward"): each sublayer keeps its per-source scalars
// (α, dL/ds, s) and a copy of dx_j, and each source's gradient is summed in one pass when it is due
// and written as T (no fp32 gradient rows). Block where the two-phase path does not apply (and Full
// at d > 8192) adds each sublayer's gradient into every source's fp32 row (aggregate_backward:
// read-modify-write of K·d fp32 per sublayer and token). Block runs two-phase (cuda/attnres.cuh, doc/cuda.md
// "AttnRes-Block, two-phase"): at a block's first sublayer one pass over the block sources
// b_0..b_{n-1} serves all of its sublayers (their pseudo-queries are parameters), each later
// sublayer only merges in the partial sum p; in backward each sublayer touches only dx, its
// inter-block aggregate a_j and p, and once per block one flush reads every block source,
// recomputes the block's scores and adds the block's gradient into it.
// Extra buffers: a_j for every sublayer not first in its block [D - N_b, N, d] (T; each row turns
// into that sublayer's dx stash in the backward), the block sources' log-sum-exp [D - N_b, N], and
// their share β = 1 − α_p and e = α_p dx·p [2, S_max - 1, N] (fp32). Applies where d <= 8192 (values
// per thread in registers) and the flush's dq rows fit in shared memory (about S_max·d floats: 25 KiB
// at llama-400m, 201 KiB at qwen3-14b with N = 8).
template <typename T>
struct GpuAttnRes : GpuScheme<T> {
    GpuAttnRes(const ModelConfig& cfg, bool block)
        : d_(cfg.d_model), D_(cfg.n_sublayers()), block_(block), eps_((float)cfg.norm_eps) {
        if (block_) {
            nb_ = std::min(cfg.attnres_blocks, D_);
            if (nb_ <= 0)
                throw Error(strprintf("attnres-block: attnres_blocks must be positive, got %d", cfg.attnres_blocks));
            S_ = D_ / nb_;
        } else {
            nb_ = D_;
            S_ = 1;
        }
        smax_ = block_ ? std::max(S_, D_ - (nb_ - 1) * S_) : 1;
        two_phase_ = block_ && d_ <= ar_detail::kThreads * ar_detail::kOnePassMaxVpt &&
                     ar_detail::flush2_smem_floats(smax_, d_, nb_) * sizeof(float) <= smem_optin_;
        deferred_ = !block_ && d_ <= ar_detail::kThreads * ar_detail::kOnePassMaxVpt;
    }
    // Block on the two-phase path (false: Full, or a Block shape it does not apply to).
    bool two_phase() const { return two_phase_; }
    // Full on the deferred backward (false: Block, or Full at d > 8192).
    bool deferred() const { return deferred_; }
    // Full's flush pairs sources (k, k − 1) where m = D + 1 − k >= this many consumers remain
    // (full_flush, ar_detail::full_flush_pairs): against two single flushes a pair reads
    // (m − 1)·sizeof(T) bytes per value fewer and moves the 8 bytes of the fp32 partial (written
    // once, read once), so it pays from m = 2 + 8/sizeof(T) on (bf16 6, fp32 4).
    static constexpr int kFlushPairMin = 2 + 8 / (int)sizeof(T);

    void bind(const T* params, const float* master, float* grads) override {
        P_ = params;
        M_ = master;
        G_ = grads;
    }

    void resize(int B, int T_) override {
        N_ = B * T_;
        const int64_t N = N_, d = d_, K = nb_ + 1;
        grow(src_, K * N * d);
        grow(rsrc_, K * N);
        if (deferred_) {
            grow(stash_, (int64_t)(D_ + 1) * N * d);
            grow(pairs_, 3 * ar_detail::full_pair(D_ + 2, 0) * N);
            if (flush_pairs()) grow(part_, N * d);
        } else {
            grow(dsrc_, K * N * d);
        }
        if (block_) {
            grow(pv_, (int64_t)D_ * N * d);
            grow(rp_, (int64_t)D_ * N);
        }
        grow(dq_part_, (int64_t)bwd_blocks() * d);
        if (two_phase_) {
            grow(rows_, (int64_t)(D_ - nb_) * N * d);
            grow(lse_, (int64_t)(D_ - nb_) * N);
            grow(co_, 2 * (int64_t)(smax_ - 1) * N);
            grow(dq2_part_, (int64_t)bwd_blocks() * smax_ * d);
        }
    }

    void begin(const T* e, cudaStream_t s) override {
        ar_detail::source_kernel<T><<<N_, ar_detail::kThreads, 0, s>>>(U(0), RU(0), nullptr, e, d_, eps_);
        LDM_LAUNCH_CHECK();
    }

    void input_norm(int j, T* x, T* xn, float* rstd, const T* w, float eps, cudaStream_t s) override {
        if (two_phase_) block_forward_2p(j, x, xn, rstd, w, eps, s);
        else aggregate(j, x, xn, rstd, w, eps, s);
    }

    void output(int j, const T* o, cudaStream_t s) override {
        if (!block_) {  // (o may already be U(j): output_buffer)
            ar_detail::source_kernel<T><<<N_, ar_detail::kThreads, 0, s>>>(U(j), RU(j), nullptr, o, d_, eps_);
            LDM_LAUNCH_CHECK();
            return;
        }
        int n, i;
        locate(j, &n, &i);
        const T* p = i >= 2 ? PV(j) : nullptr;
        if (block_end(j, n))
            ar_detail::source_kernel<T><<<N_, ar_detail::kThreads, 0, s>>>(U(n), RU(n), p, o, d_, eps_);
        else
            ar_detail::source_kernel<T><<<N_, ar_detail::kThreads, 0, s>>>(PV(j + 1), RP(j + 1), p, o, d_, eps_);
        LDM_LAUNCH_CHECK();
    }

    // Full keeps v_j = o_j as source j (Block keeps p + o_j, a new row)
    T* output_buffer(int j) override { return block_ ? nullptr : U(j); }
    void readout(T* y, cudaStream_t s) override { aggregate(D_ + 1, y, nullptr, nullptr, nullptr, 0.f, s); }

    void readout_backward(const T* dy, cudaStream_t s) override {
        pending_ = -1;  // (a backward that stopped early leaves no partial behind)
        if (deferred_) full_scores_backward(D_ + 1, dy, s);
        else aggregate_backward(D_ + 1, dy, true, s);
    }

    void output_backward(int j, T* d_o, cudaStream_t s) override {
        if (deferred_) return full_flush(j, d_o, s);
        int n = j, i = 1;
        if (block_) locate(j, &n, &i);
        // Full: dL/dv_j. Block: dL/dp after sublayer j, kept in place in b_n's gradient buffer.
        to_act(d_o, DU(n), s);
    }

    void input_backward(int j, const T* dx, cudaStream_t s) override {
        if (two_phase_) block_backward_2p(j, dx, s);
        else if (deferred_) full_scores_backward(j, dx, s);
        else aggregate_backward(j, dx, false, s);
    }

    void begin_backward(T* de, cudaStream_t s) override {
        if (deferred_) full_flush(0, de, s);
        else to_act(de, DU(0), s);
    }

    // Every byte per token allocated in resize(): sources (T) + r + fp32 gradients (deferred Full:
    // the dx stash (T), the pair scalars and the paired flush's fp32 partial row instead of the
    // gradients); Block also the partial-sum
    // snapshots pv (T) + r; two-phase also the aggregates a_j (T), the log-sum-exps and e. (The dq
    // partials are per thread block, not per token.)
    int64_t extra_bytes_per_token() const override {
        const int64_t d = d_, K = nb_ + 1, tb = sizeof(T);
        int64_t v = K * d * tb + K * 4;
        if (deferred_)
            v += (int64_t)(D_ + 1) * d * tb + 3 * ar_detail::full_pair(D_ + 2, 0) * 4 + (flush_pairs() ? d * 4 : 0);
        else v += K * d * 4;
        if (block_) v += (int64_t)D_ * d * tb + (int64_t)D_ * 4;
        if (two_phase_) v += (int64_t)(D_ - nb_) * (d * tb + 4) + 2 * (int64_t)(smax_ - 1) * 4;
        return v;
    }
    int n_blocks() const { return nb_; }
    // Block index n and position i (1-based) of sublayer j (same rule as the CPU reference).
    void locate(int j, int* n, int* i) const {
        int b = (j - 1) / S_ + 1;
        if (b > nb_) b = nb_;
        *n = b;
        *i = j - (b - 1) * S_;
    }

   protected:  // (dev/cuda/attnres.cu derives the workbench's other Block paths to compare)
    int d_, D_, nb_ = 0, S_ = 1;
    bool block_;
    bool two_phase_ = false;
    bool deferred_ = false;
    size_t smem_optin_ = max_dynamic_smem_optin();  // per block, this device (cudaFuncSetAttribute)
    int smax_ = 1;  // most sublayers in one block (the last block takes the remainder)
    float eps_;
    int N_ = 0;
    const T* P_ = nullptr;
    const float* M_ = nullptr;
    float* G_ = nullptr;
    DeviceBuffer<T> src_, pv_;
    DeviceBuffer<float> rsrc_, dsrc_, rp_, dq_part_;
    // two-phase, per sublayer j at position >= 2 of block n at row j - n - 1: rows [D - nb, N, d]
    // (its inter-block aggregate a_j, then its dx stash in the backward), lse [D - nb, N] (its block
    // sources' log-sum-exp); per position i >= 2 of the current block at row i - 2: co [2][smax-1, N]
    // (β = 1 − α_p, e = α_p dx·p); flush dq partials [blocks, smax, d]
    DeviceBuffer<T> rows_;
    DeviceBuffer<float> lse_, co_, dq2_part_;
    // deferred Full: dx_j of sublayer j = 1..D+1 at row j - 1 [D + 1, N, d]; the pair scalars α, dL/ds,
    // s as three planes [pairs, N] (pairs = full_pair(D + 2, 0), pair (j, k) at full_pair(j, k))
    DeviceBuffer<T> stash_;
    DeviceBuffer<float> pairs_;
    // pairs_'s three planes: pair_plane(0) α, pair_plane(1) dL/ds, pair_plane(2) s
    float* pair_plane(int i) const { return pairs_.ptr + i * ar_detail::full_pair(D_ + 2, 0) * N_; }
    // deferred Full, paired flushes (full_flush): source pending_'s partial gradient [N, d] (fp32;
    // pending_ = -1: none); pairs where J − k >= pair_min_ (the workbench moves it)
    DeviceBuffer<float> part_;
    int pending_ = -1;
    int pair_min_ = kFlushPairMin;

    template <typename E>
    static void grow(DeviceBuffer<E>& b, int64_t n) {  // allocations only grow (resize per step)
        if (b.n < n) b.alloc(n);
    }
    T* U(int k) const { return src_.ptr + (int64_t)k * N_ * d_; }
    float* RU(int k) const { return rsrc_.ptr + (int64_t)k * N_; }
    float* DU(int k) const { return dsrc_.ptr + (int64_t)k * N_ * d_; }
    T* PV(int j) const { return pv_.ptr + (int64_t)(j - 1) * N_ * d_; }
    float* RP(int j) const { return rp_.ptr + (int64_t)(j - 1) * N_; }
    bool block_end(int j, int n) const { return (n < nb_) ? (j == n * S_) : (j == D_); }
    int block_len(int n) const { return n < nb_ ? S_ : D_ - (nb_ - 1) * S_; }
    // The most thread blocks of a persistent backward kernel (the partial buffers' rows); each
    // launch takes one wave of them (persistent_grid).
    int bwd_blocks() const { return std::max(1, std::min(N_, ar_detail::kBackwardBlocks)); }
    const float* Wj(int j) const { return M_ + (int64_t)(j - 1) * 2 * d_; }  // w_j; g_j = Wj(j) + d
    float* GWj(int j) const { return G_ + (int64_t)(j - 1) * 2 * d_; }

    ar_detail::Sources sources(int j) const {
        ar_detail::Sources S{U(0), RU(0), 0, nullptr, nullptr, deferred_ ? nullptr : DU(0), nullptr};
        if (j == D_ + 1) {
            S.K0 = nb_ + 1;
        } else if (!block_) {
            S.K0 = j;
        } else {
            int n, i;
            locate(j, &n, &i);
            S.K0 = n;
            if (i >= 2) {
                S.Ux = PV(j);
                S.Rx = RP(j);
                S.dUx = DU(n);  // dL/dp accumulates in place in b_n's gradient buffer
            }
        }
        return S;
    }

    void aggregate(int j, T* x, T* xn, float* rstd, const T* wn, float eps_n, cudaStream_t s) {
        const ar_detail::Sources S = sources(j);
        const float* w = Wj(j);
        const float* g = w + d_;
        const int nw = ar_detail::kThreads / 32;
        // one pass over the sources (registers hold the running sum) wherever d allows it
        const bool one_pass = ar_detail::dispatch_vpt(d_, [&](auto c) {
            constexpr int VPT = decltype(c)::value;
            ar_detail::aggregate_onepass_kernel<T, VPT><<<N_, ar_detail::kThreads, ar_detail::onepass_smem<VPT>(), s>>>(
                x, xn, rstd, wn, eps_n, S, w, g, N_, d_);
        });
        if (!one_pass) {  // d > 8192: the two-pass kernel (scores, then the weighted sum)
            const size_t smem = (size_t)(nw + 1) * S.K() * sizeof(float);
            ar_detail::aggregate_kernel<T><<<N_, ar_detail::kThreads, smem, s>>>(x, xn, rstd, wn, eps_n, S, w, g, N_, d_);
        }
        LDM_LAUNCH_CHECK();
    }

    void aggregate_backward(int j, const T* dx, bool overwrite, cudaStream_t s) {
        const ar_detail::Sources S = sources(j);
        const float* w = Wj(j);
        const float* g = w + d_;
        float* gw = GWj(j);
        float* gg = gw + d_;
        const int nw = ar_detail::kThreads / 32;
        const size_t smem = ((size_t)(2 * nw + 3) * S.K() + d_) * sizeof(float);
        const int nb = persistent_grid(ar_detail::aggregate_backward_kernel<T>, ar_detail::kThreads, smem, bwd_blocks());
        ar_detail::aggregate_backward_kernel<T><<<nb, ar_detail::kThreads, smem, s>>>(dq_part_.ptr, dx, S, w, g, N_,
                                                                                       d_, overwrite);
        LDM_LAUNCH_CHECK();
        ar_detail::dq_reduce_kernel<float><<<(unsigned)ceil_div(d_, 256), 256, 0, s>>>(gw, gg, dq_part_.ptr, nb, w, g, d_);
        LDM_LAUNCH_CHECK();
    }

    // Deferred Full backward of sublayer j (the readout: j = D + 1): scores, dL/dq, the pair scalars
    // of j's sources and dx_j's stash row. Sources in groups of full_group<VPT>() per barrier; the
    // token's rows copied into shared memory first (cp.async, all in flight at once) wherever they
    // fit (STAGE), else read twice from global memory. (Virtual: the workbench also runs one
    // source per barrier without staging, and the scores kernel before cp.async.)
    virtual void full_scores_backward(int j, const T* dx, cudaStream_t s) {
        ar_detail::dispatch_vpt(d_, [&](auto c) {
            constexpr int VPT = decltype(c)::value, G = ar_detail::full_group<VPT>();
            if (ar_detail::full_scores_smem<T>(G, true, j, d_) <= smem_optin_)
                launch_full_scores<VPT, G, true>(j, dx, s);
            else
                launch_full_scores<VPT, G, false>(j, dx, s);
        });
    }
    template <int VPT, int G, bool STAGE>
    void launch_full_scores(int j, const T* dx, cudaStream_t s) {
        launch_full_scores_kernel(ar_detail::full_scores_backward_kernel<T, VPT, G, STAGE>,
                                  ar_detail::full_scores_smem<T>(G, STAGE, j, d_), j, dx, s);
    }
    // kern: full_scores_backward_kernel's arguments (the workbench also launches a replaced variant).
    template <typename Kernel>
    void launch_full_scores_kernel(Kernel kern, size_t smem, int j, const T* dx, cudaStream_t s) {
        const float* w = Wj(j);
        const float* g = w + d_;
        const int nb = persistent_grid(kern, ar_detail::kThreads, smem, bwd_blocks());
        kern<<<nb, ar_detail::kThreads, smem, s>>>(dq_part_.ptr, pair_plane(0), pair_plane(1), pair_plane(2),
                                                   stash_.ptr + (int64_t)(j - 1) * N_ * d_, dx, U(0), RU(0), j, w, g,
                                                   ar_detail::full_pair(j, 0), N_, d_);
        LDM_LAUNCH_CHECK();
        ar_detail::dq_reduce_kernel<float><<<(unsigned)ceil_div(d_, 256), 256, 0, s>>>(GWj(j), GWj(j) + d_, dq_part_.ptr,
                                                                                        nb, w, g, d_);
        LDM_LAUNCH_CHECK();
    }
    // Deferred Full: source k's whole gradient (every consumer j > k has run its backward), as T.
    // Where ar_detail::full_flush_pairs(k, J, pair_min_) holds (threshold: kFlushPairMin), one launch
    // also sums source k−1's consumers j > k into the fp32 partial part_ (each stash row read once
    // for both), and output_backward(k−1) then adds only j = k to it (pending_ = k−1 until then).
    // Same sums in the same order: the results are those of one launch per source.
    void full_flush(int k, T* out, cudaStream_t s) {
        const int J = D_ + 1;
        if (pending_ >= 0 && pending_ != k)
            throw Error(strprintf("attnres-full: flush of source %d while source %d's is pending", k, pending_));
        if (pending_ == k) {  // source k's partial over j = J .. k+2 is in part_: add j = k+1
            const int64_t o = ar_detail::full_pair(k + 1, k) * N_;
            ar_detail::full_flush_last_kernel<T><<<(unsigned)ceil_div((int64_t)N_ * d_, ar_detail::kThreads),
                                                   ar_detail::kThreads, 0, s>>>(
                out, part_.ptr, U(k), RU(k), stash_.ptr + (int64_t)k * N_ * d_, pair_plane(0) + o, pair_plane(1) + o,
                pair_plane(2) + o, Wj(k + 1), Wj(k + 1) + d_, N_, d_);
            LDM_LAUNCH_CHECK();
            pending_ = -1;
            return;
        }
        ar_detail::dispatch_vpt(d_, [&](auto c) {
            constexpr int VPT = decltype(c)::value;
            constexpr int TT = ar_detail::flush_tokens<VPT>(), TT2 = ar_detail::flush_tokens<VPT, 2>();
            if (TT2 > 0 && ar_detail::full_flush_pairs(k, J, pair_min_)) {
                if constexpr (TT2 > 0)
                    launch_flush<VPT, 2, TT2>(out, U(k), RU(k), U(k - 1), RU(k - 1), k, s);
                pending_ = k - 1;
            } else {
                launch_flush<VPT, 1, TT>(out, U(k), RU(k), nullptr, nullptr, k, s);
            }
        });
    }
    // full_flush_kernel with its ring of kFlushStages slots wherever that fits the opt-in limit, else
    // with direct loads. (Virtual: the workbench also runs the direct loads everywhere.)
    virtual bool flush_ring(size_t bytes) const { return bytes <= smem_optin_; }
    template <int VPT, int NS, int TT>
    void launch_flush(T* out, const T* u, const float* r, const T* u1, const float* r1, int k, cudaStream_t s) {
        constexpr int S = ar_detail::kFlushStages;
        const float *pa = pair_plane(0), *pds = pair_plane(1), *psc = pair_plane(2);
        const unsigned grid = (unsigned)ceil_div(N_, TT);
        const size_t smem = S * ar_detail::flush_slot_bytes<T>(TT, NS, d_);
        float* part = NS == 2 ? part_.ptr : nullptr;
        if (flush_ring(smem)) {
            auto kern = ar_detail::full_flush_kernel<T, VPT, NS, TT, S>;
            ensure_dynamic_smem(kern, smem);
            kern<<<grid, ar_detail::kThreads, smem, s>>>(out, part, u, r, u1, r1, stash_.ptr, pa, pds, psc, M_, k,
                                                         D_ + 1, N_, d_);
        } else {
            ar_detail::full_flush_kernel<T, VPT, NS, TT, 0><<<grid, ar_detail::kThreads, 0, s>>>(
                out, part, u, r, u1, r1, stash_.ptr, pa, pds, psc, M_, k, D_ + 1, N_, d_);
        }
        LDM_LAUNCH_CHECK();
    }
    // Whether full_flush pairs any sources: d <= 4096 (full_flush_kernel's NS = 2 needs VPT <= 16)
    // and the rule holds for some source (for k = 1, which has the most consumers, if for any).
    bool flush_pairs() const {
        bool ok = false;
        ar_detail::dispatch_vpt(d_, [&](auto c) { ok = ar_detail::flush_tokens<decltype(c)::value, 2>() > 0; });
        return ok && ar_detail::full_flush_pairs(1, D_ + 1, pair_min_);
    }

    // Two-phase forward of Block sublayer j at position i of block n: i = 1 runs the block's
    // inter-block pass (x_j itself and the aggregates of positions 2..ns), i >= 2 merges in p.
    void block_forward_2p(int j, T* x, T* xn, float* rstd, const T* wn, float eps_n, cudaStream_t s) {
        int n, i;
        locate(j, &n, &i);
        const int j0 = j - i + 1, ns = block_len(n);
        ar_detail::dispatch_vpt(d_, [&](auto c) {
            constexpr int VPT = decltype(c)::value;
            if (i == 1) {
                const int nchunk = (int)ceil_div(ns, ar_detail::block_chunk<VPT>());
                ar_detail::block_inter_kernel<T, VPT>
                    <<<(unsigned)((int64_t)N_ * nchunk), ar_detail::kThreads, ar_detail::inter_smem<VPT>(), s>>>(
                        x, xn, rstd, wn, eps_n, ns > 1 ? A(j0 + 1, n) : nullptr, ns > 1 ? LSEI(j0 + 1, n) : nullptr,
                        U(0), RU(0), n, Wj(j0), ns, N_, d_);
            } else {
                ar_detail::block_merge_kernel<T, VPT>
                    <<<N_, ar_detail::kThreads, 2 * (ar_detail::kThreads / 32) * sizeof(float), s>>>(
                        x, xn, rstd, wn, eps_n, LSEI(j, n), A(j, n), PV(j), RP(j), Wj(j), Wj(j) + d_, N_, d_);
            }
        });
        LDM_LAUNCH_CHECK();
    }
    // Sublayer j's row (position >= 2 of block n) of the two-phase aggregates / dx stash.
    T* A(int j, int n) const { return rows_.ptr + (int64_t)(j - n - 1) * N_ * d_; }
    float* LSEI(int j, int n) const { return lse_.ptr + (int64_t)(j - n - 1) * N_; }
    float* BP(int i) const { return co_.ptr + (int64_t)(i - 2) * N_; }  // position i >= 2 (E: the next plane)
    float* E(int i) const { return co_.ptr + ((int64_t)(smax_ - 1) + i - 2) * N_; }

    // Two-phase backward of Block sublayer j (position i of block n): i >= 2 updates p's gradient now
    // and stashes dx_j, β_j and e_j; i = 1 (the last of the block in backward order) flushes the whole
    // block into the block sources' gradients.
    void block_backward_2p(int j, const T* dx, cudaStream_t s) {
        int n, i;
        locate(j, &n, &i);
        const int j0 = j - i + 1, ns = block_len(n);
        ar_detail::dispatch_vpt(d_, [&](auto c) {
            constexpr int VPT = decltype(c)::value;
            if (i >= 2) {
                const size_t psm = 2 * 3 * (ar_detail::kThreads / 32) * sizeof(float);
                const int nbk = persistent_grid(ar_detail::block_p_backward_kernel<T, VPT>, ar_detail::kThreads, psm,
                                                bwd_blocks());
                ar_detail::block_p_backward_kernel<T, VPT><<<nbk, ar_detail::kThreads, psm, s>>>(
                    dq_part_.ptr, BP(i), E(i), A(j, n), dx, PV(j), RP(j), DU(n), LSEI(j, n), Wj(j), Wj(j) + d_, N_, d_);
                LDM_LAUNCH_CHECK();
                ar_detail::dq_reduce_kernel<float><<<(unsigned)ceil_div(d_, 256), 256, 0, s>>>(
                    GWj(j), GWj(j) + d_, dq_part_.ptr, nbk, Wj(j), Wj(j) + d_, d_);
                LDM_LAUNCH_CHECK();
                return;
            }
            const size_t fsm = ar_detail::flush2_smem_floats(ns, d_, n) * sizeof(float);
            const int nbk =
                persistent_grid(ar_detail::block_flush2_kernel<T, VPT>, ar_detail::kThreads, fsm, bwd_blocks());
            ar_detail::block_flush2_kernel<T, VPT><<<nbk, ar_detail::kThreads, fsm, s>>>(
                dq2_part_.ptr, ns > 1 ? BP(2) : nullptr, ns > 1 ? E(2) : nullptr, dx, ns > 1 ? A(j0 + 1, n) : nullptr,
                U(0), RU(0), DU(0), n, Wj(j0), ns, N_, d_);
            LDM_LAUNCH_CHECK();
            dim3 rg((unsigned)ceil_div(d_, 256), (unsigned)ns);
            ar_detail::dq_reduce_multi_kernel<float><<<rg, 256, 0, s>>>(GWj(j0), dq2_part_.ptr, nbk, ns, Wj(j0), d_);
            LDM_LAUNCH_CHECK();
        });
    }

    void to_act(T* out, const float* in, cudaStream_t s) {
        const int64_t n = (int64_t)N_ * d_;
        const unsigned b = (unsigned)std::min<int64_t>(std::max<int64_t>(ceil_div(n, 256), 1), 65535 * 16);
        ar_detail::to_act_kernel<T><<<b, 256, 0, s>>>(out, in, n);
        LDM_LAUNCH_CHECK();
    }
};

// ==== the trainer ================================================================================

void check_gpu_scheme(const ModelConfig& cfg) {
    if (cfg.scheme == "hc" || cfg.scheme == "mhc") {
        const int n = cfg.hc_streams;
        if (n != 1 && n != 2 && n != 3 && n != 4 && n != 8)
            throw Error(strprintf("hc/mhc on the GPU: --hc-streams %d is not supported (1, 2, 3, 4, 8)", n));
        return;
    }
    for (const char* k : {"preln", "attnres-full", "attnres-block"})
        if (cfg.scheme == k) return;
    if (cfg.scheme == "ldm") throw Error("scheme 'ldm' runs on the GPU in train_ldm, not train_gpt_baselines");
    throw Error("unknown scheme '" + cfg.scheme + "' (train_gpt_baselines supports: preln, hc, mhc, attnres-full, attnres-block)");
}

template <typename T>
std::unique_ptr<GpuScheme<T>> make_gpu_scheme(const ModelConfig& cfg) {
    check_gpu_scheme(cfg);
    if (cfg.scheme == "preln") return std::make_unique<GpuPreLN<T>>(cfg);
    if (cfg.scheme == "hc") return std::make_unique<GpuHC<T>>(cfg, false);          // spec §2.2
    if (cfg.scheme == "mhc") return std::make_unique<GpuHC<T>>(cfg, true);          // spec §2.3
    if (cfg.scheme == "attnres-full") return std::make_unique<GpuAttnRes<T>>(cfg, false);  // spec §2.4
    if (cfg.scheme == "attnres-block") return std::make_unique<GpuAttnRes<T>>(cfg, true);
    throw Error("unknown scheme '" + cfg.scheme + "'");  // not reached: check_gpu_scheme
}

}  // namespace gpu
}  // namespace ldm

#ifndef TESTING
int main(int argc, char** argv) {
    return ldm::gpu::trainer_main(argc, argv, "train_gpt_baselines",
                                  "Train the spec §1 backbone with a baseline depth scheme (PreLN, HC, mHC, "
                                  "AttnRes Full and Block) on one or many GPUs (mpirun; doc/distributed.md). "
                                  "See doc/cuda.md.",
                                  "preln");
}
#endif
