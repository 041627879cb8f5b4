// dev/cuda/rmsnorm.cu — workbench for cuda/rmsnorm.cuh: rmsnorm_forward, residual_rmsnorm_forward
// (also with h_out aliasing h_in) and rmsnorm_backward (overwrite and accumulate), "v2" = the
// production launchers (warp per row, 16-byte packs when C and the bases allow, lane-strided
// scalars otherwise: C = 37 runs that path) and the workbench-only "v1" below (thread per row,
// slower: doc/cuda.md "Kernel variants"), against cpu::rmsnorm_forward / rmsnorm_backward; PreLN's
// fused rmsnorm_backward_residual against the CPU and, bit for bit, against the three kernels it
// replaces; then timing at N = 8·2048, C = 1024 and the QK-norm view [N·16, 64].
// Usage: build/cuda/rmsnorm [--quick] [--check-only | --bench-only] [--help] (workbench.cuh Cli).
// Output format: doc/cuda.md.
#include "cuda/rmsnorm.cuh"
#include "cuda/scheme.cuh"  // accumulate_f32, convert_f32 (the unfused PreLN sequence)
#include "cpu/ops.h"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;
using wb::Report;
using wb::Rng;

// ---- v1 (workbench only): one thread per row, same math as the production warp kernels ------
template <typename T, bool RESID>
__global__ void rmsnorm_forward_thread_kernel(T* out, float* rstd, T* h_out, const T* h_in,
                                              const T* o, const T* w, int64_t N, int C, float eps) {
    const int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (n >= N) return;
    const T* x = h_in + n * C;
    if (RESID) {
        for (int c = 0; c < C; c++)
            h_out[n * C + c] = from_f<T>(to_f(h_in[n * C + c]) + to_f(o[n * C + c]));
        x = h_out + n * C;
    }
    float ss = 0.f;
    for (int c = 0; c < C; c++) {
        const float v = to_f(x[c]);
        ss += v * v;
    }
    const float s = rms_scale(ss, C, eps);
    rstd[n] = s;
    for (int c = 0; c < C; c++) out[n * C + c] = from_f<T>(to_f(w[c]) * (to_f(x[c]) * s));
}

template <typename T>
__global__ void rmsnorm_backward_dx_thread_kernel(T* dx, const T* dout, const T* x, const T* w,
                                                  const float* rstd, int64_t N, int C,
                                                  bool accumulate) {
    const int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (n >= N) return;
    const T* xr = x + n * C;
    const T* g = dout + n * C;
    const float s = rstd[n];
    float dot = 0.f;
    for (int c = 0; c < C; c++) dot += to_f(w[c]) * to_f(g[c]) * to_f(xr[c]);
    const float k = s * s * s * dot / (float)C;
    for (int c = 0; c < C; c++) {
        float v = s * to_f(w[c]) * to_f(g[c]) - k * to_f(xr[c]);
        if (accumulate) v += to_f(dx[n * C + c]);
        dx[n * C + c] = from_f<T>(v);
    }
}

// The launchers by variant (1 = the thread kernels above, 2 = production), same contracts as
// rmsnorm_forward / residual_rmsnorm_forward / rmsnorm_backward.
template <typename T, bool RESID>
static void forward_variant(int v, T* out, float* rstd, T* h_out, const T* h_in, const T* o,
                            const T* w, int64_t N, int C, float eps, cudaStream_t s) {
    if (v == 2) {
        if (RESID) return residual_rmsnorm_forward<T>(h_out, out, rstd, h_in, o, w, N, C, eps, s);
        return rmsnorm_forward<T>(out, rstd, h_in, w, N, C, eps, s);
    }
    if (N <= 0 || C <= 0) return;
    rmsnorm_forward_thread_kernel<T, RESID><<<(unsigned)ceil_div(N, 128), 128, 0, s>>>(
        out, rstd, h_out, h_in, o, w, N, C, eps);
    LDM_LAUNCH_CHECK();
}
template <typename T>
static void backward_variant(int v, T* dx, float* dw, float* scratch, const T* dout, const T* x,
                             const T* w, const float* rstd, int64_t N, int C, bool accumulate,
                             cudaStream_t s) {
    if (v == 2) return rmsnorm_backward<T>(dx, dw, scratch, dout, x, w, rstd, N, C, accumulate, s);
    if (N <= 0 || C <= 0) return;
    rmsnorm_backward_dx_thread_kernel<T><<<(unsigned)ceil_div(N, 128), 128, 0, s>>>(
        dx, dout, x, w, rstd, N, C, accumulate);
    LDM_LAUNCH_CHECK();
    if (dw) colsum(dw, scratch, RmsDwOp<T>{dout, x, rstd, C}, N, C, s);
}

