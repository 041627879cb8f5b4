// cpu/scheme.cpp — scheme factory and PreLN (spec §2.1).
#include "cpu/scheme.h"

#include <algorithm>

#include "core/common.h"
#include "cpu/scheme_ldm.h"
#include "cpu/scheme_attnres.h"
#include "cpu/scheme_hc.h"

namespace ldm {
namespace cpu {

template <typename R>
std::unique_ptr<Scheme<R>> make_scheme(const ModelConfig& cfg) {
    if (cfg.scheme == "preln") return std::make_unique<PreLN<R>>(cfg);
    if (cfg.scheme == "ldm") return std::make_unique<LDMScheme<R>>(cfg);
    if (cfg.scheme == "hc") return std::make_unique<HC<R>>(cfg);
    if (cfg.scheme == "mhc") return std::make_unique<MHC<R>>(cfg);
    if (cfg.scheme == "attnres-full") return std::make_unique<AttnRes<R>>(cfg, false);
    if (cfg.scheme == "attnres-block") return std::make_unique<AttnRes<R>>(cfg, true);
    throw Error("scheme '" + cfg.scheme +
                "' is unknown (available: preln, hc, mhc, attnres-full, attnres-block, ldm)");
}

template <typename R>
void PreLN<R>::resize(int B, int T) {
    n_ = (size_t)B * T * d_;
    h_.assign(n_, R(0));
    dh_.assign(n_, R(0));
}
template <typename R>
void PreLN<R>::begin(const R* e) { std::copy(e, e + n_, h_.begin()); }
template <typename R>
void PreLN<R>::input(int, R* x) { std::copy(h_.begin(), h_.end(), x); }
template <typename R>
void PreLN<R>::output(int, const R* o) {
    R* h = h_.data();
    const size_t n = n_;
#pragma omp parallel for simd schedule(static) if (n >= (1 << 15))
    for (size_t i = 0; i < n; i++) h[i] += o[i];
}
template <typename R>
void PreLN<R>::readout(R* y) { std::copy(h_.begin(), h_.end(), y); }
template <typename R>
void PreLN<R>::readout_backward(const R* dy) { std::copy(dy, dy + n_, dh_.begin()); }
template <typename R>
void PreLN<R>::output_backward(int, R* d_o) { std::copy(dh_.begin(), dh_.end(), d_o); }
template <typename R>
void PreLN<R>::input_backward(int, const R* dx) {
    R* dh = dh_.data();
    const size_t n = n_;
#pragma omp parallel for simd schedule(static) if (n >= (1 << 15))
    for (size_t i = 0; i < n; i++) dh[i] += dx[i];
}
template <typename R>
void PreLN<R>::begin_backward(R* de) { std::copy(dh_.begin(), dh_.end(), de); }

template struct PreLN<float>;
template struct PreLN<double>;
template std::unique_ptr<Scheme<float>> make_scheme<float>(const ModelConfig&);
template std::unique_ptr<Scheme<double>> make_scheme<double>(const ModelConfig&);

}  // namespace cpu
}  // namespace ldm
