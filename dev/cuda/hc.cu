// dev/cuda/hc.cu — workbench of the HC / mHC GPU schemes (GpuHC of train_gpt_baselines.cu over
// the kernels of cuda/hc.cuh, spec §2.2, §2.3)
// against the CPU reference Scheme<double> (cpu/scheme_hc.*): every x_j, xn_j, y, d_o_j, de
// and every scheme parameter gradient at several shapes (odd N and d, n = 4 and 3), fp32 (tight)
// and bf16 (loose), for production and for mHC's earlier GEMM-dZ stream gradient ("mhc-gemm-dz",
// dev/cuda/hc_gemm_dz.cuh); then the forward+backward time of all D sublayers at N = 16384,
// d = 1024, D = 48, n = 4. Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK fails.
// Usage: hc [--quick]   (no GPU: prints "skipped: no GPU", exits 0)
#include <cstring>

#define TESTING  // the trainer file without its main()
#include "train_gpt_baselines.cu"
#include "dev/cuda/hc_gemm_dz.cuh"
#include "dev/cuda/scheme_check.cuh"

using namespace ldm;
using namespace ldm::gpu;

enum class Variant { HC, MHC, MhcGemmDz };
inline const char* label(Variant v) { return v == Variant::HC ? "hc" : v == Variant::MHC ? "mhc" : "mhc-gemm-dz"; }

template <typename T>
static wb::Factory<T> factory(Variant v) {
    return [v](const ModelConfig& c) {
        if (v == Variant::MhcGemmDz) return std::unique_ptr<GpuScheme<T>>(new MhcGemmDz<T>(c));
        return std::unique_ptr<GpuScheme<T>>(new GpuHC<T>(c, v == Variant::MHC));
    };
}

template <typename T>
static bool run_checks(bool quick, double tol_act, double tol_grad) {
    struct Case {
        wb::Shape shape;
        uint64_t seed;
    };
    const std::vector<Case> cases = {
        {{2, 33, 67, 3, 4, 8}, 11},    // odd N (66: mHC combine token tiles 32, 32, 2) and d, D = 6 > n (A_m0 wraps)
        {{1, 7, 128, 2, 3, 8}, 12},    // n = 3 (mHC combine blocks of 64 × 3 threads), an odd token tile
        {{1, 5, 40, 1, 8, 8}, 15},     // n = 8 (mHC combine: 32 channels per block, a partial one; R = 80)
        {{1, 9, 33, 1, 2, 8}, 16},     // n = 2
        {{1, 3, 600, 2, 4, 8}, 13},    // d > 2 * 256: two channel steps per batch and a partial one (kSteps)
        {{3, 50, 1024, 2, 4, 8}, 14},  // realistic d
    };
    bool ok = true;
    for (size_t k = 0; k < cases.size(); k++) {
        if (quick && k == cases.size() - 1) break;
        for (Variant v : {Variant::HC, Variant::MHC, Variant::MhcGemmDz}) {
            const bool m = v != Variant::HC;
            ok &= wb::check_scheme<T>("hc", m ? "mhc" : "hc", cases[k].shape, factory<T>(v), tol_act, tol_grad,
                                      cases[k].seed, m ? 0.1 : 0.3, label(v));
        }
    }
    return ok;
}

template <typename T>
static void run_bench() {
    const wb::Shape big{8, 2048, 1024, 24, 4, 8};
    const double n = 4, d = 1024, D = 48, tb = sizeof(T);
    for (Variant v : {Variant::HC, Variant::MHC, Variant::MhcGemmDz}) {
        // Estimated traffic per sublayer and token: forward (4n+4)·d·tb; backward (4n+4)·d·tb (HC,
        // and mHC with dZ formed in the combine kernel) or (6n+4)·d·tb (the GEMM-dZ path: dZ
        // written and read), + 3·n·d·tb (stream gradients, type T: read twice, written once) —
        // see doc/cuda.md.
        const double bytes = D * ((v == Variant::MhcGemmDz ? 10 * n + 8 : 8 * n + 8) * d * tb + 3 * n * d * tb);
        wb::bench_scheme<T>("hc", v == Variant::HC ? "hc" : "mhc", big, factory<T>(v), bytes, 20, label(v));
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