// PreLN's input-norm backward as three kernels (the backbone's sequence before the fusion):
// rmsnorm_backward into dx, accumulate_f32 (dh += dx), convert_f32 (d_next = dh).
template <typename T>
static void backward_residual_unfused(T* dx, float* dh, T* d_next, float* dw, float* scratch,
                                      const T* dout, const T* x, const T* w, const float* rstd,
                                      int64_t N, int C, cudaStream_t s) {
    rmsnorm_backward<T>(dx, dw, scratch, dout, x, w, rstd, N, C, false, s);
    accumulate_f32<T>(dh, dx, N * C, true, s);
    convert_f32<T>(d_next, dh, N * C, s);
}

template <typename T>
static void check(Report& R, Rng& rng, int N, int C) {
    const char* dt = dtype_name<T>();
    const std::string shape = strprintf("N=%d,C=%d", N, C);
    const float eps = 1e-5f;
    const int64_t NC = (int64_t)N * C;
    std::vector<float> x = wb::round_to<T>(wb::random_vec(rng, NC));
    std::vector<float> o = wb::round_to<T>(wb::random_vec(rng, NC, 0.5f));
    std::vector<float> w = wb::round_to<T>(wb::random_vec(rng, C, 0.2f, 1.f));
    auto d_x = wb::to_device<T>(x);
    auto d_o = wb::to_device<T>(o);
    auto d_w = wb::to_device<T>(w);
    DeviceBuffer<T> out(NC), h(NC);
    DeviceBuffer<float> rstd(N);

    // forward
    std::vector<float> ref_out(NC), ref_rstd(N);
    cpu::rmsnorm_forward<float>(ref_out.data(), ref_rstd.data(), x.data(), w.data(), N, C, eps);
    for (int v = 1; v <= 2; v++) {
        fill(out.get(), NC, NAN, 0);
        fill(rstd.get(), N, NAN, 0);
        forward_variant<T, false>(v, out.get(), rstd.get(), nullptr, d_x.get(), nullptr, d_w.get(), N,
                                  C, eps, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::string var = strprintf("forward_v%d", v);
        R.check("rmsnorm", var, dt, shape, download(out.get(), NC), ref_out, wb::tol<T>());
        R.check("rmsnorm", var + "_rstd", dt, shape, download(rstd.get(), N), ref_rstd,
                wb::tol<float>());
    }
    // residual + norm: h = round_T(x + o), out = RMSNorm(h); separate output and aliased
    std::vector<float> hr(NC);
    for (int64_t i = 0; i < NC; i++) hr[i] = to_f(from_f<T>(x[i] + o[i]));
    std::vector<float> ref_rout(NC), ref_rrstd(N);
    cpu::rmsnorm_forward<float>(ref_rout.data(), ref_rrstd.data(), hr.data(), w.data(), N, C, eps);
    for (int v = 1; v <= 2; v++)
        for (int alias = 0; alias <= 1; alias++) {
            fill(out.get(), NC, NAN, 0);
            fill(rstd.get(), N, NAN, 0);
            T* h_out = h.get();
            if (alias)
                upload(h.get(), x.data(), NC);
            else
                fill(h.get(), NC, NAN, 0);
            const T* h_in = alias ? h.get() : d_x.get();
            forward_variant<T, true>(v, out.get(), rstd.get(), h_out, h_in, d_o.get(), d_w.get(), N,
                                     C, eps, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const std::string var = strprintf("residual_forward_v%d%s", v, alias ? "_alias" : "");
            R.check("rmsnorm", var + "_h", dt, shape, download(h.get(), NC), hr, 0.0);
            R.check("rmsnorm", var, dt, shape, download(out.get(), NC), ref_rout, wb::tol<T>());
            R.check("rmsnorm", var + "_rstd", dt, shape, download(rstd.get(), N), ref_rrstd,
                    wb::tol<float>());
        }
    // backward (rstd from the CPU forward, uploaded)
    std::vector<float> dout = wb::round_to<T>(wb::random_vec(rng, NC));
    std::vector<float> dx0 = wb::round_to<T>(wb::random_vec(rng, NC));
    std::vector<float> dw0 = wb::random_vec(rng, C);
    auto d_dout = wb::to_device<T>(dout);
    upload(rstd.get(), ref_rstd.data(), N);
    DeviceBuffer<float> scratch(rmsnorm_backward_scratch(N, C));
    for (int acc = 0; acc <= 1; acc++) {
        std::vector<float> rdx = acc ? dx0 : std::vector<float>(NC, 0.f), rdw = dw0;
        cpu::rmsnorm_backward<float>(rdx.data(), rdw.data(), dout.data(), x.data(), w.data(),
                                     ref_rstd.data(), N, C);
        for (int v = 1; v <= 2; v++) {
            DeviceBuffer<T> dx(NC);
            if (acc)
                upload(dx.get(), dx0.data(), NC);
            else
                fill(dx.get(), NC, NAN, 0);
            auto dw = wb::to_device<float>(dw0);
            backward_variant<T>(v, dx.get(), dw.get(), scratch.get(), d_dout.get(), d_x.get(),
                                d_w.get(), rstd.get(), N, C, acc != 0, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const std::string var = strprintf("backward_v%d", v);
            const std::string sh = shape + (acc ? ",acc" : ",set");
            R.check("rmsnorm", var + "_dx", dt, sh, download(dx.get(), NC), rdx, wb::tol<T>());
            std::vector<float> dw1 = download(dw.get(), C);
            R.check("rmsnorm", var + "_dw", dt, sh, dw1, rdw, wb::tol<T>());
            upload(dw.get(), dw0.data(), C);
            backward_variant<T>(v, dx.get(), dw.get(), scratch.get(), d_dout.get(), d_x.get(),
                                d_w.get(), rstd.get(), N, C, false, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            R.check_same("rmsnorm", var + "_dw", dt, sh, download(dw.get(), C), dw1);
        }
    }
    // PreLN's fused backward into the fp32 residual gradient: dh = dh0 + round_T(dx), d_next =
    // round_T(dh), dw = dw0 + Σ, vs the CPU dx (rounded to T, added in fp32); then bit for bit
    // vs the unfused three kernels, and with d_next = dw = nullptr (PreLN's sublayer 1).
    {
        const std::vector<float> dh0 = wb::random_vec(rng, NC);  // fp32 stream: not rounded
        std::vector<float> rdx(NC, 0.f), rdw = dw0, rdh(NC), rnext(NC);
        cpu::rmsnorm_backward<float>(rdx.data(), rdw.data(), dout.data(), x.data(), w.data(),
                                     ref_rstd.data(), N, C);
        for (int64_t i = 0; i < NC; i++) {
            rdh[i] = dh0[i] + to_f(from_f<T>(rdx[i]));
            rnext[i] = to_f(from_f<T>(rdh[i]));
        }
        auto dh_u = wb::to_device<float>(dh0), dw_u = wb::to_device<float>(dw0);
        auto dh_f = wb::to_device<float>(dh0), dw_f = wb::to_device<float>(dw0);
        auto dh_n = wb::to_device<float>(dh0);
        DeviceBuffer<T> dx(NC), next_u(NC), next_f(NC);
        fill(dx.get(), NC, NAN, 0);
        fill(next_u.get(), NC, NAN, 0);
        fill(next_f.get(), NC, NAN, 0);
        backward_residual_unfused<T>(dx.get(), dh_u.get(), next_u.get(), dw_u.get(), scratch.get(),
                                     d_dout.get(), d_x.get(), d_w.get(), rstd.get(), N, C, 0);
        rmsnorm_backward_residual<T>(dh_f.get(), next_f.get(), dw_f.get(), scratch.get(),
                                     d_dout.get(), d_x.get(), d_w.get(), rstd.get(), N, C, 0);
        rmsnorm_backward_residual<T>(dh_n.get(), nullptr, nullptr, nullptr, d_dout.get(), d_x.get(),
                                     d_w.get(), rstd.get(), N, C, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> gdh = download(dh_f.get(), NC), gnext = download(next_f.get(), NC),
                                 gdw = download(dw_f.get(), C);
        R.check("rmsnorm", "backward_resid_dh", dt, shape, gdh, rdh, wb::tol<T>());
        R.check("rmsnorm", "backward_resid_d_next", dt, shape, gnext, rnext, wb::tol<T>());
        R.check("rmsnorm", "backward_resid_dw", dt, shape, gdw, rdw, wb::tol<T>());
        R.check("rmsnorm", "backward_resid_unfused_dh", dt, shape, download(dh_u.get(), NC), rdh,
                wb::tol<T>());
        // "<variant>_repeat" lines: bit-identical to the unfused sequence / the d_next run
        R.check_same("rmsnorm", "backward_resid_vs_unfused_dh", dt, shape, gdh,
                     download(dh_u.get(), NC));
        R.check_same("rmsnorm", "backward_resid_vs_unfused_d_next", dt, shape, gnext,
                     download(next_u.get(), NC));
        R.check_same("rmsnorm", "backward_resid_vs_unfused_dw", dt, shape, gdw,
                     download(dw_u.get(), C));
        R.check_same("rmsnorm", "backward_resid_no_next_dh", dt, shape, download(dh_n.get(), NC),
                     gdh);
    }
}

template <typename T>
static void bench(Report& R, int N, int C) {
    const char* dt = dtype_name<T>();
    const std::string shape = strprintf("N=%d,C=%d", N, C);
    const int64_t NC = (int64_t)N * C;
    DeviceBuffer<T> x(NC), o(NC), w(C), out(NC), h(NC), dout(NC), dx(NC);
    DeviceBuffer<float> rstd(N), dw(C), scratch(rmsnorm_backward_scratch(N, C));
    fill(x.get(), NC, 0.5f, 0);
    fill(o.get(), NC, 0.25f, 0);
    fill(w.get(), C, 1.f, 0);
    fill(dout.get(), NC, 0.1f, 0);
    fill(dw.get(), C, 0.f, 0);
    const double e = sizeof(T);
    for (int v = 1; v <= 2; v++) {
        float ms = time_median_ms([&] { forward_variant<T, false>(v, out.get(), rstd.get(), nullptr,
                                                                  x.get(), nullptr, w.get(), N, C,
                                                                  1e-5f, 0); },
                                  wb::kWarmup, wb::kReps);
        R.bench("rmsnorm", strprintf("forward_v%d", v), dt, shape, ms, 2.0 * NC * e + 4.0 * N, -1);
        ms = time_median_ms([&] { forward_variant<T, true>(v, out.get(), rstd.get(), h.get(),
                                                           x.get(), o.get(), w.get(), N, C, 1e-5f,
                                                           0); },
                            wb::kWarmup, wb::kReps);
        R.bench("rmsnorm", strprintf("residual_forward_v%d", v), dt, shape, ms,
                4.0 * NC * e + 4.0 * N, -1);
        ms = time_median_ms([&] { backward_variant<T>(v, dx.get(), dw.get(), scratch.get(),
                                                      dout.get(), x.get(), w.get(), rstd.get(), N,
                                                      C, false, 0); },
                            wb::kWarmup, wb::kReps);
        // minimum traffic: read dout, x; write dx (the dw pass re-reads dout and x)
        R.bench("rmsnorm", strprintf("backward_v%d", v), dt, shape, ms, 3.0 * NC * e + 4.0 * N, -1);
    }
    // PreLN's input-norm backward, the three kernels vs the fused one (both with the dw pass,
    // whose re-read of dout and x is not counted, as above). Minimum traffic per element:
    // unfused: rmsnorm_backward reads dout, x, writes dx (3e); accumulate_f32 reads dx, dh (fp32),
    // writes dh (e + 8); convert_f32 reads dh, writes d_next (4 + e): 5e + 12 (22 B in bf16).
    // fused: reads dout, x, dh, writes dh, d_next: 3e + 8 (14 B in bf16).
    DeviceBuffer<float> dh(NC);
    DeviceBuffer<T> dnext(NC);
    fill(dh.get(), NC, 0.f, 0);
    float ms = time_median_ms([&] { backward_residual_unfused<T>(dx.get(), dh.get(), dnext.get(),
                                                                  dw.get(), scratch.get(), dout.get(),
                                                                  x.get(), w.get(), rstd.get(), N, C,
                                                                  0); },
                              wb::kWarmup, wb::kReps);
    R.bench("rmsnorm", "backward_resid_unfused", dt, shape, ms, (5.0 * e + 12.0) * NC + 4.0 * N, -1);
    ms = time_median_ms([&] { rmsnorm_backward_residual<T>(dh.get(), dnext.get(), dw.get(),
                                                           scratch.get(), dout.get(), x.get(),
                                                           w.get(), rstd.get(), N, C, 0); },
                        wb::kWarmup, wb::kReps);
    R.bench("rmsnorm", "backward_resid", dt, shape, ms, (3.0 * e + 8.0) * NC + 4.0 * N, -1);
}

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "rmsnorm",
                                 "RMSNorm forward and backward, the residual-add and fused backward forms",
                                 "2 CHECK shapes; BENCH bf16 16384 x 1024 only");
        rc >= 0)
        return rc;
    exit_if_no_gpu("rmsnorm");
    const bool quick = cli.quick;
    try {
        std::printf("rmsnorm: %s\n", device_description().c_str());
        Report R;
        Rng rng(7);
        if (cli.check) {
            check<float>(R, rng, 77, 37);
            check<bf16>(R, rng, 77, 37);
            check<float>(R, rng, 130, 64);
            check<bf16>(R, rng, 130, 64);
            if (!quick) {
                check<float>(R, rng, 1001, 1024);
                check<bf16>(R, rng, 1001, 1024);
                check<float>(R, rng, 4099, 128);
                check<bf16>(R, rng, 4099, 128);
            }
        }
        if (cli.bench) {
            bench<bf16>(R, 16384, 1024);
            if (!quick) {
                bench<float>(R, 16384, 1024);
                bench<bf16>(R, 16384 * 16, 64);
            }
        }
        return R.finish("rmsnorm");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rmsnorm: error: %s\n", e.what());
        return 1;
    }
}
