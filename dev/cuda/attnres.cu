// dev/cuda/attnres.cu — workbench of the AttnRes GPU schemes, Full and Block (GpuAttnRes of
// train_gpt_baselines.cu over the kernels of cuda/attnres.cuh, spec §2.4), against the CPU
// reference Scheme<double> (cpu/scheme_attnres.*): every x_j, xn_j, y, d_o_j, de and every w/g
// gradient at several shapes (odd N and d; Block with even blocks, with a remainder block, N_b > D
// clamped, more sublayers per block than one pass of the two-phase kernels holds, source groups
// with a remainder), fp32 (tight) and bf16 (loose); then forward+backward of all D sublayers at
// N = 16384, d = 1024, D = 48 (Block: 8 blocks). Block runs three ways: production's two-phase
// path, the per-sublayer path it replaced (dev/cuda/attnres_onephase.cuh) and the per-sublayer
// forward with the direct backward (production's fallback where the two-phase path does not
// apply). Full runs three ways: production's deferred backward, the same with one source per
// barrier and the sources read twice (attnres-full-g1), and the direct backward it replaced
// (production's Full path at d > 8192). Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK fails.
// Usage: attnres [--quick]   (no GPU: prints "skipped: no GPU", exits 0)
#include <cstring>

#define TESTING  // the trainer file without its main()
#include "train_gpt_baselines.cu"
#include "dev/cuda/attnres_onephase.cuh"
#include "dev/cuda/scheme_check.cuh"

using namespace ldm;
using namespace ldm::gpu;

enum class BlockPath { TwoPhase, OnePhase, Direct };
inline const char* block_label(BlockPath p) {
    return p == BlockPath::TwoPhase ? "attnres-block" : p == BlockPath::OnePhase ? "attnres-block-1phase"
                                                                                : "attnres-block-direct";
}

// Block with the per-sublayer forward and the direct backward (each sublayer updates its sources'
// gradients).
template <typename T>
struct AttnResDirectBackward : GpuAttnRes<T> {
    explicit AttnResDirectBackward(const ModelConfig& c) : GpuAttnRes<T>(c, true) { this->two_phase_ = false; }
};

// Full with the direct backward (each sublayer read-modify-writes its sources' fp32 gradients).
template <typename T>
struct AttnResFullDirect : GpuAttnRes<T> {
    explicit AttnResFullDirect(const ModelConfig& c) : GpuAttnRes<T>(c, false) { this->deferred_ = false; }
};

// Full, deferred backward with the scores kernel at one source per barrier and without staging the
// rows in shared memory (the sources read twice from global memory).
template <typename T>
struct AttnResFullG1 : GpuAttnRes<T> {
    explicit AttnResFullG1(const ModelConfig& c) : GpuAttnRes<T>(c, false) {}
    void full_scores_backward(int j, const T* dx, cudaStream_t s) override {
        ar_detail::dispatch_vpt(this->d_, [&](auto c) {
            constexpr int VPT = decltype(c)::value;
            this->template launch_full_scores<VPT, 1, false>(j, dx, s);
        });
    }
};

// Full: path TwoPhase means production (the deferred backward), OnePhase the deferred backward at
// one source per barrier (AttnResFullG1), Direct the direct backward.
inline const char* full_label(BlockPath p) {
    return p == BlockPath::TwoPhase ? "attnres-full" : p == BlockPath::OnePhase ? "attnres-full-g1"
                                                                               : "attnres-full-direct";
}
template <typename T>
static wb::Factory<T> factory(bool block, BlockPath path = BlockPath::TwoPhase) {
    return [block, path](const ModelConfig& c) {
        if (!block && path == BlockPath::Direct) return std::unique_ptr<GpuScheme<T>>(new AttnResFullDirect<T>(c));
        if (!block && path == BlockPath::OnePhase) return std::unique_ptr<GpuScheme<T>>(new AttnResFullG1<T>(c));
        if (!block) {
            auto s = std::make_unique<GpuAttnRes<T>>(c, false);
            if (!s->deferred()) throw Error("attnres-full: the deferred backward does not apply at this shape");
            return std::unique_ptr<GpuScheme<T>>(std::move(s));
        }
        if (path == BlockPath::OnePhase) return std::unique_ptr<GpuScheme<T>>(new AttnResOnePhase<T>(c));
        if (path == BlockPath::Direct) return std::unique_ptr<GpuScheme<T>>(new AttnResDirectBackward<T>(c));
        auto s = std::make_unique<GpuAttnRes<T>>(c, true);
        if (!s->two_phase()) throw Error("attnres-block: the two-phase path does not apply at this shape");
        return std::unique_ptr<GpuScheme<T>>(std::move(s));
    };
}

