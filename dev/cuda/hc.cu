// dev/cuda/hc.cu — workbench of the HC / mHC GPU schemes (GpuHC of train_gpt_baselines.cu over
// the kernels of cuda/hc.cuh, spec §2.2, §2.3)
// against the CPU reference Scheme<double> (cpu/scheme_hc.*): every x_j, xn_j, y, d_o_j, de
// and every scheme parameter gradient at several shapes (odd N and d, n = 4 and 3), fp32 (tight)
// and bf16 (loose), for production and for mHC's earlier stream-gradient paths ("mhc-gemm-dw":
// the dΦ GEMM beside the combine kernel; "mhc-gemm-dz": dZ by a GEMM too; dev/cuda/hc_variants.cuh); then the forward+backward time of all D sublayers at N = 16384,
// d = 1024, D = 48, n = 4. Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK fails.
// Usage: hc [--quick]   (no GPU: prints "skipped: no GPU", exits 0)
#include <cstring>

#define TESTING  // the trainer file without its main()
#include "train_gpt_baselines.cu"
#include "dev/cuda/hc_variants.cuh"
#include "dev/cuda/scheme_check.cuh"

using namespace ldm;
using namespace ldm::gpu;

// Production mHC's kernels with the combine grid cut to at most 2 token slices, so that at the
// small check shapes (where production's grid gives every tile its own slice) a block walks
// several tiles and the fixed-order sum adds several partials of dΦ ("mhc-2slices"; checks only).
template <typename T>
struct MhcTwoSlices : GpuHC<T> {
    explicit MhcTwoSlices(const ModelConfig& cfg) : GpuHC<T>(cfg, true) {}

   protected:
    void stream_gradient(int j, const T* dx, const T* W, float* gW, cudaStream_t s) override {
        this->dispatch([&](auto NSC) {
            constexpr int NS = decltype(NSC)::value;
            dim3 grid = hc_detail::mhc_combine_grid<NS>(this->N_, this->d_);
            grid.y = std::min(grid.y, 2u);
            hc_detail::mhc_combine_kernel<T, NS><<<grid, dim3(hc_detail::kMhcChannels<NS>, NS), 0, s>>>(
                this->dHp_.ptr, this->dWp_.ptr, this->dH_.ptr, dx, this->dPp_.ptr, W, this->H(j - 1),
                this->coef_.ptr, this->beta_.ptr, this->N_, this->d_);
            LDM_LAUNCH_CHECK();
            const int64_t E = (int64_t)this->wrows_ * this->kdim_;
            hc_detail::mhc_dw_reduce_kernel<<<hc_detail::grid_1d(E, 256), 256, 0, s>>>(gW, this->dWp_.ptr, E,
                                                                                      (int)grid.y);
        });
        LDM_LAUNCH_CHECK();
    }
};

enum class Variant { HC, MHC, MhcTwoSlices, MhcGemmDw, MhcGemmDz };
constexpr Variant kVariants[] = {Variant::HC, Variant::MHC, Variant::MhcTwoSlices, Variant::MhcGemmDw,
                                 Variant::MhcGemmDz};
inline const char* label(Variant v) {
    return v == Variant::HC             ? "hc"
           : v == Variant::MHC          ? "mhc"
           : v == Variant::MhcTwoSlices ? "mhc-2slices"
           : v == Variant::MhcGemmDw    ? "mhc-gemm-dw"
                                        : "mhc-gemm-dz";
}

template <typename T>
static wb::Factory<T> factory(Variant v) {
    return [v](const ModelConfig& c) {
        if (v == Variant::MhcGemmDz) return std::unique_ptr<GpuScheme<T>>(new MhcGemmDz<T>(c));
        if (v == Variant::MhcGemmDw) return std::unique_ptr<GpuScheme<T>>(new MhcGemmDw<T>(c));
        if (v == Variant::MhcTwoSlices) return std::unique_ptr<GpuScheme<T>>(new MhcTwoSlices<T>(c));
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
        for (Variant v : kVariants) {
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
    for (Variant v : kVariants) {
        if (v == Variant::MhcTwoSlices) continue;  // a check of production's kernels, not a contender
        // Estimated traffic per sublayer and token (doc/cuda.md): forward (4n+4)·d·tb; backward
        // (4n+4)·d·tb (HC, and mHC with dZ formed in the combine kernel and the dΦ GEMM), (3n+4)·d·tb
        // (production mHC: dΦ in the combine kernel, no GEMM reading H_{j-1}; plus its slices'
        // fp32 partials written and read once per sublayer) or (6n+4)·d·tb (the GEMM-dZ path: dZ
        // written and read); + 3·n·d·tb (stream gradients, type T: read twice, written once).
        const double own = v == Variant::MHC ? 7 * n + 8 : v == Variant::MhcGemmDz ? 10 * n + 8 : 8 * n + 8;
        double part = 0;
        if (v == Variant::MHC) {
            const double R = 2 * n + n * n, slices = hc_detail::mhc_combine_grid<4>(big.B * big.T, (int)d).y;
            part = 2 * slices * R * n * d * 4 / (big.B * big.T);
        }
        const double bytes = D * (own * d * tb + 3 * n * d * tb + part);
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
