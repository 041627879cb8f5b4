// dev/cuda/scheme_check.cuh — shared driver of the scheme workbenches (dev/cuda/hc.cu,
// dev/cuda/attnres.cu): runs the CPU reference Scheme<double> (cpu/scheme.h make_scheme) and a
// GpuScheme<T> through the same sequence
//   begin(e) / input_norm(j) / output(j, o_j) ... / readout / readout_backward(dy) /
//   output_backward(j) / input_backward_next(j, dx_j, d_o buffer) ... / begin_backward
// with the same random parameters (rounded to T, master = the rounded values) and tensors, and
// compares every x_j, xn_j (vs cpu::rmsnorm_forward of the CPU x_j), y, d_o_j, de and every scheme
// parameter gradient tensor (accumulated onto non-zero initial gradients). Prints CHECK lines
// (doc/cuda.md workbench convention) and times forward+backward with CUDA events (BENCH lines).
#pragma once
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/config.h"
#include "cuda/common.cuh"
#include "cuda/scheme.cuh"
#include "cpu/ops.h"
#include "cpu/rng.h"
#include "cpu/scheme.h"

namespace ldm {
namespace gpu {
namespace wb {

struct Shape {
    int B, T, d, n_layer, streams, blocks;
    std::string str() const {
        return strprintf("B%dT%dd%dD%dn%dk%d", B, T, d, 2 * n_layer, streams, blocks);
    }
};

inline ModelConfig make_config(const std::string& scheme, const Shape& s) {
    ModelConfig c = preset_config("tiny", 101);
    c.scheme = scheme;
    c.d_model = s.d;
    c.n_layer = s.n_layer;
    c.hc_streams = s.streams;
    c.attnres_blocks = s.blocks;
    c.seq_len = std::max(c.seq_len, s.T);
    return c;
}

// Which checks a workbench's run_checks runs: Full (the workbench on a GPU: every shape), Quick
// (CI's emulation tests: all but the realistic shape) or Race (the same tests built with
// ThreadSanitizer: Quick less the variants production does not use at the shape with the most
// tokens, which holds most of the emulated work; production's kernels still run at every Quick
// shape, and every variant at the others).
enum class Checks { Full, Quick, Race };

template <typename T>
using Factory = std::function<std::unique_ptr<GpuScheme<T>>(const ModelConfig&)>;

// Rounds a double to T and back (so the CPU sees exactly the GPU's values).
template <typename T>
inline double rnd(double v) { return (double)to_f(from_f<T>((float)v)); }


template <typename T>
inline std::vector<double> rand_vec(int64_t n, uint64_t seed, uint64_t stream, double scale) {
    std::vector<double> v((size_t)n);
    const uint64_t s0 = init_stream(seed, stream);
    for (int64_t i = 0; i < n; i++) v[(size_t)i] = rnd<T>(scale * stream_normal(s0, (uint64_t)i));
    return v;
}

struct Worst {
    double rel = 0, max_abs = 0;
    std::string where;
    void add(const Compare& c, const std::string& w) {
        double r = c.finite ? c.rel : INFINITY;
        if (r > rel || where.empty()) {
            rel = r;
            where = w;
        }
        max_abs = std::max(max_abs, c.finite ? c.max_abs : INFINITY);
    }
};

// The sensitivity references' inputs (the condition-scaled bound of check_scheme_impl and of
// dev/cuda/ldm.cu): v with every element multiplied by 1 + δ, δ uniform in [−u, u], drawn from
// stream `stream` of `seed`. kSensDraws such draws per check.
constexpr int kSensDraws = 4;
inline std::vector<double> perturbed(const std::vector<double>& v, uint64_t seed, uint64_t stream, double u) {
    const uint64_t s0 = init_stream(seed, stream);
    std::vector<double> w(v.size());
    for (size_t k = 0; k < v.size(); k++) w[k] = v[k] * (1.0 + u * (2.0 * stream_uniform(s0, (uint64_t)k) - 1.0));
    return w;
}

// The kSensDraws sensitivity references: reference(params, e, dy, o, dx) again with every input
// perturbed (perturb(v) returns v with a fresh draw; o_j and dx_j for j = 1..D, index 0 unused).
template <typename Perturb, typename Reference>
auto sensitivity_refs(const Perturb& perturb, const Reference& reference, const std::vector<double>& params,
                      const std::vector<double>& e, const std::vector<double>& dy,
                      const std::vector<std::vector<double>>& o, const std::vector<std::vector<double>>& dx, int D) {
    std::vector<decltype(reference(params, e, dy, o, dx))> sens;
    for (int r = 0; r < kSensDraws; r++) {
        std::vector<std::vector<double>> op(D + 1), dxp(D + 1);
        for (int j = 1; j <= D; j++) {
            op[j] = perturb(o[j]);
            dxp[j] = perturb(dx[j]);
        }
        sens.push_back(reference(perturb(params), perturb(e), perturb(dy), op, dxp));
    }
    return sens;
}

inline Compare compare_d(const std::vector<float>& a, const std::vector<double>& b, double floor_norm = 0) {
    std::vector<float> bf(b.size());
    for (size_t i = 0; i < b.size(); i++) bf[i] = (float)b[i];
    Compare c = compare(a.data(), bf.data(), (int64_t)a.size());
    if (floor_norm > 0) {  // relative to max(||b||, floor_norm)
        double num = 0, den = 0;
        for (size_t i = 0; i < b.size(); i++) {
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            den += b[i] * b[i];
        }
        c.rel = std::sqrt(num) / std::max(std::sqrt(den), floor_norm);
    }
    return c;
}

// One CHECK line; returns pass.
inline bool report(const char* family, const std::string& variant, const char* dtype, const std::string& shape,
                   const std::string& what, const Worst& w, double tol) {
    const bool ok = std::isfinite(w.rel) && w.rel <= tol;
    std::printf("CHECK %s %s.%s %s %s rel=%.3e max_abs=%.3e %s%s%s\n", family, variant.c_str(), what.c_str(), dtype,
                shape.c_str(), w.rel, w.max_abs, ok ? "PASS" : "FAIL", ok ? "" : "  worst: ", ok ? "" : w.where.c_str());
    return ok;
}

// Runs the comparison for one scheme / shape / dtype. tol_act: x, xn, y, d_o, de; tol_grad: the
// parameter gradients (per tensor, relative to max(||g_cpu||, f·max over tensors), f = 1e-3 for
// fp32 and 1e-2 for bf16, see grad_floor). results: when not null, every GPU result compared (x_j,
// y, d_o_j, de, the gradients, in that order) is appended to it, so that a workbench can compare
// two paths bit for bit.
template <typename T>
bool check_scheme_impl(const char* family, const std::string& scheme, const Shape& sh, const Factory<T>& make,
                       double tol_act, double tol_grad, uint64_t seed, double param_scale, std::string label,
                       std::vector<float>* results) {
    auto capture = [results](const std::vector<float>& v) {
        if (results) results->insert(results->end(), v.begin(), v.end());
    };
    const ModelConfig c = make_config(scheme, sh);
    const int B = sh.B, Tn = sh.T, d = sh.d, D = c.n_sublayers();
    const int64_t N = (int64_t)B * Tn, Nd = N * d;
    const auto specs = scheme_param_specs(c);
    int64_t P = 0;
    for (const auto& s : specs) P = std::max(P, s.offset + s.numel);

    // Parameters: spec init, then + param_scale·N(0,1) (generic point), rounded to T.
    std::vector<double> params((size_t)P, 0.0);
    auto cs = cpu::make_scheme<double>(c);
    cs->init_params(params.data(), seed, 0);
    {
        const uint64_t s0 = init_stream(seed, 777);
        for (int64_t k = 0; k < P; k++) params[(size_t)k] = rnd<T>(params[(size_t)k] + param_scale * stream_normal(s0, (uint64_t)k));
    }
    const auto e = rand_vec<T>(Nd, seed, 1, 1.0);
    const auto dy = rand_vec<T>(Nd, seed, 2, 1.0);
    const auto wn = rand_vec<T>(d, seed, 3, 1.0);
    std::vector<std::vector<double>> o(D + 1), dx(D + 1);
    for (int j = 1; j <= D; j++) {
        o[j] = rand_vec<T>(Nd, seed, 100 + j, 1.0);
        dx[j] = rand_vec<T>(Nd, seed, 300 + j, 1.0);
    }

    // CPU reference (double), gradients from zero.
    struct Ref {
        std::vector<double> grads, y, de;
        std::vector<std::vector<double>> X, DO;
    };
    auto reference = [&](const std::vector<double>& prm, const std::vector<double>& e_, const std::vector<double>& dy_,
                         const std::vector<std::vector<double>>& o_, const std::vector<std::vector<double>>& dx_) {
        Ref r;
        r.grads.assign((size_t)P, 0.0);
        r.X.resize(D + 1);
        r.DO.resize(D + 1);
        r.y.resize((size_t)Nd);
        r.de.resize((size_t)Nd);
        auto cr = cpu::make_scheme<double>(c);
        cr->bind(prm.data(), r.grads.data());
        cr->resize(B, Tn);
        cr->begin(e_.data());
        for (int j = 1; j <= D; j++) {
            r.X[j].resize((size_t)Nd);
            cr->input(j, r.X[j].data());
            cr->output(j, o_[j].data());
        }
        cr->readout(r.y.data());
        cr->readout_backward(dy_.data());
        for (int j = D; j >= 1; j--) {
            r.DO[j].resize((size_t)Nd);
            cr->output_backward(j, r.DO[j].data());
            cr->input_backward(j, dx_[j].data());
        }
        cr->begin_backward(r.de.data());
        return r;
    };
    const Ref ref = reference(params, e, dy, o, dx);
    const std::vector<double>& grads = ref.grads;
    const std::vector<double>&y = ref.y, &de = ref.de;
    const std::vector<std::vector<double>>&X = ref.X, &DO = ref.DO;
    // Sensitivity reference: the same computation in double with every input (parameters, e, o_j,
    // dx_j, dy) multiplied by 1 + δ, δ uniform in [−u, u], u = T's unit roundoff (2^-8 bf16,
    // 2^-24 fp32), kDraws times. A result's movement m (RMS over the draws of ||ref_δ − ref||)
    // gives its condition number κ = m / (u·||ref||): about 1 for a well-conditioned tensor, large
    // for a sum with cancellation (HC/mHC's scalar gate gradients over a handful of tokens). The
    // GPU rounds its stored intermediates (streams, their gradients, o) to T at every sublayer,
    // so its error follows the usual bound c·κ·u·||ref||, and the check allows
    // tol·max(1, κ)·||ref|| = tol·max(||ref||, m / u) (beside the gradients' floor below).
    // Measured (bf16, dev/cuda/hc.cu's five small shapes, HC and mHC, seeds 11-50: 400 checks;
    // 146 tensors above the plain tol·max(||ref||, floor), all 1-4 element controller gradients
    // or HC's d-sized W rows at 3 tokens, failing 30% of the seeds): error / m at most 9.5 (mHC
    // a_res at 3 tokens), all others ≤ 7.9, against tol / u = 12.8 for gradients; well-
    // conditioned tensors (mHC φ_pre: κ ≈ 1.25 on average) keep about their plain tolerance.
    const double u = std::is_same<T, float>::value ? 0x1.0p-24 : 0x1.0p-8;
    uint64_t stream = 900;
    auto perturb = [&](const std::vector<double>& v) { return perturbed(v, seed, stream++, u); };
    // kDraws independent draws; a result's movement is the RMS over them of ||ref_δ − ref||.
    constexpr int kDraws = kSensDraws;
    const std::vector<Ref> sens = sensitivity_refs(perturb, reference, params, e, dy, o, dx, D);
    // RMS over the draws of ||pick(draw) − pick(ref)|| (over [off, off + n), all of it when n < 0).
    auto moved_by = [&](const std::function<const std::vector<double>&(const Ref&)>& pick, int64_t off = 0,
                        int64_t n = -1) {
        const std::vector<double>& b0 = pick(ref);
        if (n < 0) n = (int64_t)b0.size();
        double s2 = 0;
        for (const Ref& r : sens) {
            const std::vector<double>& a0 = pick(r);
            for (int64_t k = off; k < off + n; k++) s2 += (a0[(size_t)k] - b0[(size_t)k]) * (a0[(size_t)k] - b0[(size_t)k]);
        }
        return std::sqrt(s2 / kDraws);
    };
    // compare_d's floor_norm per result: m / u
    std::vector<double> fX(D + 1, 0.0), fDO(D + 1, 0.0);
    for (int j = 1; j <= D; j++) {
        fX[j] = moved_by([j](const Ref& r) -> const std::vector<double>& { return r.X[j]; }) / u;
        fDO[j] = moved_by([j](const Ref& r) -> const std::vector<double>& { return r.DO[j]; }) / u;
    }
    const double fy = moved_by([](const Ref& r) -> const std::vector<double>& { return r.y; }) / u;
    const double fde = moved_by([](const Ref& r) -> const std::vector<double>& { return r.de; }) / u;

    // GPU. Initial gradients g0 = 0.25·(CPU gradient) so that accumulation (+=) is exercised.
    std::vector<float> g0((size_t)P);
    for (int64_t k = 0; k < P; k++) g0[(size_t)k] = (float)(0.25 * grads[(size_t)k]);
    DeviceBuffer<T> dparams(std::max<int64_t>(P, 1));
    DeviceBuffer<float> dmaster(std::max<int64_t>(P, 1)), dgrads(std::max<int64_t>(P, 1));
    upload(dparams.ptr, params.data(), P);
    upload(dmaster.ptr, params.data(), P);
    upload(dgrads.ptr, g0.data(), P);
    DeviceBuffer<T> de_(Nd), dy_(Nd), dwn(d), dx_buf(Nd), dxn(Nd), dyo(Nd), dded(Nd), ddo(Nd), dob(Nd), ddx(Nd);
    DeviceBuffer<float> drstd(N);
    upload(de_.ptr, e.data(), Nd);
    upload(dy_.ptr, dy.data(), Nd);
    upload(dwn.ptr, wn.data(), d);
    cudaStream_t st = 0;
    auto gs = make(c);
    gs->bind(dparams.ptr, dmaster.ptr, dgrads.ptr);
    gs->resize(B, Tn);
    const float nanv = std::nanf("");
    const float eps = (float)c.norm_eps;
    Worst wx, wxn, wrs, wy, wdo, wde, wg;
    gs->begin(de_.ptr, st);
    for (int j = 1; j <= D; j++) {
        fill(dx_buf.ptr, Nd, nanv, st);
        fill(dxn.ptr, Nd, nanv, st);
        fill(drstd.ptr, N, nanv, st);
        gs->input_norm(j, dx_buf.ptr, dxn.ptr, drstd.ptr, dwn.ptr, eps, st);
        auto xg = download(dx_buf.ptr, Nd);
        auto xng = download(dxn.ptr, Nd);
        auto rsg = download(drstd.ptr, N);
        capture(xg);
        wx.add(compare_d(xg, X[j], fX[j]), strprintf("x_%d", j));
        // xn reference: RMSNorm of the GPU's own x (isolates the fused norm from upstream error).
        std::vector<double> xgd(xg.begin(), xg.end()), xnr((size_t)Nd), rsr((size_t)N);
        cpu::rmsnorm_forward(xnr.data(), rsr.data(), xgd.data(), wn.data(), (int)N, d, (double)eps);
        wxn.add(compare_d(xng, xnr), strprintf("xn_%d", j));
        wrs.add(compare_d(rsg, rsr), strprintf("rstd_%d", j));
        // o_j where the trainer's GEMM puts it (the scheme's output_buffer) for odd j, a buffer of
        // the caller's for even j (the copy path: inference, other callers)
        T* ob = j % 2 == 1 && gs->output_buffer(j) ? gs->output_buffer(j) : dob.ptr;
        upload(ob, o[j].data(), Nd);
        gs->output(j, ob, st);
    }
    fill(dyo.ptr, Nd, nanv, st);
    gs->readout(dyo.ptr, st);
    const auto yg = download(dyo.ptr, Nd);
    capture(yg);
    wy.add(compare_d(yg, y, fy), "y");
    gs->readout_backward(dy_.ptr, st);
    fill(ddo.ptr, Nd, nanv, st);
    for (int j = D; j >= 1; j--) {
        gs->output_backward(j, ddo.ptr, st);
        const auto dog = download(ddo.ptr, Nd);
        capture(dog);
        wdo.add(compare_d(dog, DO[j], fDO[j]), strprintf("d_o_%d", j));
        upload(ddx.ptr, dx[j].data(), Nd);
        // NaN again: whichever of input_backward_next(j) (into d_o_next, as HC / mHC do) and
        // output_backward(j-1) writes dL/do_{j-1}, every value must be written
        fill(ddo.ptr, Nd, nanv, st);
        gs->input_backward_next(j, ddx.ptr, ddo.ptr, st);
    }
    fill(dded.ptr, Nd, nanv, st);
    gs->begin_backward(dded.ptr, st);
    const auto deg = download(dded.ptr, Nd);
    capture(deg);
    wde.add(compare_d(deg, de, fde), "de");
    CUDA_CHECK(cudaDeviceSynchronize());
    auto gg = download(dgrads.ptr, P);
    capture(gg);
    double gmax = 0;
    for (const auto& s : specs) {
        double nrm = 0;
        for (int64_t k = 0; k < s.numel; k++) nrm += grads[(size_t)(s.offset + k)] * grads[(size_t)(s.offset + k)];
        gmax = std::max(gmax, std::sqrt(nrm));
    }
    // Floor of the per-tensor relative error: a tensor whose gradient is tiny next to the largest
    // one is compared against grad_floor·gmax. bf16: 1e-2 (the stream states hold 8 bits, about
    // 4e-3 relative; small tensors are projected remainders of coefficient gradients of size
    // ~gmax, e.g. mHC's res logits through the Sinkhorn Jacobian: at B2T33d67D6n4 the CPU's
    // |dL/dphi_res| of sublayer 3 is 1.1e-3·gmax, so bf16 noise of the size of gmax·1e-4 — what the
    // H200 showed — is 8% of its own norm). fp32: 1e-3.
    const double grad_floor = std::is_same<T, float>::value ? 1e-3 : 1e-2;
    for (const auto& s : specs) {
        std::vector<float> a((size_t)s.numel);
        std::vector<double> b((size_t)s.numel);
        for (int64_t k = 0; k < s.numel; k++) {
            a[(size_t)k] = gg[(size_t)(s.offset + k)] - g0[(size_t)(s.offset + k)];
            b[(size_t)k] = grads[(size_t)(s.offset + k)];
        }
        const double fs = moved_by([](const Ref& r) -> const std::vector<double>& { return r.grads; }, s.offset,
                                   s.numel) / u;
        wg.add(compare_d(a, b, std::max(grad_floor * gmax, fs)), s.name);
    }
    const char* dt = dtype_name<T>();
    const std::string shs = sh.str();
    bool ok = true;
    ok &= report(family, label, dt, shs, "x", wx, tol_act);
    ok &= report(family, label, dt, shs, "xn", wxn, tol_act);
    ok &= report(family, label, dt, shs, "rstd", wrs, tol_act);
    ok &= report(family, label, dt, shs, "y", wy, tol_act);
    ok &= report(family, label, dt, shs, "d_o", wdo, tol_act);
    ok &= report(family, label, dt, shs, "de", wde, tol_act);
    ok &= report(family, label, dt, shs, "grads", wg, tol_grad);
    return ok;
}

// check_scheme_impl, with an exception (e.g. a GEMM shape cuBLASLt rejects) reported as a FAIL
// line so that the remaining checks still run.
template <typename T>
bool check_scheme(const char* family, const std::string& scheme, const Shape& sh, const Factory<T>& make,
                  double tol_act, double tol_grad, uint64_t seed, double param_scale, std::string label = "",
                  std::vector<float>* results = nullptr) {
    if (label.empty()) label = scheme;
    try {
        return check_scheme_impl<T>(family, scheme, sh, make, tol_act, tol_grad, seed, param_scale, label, results);
    } catch (const std::exception& e) {
        std::printf("CHECK %s %s %s %s rel=- max_abs=- FAIL  exception: %s\n", family, label.c_str(), dtype_name<T>(),
                    sh.str().c_str(), e.what());
        (void)cudaGetLastError();
        return false;
    }
}

// Device fill with pseudo-random values in [-1, 1) (timing inputs; no host generation).
template <typename T>
__global__ void rand_fill_kernel(T* p, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = from_f<T>((float)(h & 0xffffff) / 8388608.f - 1.f);
    }
}
template <typename T>
inline void rand_fill(T* p, int64_t n, uint32_t seed) {
    rand_fill_kernel<T><<<1024, 256>>>(p, n, seed);
    LDM_LAUNCH_CHECK();
}

// Times the scheme's forward (begin, D × input_norm/output, readout) and backward
// (readout_backward, D × output_backward/input_backward, begin_backward) at the given shape with
// random inputs (o_j and dx_j share one buffer each) and spec-init parameters + 0.1 noise.
// bytes_per_token: the scheme's estimated global-memory traffic per token for fwd+bwd (GB/s).
template <typename T>
void bench_scheme_impl(const char* family, const std::string& scheme, const Shape& sh, const Factory<T>& make,
                       double bytes_per_token, int reps, const std::string& label) {
    const ModelConfig c = make_config(scheme, sh);
    const int B = sh.B, Tn = sh.T, d = sh.d, D = c.n_sublayers();
    const int64_t N = (int64_t)B * Tn, Nd = N * d;
    const auto specs = scheme_param_specs(c);
    int64_t P = 0;
    for (const auto& s : specs) P = std::max(P, s.offset + s.numel);
    std::vector<double> params((size_t)P, 0.0);
    auto cs = cpu::make_scheme<double>(c);
    cs->init_params(params.data(), 1, 0);
    const uint64_t s0 = init_stream(1, 777);
    for (int64_t k = 0; k < P; k++) params[(size_t)k] += 0.1 * stream_normal(s0, (uint64_t)k);
    DeviceBuffer<T> dparams(std::max<int64_t>(P, 1));
    DeviceBuffer<float> dmaster(std::max<int64_t>(P, 1)), dgrads(std::max<int64_t>(P, 1));
    upload(dparams.ptr, params.data(), P);
    upload(dmaster.ptr, params.data(), P);
    CUDA_CHECK(cudaMemset(dgrads.ptr, 0, (size_t)std::max<int64_t>(P, 1) * sizeof(float)));
    DeviceBuffer<T> e(Nd), o(Nd), dx(Nd), x(Nd), xn(Nd), y(Nd), wn(d), dobuf(Nd), de(Nd);
    DeviceBuffer<float> rstd(N);
    rand_fill(e.ptr, Nd, 1);
    rand_fill(o.ptr, Nd, 2);
    rand_fill(dx.ptr, Nd, 3);
    rand_fill(wn.ptr, d, 4);
    auto gs = make(c);
    gs->bind(dparams.ptr, dmaster.ptr, dgrads.ptr);
    gs->resize(B, Tn);
    cudaStream_t st = 0;
    const float eps = (float)c.norm_eps;
    // as the trainer: o_j in the scheme's output_buffer where it has one (filled once here; the
    // timed calls do not change it)
    std::vector<T*> ob((size_t)D + 1, o.ptr);
    for (int j = 1; j <= D; j++)
        if (T* b = gs->output_buffer(j)) {
            CUDA_CHECK(cudaMemcpy(b, o.ptr, (size_t)Nd * sizeof(T), cudaMemcpyDeviceToDevice));
            ob[(size_t)j] = b;
        }
    auto fwd = [&]() {
        gs->begin(e.ptr, st);
        for (int j = 1; j <= D; j++) {
            gs->input_norm(j, x.ptr, xn.ptr, rstd.ptr, wn.ptr, eps, st);
            gs->output(j, ob[(size_t)j], st);
        }
        gs->readout(y.ptr, st);
    };
    auto bwd = [&]() {
        gs->readout_backward(y.ptr, st);
        for (int j = D; j >= 1; j--) {
            gs->output_backward(j, dobuf.ptr, st);
            gs->input_backward_next(j, dx.ptr, dobuf.ptr, st);
        }
        gs->begin_backward(de.ptr, st);
    };
    fwd();
    const float ms_f = time_median_ms(fwd, 2, reps, st);
    const float ms_b = time_median_ms(bwd, 2, reps, st);
    const double gb = bytes_per_token * (double)N / 1e9;
    const char* dt = dtype_name<T>();
    std::printf("BENCH %s %s.fwd %s %s ms=%.3f GB/s=- TFLOP/s=-\n", family, label.c_str(), dt, sh.str().c_str(), ms_f);
    std::printf("BENCH %s %s.bwd %s %s ms=%.3f GB/s=- TFLOP/s=-\n", family, label.c_str(), dt, sh.str().c_str(), ms_b);
    std::printf("BENCH %s %s.fwd+bwd %s %s ms=%.3f GB/s=%.0f TFLOP/s=-  (per sublayer %.3f ms; %.1f MiB/token allocated)\n",
                family, label.c_str(), dt, sh.str().c_str(), ms_f + ms_b, gb / ((ms_f + ms_b) * 1e-3),
                (ms_f + ms_b) / D, (double)gs->extra_bytes_per_token() / (1024.0 * 1024.0));
    CUDA_CHECK(cudaDeviceSynchronize());
}

// bench_scheme_impl; an exception (e.g. out of memory) is printed and the run goes on.
template <typename T>
void bench_scheme(const char* family, const std::string& scheme, const Shape& sh, const Factory<T>& make,
                  double bytes_per_token, int reps = 20, std::string label = "") {
    if (label.empty()) label = scheme;
    try {
        bench_scheme_impl<T>(family, scheme, sh, make, bytes_per_token, reps, label);
    } catch (const std::exception& e) {
        std::printf("BENCH %s %s.fwd+bwd %s %s ms=- GB/s=- TFLOP/s=-  exception: %s\n", family, label.c_str(),
                    dtype_name<T>(), sh.str().c_str(), e.what());
        (void)cudaGetLastError();
    }
}

}  // namespace wb
}  // namespace gpu
}  // namespace ldm