template <typename T>
static bool run_checks(bool quick, double tol_act, double tol_grad) {
    bool ok = true;
    // Full, deferred (production) and direct backward. N = 66: 9 flush tiles of 8 tokens, the last
    // partial; d = 2100: 9 values per thread (the forward's source groups of 2 with a remainder,
    // flush tiles of 2 tokens, N = 3: one partial); D = 10 at d = 40: 11 sources, readout included.
    for (BlockPath path : {BlockPath::TwoPhase, BlockPath::OnePhase, BlockPath::Direct}) {
        const char* label = full_label(path);
        auto chk = [&](const wb::Shape& sh, uint64_t seed) {
            return wb::check_scheme<T>("attnres", "attnres-full", sh, factory<T>(false, path), tol_act, tol_grad, seed,
                                       0.3, label);
        };
        ok &= chk({2, 33, 67, 3, 4, 8}, 21);
        ok &= chk({1, 3, 2100, 3, 4, 8}, 27);
        ok &= chk({1, 7, 40, 5, 4, 8}, 31);
        if (!quick) ok &= chk({3, 50, 1024, 2, 4, 8}, 22);
    }
    // Block: D = 6 in 2 blocks of 3; D = 6 in 4 blocks (S = 1, the last takes 3); N_b > D (clamped);
    // D = 8 in 3 blocks at d = 1024. Two-phase only: d = 2100 with 6 sublayers per block (12 values
    // per thread: forward passes of 2 sublayers, 3 thread blocks per token; flush passes of 5 and 1),
    // d = 1100 with 5 (8 values per thread: forward passes of 4 and 1, one flush pass; block
    // sources in groups of 2, one partial), both at a smaller parameter scale
    // (at 0.3 the scores reach ±15 at this d and some pseudo-query gradients are cancellation
    // remainders of 1e-3 of the largest, below fp32's resolution on every path), and D = 12 in 6
    // blocks at d = 64 (up to 6 block sources in groups of 4: a partial group).
    for (BlockPath path : {BlockPath::TwoPhase, BlockPath::OnePhase, BlockPath::Direct}) {
        auto chk = [&](const wb::Shape& sh, uint64_t seed, double scale = 0.3) {
            return wb::check_scheme<T>("attnres", "attnres-block", sh, factory<T>(true, path), tol_act, tol_grad,
                                       seed, scale, block_label(path));
        };
        ok &= chk({2, 33, 67, 3, 4, 2}, 23);
        ok &= chk({1, 9, 96, 3, 4, 4}, 24);
        if (path == BlockPath::TwoPhase) {
            ok &= chk({1, 3, 2100, 6, 4, 2}, 28, 0.05);
            ok &= chk({1, 3, 1100, 5, 4, 2}, 29, 0.05);
            ok &= chk({1, 5, 64, 6, 4, 6}, 30);
            ok &= chk({1, 5, 64, 2, 4, 9}, 25);  // N_b > D: one sublayer per block, no p anywhere
        }
        if (!quick) {
            if (path != BlockPath::TwoPhase) ok &= chk({1, 5, 64, 2, 4, 9}, 25);
            ok &= chk({3, 50, 1024, 4, 4, 3}, 26);
        }
    }
    return ok;
}

// Estimated traffic per token of fwd+bwd. Per sublayer, every path: x, xn written, the new source
// (o read, p read, written) and the fp32 rows of the gradient plumbing (6·d·tb + 8·d); Full's
// sources are o_j itself (the trainer's GEMM writes o_j into the source array: output_buffer),
// so one d·tb less there (the source is read for its RMS, not copied). Aggregation
// over K sources: the per-sublayer forward reads K·d·tb; the direct backward 2·K·d·tb + 8·K·d
// (fp32 gradient read-modify-write). Full, deferred backward (path TwoPhase): no fp32 rows (8·d
// less), the scores kernel reads the K sources once (kept in shared memory for dL/dq, which they
// are at the bench shape in fp32 and bf16), dx and writes the stash, K·d·tb + 2·d·tb (path
// OnePhase, attnres-full-g1: the sources read twice, 2·K·d·tb + 2·d·tb), and the flush of one source per sublayer reads the source and on
// average K stash rows, (K + 1)·d·tb. Block, one-phase deferred backward: K·d·tb per sublayer, p's
// update d·(tb + 8), dx read + stash 2·d·tb, and once per block (tb + 8)·d per block source.
// Block, two-phase: forward at position 1 the n block sources and the other positions' aggregates
// written, (n + ns − 1)·d·tb, at i >= 2 the aggregate and p read, 2·d·tb; backward at i >= 2 dx
// and a_j read and the stash written 3·d·tb plus p's update d·(tb + 8), at i = 1 dx_1 and the
// ns − 1 stashes read, ns·d·tb, plus (tb + 8)·d per block source.
template <typename T>
static double traffic(bool block, int D, int nb, double d, BlockPath path = BlockPath::Direct) {
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
        const int ns = n < nb ? S : D - (nb - 1) * S;
        if (!block && j <= D) b -= d * tb;  // o_j written in place (no copy)
        if (!block && path != BlockPath::Direct) {
            const int reads = path == BlockPath::OnePhase ? 2 : 1;
            b += 6 * d * tb + K * d * tb + (reads * K + 2) * d * tb + (K + 1) * d * tb;
            continue;
        }
        b += 6 * d * tb + 8 * d;
        if (!block || j == D + 1 || path == BlockPath::Direct) {
            b += K * d * tb + K * d * (2 * tb + 8);
        } else if (path == BlockPath::OnePhase) {
            b += K * d * tb;
            b += K * d * tb + (i >= 2 ? d * (tb + 8) : 0) + 2 * d * tb;
            if (i == 1) b += n * d * (tb + 8);
        } else {
            b += i == 1 ? (n + ns - 1) * d * tb : 2 * d * tb;
            b += i == 1 ? ns * d * tb + n * d * (tb + 8) : 3 * d * tb + d * (tb + 8);
        }
    }
    return b;
}

template <typename T>
static void run_bench() {
    const wb::Shape full{8, 2048, 1024, 24, 4, 8};
    for (BlockPath path : {BlockPath::TwoPhase, BlockPath::OnePhase, BlockPath::Direct})
        wb::bench_scheme<T>("attnres", "attnres-block", full, factory<T>(true, path),
                            traffic<T>(true, 48, 8, 1024, path), 20, block_label(path));
    for (BlockPath path : {BlockPath::TwoPhase, BlockPath::OnePhase, BlockPath::Direct})
        wb::bench_scheme<T>("attnres", "attnres-full", full, factory<T>(false, path),
                            traffic<T>(false, 48, 48, 1024, path), 20, full_label(path));
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
