// dev/cuda/attnres.cu — workbench of the AttnRes GPU schemes, Full and Block (GpuAttnRes of
// train_gpt_baselines.cu over the kernels of cuda/attnres.cuh, spec §2.4), against the CPU
// reference Scheme<double> (cpu/scheme_attnres.*): every x_j, xn_j, y, d_o_j, de and every w/g
// gradient at several shapes (odd N and d; Block with even blocks, with a remainder block, N_b > D
// clamped, more sublayers per block than one pass of the two-phase kernels holds, source groups
// with a remainder), fp32 (tight) and bf16 (loose); then forward+backward of all D sublayers at
// N = 16384, d = 1024, D = 48 (Block: 8 blocks). Block runs three ways: production's two-phase
// path, the per-sublayer path it replaced (dev/cuda/attnres_onephase.cuh) and the per-sublayer
// forward with the direct backward (production's fallback where the two-phase path does not
// apply). Full runs seven ways: production's deferred backward (paired flushes), the same with one
// source per barrier and the sources read twice (attnres-full-g1), with the scores kernel's rows
// staged through registers (-regstage, dev/cuda/attnres_fullstage.cuh), with the flushes' direct
// loads instead of their cp.async ring (-flushdirect), with one source per flush
// (-flush1, before the pairs) or a pair at every other flush (-pairall), and the direct backward
// (production's Full path at d > 8192). Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK fails.
// Usage: attnres [--quick] [--check-only | --bench-only] [--help] (workbench.cuh Cli; --quick: the
// small check shapes, no timing; no GPU: prints "skipped: no GPU", exits 0)
#include <cstring>
#include <limits>

#define TESTING  // the trainer file without its main()
#include "train_gpt_baselines.cu"
#include "dev/cuda/attnres_fullstage.cuh"
#include "dev/cuda/attnres_onephase.cuh"
#include "dev/cuda/scheme_check.cuh"
#include "dev/cuda/workbench.cuh"

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

// Full, deferred backward with the scores kernel production ran before the cp.async staging
// (dev/cuda/attnres_fullstage.cuh: each group's rows loaded through registers) where the rows are
// staged; elsewhere production's kernel.
template <typename T>
struct AttnResFullRegStage : GpuAttnRes<T> {
    explicit AttnResFullRegStage(const ModelConfig& c) : GpuAttnRes<T>(c, false) {}
    void full_scores_backward(int j, const T* dx, cudaStream_t s) override {
        ar_detail::dispatch_vpt(this->d_, [&](auto c) {
            constexpr int VPT = decltype(c)::value, G = ar_detail::full_group<VPT>();
            const size_t smem = ar_detail::full_scores_smem<T>(G, true, j, this->d_);
            if (smem <= this->smem_optin_)
                this->launch_full_scores_kernel(ar_detail::full_scores_regstage_kernel<T, VPT, G>, smem, j, dx, s);
            else
                this->template launch_full_scores<VPT, G, false>(j, dx, s);
        });
    }
};

// Full, deferred backward with the flushes' direct loads (full_flush_kernel with S = 0, production
// before the cp.async ring and its fallback where the ring does not fit the opt-in limit).
template <typename T>
struct AttnResFullFlushDirect : GpuAttnRes<T> {
    explicit AttnResFullFlushDirect(const ModelConfig& c) : GpuAttnRes<T>(c, false) {}
    bool flush_ring(size_t) const override { return false; }
};

// Full, deferred backward with the flush's pairing threshold moved: pair_min = INT_MAX flushes one
// source per pass (production until the paired flush), pair_min = 1 pairs wherever a source below
// remains (at every other k, from k = D down; also where it moves more bytes).
template <typename T>
struct AttnResFullPairMin : GpuAttnRes<T> {
    AttnResFullPairMin(const ModelConfig& c, int pair_min) : GpuAttnRes<T>(c, false) { this->pair_min_ = pair_min; }
};

// Full's paths: production (the deferred backward with paired flushes), the deferred backward with
// one source per barrier (AttnResFullG1), with the scores kernel's rows staged through registers
// (AttnResFullRegStage), the flushes with direct loads (AttnResFullFlushDirect), with one source
// per flush, with a pair at every other flush, and the direct backward.
enum class FullPath { Deferred, G1, RegStage, FlushDirect, Flush1, PairAll, Direct };
constexpr FullPath kFullPaths[] = {FullPath::Deferred, FullPath::G1,     FullPath::RegStage, FullPath::FlushDirect,
                                   FullPath::Flush1,   FullPath::PairAll, FullPath::Direct};
