// cpu/model.h — the CPU reference model: backbone of spec §1 with a pluggable
// depth-aggregation scheme (spec §2; PreLN now). Templated on the scalar type R (float, double).
//
// Data layout: activations row-major [N, C] with N = B*T tokens in (b, t) order; parameters in
// one flat array in param_specs() order (core/config.h), matrices [out, in] (y = x W^T).
// Spec: ../shared/spec/model.md §1, §2.1, §3. Walkthrough: doc/cpu_reference.md.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "cpu/scheme.h"

namespace ldm {
namespace cpu {

template <typename R>
struct Model {
    // Validates cfg (ldm::Error) and allocates params and grads (flat, param_specs order, zero).
    // Throws ldm::Error for an unknown scheme name.
    explicit Model(const ModelConfig& cfg);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    ModelConfig cfg;
    std::vector<ParamSpec> specs;  // param_specs(cfg)
    std::vector<R> params, grads;  // both [count_params(cfg)]

    // Spec §1 init, deterministic from seed (doc/cpu_reference.md "Init"): tensor i of
    // param_specs draws from its own stream splitmix64(seed, i), element k = k-th normal of it.
    void init(uint64_t seed);

    // tokens, targets: [B*T] int32 row-major (b, t); targets may be nullptr (logits only, loss =
    // NaN). Token/target ids must be in [0, V) and T <= cfg.seq_len, else ldm::Error.
    // Returns mean cross-entropy (nats) over the B*T targets. Activations sized lazily per (B,T).
    double forward(const int32_t* tokens, const int32_t* targets, int B, int T);
    // [B*T, Vp] logits of the last forward; columns >= V are 0 (never computed, no gradient).
    const R* logits() const;
    void zero_grad();
    // grads += scale * d(mean loss)/d(params). Needs a forward with targets, and at most one
    // backward per forward (ldm::Error else). Gradient accumulation: forward/backward(1/k) k times.
    void backward(double scale = 1.0);

    // Lookup of one tensor by its param_specs name (ldm::Error if absent).
    const ParamSpec& spec(const std::string& name) const;
    R* param(const std::string& name) { return params.data() + spec(name).offset; }
    R* grad(const std::string& name) { return grads.data() + spec(name).offset; }

    // Values held in activation and scratch buffers for the last (B, T) (params/grads excluded);
    // equals B*T*activation_values_per_token(cfg, T) (core/config.h), which the dry-run uses.
    int64_t activation_values() const;

    // The scheme's health numbers of the last step (Scheme::metrics; empty for PreLN).
    std::vector<std::pair<std::string, double>> scheme_metrics() const;
    // The scheme itself (its saved state across a resume, its data-parallel hook).
    Scheme<R>& scheme();

    int last_B() const { return B_; }
    int last_T() const { return T_; }

   private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int B_ = 0, T_ = 0;
};

// The spec §1 init of Model::init on a bare flat array laid out as param_specs(cfg) (backbone and
// scheme tensors), so the GPU trainers start from exactly the CPU reference's weights without
// building a Model. Model::init(seed) == init_params(cfg, params.data(), seed).
template <typename R>
void init_params(const ModelConfig& cfg, R* params, uint64_t seed);

extern template struct Model<float>;
extern template struct Model<double>;

}  // namespace cpu
}  // namespace ldm
