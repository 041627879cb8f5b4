// dev/cuda/hc.cu — workbench of the HC / mHC GPU schemes (GpuHC of train_gpt_baselines.cu over
// the kernels of cuda/hc.cuh, spec §2.2, §2.3)
// against the CPU reference Scheme<double> (cpu/scheme_hc.*): every x_j, xn_j, y, d_o_j, de
// and every scheme parameter gradient at several shapes (odd N and d, n = 4 and 3), fp32 (tight)
// and bf16 (loose); then the forward+backward time of all D sublayers at N = 16384, d = 1024,
// D = 48, n = 4. Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK fails.
// Usage: hc [--quick]   (no GPU: prints "skipped: no GPU", exits 0)
#include <cstring>

#define TESTING  // the trainer file without its main()
#include "train_gpt_baselines.cu"
#include "dev/cuda/scheme_check.cuh"

using namespace ldm;
using namespace ldm::gpu;

template <typename T>
static bool run_checks(bool quick, double tol_act, double tol_grad) {
    const std::vector<wb::Shape> shapes = {
        {2, 33, 67, 3, 4, 8},   // odd N (66) and d, D = 6 > n (A_m0 wraps)
        {1, 7, 128, 2, 3, 8},   // n = 3
        {1, 3, 600, 2, 4, 8},   // d > 2 * 256: two channel steps per batch and a partial one (kSteps)
        {3, 50, 1024, 2, 4, 8}, // realistic d
    };
    bool ok = true;
    for (size_t k = 0; k < shapes.size(); k++) {
        if (quick && k == 3) break;
        for (const char* sch : {"hc", "mhc"}) {
            const bool m = std::strcmp(sch, "mhc") == 0;
            wb::Factory<T> f = [m](const ModelConfig& c) { return std::unique_ptr<GpuScheme<T>>(new GpuHC<T>(c, m)); };
            ok &= wb::check_scheme<T>("hc", sch, shapes[k], f, tol_act, tol_grad, 11 + k, m ? 0.1 : 0.3);
        }
    }
    return ok;
}

template <typename T>
static void run_bench() {
    const wb::Shape big{8, 2048, 1024, 24, 4, 8};
    const double n = 4, d = 1024, D = 48, tb = sizeof(T);
    for (const char* sch : {"hc", "mhc"}) {
        const bool m = std::strcmp(sch, "mhc") == 0;
        // Estimated traffic per sublayer and token: forward (4n+4)·d·tb, backward (4n+4)·d·tb (HC)
        // or (6n+4)·d·tb (mHC, dZ) + 3·n·d·tb (stream gradients, type T: read twice, written once)
        // — see doc/cuda.md.
        const double bytes = D * ((m ? 10 * n + 8 : 8 * n + 8) * d * tb + 3 * n * d * tb);
        wb::Factory<T> f = [m](const ModelConfig& c) { return std::unique_ptr<GpuScheme<T>>(new GpuHC<T>(c, m)); };
        wb::bench_scheme<T>("hc", sch, big, f, bytes);
    }
}

int main(int argc, char** argv) {
    exit_if_no_gpu("hc");
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    try {
        std::printf("# %s\n", device_description().c_str());
        bool ok = run_checks<float>(quick, 1e-4, 1e-4);
        ok &= run_checks<bf16>(quick, 3e-2, 5e-2);
        if (!quick) {
            run_bench<bf16>();
            run_bench<float>();
        }
        std::printf("hc: %s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
        return ok ? 0 : 1;
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "hc: error: %s\n", ex.what());
        return 1;
    }
}
