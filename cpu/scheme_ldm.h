// cpu/scheme_ldm.h — Linear Depth Memory (spec §2.5) for the CPU reference.
//
// State per token: the residual h (or c for --no-residual) [d], and per memory head h the memory
// S [d_v, d_k] and (rls) the inverse covariance P [d_k, d_k], in the scalar type R of the build.
// Writes i = 0..D: write 0 stores the embedding (k_0 = L2n(W_k^0 e), v_0 = e), write j the
// output o_j of sublayer j; sublayer j reads the memory before its own write; the readout makes
// one final read. Per token-head math lives in math/ldm_math.h (LDM_HD, shared with CUDA).
//
// Layout: the memory states (S, P per head), their gradients and the window buffers are TILED:
// tokens in groups of W = Lane<R>::W (16 floats / 8 doubles; cpu/lanes.h), the last group
// padded with inert tokens (k = v = q = 0). Per (tile t, head h) a block of ST/H_m Lanes holds
// element e of the head's S then P for the W tokens of the tile; the ldm_math.h functions run
// on Lane<R> and so update W tokens per call with exactly the scalar per-token operations.
// Projections, keys, queries and all [N, ...] activations stay token-major (GEMMs, L2n).
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

#include "cpu/lanes.h"
#include "cpu/scheme.h"
#include "math/ldm_math.h"

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
    std::vector<std::pair<std::string, double>> saved_state() const override {
        return ldm_fallback_saved(fell_back_, ckpt_, window_, settled_);
    }
    std::string restore_state(const std::vector<std::pair<std::string, double>>& saved) override;

    // Test hooks: a copy of the live state [N, ST] (ST = ldm_state_size; per token heads in
    // order, each S then P) and the current checkpoint interval (0 = pure store/unwind).
    std::vector<R> state() const;
    int checkpoint_every() const { return ckpt_; }

   private:
    using LV = Lane<R>;
    static constexpr int L = LV::W;  // tokens per tile
    // k/beta for write i from o, apply the write to the state `from` (nullptr: the initial
    // state), result in dst (== from: in place); live_ = dst after.
    void write_forward(int i, const R* o, const LV* from, LV* dst);
    LV* write_dst(int i);                          // where write i's result goes (mode)
    void write_backward(int i, R* d_o, bool back);  // VJP of write i (state: after -> before)
    void read_forward(int j, const R* src, R* x);   // q_j from src, r = S q, x = src + a r (or r)
    void read_backward(int j, const R* src, const R* dx, R* dsrc);
    void prev_state(int i);                      // live_: state after write i -> before write i
    void init_state(LV* st);                     // st = (0, I/delta) per token-head
    void record_drift(const LV* ref, bool init);  // compares cur_ with ref (or the init state)
    void window_append(int t, int h, int i, const LV* k, const LV* v, LV* u);
    void window_read(int t, int h, int m, const LV* q, LV* r, LV* scr);
    void window_flush(int t, int h, int i, LV* scr);
    size_t scr_size() const { return (size_t)std::max(4 * dk_ + 2 * dv_, w_ * dk_ + dk_ + w_); }
    size_t blk(int t, int h) const { return ((size_t)t * Hm_ + h) * (SS_ + PP_); }  // (tile, head)
    size_t lanes_per_state() const { return (size_t)NT_ * ST_; }
    LV* lane_scratch() const;  // this thread's block of lscr_
    // Tile t's W tokens of a token-major array: out[i] lane l = src[(tW + l) ld + off + i],
    // i < cnt (0 for padding tokens); scatter writes (add: adds) them back for real tokens.
    void gather(LV* out, const R* src, int t, size_t ld, int off, int cnt) const;
    void scatter(const LV* in, R* dst, int t, size_t ld, int off, int cnt, bool add) const;

    ModelConfig cfg_;
    int d_, D_, Hm_, dk_, dv_, HK_, SS_, PP_, ST_;
    bool rls_, delta_, outer_, residual_, forget_;
    bool unwind_;      // unwind (vs store) in the configured mode
    bool window_ = false;
    int w_ = 1;
    int ckpt_;         // checkpoint interval in use (0 = none)
    bool fell_back_ = false;
    bool settled_ = false;  // a fallback interval's drift met the tolerance (saved for the GPU trainer)
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
    int NT_ = 0;  // tiles of L tokens
    std::vector<LV> Kt_, Et_, Lc_;  // window mode: pending writes per token-head (tiled)
    std::vector<LV> cur_, stored_, dS_;  // live state, kept states, dL/dstate (tiled)
    std::vector<R> dsrc_, tmp_, raw_, draw_, dtok_;
    mutable std::vector<LV> lscr_;  // per-thread lane scratch
    size_t lscr_per_thread_ = 0;
    // The state in use: forward, after the last write (store mode: its slot of stored_; else
    // cur_); backward, the state before the write being differentiated (= the one its read saw).
    LV* live_ = nullptr;
};

}  // namespace cpu
}  // namespace ldm