inline const char* full_label(FullPath p) {
    switch (p) {
        case FullPath::Deferred: return "attnres-full";
        case FullPath::G1: return "attnres-full-g1";
        case FullPath::RegStage: return "attnres-full-regstage";
        case FullPath::FlushDirect: return "attnres-full-flushdirect";
        case FullPath::Flush1: return "attnres-full-flush1";
        case FullPath::PairAll: return "attnres-full-pairall";
        default: return "attnres-full-direct";
    }
}
// The pairing threshold of each Full path (production's: GpuAttnRes::kFlushPairMin).
template <typename T>
static int full_pair_min(FullPath path) {
    return path == FullPath::Flush1 ? std::numeric_limits<int>::max()
           : path == FullPath::PairAll ? 1
                                       : GpuAttnRes<T>::kFlushPairMin;
}
template <typename T>
static wb::Factory<T> full_factory(FullPath path) {
    return [path](const ModelConfig& c) {
        std::unique_ptr<GpuAttnRes<T>> s;
        switch (path) {
            case FullPath::Direct: return std::unique_ptr<GpuScheme<T>>(new AttnResFullDirect<T>(c));
            case FullPath::G1: s.reset(new AttnResFullG1<T>(c)); break;
            case FullPath::RegStage: s.reset(new AttnResFullRegStage<T>(c)); break;
            case FullPath::FlushDirect: s.reset(new AttnResFullFlushDirect<T>(c)); break;
            case FullPath::Flush1:
            case FullPath::PairAll: s.reset(new AttnResFullPairMin<T>(c, full_pair_min<T>(path))); break;
            default: s.reset(new GpuAttnRes<T>(c, false));
        }
        if (!s->deferred()) throw Error("attnres-full: the deferred backward does not apply at this shape");
        return std::unique_ptr<GpuScheme<T>>(std::move(s));
    };
}
// Block's paths (TwoPhase: production).
template <typename T>
static wb::Factory<T> factory(BlockPath path = BlockPath::TwoPhase) {
    return [path](const ModelConfig& c) {
        if (path == BlockPath::OnePhase) return std::unique_ptr<GpuScheme<T>>(new AttnResOnePhase<T>(c));
        if (path == BlockPath::Direct) return std::unique_ptr<GpuScheme<T>>(new AttnResDirectBackward<T>(c));
        auto s = std::make_unique<GpuAttnRes<T>>(c, true);
        if (!s->two_phase()) throw Error("attnres-block: the two-phase path does not apply at this shape");
        return std::unique_ptr<GpuScheme<T>>(std::move(s));
    };
}

