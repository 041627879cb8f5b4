// dev/cuda/swiglu.cu — workbench for cuda/swiglu.cuh: swiglu_forward / swiglu_backward on the
// packed h13 layout, both production kernels (v1 thread per element: the fallback for any F;
// v2 thread per 16-byte pack: where F and the alignment allow it) against
// cpu::swiglu_forward / swiglu_backward on the same packed h13; then timing at N = 8·2048,
// F = 2816 (llama-400m). Usage: build/cuda/swiglu [--quick] [--check-only | --bench-only] [--help]
// (workbench.cuh Cli). Output format: doc/cuda.md.
#include "cuda/swiglu.cuh"
#include "cpu/ops.h"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;
using wb::Report;
using wb::Rng;

// v = 1: the scalar kernels, v = 2: the packed ones; each through swiglu_forward / _backward
// where that is what they pick for these buffers, else through the swiglu_detail launcher.
template <typename T>
static void forward_variant(int v, T* a, const T* h13, int64_t N, int F, cudaStream_t s) {
    if ((v == 2) == swiglu_detail::packed_ok<T>(F, a, h13)) return swiglu_forward<T>(a, h13, N, F, s);
    if (v == 2) swiglu_detail::forward_packed<T>(a, h13, N, F, s);  // throws: does not apply
    else swiglu_detail::forward_scalar<T>(a, h13, N, F, s);
}
template <typename T>
static void backward_variant(int v, T* dh13, const T* da, const T* h13, int64_t N, int F,
                             cudaStream_t s) {
    if ((v == 2) == swiglu_detail::packed_ok<T>(F, dh13, da, h13))
        return swiglu_backward<T>(dh13, da, h13, N, F, s);
    if (v == 2) swiglu_detail::backward_packed<T>(dh13, da, h13, N, F, s);  // throws
    else swiglu_detail::backward_scalar<T>(dh13, da, h13, N, F, s);
}

template <typename T>
static void check(Report& R, Rng& rng, int64_t N, int F) {
    const char* dt = dtype_name<T>();
    const std::string shape = strprintf("N=%lld,F=%d", (long long)N, F);
    const int64_t NF = N * F;
    std::vector<float> h13 = wb::round_to<T>(wb::random_vec(rng, 2 * NF, 3.f));
    std::vector<float> da = wb::round_to<T>(wb::random_vec(rng, NF));
    std::vector<float> ref_a(NF), ref_dh13(2 * NF);
    cpu::swiglu_forward<float>(ref_a.data(), h13.data(), (int)N, F);
    cpu::swiglu_backward<float>(ref_dh13.data(), da.data(), h13.data(), (int)N, F);
    auto d_h13 = wb::to_device<T>(h13);
    auto d_da = wb::to_device<T>(da);
    DeviceBuffer<T> a(NF), dh13(2 * NF);
    for (int v = 1; v <= 2; v++) {
        if (v == 2 && F % Pack<T>::n != 0) continue;  // the packed kernels do not apply
        fill(a.get(), NF, NAN, 0);
        fill(dh13.get(), 2 * NF, NAN, 0);
        forward_variant<T>(v, a.get(), d_h13.get(), N, F, 0);
        backward_variant<T>(v, dh13.get(), d_da.get(), d_h13.get(), N, F, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        R.check("swiglu", strprintf("forward_v%d", v), dt, shape, download(a.get(), NF), ref_a,
                wb::tol<T>());
        R.check("swiglu", strprintf("backward_v%d", v), dt, shape, download(dh13.get(), 2 * NF),
                ref_dh13, wb::tol<T>());
    }
}

template <typename T>
static void bench(Report& R, int64_t N, int F) {
    const char* dt = dtype_name<T>();
    const std::string shape = strprintf("N=%lld,F=%d", (long long)N, F);
    const int64_t NF = N * F;
    DeviceBuffer<T> h13(2 * NF), a(NF), da(NF), dh13(2 * NF);
    fill(h13.get(), h13.n, 0.5f, 0);
    fill(da.get(), da.n, 0.1f, 0);
    const double e = sizeof(T);
    for (int v = 1; v <= 2; v++) {
        float ms = time_median_ms([&] { forward_variant<T>(v, a.get(), h13.get(), N, F, 0); },
                                  wb::kWarmup, wb::kReps);
        R.bench("swiglu", strprintf("forward_v%d", v), dt, shape, ms, 3.0 * NF * e, -1);
        ms = time_median_ms([&] { backward_variant<T>(v, dh13.get(), da.get(), h13.get(), N, F, 0); },
                            wb::kWarmup, wb::kReps);
        R.bench("swiglu", strprintf("backward_v%d", v), dt, shape, ms, 5.0 * NF * e, -1);
    }
}

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "swiglu", "SwiGLU forward and backward",
                                 "2 CHECK shapes; BENCH bf16 only");
        rc >= 0)
        return rc;
    exit_if_no_gpu("swiglu");
    const bool quick = cli.quick;
    try {
        std::printf("swiglu: %s\n", device_description().c_str());
        Report R;
        Rng rng(3);
        if (cli.check) {
            check<float>(R, rng, 77, 37);
            check<bf16>(R, rng, 77, 37);
            check<float>(R, rng, 130, 64);
            check<bf16>(R, rng, 130, 64);
            if (!quick) {
                check<float>(R, rng, 1001, 2816);
                check<bf16>(R, rng, 1001, 2816);
            }
        }
        if (cli.bench) {
            bench<bf16>(R, 16384, 2816);
            if (!quick) bench<float>(R, 16384, 2816);
        }
        return R.finish("swiglu");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "swiglu: error: %s\n", e.what());
        return 1;
    }
}
