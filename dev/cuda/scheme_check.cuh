// dev/cuda/scheme_check.cuh — shared driver of the scheme workbenches (dev/cuda/hc.cu,
// dev/cuda/attnres.cu): runs the CPU reference Scheme<double> (cpu/scheme.h make_scheme) and a
// GpuScheme<T> through the same sequence
//   begin(e) / input_norm(j) / output(j, o_j) ... / readout / readout_backward(dy) /
//   output_backward(j) / input_backward(j, dx_j) ... / begin_backward
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
// fp32 and 1e-2 for bf16, see grad_floor).
template <typename T>
bool check_scheme_impl(const char* family, const std::string& scheme, const Shape& sh, const Factory<T>& make,
                       double tol_act, double tol_grad, uint64_t seed, double param_scale, std::string label) {
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
    std::vector<double> grads((size_t)P, 0.0);
    std::vector<std::vector<double>> X(D + 1), DO(D + 1);
    std::vector<double> y((size_t)Nd), de((size_t)Nd);
    cs->bind(params.data(), grads.data());
    cs->resize(B, Tn);
    cs->begin(e.data());
    for (int j = 1; j <= D; j++) {
        X[j].resize((size_t)Nd);
        cs->input(j, X[j].data());
        cs->output(j, o[j].data());
    }
    cs->readout(y.data());
    cs->readout_backward(dy.data());
    for (int j = D; j >= 1; j--) {
        DO[j].resize((size_t)Nd);
        cs->output_backward(j, DO[j].data());
        cs->input_backward(j, dx[j].data());
    }
    cs->begin_backward(de.data());

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
        wx.add(compare_d(xg, X[j]), strprintf("x_%d", j));
        // xn reference: RMSNorm of the GPU's own x (isolates the fused norm from upstream error).
        std::vector<double> xgd(xg.begin(), xg.end()), xnr((size_t)Nd), rsr((size_t)N);
        cpu::rmsnorm_forward(xnr.data(), rsr.data(), xgd.data(), wn.data(), (int)N, d, (double)eps);
        wxn.add(compare_d(xng, xnr), strprintf("xn_%d", j));
        wrs.add(compare_d(rsg, rsr), strprintf("rstd_%d", j));
        upload(dob.ptr, o[j].data(), Nd);
        gs->output(j, dob.ptr, st);
    }
    fill(dyo.ptr, Nd, nanv, st);
    gs->readout(dyo.ptr, st);
    wy.add(compare_d(download(dyo.ptr, Nd), y), "y");
    gs->readout_backward(dy_.ptr, st);
    for (int j = D; j >= 1; j--) {
        fill(ddo.ptr, Nd, nanv, st);
        gs->output_backward(j, ddo.ptr, st);
        wdo.add(compare_d(download(ddo.ptr, Nd), DO[j]), strprintf("d_o_%d", j));
        upload(ddx.ptr, dx[j].data(), Nd);
        gs->input_backward(j, ddx.ptr, st);
    }
    fill(dded.ptr, Nd, nanv, st);
    gs->begin_backward(dded.ptr, st);
    wde.add(compare_d(download(dded.ptr, Nd), de), "de");
    CUDA_CHECK(cudaDeviceSynchronize());
    auto gg = download(dgrads.ptr, P);
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
        wg.add(compare_d(a, b, grad_floor * gmax), s.name);
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
                  double tol_act, double tol_grad, uint64_t seed, double param_scale, std::string label = "") {
    if (label.empty()) label = scheme;
    try {
        return check_scheme_impl<T>(family, scheme, sh, make, tol_act, tol_grad, seed, param_scale, label);
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
    auto fwd = [&]() {
        gs->begin(e.ptr, st);
        for (int j = 1; j <= D; j++) {
            gs->input_norm(j, x.ptr, xn.ptr, rstd.ptr, wn.ptr, eps, st);
            gs->output(j, o.ptr, st);
        }
        gs->readout(y.ptr, st);
    };
    auto bwd = [&]() {
        gs->readout_backward(y.ptr, st);
        for (int j = D; j >= 1; j--) {
            gs->output_backward(j, dobuf.ptr, st);
            gs->input_backward(j, dx.ptr, st);
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
