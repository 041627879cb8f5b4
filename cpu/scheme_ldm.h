// cpu/scheme_ldm.h — Linear Depth Memory (spec §2.5) for the CPU reference.
//
// State per token: the residual h (or c for --no-residual) [d], and per memory head h the memory
// S [d_v, d_k] and (rls) the inverse covariance P [d_k, d_k], in the scalar type R of the build.
// Writes i = 0..D: write 0 stores the embedding (k_0 = L2n(W_k^0 e), v_0 = e), write j the
// output o_j of sublayer j; sublayer j reads the memory before its own write; the readout makes
// one final read. Per token-head math lives in math/ldm_math.h (LDM_HD, shared with CUDA).
//
// Training modes (ModelConfig::ldm_mode, ldm_checkpoint_every; not part of the model identity):
//   store      keeps (S, P) after every write (reference);
//   unwind     keeps only the final state and inverts each write in backward (rls, outer); the
//              recovered initial state is compared with (0, I/delta) after every backward
//              (metrics ldm_drift_S = max|S~_0|, ldm_drift_P = max|delta P~_0 - I|); when the
//              drift exceeds ldm_drift_tol the scheme switches to checkpointed segments from
//              the NEXT step on (the step that detected it already used unwound states) with
//              c = ldm_checkpoint_every, or round(sqrt(D+1)) when that is 0; a warning is printed
//              once and metrics report ldm_fallback = 1;
//   c > 0      (ldm_checkpoint_every, with store or unwind) keeps the states after writes
//              0, c, 2c, ... and unwinds inside segments (rls, outer) or recomputes the segment
//              forward from its checkpoint (delta); drift = max deviation of an unwound state
//              from the stored checkpoint it reaches;
//   window w   (rls only) forward applies w writes at once (Woodbury, spec §2.5) and gives reads
//              inside a window the pending writes exactly through the Cholesky factor of C, grown
//              one row per write (ldm_math.h window_*); backward UNWINDS like unwind mode (keeps
//              only the final state; drift check after every backward). On drift above the
//              tolerance (from the next step), or when ldm_checkpoint_every > 0 is set, it keeps
//              the state at each window start instead and recomputes a window's states from its
//              start by sequential writes (exact); ckpt_ then reads w (metrics ldm_ckpt = w).
#pragma once
#include <algorithm>
#include <string>

#include "cpu/scheme.h"

namespace ldm {
namespace cpu {

// Values of the memory state (S and P over all heads) per token: H_m (d_v d_k + d_k^2) for rls,
// H_m d_v d_k for delta/outer.
int64_t ldm_state_size(const ModelConfig& c);
// Memory-state values kept per token for backward in the configured mode: store (D+1) states;
// unwind 1 (the final state); checkpoint-every c: ceil((D+1)/c) + 1.
int64_t ldm_backward_state_values(const ModelConfig& c);
// All values the LDM scheme allocates per token (state, saved inputs of every write and read,
// gradient buffers); what Scheme::state_values_per_token returns.
int64_t ldm_scheme_values_per_token(const ModelConfig& c);

template <typename R>
struct LDMScheme final : Scheme<R> {
    explicit LDMScheme(const ModelConfig& cfg);  // ldm::Error for window mode with delta/outer
    void bind(const R* params, R* grads) override;
    void init_params(R* params, uint64_t seed, uint64_t first_index) override;
    void resize(int B, int T) override;
    void begin(const R* e) override;
    void input(int j, R* x) override;
    void output(int j, const R* o) override;
    void readout(R* y) override;
    void readout_backward(const R* dy) override;
    void output_backward(int j, R* d_o) override;
    void input_backward(int j, const R* dx) override;
    void begin_backward(R* de) override;
    int64_t state_values_per_token() const override {
        ModelConfig c = cfg_;  // the interval in use (a fallback may have set one)
        c.ldm_checkpoint_every = ckpt_;
        return ldm_scheme_values_per_token(c);
    }
    std::vector<std::pair<std::string, double>> metrics() const override;

    // Test hooks: the live state [N, ST] (ST = ldm_state_size; per token heads in order, each
    // S then P) and the current checkpoint interval (0 = pure store/unwind).
    const std::vector<R>& state() const { return cur_; }
    int checkpoint_every() const { return ckpt_; }

   private:
    void write_forward(int i, const R* o);       // k/beta for write i from o, apply the write
    void write_backward(int i, R* d_o);          // VJP of write i (state: after -> before)
    void read_forward(int j, const R* src, R* r);  // q_j from src, r = S q
    void read_backward(int j, const R* src, const R* dr, R* dsrc);
    void prev_state(int i);                      // cur_: state after write i -> before write i
    void record_drift(const R* ref, bool init);  // compares cur_ with ref (or the init state)
    void window_append(int n, int h, int i, const R* k, const R* v, R* u);
    void window_read(int n, int h, int m, const R* q, R* r, R* scr);
    void window_flush(int n, int h, int i, R* scr);
    size_t scr_size() const { return (size_t)std::max(4 * dk_ + 2 * dv_, w_ * dk_ + dk_ + w_); }

    ModelConfig cfg_;
    int d_, D_, Hm_, dk_, dv_, HK_, SS_, PP_, ST_;
    bool rls_, delta_, outer_, residual_, forget_;
    bool unwind_;      // unwind (vs store) in the configured mode
    bool window_ = false;
    int w_ = 1;
    int ckpt_;         // checkpoint interval in use (0 = none)
    bool warned_ = false, fell_back_ = false;
    double drift_S_ = 0, drift_P_ = 0;
    // parameters (params_/grads_ views)
    std::vector<const R*> Wk_, Wq_, A_, Wb_, Bb_;  // Wq_/A_ indexed 1..D, D+1 = final
    std::vector<R*> gWk_, gWq_, gA_, gWb_, gBb_;
    const R* theta_ = nullptr;
    R* gtheta_ = nullptr;
    std::vector<R> lam_;  // [(D+1) * Hm] lambda per write and head
    // activations
    int N_ = 0;
    std::vector<R> src_, O_, Qn_, Qnrm_, Kn_, Knrm_, beta_;
    std::vector<R> Kt_, Et_, Lc_;  // window mode: pending writes per token-head
    std::vector<R> cur_, stored_, dS_, dsrc_, tmp_, raw_, draw_, dtok_, scratch_;
};

}  // namespace cpu
}  // namespace ldm
