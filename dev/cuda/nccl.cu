// dev/cuda/nccl.cu — workbench of cuda/nccl.cuh (issue #10): checks NCCL all-reduce,
// reduce-scatter and all-gather through the typed wrappers against a CPU sum over the ranks'
// inputs (every rank computes every rank's input on the host), for fp32 and bf16, at several sizes
// including odd ones, with outputs poisoned (NaN) first; then times each collective on a
// gradient-sized buffer (llama-400m-like: 4e8 fp32 values; --quick: 2^24).
//
//   build/cuda/nccl [--quick] [--check-only | --bench-only] [--nccl-id-file PATH] [--help]
//                                               world size 1 (one GPU); flags: workbench.cuh Cli
//   mpirun -np 8 build/cuda/nccl                8 GPUs of a node
//
// Output (doc/cuda.md workbench convention), from every rank's check and rank 0's timing:
//   CHECK nccl <op> <dtype> n=<count> rank=<r>/<W> rel=<x> max_abs=<y> PASS|FAIL
//   BENCH nccl <op> <dtype> n=<count> ms=<x> GB/s=<bus bandwidth> TFLOP/s=-
// Bus bandwidth (nccl-tests convention): all-reduce bytes*2(W-1)/W / t; reduce-scatter and
// all-gather bytes*(W-1)/W / t, bytes = the full buffer; with W = 1 the algorithm bandwidth
// bytes / t is printed instead. Exit status non-zero if any CHECK fails. No GPU: "skipped: no GPU".
//
// The trainers' overlap path (GpuDataParallel with overlap, issue #10 item 3) on the gradient
// layout of a model (tiny + mHC for the checks; llama-400m for the timing, --quick: small):
//   CHECK nccl bucketed_zero<z> fp32 n=... rank=<r>/<W> buckets=... max_abs=... PASS|FAIL
//     the buckets reduced stage by stage through on_grads_final / finish_reduction (as
//     GPT::backward drives them) == the expected sum (ZeRO-0: every element; ZeRO-1: this rank's
//     slice), exactly; the inputs are multiples of 1/4, so every summation order gives the same
//     bits and the check is about coverage and placement, not order (see doc/distributed.md);
//   CHECK nccl gather_params bf16 ... : the ZeRO-1 bf16 working-copy gather (+ fp32 scheme range);
//   BENCH nccl bucketed_all_reduce / bucketed_reduce_zero1 fp32 n=... ms=... buckets=... and
//   BENCH nccl gather_params bf16 ...: the same reductions back to back (no backward to hide
//   behind), to compare with the flat all_reduce / reduce_scatter lines of the same n.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dist.h"
#include "cuda/common.cuh"
#include "cuda/nccl.cuh"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;

