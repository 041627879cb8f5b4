// dev/cuda/hc.cu — workbench of the HC / mHC GPU schemes (GpuHC of train_gpt_baselines.cu over
// the kernels of cuda/hc.cuh, spec §2.2, §2.3)
// against the CPU reference Scheme<double> (cpu/scheme_hc.*): every x_j, xn_j, y, d_o_j, de
// and every scheme parameter gradient at several shapes (odd N and d, n = 4 and 3), fp32 (tight)
// and bf16 (loose), for production, for production with 2 token slices in the combine kernels
// ("hc-2slices", "mhc-2slices") and for the earlier stream-gradient paths ("hc-gemm-dw",
// "mhc-gemm-dw": the weight gradient by a GEMM; "mhc-gemm-dz": dZ by a GEMM too;
// dev/cuda/hc_variants.cuh); then the forward+backward time of all D sublayers at N = 16384,
// d = 1024, D = 48, n = 4. Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK fails.
// Usage: hc [--quick]   (no GPU: prints "skipped: no GPU", exits 0)
#include <cstring>

#define TESTING  // the trainer file without its main()
#include "train_gpt_baselines.cu"
#include "dev/cuda/hc_variants.cuh"
#include "dev/cuda/scheme_check.cuh"

using namespace ldm;
using namespace ldm::gpu;

// Production's kernels with the combine grid cut to at most 2 token slices, so that at the small
// check shapes (where production's grid gives every tile its own slice) a block walks several
// tiles and the fixed-order sum adds several partials of dW_j / dΦ_j ("hc-2slices",
// "mhc-2slices"; checks only).
template <typename T>
struct TwoSlices : GpuHC<T> {
    TwoSlices(const ModelConfig& cfg, bool manifold) : GpuHC<T>(cfg, manifold) {}

   protected:
    void stream_gradient(int j, const T* dx, const T* W, float* gW, cudaStream_t s) override {
        this->combine(j, dx, W, gW, 2, s);
    }
};

enum class Variant { HC, HcTwoSlices, HcGemmDw, MHC, MhcTwoSlices, MhcGemmDw, MhcGemmDz };
constexpr Variant kVariants[] = {Variant::HC,  Variant::HcTwoSlices,  Variant::HcGemmDw, Variant::MHC,
                                 Variant::MhcTwoSlices, Variant::MhcGemmDw, Variant::MhcGemmDz};
inline bool is_mhc(Variant v) { return v >= Variant::MHC; }
inline bool checks_only(Variant v) { return v == Variant::HcTwoSlices || v == Variant::MhcTwoSlices; }
inline const char* label(Variant v) {
    switch (v) {
        case Variant::HC: return "hc";
        case Variant::HcTwoSlices: return "hc-2slices";
        case Variant::HcGemmDw: return "hc-gemm-dw";
        case Variant::MHC: return "mhc";
        case Variant::MhcTwoSlices: return "mhc-2slices";
        case Variant::MhcGemmDw: return "mhc-gemm-dw";
        case Variant::MhcGemmDz: return "mhc-gemm-dz";
    }
    return "?";
}

template <typename T>
static wb::Factory<T> factory(Variant v) {
    return [v](const ModelConfig& c) -> std::unique_ptr<GpuScheme<T>> {
        switch (v) {
            case Variant::HcTwoSlices: return std::unique_ptr<GpuScheme<T>>(new TwoSlices<T>(c, false));
            case Variant::MhcTwoSlices: return std::unique_ptr<GpuScheme<T>>(new TwoSlices<T>(c, true));
            case Variant::HcGemmDw: return std::unique_ptr<GpuScheme<T>>(new HcGemmDw<T>(c));
            case Variant::MhcGemmDw: return std::unique_ptr<GpuScheme<T>>(new MhcGemmDw<T>(c));
            case Variant::MhcGemmDz: return std::unique_ptr<GpuScheme<T>>(new MhcGemmDz<T>(c));
            default: return std::unique_ptr<GpuScheme<T>>(new GpuHC<T>(c, is_mhc(v)));
        }
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
            const bool m = is_mhc(v);
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
        if (checks_only(v)) continue;  // a check of production's kernels, not a contender
        // Estimated traffic per sublayer and token (doc/cuda.md): forward (4n+3)·d·tb (o_j is
        // written by the trainer's GEMM into the scheme's O_j: output_buffer); backward
        // (3n+4)·d·tb (production HC and mHC: the weight gradient in the combine kernel, plus its
        // slices' fp32 partials written and read once per sublayer), (4n+4)·d·tb (the dW GEMM reads
        // H_{j-1} once more: hc-gemm-dw, mhc-gemm-dw) or (6n+4)·d·tb (mhc-gemm-dz: dZ written and
        // read as well); + 3·n·d·tb (stream gradients, type T: read twice, written once).
        const bool gemm_dw = v == Variant::HcGemmDw || v == Variant::MhcGemmDw;
        const double own = v == Variant::MhcGemmDz ? 10 * n + 7 : gemm_dw ? 8 * n + 7 : 7 * n + 7;
        double part = 0;
        if (v == Variant::HC || v == Variant::MHC) {
            const double wsize = v == Variant::MHC ? (2 * n + n * n) * n * d : (n + 2) * d;
            const double slices = hc_detail::combine_grid<4>(big.B * big.T, (int)d).y;
            part = 2 * slices * wsize * 4 / (big.B * big.T);
        }
        const double bytes = D * (own * d * tb + 3 * n * d * tb + part);
        wb::bench_scheme<T>("hc", is_mhc(v) ? "mhc" : "hc", big, factory<T>(v), bytes, 20, label(v));
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
