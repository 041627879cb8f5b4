// cpu/scheme.h — the depth-aggregation scheme interface (spec §2).
//
// A scheme owns all cross-layer state. The backbone (cpu/model.cpp) only ever sees
//   x_j = scheme.input(j)      the input of sublayer j (before RMSNorm_j), j = 1..D
//   scheme.output(j, o_j)      the sublayer's output o_j = f_j(RMSNorm_j(x_j))
//   y   = scheme.readout()     what goes into RMSNorm_f
// and the reverse sequence in backward:
//   scheme.readout_backward(dy)         dL/dy
//   for j = D..1:
//     scheme.output_backward(j, do_j)   writes dL/do_j (all later uses of o_j are done)
//     scheme.input_backward(j, dx_j)    accepts dL/dx_j (the backbone's part for sublayer j)
//   scheme.begin_backward(de)           writes dL/de (embedding output)
// All tensors are [N, d] row-major with N = B*T tokens. Parameter gradients of the scheme go to
// its slice of the model's flat grads array (bound by bind()), accumulated (+=) like every other
// gradient; the loss scale reaches the scheme through dy and do_j, so schemes never see it.
// The sublayer index j is 1-based as in the spec (odd = attention, even = MLP).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace ldm {
namespace cpu {

template <typename R>
struct Scheme {
    virtual ~Scheme() = default;
    // params/grads: the scheme's block of the flat arrays, laid out as scheme_param_specs(cfg)
    // (nullptr when the scheme has no parameters). Called once by the model after allocation.
    virtual void bind(const R* params, R* grads) = 0;
    // Spec init of the scheme's parameters (its block of the flat array), deterministic from
    // seed with the same RNG as the backbone (cpu/rng.h): scheme tensor k (in
    // scheme_param_specs order) draws from init_stream(seed, first_index + k), first_index being
    // its position in param_specs. Called from Model::init.
    virtual void init_params(R* params, uint64_t seed, uint64_t first_index) = 0;
    // Sizes the state for N tokens (B sequences of T); called before each forward.
    virtual void resize(int B, int T) = 0;
    // Forward.
    virtual void begin(const R* e) = 0;              // e [N, d]: the embedding output
    virtual void input(int j, R* x) = 0;             // writes x_j [N, d]
    virtual void output(int j, const R* o) = 0;      // reads o_j [N, d]
    virtual void readout(R* y) = 0;                  // writes y [N, d]
    // Backward (see order above).
    virtual void readout_backward(const R* dy) = 0;
    virtual void output_backward(int j, R* d_o) = 0;     // writes (=) dL/do_j
    virtual void input_backward(int j, const R* dx) = 0; // reads dL/dx_j
    virtual void begin_backward(R* de) = 0;              // writes (=) dL/de
    // Values stored per token (for memory estimates / tests).
    virtual int64_t state_values_per_token() const = 0;
    // Health numbers of the last step for the training log, e.g. LDM's unwind drift
    // {"ldm_drift_S", ...}; empty for PreLN.
    virtual std::vector<std::pair<std::string, double>> metrics() const { return {}; }
    // What the scheme decided during training that later steps depend on (LDM: its drift
    // fallback, math/ldm_math.h ldm_fallback_saved), name -> value; the trainer saves it in the
    // training state (extra.scheme_state) and hands it back on resume. Empty for most schemes.
    virtual std::vector<std::pair<std::string, double>> saved_state() const { return {}; }
    // Restores saved_state() of a checkpoint; returns a line for the console ("" = nothing to
    // say). ldm::Error for a malformed entry.
    virtual std::string restore_state(const std::vector<std::pair<std::string, double>>&) { return ""; }
    // Data parallel: `any_rank(flag)` returns the OR of the flag over every rank (a collective:
    // every rank calls it at the same points); host-side decisions that must agree over the ranks
    // go through it (LDM's drift check). `warns`: this rank prints the scheme's warnings (rank 0).
    // One process: the flag itself, warnings printed.
    void set_data_parallel(std::function<bool(bool)> any_rank, bool warns) {
        any_rank_ = std::move(any_rank);
        warns_ = warns;
    }

   protected:
    std::function<bool(bool)> any_rank_ = [](bool flag) { return flag; };
    bool warns_ = true;
};

// Factory: the scheme named by cfg.scheme (preln, hc, mhc, attnres-full, attnres-block, ldm).
// Throws ldm::Error for an unknown name.
template <typename R>
std::unique_ptr<Scheme<R>> make_scheme(const ModelConfig& cfg);

// PreLN (spec §2.1): state h; h_0 = e; x_j = h_{j-1}; h_j = h_{j-1} + o_j; readout h_D.
// Backward keeps dh = dL/dh_j: readout_backward sets dh = dy; output_backward copies
// dL/do_j = dh; input_backward adds dh += dx_j; begin_backward returns de = dh.
template <typename R>
struct PreLN final : Scheme<R> {
    explicit PreLN(const ModelConfig& cfg) : d_(cfg.d_model) {}
    void bind(const R*, R*) override {}
    void init_params(R*, uint64_t, uint64_t) override {}
    void resize(int B, int T) override;
    void begin(const R* e) override;
    void input(int j, R* x) override;
    void output(int j, const R* o) override;
    void readout(R* y) override;
    void readout_backward(const R* dy) override;
    void output_backward(int j, R* d_o) override;
    void input_backward(int j, const R* dx) override;
    void begin_backward(R* de) override;
    int64_t state_values_per_token() const override { return 2 * (int64_t)d_; }

   private:
    int d_;
    size_t n_ = 0;         // N * d
    std::vector<R> h_, dh_;
};

}  // namespace cpu
}  // namespace ldm