template <typename T>
static bool run_checks(wb::Checks which, double tol_act, double tol_grad) {
    const bool quick = which != wb::Checks::Full;
    bool ok = true;
    // Full, every path. N = 66: 9 flush tiles of 8 tokens (17 paired tiles of 4), the last partial;
    // d = 2100: 9 values per thread (the forward's source groups of 2 with a remainder, flush tiles
    // of 2 tokens, paired 1, N = 3: one partial); D = 10 at d = 40: 11 sources, readout included;
    // d = 300, 1100, 3100: the paired flush at 2, 8 and 16 values per thread (4, 2, 1 tokens).
    // Production pairs sources (k, k−1) where J − k >= 6 in bf16, 4 in fp32 (J = D + 1): at D = 6
    // (1, 0) in bf16, (3, 2), (1, 0) in fp32; at D = 10 (5, 4), (3, 2), (1, 0) in bf16, (7, 6) ..
    // (1, 0) in fp32. pairall pairs (D, D−1), (D−2, D−3), .. (2, 1) (D is even: source 0 alone).
    // Paired and single flushes add the same terms in the same order, and neither the scores
    // kernel's nor the flushes' sums depend on how their rows reach the threads: production,
    // regstage, flushdirect, flush1 and pairall must agree bit for bit (every x_j, y, d_o_j, de and gradient; g1 and direct sum in
    // other orders). The scores kernel stages every shape here: with 16-byte copies at d = 40
    // and, in fp32, at d = 300 .. 3100; with plain loads at d = 67 and, in bf16, at d = 300 .. 3100.
    std::vector<wb::Shape> shapes = {{2, 33, 67, 3, 4, 8}, {1, 3, 2100, 3, 4, 8}, {1, 7, 40, 5, 4, 8},
                                     {1, 5, 300, 3, 4, 8},  {1, 5, 1100, 3, 4, 8}, {1, 2, 3100, 3, 4, 8}};
    const uint64_t seeds[] = {21, 27, 31, 32, 33, 34, 22};
    if (!quick) shapes.push_back({3, 50, 1024, 2, 4, 8});
    for (size_t si = 0; si < shapes.size(); si++) {
        // Race: shape 0 (66 tokens, the most emulated work) on production's path only, and
        // nowhere the two paths that only move loads (regstage: the workbench's copy of the scores
        // kernel before cp.async; flushdirect: the flush without its ring, no shared memory).
        const bool all_paths = !(which == wb::Checks::Race && si == 0);
        auto skip = [&](FullPath p) {
            return (!all_paths && p != FullPath::Deferred) ||
                   (which == wb::Checks::Race && (p == FullPath::RegStage || p == FullPath::FlushDirect));
        };
        std::vector<float> got[7];
        for (FullPath path : kFullPaths) {
            if (skip(path)) continue;
            ok &= wb::check_scheme<T>("attnres", "attnres-full", shapes[si], full_factory<T>(path), tol_act, tol_grad,
                                      seeds[si], 0.3, full_label(path), &got[(int)path]);
        }
        if (!all_paths) continue;
        const std::vector<float>& a = got[(int)FullPath::Deferred];
        for (FullPath other : {FullPath::RegStage, FullPath::FlushDirect, FullPath::Flush1, FullPath::PairAll}) {
            if (skip(other)) continue;
            const std::vector<float>& b = got[(int)other];
            const bool same = a.size() == b.size() && !a.empty() &&
                              std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
            double dmax = a.size() == b.size() ? 0.0 : INFINITY, amax = 0;
            for (size_t i = 0; i < a.size() && i < b.size(); i++) {
                dmax = std::max(dmax, std::fabs((double)a[i] - b[i]));
                amax = std::max(amax, std::fabs((double)a[i]));
            }
            std::printf("CHECK attnres %s.bitwise=attnres-full %s %s rel=%.3e max_abs=%.3e %s\n", full_label(other),
                        dtype_name<T>(), shapes[si].str().c_str(), amax > 0 ? dmax / amax : dmax, dmax,
                        same ? "PASS" : "FAIL  (not bit for bit the same)");
            ok &= same;
        }
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
            return wb::check_scheme<T>("attnres", "attnres-block", sh, factory<T>(path), tol_act, tol_grad,
                                       seed, scale, block_label(path));
        };
        if (which != wb::Checks::Race || path == BlockPath::TwoPhase) ok &= chk({2, 33, 67, 3, 4, 2}, 23);
        ok &= chk({1, 9, 96, 3, 4, 4}, 24);
        if (path == BlockPath::TwoPhase) {
            ok &= chk({1, 3, 2100, 6, 4, 2}, 28, 0.05);
            ok &= chk({1, 3, 1100, 5, 4, 2}, 29, 0.05);
            ok &= chk({1, 5, 64, 6, 4, 6}, 30);
            ok &= chk({1, 5, 64, 2, 4, 9}, 25);  // N_b > D: one sublayer per block, no p anywhere
            // up to 8 block sources at 2 and 4 values per thread: block_inter_kernel's groups of
            // 8 and 4 sources and block_flush2_kernel's of 4 and 2, the last ones partial
            ok &= chk({1, 7, 400, 8, 4, 8}, 31);
            ok &= chk({1, 5, 1024, 8, 4, 8}, 32);
        }
        if (!quick) {
            if (path != BlockPath::TwoPhase) ok &= chk({1, 5, 64, 2, 4, 9}, 25);
            ok &= chk({3, 50, 1024, 4, 4, 3}, 26);
        }
    }
    return ok;
}

