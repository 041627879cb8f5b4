// dev/cuda/attnres.cu — workbench of the AttnRes GPU schemes, Full and Block
// (cuda/scheme_attnres.cuh, spec §2.4), against the CPU reference Scheme<double>
// (dev/cpu/scheme_attnres.*): every x_j, xn_j, y, d_o_j, de and every w/g gradient at several
// shapes (odd N and d; Block with even blocks, with a remainder block, and N_b > D clamped),
// fp32 (tight) and bf16 (loose); then forward+backward of all D sublayers at N = 16384, d = 1024,
// D = 48 (Block: 8 blocks). Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK fails.
// Usage: attnres [--quick]   (no GPU: prints "skipped: no GPU", exits 0)
#include <cstring>

#include "cuda/scheme_attnres.cuh"
#include "dev/cuda/scheme_check.cuh"

using namespace ldm;
using namespace ldm::gpu;

template <typename T>
static wb::Factory<T> factory(bool block) {
    return [block](const ModelConfig& c) { return std::unique_ptr<GpuScheme<T>>(new GpuAttnRes<T>(c, block)); };
}

template <typename T>
static bool run_checks(bool quick, double tol_act, double tol_grad) {
    bool ok = true;
    // Full.
    ok &= wb::check_scheme<T>("attnres", "attnres-full", {2, 33, 67, 3, 4, 8}, factory<T>(false), tol_act, tol_grad, 21, 0.3);
    if (!quick)
        ok &= wb::check_scheme<T>("attnres", "attnres-full", {3, 50, 1024, 2, 4, 8}, factory<T>(false), tol_act, tol_grad, 22, 0.3);
    // Block: D = 6 in 2 blocks of 3; D = 6 in 4 blocks (S = 1, the last takes 3); N_b > D (clamped).
    ok &= wb::check_scheme<T>("attnres", "attnres-block", {2, 33, 67, 3, 4, 2}, factory<T>(true), tol_act, tol_grad, 23, 0.3);
    ok &= wb::check_scheme<T>("attnres", "attnres-block", {1, 9, 96, 3, 4, 4}, factory<T>(true), tol_act, tol_grad, 24, 0.3);
    if (!quick) {
        ok &= wb::check_scheme<T>("attnres", "attnres-block", {1, 5, 64, 2, 4, 9}, factory<T>(true), tol_act, tol_grad, 25, 0.3);
        ok &= wb::check_scheme<T>("attnres", "attnres-block", {3, 50, 1024, 4, 4, 3}, factory<T>(true), tol_act, tol_grad, 26, 0.3);
    }
    return ok;
}

// Estimated traffic per token of fwd+bwd: per aggregation over K sources 2·K·d·tb (two passes)
// forward, 2·K·d·tb + 8·K·d (fp32 gradient read-modify-write) backward, plus x/xn/dx/new-source rows.
template <typename T>
static double traffic(bool block, int D, int nb, double d) {
    const double tb = sizeof(T);
    double b = 0;
    const int S = D / nb;
    for (int j = 1; j <= D + 1; j++) {
        int K;
        if (j == D + 1) K = (block ? nb : D) + 1;
        else if (!block) K = j;
        else {
            int n = std::min((j - 1) / S + 1, nb), i = j - (n - 1) * S;
            K = n + (i >= 2 ? 1 : 0);
        }
        b += K * d * (4 * tb + 8) + 6 * d * tb + 8 * d;
    }
    return b;
}

template <typename T>
static void run_bench() {
    const wb::Shape full{8, 2048, 1024, 24, 4, 8};
    wb::bench_scheme<T>("attnres", "attnres-block", full, factory<T>(true), traffic<T>(true, 48, 8, 1024));
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
