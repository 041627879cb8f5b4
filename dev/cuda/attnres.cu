// dev/cuda/attnres.cu — workbench of the AttnRes GPU schemes, Full and Block (GpuAttnRes of
// train_gpt_baselines.cu over the kernels of cuda/attnres.cuh, spec §2.4), against the CPU
// reference Scheme<double>
// (cpu/scheme_attnres.*): every x_j, xn_j, y, d_o_j, de and every w/g gradient at several
// shapes (odd N and d; Block with even blocks, with a remainder block, and N_b > D clamped),
// fp32 (tight) and bf16 (loose); then forward+backward of all D sublayers at N = 16384, d = 1024,
// D = 48 (Block: 8 blocks), Block with its deferred backward and with the direct one (the
// backward production uses only when the deferred flush does not fit in shared memory, derived
// here as AttnResDirectBackward). Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK
// fails.
// Usage: attnres [--quick]   (no GPU: prints "skipped: no GPU", exits 0)
#include <cstring>

#define TESTING  // the trainer file without its main()
#include "train_gpt_baselines.cu"
#include "dev/cuda/scheme_check.cuh"

using namespace ldm;
using namespace ldm::gpu;

// Block with the direct backward (each sublayer updates its sources' gradients).
template <typename T>
struct AttnResDirectBackward : GpuAttnRes<T> {
    explicit AttnResDirectBackward(const ModelConfig& c) : GpuAttnRes<T>(c, true) { this->deferred_ = false; }
};

template <typename T>
static wb::Factory<T> factory(bool block, bool direct = false) {
    return [block, direct](const ModelConfig& c) {
        return std::unique_ptr<GpuScheme<T>>(direct ? new AttnResDirectBackward<T>(c) : new GpuAttnRes<T>(c, block));
    };
}

template <typename T>
static bool run_checks(bool quick, double tol_act, double tol_grad) {
    bool ok = true;
    // Full.
    ok &= wb::check_scheme<T>("attnres", "attnres-full", {2, 33, 67, 3, 4, 8}, factory<T>(false), tol_act, tol_grad, 21, 0.3);
    // d = 2100: 9 values per thread, the forward's source groups of 2 (onepass_group) with a remainder
    ok &= wb::check_scheme<T>("attnres", "attnres-full", {1, 3, 2100, 3, 4, 8}, factory<T>(false), tol_act, tol_grad, 27, 0.3);
    if (!quick)
        ok &= wb::check_scheme<T>("attnres", "attnres-full", {3, 50, 1024, 2, 4, 8}, factory<T>(false), tol_act, tol_grad, 22, 0.3);
    // Block, deferred and direct backward: D = 6 in 2 blocks of 3; D = 6 in 4 blocks (S = 1, the
    // last takes 3); N_b > D (clamped); D = 8 in 3 blocks at d = 1024.
    for (bool direct : {false, true}) {
        const std::string name = direct ? "attnres-block-direct" : "attnres-block";
        auto chk = [&](const wb::Shape& sh, uint64_t seed) {
            return wb::check_scheme<T>("attnres", "attnres-block", sh, factory<T>(true, direct), tol_act, tol_grad,
                                       seed, 0.3, name);
        };
        ok &= chk({2, 33, 67, 3, 4, 2}, 23);
        ok &= chk({1, 9, 96, 3, 4, 4}, 24);
        if (!quick) {
            ok &= chk({1, 5, 64, 2, 4, 9}, 25);
            ok &= chk({3, 50, 1024, 4, 4, 3}, 26);
        }
    }
    return ok;
}

// Estimated traffic per token of fwd+bwd: per aggregation over K sources K·d·tb (the one-pass
// forward); direct backward: 2·K·d·tb + 8·K·d (fp32 gradient read-modify-write); deferred
// backward (Block): K·d·tb per sublayer plus the p source's update, the dx stash, and once per block
// (tb + 8)·d per block source; plus x/xn/dx/new-source rows.
template <typename T>
static double traffic(bool block, int D, int nb, double d, bool deferred = false) {
    const double tb = sizeof(T);
    double b = 0;
    const int S = D / nb;
    for (int j = 1; j <= D + 1; j++) {
        int K, n = 0, i = 1;
        if (j == D + 1) K = (block ? nb : D) + 1;
        else if (!block) K = j;
        else {
            n = std::min((j - 1) / S + 1, nb);
            i = j - (n - 1) * S;
            K = n + (i >= 2 ? 1 : 0);
        }
        b += K * d * tb + 6 * d * tb + 8 * d;  // forward (one pass over the sources) + rows
        if (!deferred || j == D + 1) {
            b += K * d * (2 * tb + 8);
        } else {
            b += K * d * tb + (i >= 2 ? d * (tb + 8) : 0) + 2 * d * tb;
            if (i == 1) b += n * d * (tb + 8);
        }
    }
    return b;
}

template <typename T>
static void run_bench() {
    const wb::Shape full{8, 2048, 1024, 24, 4, 8};
    wb::bench_scheme<T>("attnres", "attnres-block", full, factory<T>(true), traffic<T>(true, 48, 8, 1024, true));
    wb::bench_scheme<T>("attnres", "attnres-block", full, factory<T>(true, true), traffic<T>(true, 48, 8, 1024), 20,
                        "attnres-block-direct");
    wb::bench_scheme<T>("attnres", "attnres-full", full, factory<T>(false), traffic<T>(false, 48, 48, 1024));
}

int main(int argc, char** argv) {
    exit_if_no_gpu("attnres");
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    try {
        std::printf("# %s\n", device_description().c_str());
        bool ok = run_checks<float>(quick, 1e-4, 1e-4);
        ok &= run_checks<bf16>(quick, 3e-2, 5e-2);
        if (!quick) {
            run_bench<bf16>();
            run_bench<float>();
        }
        std::printf("attnres: %s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
        return ok ? 0 : 1;
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "attnres: error: %s\n", ex.what());
        return 1;
    }
}