// Estimated traffic per token of fwd+bwd. Per sublayer, every path: x, xn written, the new source
// (o read, p read, written) and the fp32 rows of the gradient plumbing (6·d·tb + 8·d). Aggregation
// over K sources: the per-sublayer forward reads K·d·tb; the direct backward 2·K·d·tb + 8·K·d
// (fp32 gradient read-modify-write). Block, one-phase deferred backward: K·d·tb per sublayer, p's
// update d·(tb + 8), dx read + stash 2·d·tb, and once per block (tb + 8)·d per block source.
// Block, two-phase: forward at position 1 the n block sources and the other positions' aggregates
// written, (n + ns − 1)·d·tb, at i >= 2 the aggregate and p read, 2·d·tb; backward at i >= 2 dx
// and a_j read and the stash written 3·d·tb plus p's update d·(tb + 8), at i = 1 dx_1 and the
// ns − 1 stashes read, ns·d·tb, plus (tb + 8)·d per block source.
template <typename T>
static double block_traffic(int D, int nb, double d, BlockPath path) {
    const double tb = sizeof(T);
    double b = 0;
    const int S = D / nb;
    for (int j = 1; j <= D + 1; j++) {
        int K, n = 0, i = 1;
        if (j == D + 1) K = nb + 1;
        else {
            n = std::min((j - 1) / S + 1, nb);
            i = j - (n - 1) * S;
            K = n + (i >= 2 ? 1 : 0);
        }
        const int ns = n < nb ? S : D - (nb - 1) * S;
        b += 6 * d * tb + 8 * d;
        if (j == D + 1 || path == BlockPath::Direct) {
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

// Full (K = j sources at sublayer j, the readout j = D + 1 included): the per-sublayer rows as
// above, less one d·tb (the sources are o_j itself, written by the trainer's GEMM into the source
// array, output_buffer: read for their RMS, not copied), the forward's K·d·tb. Direct backward:
// 2·K·d·tb + 8·K·d. Deferred backward: no fp32 rows (8·d less); the scores kernel reads the K
// sources once (kept in shared memory for dL/dq, which they are at the bench shape in fp32 and
// bf16), dx and writes the stash, K·d·tb + 2·d·tb (g1: the sources read twice, 2·K·d·tb + 2·d·tb);
// then the flushes under GpuAttnRes::full_flush's pairing rule with threshold pair_min (their
// d_o writes are in the per-sublayer rows): a single flush of source k reads it and its m = J − k
// stash rows, (m + 1)·d·tb; a pair (k, k−1) reads both sources and the m rows and writes the fp32
// partial, (m + 2)·d·tb + 4·d, and the flush of k−1 reads the partial, one stash row and the
// source, 4·d + 2·d·tb.
template <typename T>
static double full_traffic(int D, double d, FullPath path, int pair_min) {
    const double tb = sizeof(T);
    double b = 0;
    for (int j = 1; j <= D + 1; j++) {
        const int K = j;
        b += 6 * d * tb + K * d * tb - (j <= D ? d * tb : 0);
        if (path == FullPath::Direct) b += 8 * d + K * d * (2 * tb + 8);
        else b += ((path == FullPath::G1 ? 2 : 1) * K + 2) * d * tb;
    }
    if (path == FullPath::Direct) return b;
    const int J = D + 1;
    for (int k = D; k >= 0; k--) {
        const int m = J - k;
        if (ar_detail::full_flush_pairs(k, J, pair_min)) {
            b += (m + 2) * d * tb + 4 * d + 4 * d + 2 * d * tb;
            k--;
        } else {
            b += (m + 1) * d * tb;
        }
    }
    return b;
}

template <typename T>
static void run_bench() {
    const wb::Shape full{8, 2048, 1024, 24, 4, 8};
    for (BlockPath path : {BlockPath::TwoPhase, BlockPath::OnePhase, BlockPath::Direct})
        wb::bench_scheme<T>("attnres", "attnres-block", full, factory<T>(path), block_traffic<T>(48, 8, 1024, path), 20,
                            block_label(path));
    for (FullPath path : kFullPaths)
        wb::bench_scheme<T>("attnres", "attnres-full", full, full_factory<T>(path),
                            full_traffic<T>(48, 1024, path, full_pair_min<T>(path)), 20, full_label(path));
}

int main(int argc, char** argv) {
    wb::Cli cli;
    cli.quick_times_nothing = true;
    if (const int rc = cli.parse(argc, argv, "attnres",
                                 "AttnRes Full and Block (GpuAttnRes) forward + backward over D sublayers",
                                 "the small CHECK shapes, no BENCH");
        rc >= 0)
        return rc;
    exit_if_no_gpu("attnres");
    const bool quick = cli.quick;
    try {
        std::printf("# %s\n", device_description().c_str());
        const wb::Checks which = quick ? wb::Checks::Quick : wb::Checks::Full;
        bool ok = true;
        if (cli.check) {
            ok &= run_checks<float>(which, 1e-4, 1e-4);
            ok &= run_checks<bf16>(which, 3e-2, 5e-2);
        }
        if (!quick && cli.bench) {
            run_bench<bf16>();
            run_bench<float>();
        }
        std::printf("attnres: %s\n", !cli.check ? "no checks run" : ok ? "all checks passed" : "SOME CHECKS FAILED");
        return ok ? 0 : 1;
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "attnres: error: %s\n", ex.what());
        return 1;
    }
}