namespace {

// Rank p's input value at index i: a multiple of 1/4 in [-8, 8), exact in bf16 and in any sum of
// up to 64 ranks in fp32.
float input_value(int p, int64_t i) { return float(((i * 7 + int64_t(p) * 13) % 64) - 32) * 0.25f; }

template <typename T>
int check_all(NcclComm& comm, cudaStream_t s, int64_t n, double tol) {
    const int W = comm.world, r = comm.rank;
    int fails = 0;
    auto report = [&](const char* op, const std::vector<float>& got, const std::vector<float>& want) {
        Compare c = compare(got.data(), want.data(), int64_t(want.size()));
        const bool ok = c.finite && c.rel <= tol;
        std::printf("CHECK nccl %s %s n=%lld rank=%d/%d rel=%.3g max_abs=%.3g %s\n", op, dtype_name<T>(),
                    (long long)n, r, W, c.rel, c.max_abs, ok ? "PASS" : "FAIL");
        if (!ok) fails++;
    };
    // all-reduce, in place
    {
        std::vector<float> h(static_cast<size_t>(n)), want(static_cast<size_t>(n), 0.0f);
        for (int64_t i = 0; i < n; i++) {
            h[size_t(i)] = input_value(r, i);
            for (int p = 0; p < W; p++) want[size_t(i)] += input_value(p, i);
        }
        DeviceBuffer<T> d(n);
        upload(d.ptr, h.data(), n);
        nccl_all_reduce_sum<T>(comm, d.ptr, d.ptr, dist::Elems(n), s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        report("all_reduce", download(d.ptr, n), want);
    }
    // reduce-scatter of n per rank (send [W*n])
    {
        std::vector<float> h(static_cast<size_t>(W) * static_cast<size_t>(n)), want(static_cast<size_t>(n), 0.0f);
        for (int64_t i = 0; i < int64_t(h.size()); i++) h[size_t(i)] = input_value(r, i);
        for (int64_t i = 0; i < n; i++)
            for (int p = 0; p < W; p++) want[size_t(i)] += input_value(p, int64_t(r) * n + i);
        DeviceBuffer<T> send(int64_t(h.size())), recv(n);
        upload(send.ptr, h.data(), int64_t(h.size()));
        fill(recv.ptr, n, NAN, s);
        nccl_reduce_scatter_sum<T>(comm, send.ptr, recv.ptr, dist::Elems(n), s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        report("reduce_scatter", download(recv.ptr, n), want);
    }
    // all-gather of n per rank (recv [W*n])
    {
        std::vector<float> h(static_cast<size_t>(n)), want(static_cast<size_t>(W) * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; i++) h[size_t(i)] = input_value(r, i);
        for (int p = 0; p < W; p++)
            for (int64_t i = 0; i < n; i++) want[size_t(p) * size_t(n) + size_t(i)] = input_value(p, i);
        DeviceBuffer<T> send(n), recv(int64_t(want.size()));
        upload(send.ptr, h.data(), n);
        fill(recv.ptr, int64_t(want.size()), NAN, s);
        nccl_all_gather<T>(comm, send.ptr, recv.ptr, dist::Elems(n), s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        report("all_gather", download(recv.ptr, int64_t(want.size())), want);
    }
    return fails;
}

template <typename T>
void bench_all(NcclComm& comm, cudaStream_t s, int64_t n) {
    const int W = comm.world;
    const int64_t shard = padded_shard(n, W), full = shard * W;
    DeviceBuffer<T> buf(full), part(shard);
    fill(buf.ptr, full, 0.5f, s);
    fill(part.ptr, shard, 0.25f, s);
    const double bytes = double(full) * sizeof(T);
    const double f_ar = W > 1 ? 2.0 * (W - 1) / W : 1.0, f_rs = W > 1 ? double(W - 1) / W : 1.0;
    struct Op {
        const char* name;
        double factor;
        std::function<void()> fn;
    };
    std::vector<Op> ops = {
        {"all_reduce", f_ar, [&] { nccl_all_reduce_sum<T>(comm, buf.ptr, buf.ptr, dist::Elems(full), s); }},
        {"reduce_scatter", f_rs, [&] { nccl_reduce_scatter_sum<T>(comm, buf.ptr, part.ptr, dist::Elems(shard), s); }},
        {"all_gather", f_rs, [&] { nccl_all_gather<T>(comm, part.ptr, buf.ptr, dist::Elems(shard), s); }},
    };
    for (auto& op : ops) {
        float ms = time_median_ms(op.fn, 3, 20, s);
        if (comm.rank == 0)
            std::printf("BENCH nccl %s %s n=%lld ms=%.4f GB/s=%.1f TFLOP/s=- (world %d)\n", op.name, dtype_name<T>(),
                        (long long)full, ms, bytes * op.factor / (ms * 1e-3) / 1e9, W);
    }
}

// A fresh id file per extra communicator (rank 0 rewrites it; the others must not read an old one).
std::string next_id_file(const std::string& id_file) {
    static int k = 0;
    return id_file.empty() ? id_file : id_file + ".dp" + std::to_string(++k);
}

// Drives dp's bucketed reduction of g [n] the way GPT::backward does: every stage in order, then
// the compute stream s waits.
void reduce_all_stages(GpuDataParallel& dp, int n_layer, float* g, cudaStream_t s) {
    (void)g;
    for (int st = 0; st <= dist::grad_stage_end(n_layer); st++) dp.on_grads_final(st, s);
    (void)dp.reduce_grads(g, s);
}

// The overlap path of GpuDataParallel (ZeRO-`zero`) against the expected sums on the layout of cfg.
int check_buckets(const ModelConfig& cfg, int zero, const std::string& id_file, cudaStream_t s) {
    const std::vector<ParamSpec> specs = param_specs(cfg);
    const int64_t n = count_params(cfg);
    GpuDataParallel dp;
    dp.init(dist::context(), n, zero, true, next_id_file(id_file), true);
    const int W = dp.world, r = dp.rank;
    DeviceBuffer<float> g(n);
    dp.plan_overlap(specs, cfg.n_layer, g.ptr, int64_t(1) << 16);
    std::vector<float> h(static_cast<size_t>(n), 0.0f);
    for (int64_t i = 0; i < n; i++) h[size_t(i)] = input_value(r, i);
    upload(g.ptr, h.data(), n);
    reduce_all_stages(dp, cfg.n_layer, g.ptr, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> got = download(g.ptr, n);
    const int64_t lo = dp.own_off, cnt = dp.own_count;  // ZeRO-0: [0, n)
    double max_abs = 0;
    bool ok = true;
    for (int64_t i = lo; i < lo + cnt; i++) {
        float want = 0;
        for (int p = 0; p < W; p++) want += input_value(p, i);
        const double e = std::fabs(double(got[size_t(i)]) - double(want));
        if (!(e == 0)) ok = false;
        if (e > max_abs || e != e) max_abs = e;
    }
    int fails = ok ? 0 : 1;
    std::printf("CHECK nccl bucketed_zero%d fp32 n=%lld rank=%d/%d buckets=%zu max_abs=%.3g %s\n", zero,
                (long long)n, r, W, dp.buckets.size(), max_abs, ok ? "PASS" : "FAIL");
    if (zero == 1) {
        // bf16 working copy: this rank's slice holds its owner's values, the rest NaN; the fp32
        // master likewise; after gather_params every element holds its owner's value (work), and
        // the master's scheme range [lo_s, n) too.
        int64_t lo_s = n;
        for (const auto& sp : specs)
            if (sp.name.rfind("scheme.", 0) == 0) lo_s = std::min(lo_s, sp.offset);
        std::vector<float> want(static_cast<size_t>(n)), mine(static_cast<size_t>(n), NAN);
        for (int q = 0; q < W; q++) {
            const dist::Shard sh = dist::padded_shard_range(n, W, q);
            for (int64_t i = sh.offset; i < sh.offset + sh.count; i++) {
                want[size_t(i)] = input_value(q, i);
                if (q == r) mine[size_t(i)] = want[size_t(i)];
            }
        }
        DeviceBuffer<bf16> work(n);
        DeviceBuffer<float> master(n);
        upload(work.ptr, mine.data(), n);
        upload(master.ptr, mine.data(), n);
        dp.gather_params<bf16>(work.ptr, master.ptr, lo_s, s);
        std::vector<float> gw = download(work.ptr, n), gm = download(master.ptr, n);
        Compare cw = compare(gw.data(), want.data(), n);
        Compare cm = compare(gm.data() + lo_s, want.data() + lo_s, n - lo_s);
        const bool okg = cw.finite && cw.max_abs == 0 && cm.finite && cm.max_abs == 0;
        std::printf("CHECK nccl gather_params bf16 n=%lld rank=%d/%d scheme_fp32=%lld max_abs=%.3g %s\n",
                    (long long)n, r, W, (long long)(n - lo_s), std::max(cw.max_abs, cm.max_abs),
                    okg ? "PASS" : "FAIL");
        if (!okg) fails++;
    }
    return fails;
}

// Times the overlap path's reductions (all stages back to back) and the bf16 gather on cfg's layout.
void bench_buckets(const ModelConfig& cfg, const std::string& id_file, cudaStream_t s) {
    const int64_t n = count_params(cfg);
    for (int zero : {0, 1}) {
        GpuDataParallel dp;
        dp.init(dist::context(), n, zero, true, next_id_file(id_file), true);
        DeviceBuffer<float> g(n);
        fill(g.ptr, n, 0.5f, s);
        dp.plan_overlap(param_specs(cfg), cfg.n_layer, g.ptr, kNcclMinBucketElems);
        const int W = dp.world;
        const double bytes = double(n) * sizeof(float);
        const double f = W > 1 ? (zero == 0 ? 2.0 : 1.0) * (W - 1) / W : 1.0;
        float ms = time_median_ms([&] { reduce_all_stages(dp, cfg.n_layer, g.ptr, s); }, 2, 10, s);
        if (dp.rank == 0)
            std::printf("BENCH nccl %s fp32 n=%lld ms=%.4f GB/s=%.1f TFLOP/s=- (world %d, %zu buckets, %s)\n",
                        zero == 0 ? "bucketed_all_reduce" : "bucketed_reduce_zero1", (long long)n, ms,
                        bytes * f / (ms * 1e-3) / 1e9, W, dp.buckets.size(), cfg.preset.c_str());
        if (zero == 1) {
            DeviceBuffer<bf16> work(n);
            DeviceBuffer<float> master(n);
            fill(work.ptr, n, 0.25f, s);
            fill(master.ptr, n, 0.25f, s);
            float mg = time_median_ms([&] { dp.gather_params<bf16>(work.ptr, master.ptr, n, s); }, 2, 10, s);
            if (dp.rank == 0)
                std::printf("BENCH nccl gather_params bf16 n=%lld ms=%.4f GB/s=%.1f TFLOP/s=- (world %d, %s)\n",
                            (long long)n, mg, double(n) * 2 * (W > 1 ? double(W - 1) / W : 1.0) / (mg * 1e-3) / 1e9,
                            W, cfg.preset.c_str());
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "nccl", "NCCL collectives and GpuDataParallel's bucketed reductions",
                                 "BENCH on 2^24 values and the small preset (not 4e8 and llama-400m)",
                                 {"--nccl-id-file"}, "[--nccl-id-file PATH] ");
        rc >= 0)
        return rc;
    try {
        dist::init(&argc, &argv);
        if (!gpu_available()) {
            std::printf("nccl: skipped: no GPU\n");
            dist::finalize();
            return 0;
        }
        const bool quick = cli.quick;
        const std::string id_file = cli.value("--nccl-id-file");
        NcclComm comm;
        comm.init(dist::context(), id_file);
        if (comm.rank == 0)
            std::printf("nccl workbench: world %d, rank 0 on device %d (%s), NCCL %d\n", comm.world, comm.device,
                        device_description(comm.device).c_str(), NCCL_VERSION_CODE);
        cudaStream_t s;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        int fails = 0;
        if (cli.check) {
            for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000), int64_t(65537), int64_t((1 << 20) + 3)}) {
                fails += check_all<float>(comm, s, n, 1e-6);
                fails += check_all<bf16>(comm, s, n, 1e-2);
            }
            ModelConfig tc = preset_config("tiny", 50257);
            tc.scheme = "mhc";
            tc.validate();
            for (int zero : {0, 1}) fails += check_buckets(tc, zero, id_file, s);
        }
        if (cli.bench) {
            const int64_t nb = quick ? (int64_t(1) << 24) : int64_t(400) * 1000 * 1000;
            bench_all<float>(comm, s, nb);
            bench_all<bf16>(comm, s, nb);
            bench_buckets(preset_config(quick ? "small" : "llama-400m", 50257), id_file, s);
        }
        CUDA_CHECK(cudaStreamDestroy(s));
        std::vector<int64_t> f{fails};
        dist::allreduce_sum<int64_t>(dist::Span<int64_t>(f));
        if (comm.rank == 0) std::printf("nccl: %lld failed checks over %d ranks\n", (long long)f[0], comm.world);
        dist::finalize();
        return f[0] == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        dist::abort_all(1);
        return 1;
    }
}
