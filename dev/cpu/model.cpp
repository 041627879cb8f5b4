// dev/cpu/model.cpp — the CPU reference model (work in progress: interface only).
#include "dev/cpu/model.h"

#include <cmath>

#include "core/common.h"

namespace ldm {
namespace cpu {

template <typename R>
struct Model<R>::Impl {
    std::unique_ptr<Scheme<R>> scheme;
};

template <typename R>
Model<R>::Model(const ModelConfig& c) : cfg(c), specs(param_specs(c)), impl_(new Impl) {
    impl_->scheme = make_scheme<R>(cfg);
    int64_t n = count_params(cfg);
    params.assign(n, R(0));
    grads.assign(n, R(0));
}
template <typename R>
Model<R>::~Model() = default;
template <typename R>
void Model<R>::init(uint64_t) { throw Error("Model::init: not implemented yet"); }
template <typename R>
double Model<R>::forward(const int32_t*, const int32_t*, int, int) {
    throw Error("Model::forward: not implemented yet");
}
template <typename R>
const R* Model<R>::logits() const { return nullptr; }
template <typename R>
void Model<R>::zero_grad() { std::fill(grads.begin(), grads.end(), R(0)); }
template <typename R>
void Model<R>::backward(double) { throw Error("Model::backward: not implemented yet"); }
template <typename R>
const ParamSpec& Model<R>::spec(const std::string& name) const {
    for (const auto& s : specs)
        if (s.name == name) return s;
    throw Error("model: no parameter named '" + name + "'");
}

template struct Model<float>;
template struct Model<double>;

}  // namespace cpu
}  // namespace ldm
