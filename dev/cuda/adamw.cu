// dev/cuda/adamw.cu — workbench for cuda/adamw.cuh: the AdamW update (v2 = adamw_update, the vec4
// kernel on these equally aligned arrays; v1 = its scalar kernel, the production fallback for
// differently aligned arrays, run here through adamw_detail::launch_scalar) against core/optim.h
// AdamW<float> on the same arrays (bit-exact expected: both run
// math/optim_math.h adamw_element), the bf16 working copy against the host rounding of the CPU
// result, a skipped step (the divergence guard) leaving every array bit for bit, the on-device
// clip factor / skip flag (adamw_step_guard) against the host formula, and global_norm_squared
// against a double-precision CPU sum (plus run-to-run bit identity). Then timings at n = 400e6 (llama-400m-like parameter count).
// Output lines (doc/cuda.md workbench convention):
//   CHECK adamw <variant> <dtype> <shape> rel=<x> max_abs=<y> PASS|FAIL
//   BENCH adamw <variant> <dtype> <shape> ms=<x> GB/s=<y> TFLOP/s=-
// The ",bitexact" lines report rel = fraction of values whose bits differ (PASS only at 0).
// Exit code 1 if any CHECK failed; "skipped: no GPU" and exit 0 without a GPU. Flags (workbench.cuh
// Cli): --quick (fewer CHECK sizes), --check-only, --bench-only, --help.
#include <cstring>
#include <random>

#include "core/optim.h"
#include "cuda/adamw.cuh"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;

static int g_failures = 0;

static void report_check(const char* variant, const char* dtype, const std::string& shape,
                         double rel, double max_abs, bool pass) {
    std::printf("CHECK adamw %s %s %s rel=%.3e max_abs=%.3e %s\n", variant, dtype, shape.c_str(),
                rel, max_abs, pass ? "PASS" : "FAIL");
    if (!pass) g_failures++;
}

// Number of positions where the float bit patterns differ.
static int64_t bit_mismatches(const float* a, const float* b, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) bad++;
    return bad;
}

// Device fill with pseudo-random values in [lo, hi) from a hash of (index, seed): fast inputs for
// the large timing shapes.
__global__ void hash_fill_kernel(float* x, int64_t n, uint64_t seed, float lo, float hi) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        uint64_t z = (uint64_t)i + seed * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        x[i] = lo + (hi - lo) * u;
    }
}
static void hash_fill(float* x, int64_t n, uint64_t seed, float lo, float hi) {
    hash_fill_kernel<<<(unsigned)std::min<int64_t>(ceil_div(n, 256), 4096), 256>>>(x, n, seed, lo, hi);
    LDM_LAUNCH_CHECK();
}

// v = 2: adamw_update (production); v = 1: the same update by the scalar kernel. The step's
// scalars go to the device first (as the trainer does it); skip: the guard's "do not apply".
template <typename T>
static void update_variant(int variant, float* p, T* p_copy, float* m, float* v, const float* g,
                           int64_t n, double lr, double beta1, double beta2, double eps,
                           double weight_decay, double grad_scale, int64_t t, bool skip = false) {
    AdamWStep st = adamw_step_scalars(beta1, beta2, eps, weight_decay, lr, grad_scale, t);
    st.skip = skip ? 1 : 0;
    DeviceBuffer<AdamWStep> dst(1);
    CUDA_CHECK(cudaMemcpy(dst.get(), &st, sizeof st, cudaMemcpyHostToDevice));
    if (variant == 2) {
        adamw_update<T>(p, p_copy, m, v, g, n, dst.get(), weight_decay != 0.0, 0);
    } else if (n > 0) {
        adamw_detail::launch_scalar<T>(p, p_copy, m, v, g, n, dst.get(), weight_decay != 0.0, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());  // dst dies here
}

// ---- AdamW update vs core/optim ---------------------------------------------------------------
// Three ranges with odd boundaries: [0, a) decay, [a, b) no decay, [b, n) decay, like the
// trainer's per-range calls; the odd range starts exercise v2's scalar head (0..3 elements).
template <typename T>
static void check_adamw(int variant, int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<float> p(n), m(n), v(n), g(n);
    for (int64_t i = 0; i < n; i++) {
        p[i] = (float)(0.05 * nd(rng));
        m[i] = (float)(1e-3 * nd(rng));
        v[i] = (float)(1e-6 * std::fabs(nd(rng))) + 1e-9f;
        g[i] = (float)(1e-2 * nd(rng));
    }
    if (n > 10) g[n / 2] = 0.0f;   // an exact-zero gradient
    const int64_t a = n / 3, b = (2 * n) / 3;
    std::vector<ParamRange> ranges = {{0, a, true}, {a, b - a, false}, {b, n - b, true}};
    AdamWConfig cfg;
    cfg.beta1 = 0.9;
    cfg.beta2 = 0.95;
    cfg.eps = 1e-8;
    cfg.weight_decay = 0.1;
    const double gnorm = global_norm(g.data(), n);
    cfg.grad_clip = 0.5 * gnorm;   // clipping active: c = 0.5 (computed in double like the CPU)
    const int64_t t = 5;           // the 5th update: bias corrections well away from 1
    const double lr = 3e-4;

    // CPU reference: AdamW<float> with the same state.
    AdamW<float> opt(n, cfg, ranges);
    opt.m() = m;
    opt.v() = v;
    opt.set_step_count(t - 1);
    std::vector<float> p_ref = p;
    const double norm_cpu = opt.step(p_ref.data(), g.data(), lr);
    const double clip = (cfg.grad_clip > 0 && norm_cpu > cfg.grad_clip) ? cfg.grad_clip / norm_cpu : 1.0;

    // GPU.
    const bool copy = !std::is_same<T, float>::value;
    DeviceBuffer<float> dp(n), dm(n), dv(n), dg(n);
    DeviceBuffer<T> dcopy(copy ? n : 0);
    CUDA_CHECK(cudaMemcpy(dp.get(), p.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dm.get(), m.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dv.get(), v.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dg.get(), g.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    if (copy) fill<T>(dcopy.get(), n, NAN, 0);
    for (const ParamRange& r : ranges) {
        if (r.numel == 0) continue;
        const int64_t o = r.offset;
        update_variant<T>(variant, dp.get() + o, copy ? dcopy.get() + o : nullptr, dm.get() + o,
                          dv.get() + o, dg.get() + o, r.numel, lr, cfg.beta1, cfg.beta2, cfg.eps,
                          r.decay ? cfg.weight_decay : 0.0, clip, t);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> p_gpu = download(dp.get(), n), m_gpu = download(dm.get(), n),
                       v_gpu = download(dv.get(), n);

    const char* vname = variant == 1 ? "v1" : "v2";
    const std::string shape = strprintf("n=%lld", (long long)n);
    // Tolerance check on p (relative to the update size, the meaningful scale) and m, v; then
    // the bit-exact contract.
    std::vector<float> dp_ref(n), dp_gpu(n);
    for (int64_t i = 0; i < n; i++) {
        dp_ref[i] = p_ref[i] - p[i];
        dp_gpu[i] = p_gpu[i] - p[i];
    }
    const Compare cu = compare(dp_gpu.data(), dp_ref.data(), n);
    const Compare cm = compare(m_gpu.data(), opt.m().data(), n);
    const Compare cv = compare(v_gpu.data(), opt.v().data(), n);
    const double rel = std::max(cu.rel, std::max(cm.rel, cv.rel));
    const Compare cp = compare(p_gpu.data(), p_ref.data(), n);
    report_check(vname, dtype_name<T>(), shape + ",update", rel, cp.max_abs,
                 cu.finite && cm.finite && cv.finite && rel <= 1e-6);
    const int64_t bad = bit_mismatches(p_gpu.data(), p_ref.data(), n) +
                        bit_mismatches(m_gpu.data(), opt.m().data(), n) +
                        bit_mismatches(v_gpu.data(), opt.v().data(), n);
    report_check(vname, dtype_name<T>(), shape + ",bitexact_vs_core_optim", (double)bad / (3.0 * n),
                 cp.max_abs, bad == 0);
    if (copy) {
        std::vector<float> c_gpu = download(dcopy.get(), n), c_ref(n);
        for (int64_t i = 0; i < n; i++) c_ref[i] = to_f(from_f<T>(p_ref[i]));
        const Compare cc = compare(c_gpu.data(), c_ref.data(), n);
        const int64_t badc = bit_mismatches(c_gpu.data(), c_ref.data(), n);
        report_check(vname, dtype_name<T>(), shape + ",p_copy_bitexact", cc.rel, cc.max_abs,
                     cc.finite && badc == 0);
    }
    // skip = 1 (the divergence guard): the same call with a NaN gradient leaves every array as it was
    {
        std::vector<float> gnan = g;
        gnan[0] = NAN;
        CUDA_CHECK(cudaMemcpy(dg.get(), gnan.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        std::vector<float> c_before = copy ? download(dcopy.get(), n) : std::vector<float>();
        for (const ParamRange& r : ranges) {
            if (r.numel == 0) continue;
            const int64_t o = r.offset;
            update_variant<T>(variant, dp.get() + o, copy ? dcopy.get() + o : nullptr, dm.get() + o,
                              dv.get() + o, dg.get() + o, r.numel, lr, cfg.beta1, cfg.beta2, cfg.eps,
                              r.decay ? cfg.weight_decay : 0.0, clip, t + 1, true);
        }
        int64_t changed = bit_mismatches(download(dp.get(), n).data(), p_gpu.data(), n) +
                          bit_mismatches(download(dm.get(), n).data(), m_gpu.data(), n) +
                          bit_mismatches(download(dv.get(), n).data(), v_gpu.data(), n);
        if (copy) changed += bit_mismatches(download(dcopy.get(), n).data(), c_before.data(), n);
        report_check(vname, dtype_name<T>(), shape + ",skip_leaves_all", (double)changed / (3.0 * n), 0.0,
                     changed == 0);
    }
}

// ---- adamw_step_guard (the clip factor and the skip flag on the device vs the host formula) and
// flag_nonfinite ---------------------------------------------------------------------------------
static void check_step_guard() {
    struct Case {
        float norm_sq;
        unsigned loss_bad;
        double grad_clip;
    };
    const Case cases[] = {{4.0f, 0, 1.0},  {0.25f, 0, 1.0},     {7.3e5f, 0, 0.37}, {3.0f, 0, 0.0},
                          {2.0f, 1, 1.0},  {INFINITY, 0, 1.0}, {NAN, 0, 1.0},     {NAN, 0, 0.0}};
    int bad = 0, n = 0;
    DeviceBuffer<AdamWStep> dst(1);
    DeviceBuffer<float> dsq(1);
    DeviceBuffer<unsigned> dflag(1);
    for (const Case& c : cases) {
        AdamWStep st = adamw_step_scalars(0.9, 0.95, 1e-8, 0.1, 3e-4, 1.0, 3);
        st.sc.clip = -1.0f;  // must be overwritten
        st.skip = 7;
        CUDA_CHECK(cudaMemcpy(dst.get(), &st, sizeof st, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dsq.get(), &c.norm_sq, 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dflag.get(), &c.loss_bad, 4, cudaMemcpyHostToDevice));
        adamw_step_guard(dst.get(), dsq.get(), dflag.get(), c.grad_clip, 0);
        AdamWStep got;
        CUDA_CHECK(cudaMemcpy(&got, dst.get(), sizeof got, cudaMemcpyDeviceToHost));
        // the host: what GpuBackend's eager step and core/optim.cpp compute
        const double norm = std::sqrt((double)c.norm_sq);
        const float clip = (float)((c.grad_clip > 0 && norm > c.grad_clip) ? c.grad_clip / norm : 1.0);
        const int skip = (!std::isfinite(norm) || c.loss_bad) ? 1 : 0;
        const bool ok = std::memcmp(&got.sc.clip, &clip, 4) == 0 && got.skip == skip &&
                        std::memcmp(&got.sc.lr, &st.sc.lr, 4) == 0 && std::memcmp(&got.sc.bc2, &st.sc.bc2, 4) == 0;
        bad += ok ? 0 : 1;
        n++;
    }
    // flag_nonfinite (the per-token losses' check): stays 0 on finite values, 1 with one inf / NaN anywhere
    for (int where : {-1, 0, 777, 4098}) {
        for (float poison : {INFINITY, NAN}) {
            std::vector<float> x(4099);
            for (size_t i = 0; i < x.size(); i++) x[i] = 1e30f * ((float)(i % 7) - 3.0f);
            if (where >= 0) x[(size_t)where] = poison;
            DeviceBuffer<float> dx(x.size());
            CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
            const unsigned zero = 0;
            CUDA_CHECK(cudaMemcpy(dflag.get(), &zero, 4, cudaMemcpyHostToDevice));
            flag_nonfinite(dflag.get(), dx.get(), (int64_t)x.size(), 0);
            unsigned f = 7;
            CUDA_CHECK(cudaMemcpy(&f, dflag.get(), 4, cudaMemcpyDeviceToHost));
            bad += f == (where >= 0 ? 1u : 0u) ? 0 : 1;
            n++;
        }
    }
    std::printf("CHECK adamw step_guard fp32 cases=%d rel=%.3e max_abs=%.3e %s\n", n, (double)bad / n, 0.0,
                bad == 0 ? "PASS" : "FAIL");
    if (bad) g_failures++;
}

// ---- global_norm_squared vs a double CPU sum, and run-to-run identity --------------------------
static void check_norm(int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> g(n);
    double ref = 0;
    for (int64_t i = 0; i < n; i++) {
        g[i] = nd(rng) * (i % 97 == 0 ? 10.0f : 0.01f);
        ref += (double)g[i] * (double)g[i];
    }
    DeviceBuffer<float> dg(std::max<int64_t>(n, 1)), scratch(global_norm_scratch()), out(2);
    if (n > 0) CUDA_CHECK(cudaMemcpy(dg.get(), g.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    fill<float>(out.get(), 2, NAN, 0);
    global_norm_squared(out.get(), scratch.get(), dg.get(), n, 0);
    global_norm_squared(out.get() + 1, scratch.get(), dg.get(), n, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> r = download(out.get(), 2);
    const double err = std::fabs((double)r[0] - ref);
    const double rel = err / std::max(ref, 1e-30);
    const bool same = std::memcmp(&r[0], &r[1], sizeof(float)) == 0;
    const bool pass = std::isfinite(r[0]) && same && (n == 0 ? r[0] == 0.0f : rel <= 1e-6);
    std::printf("CHECK adamw global_norm_squared fp32 n=%lld rel=%.3e max_abs=%.3e %s\n",
                (long long)n, rel, err, pass ? "PASS" : "FAIL");
    if (!pass) g_failures++;
}

// ---- timing --------------------------------------------------------------------------------
template <typename T>
static void bench_adamw(int variant, int64_t n) {
    const bool copy = !std::is_same<T, float>::value;
    DeviceBuffer<float> dp(n), dm(n), dv(n), dg(n);
    DeviceBuffer<T> dcopy(copy ? n : 0);
    hash_fill(dp.get(), n, 1, -0.05f, 0.05f);
    hash_fill(dm.get(), n, 2, -1e-3f, 1e-3f);
    hash_fill(dv.get(), n, 3, 1e-9f, 1e-6f);
    hash_fill(dg.get(), n, 4, -1e-2f, 1e-2f);
    const AdamWStep st = adamw_step_scalars(0.9, 0.95, 1e-8, 0.1, 3e-4, 1.0, 1);
    DeviceBuffer<AdamWStep> dst(1);
    CUDA_CHECK(cudaMemcpy(dst.get(), &st, sizeof st, cudaMemcpyHostToDevice));
    auto fn = [&]() {
        if (variant == 2)
            adamw_update<T>(dp.get(), copy ? dcopy.get() : nullptr, dm.get(), dv.get(), dg.get(), n, dst.get(), true, 0);
        else
            adamw_detail::launch_scalar<T>(dp.get(), copy ? dcopy.get() : nullptr, dm.get(), dv.get(), dg.get(), n,
                                           dst.get(), true, 0);
    };
    const float ms = time_median_ms(fn, 3, 20);
    const double bytes = (double)n * (7.0 * sizeof(float) + (copy ? sizeof(T) : 0));
    std::printf("BENCH adamw %s %s n=%lld ms=%.4f GB/s=%.1f TFLOP/s=-\n", variant == 1 ? "v1" : "v2",
                dtype_name<T>(), (long long)n, ms, bytes / (ms * 1e-3) / 1e9);
}

static void bench_norm(int64_t n) {
    DeviceBuffer<float> dg(n), scratch(global_norm_scratch()), out(1);
    hash_fill(dg.get(), n, 5, -1.0f, 1.0f);
    auto fn = [&]() { global_norm_squared(out.get(), scratch.get(), dg.get(), n, 0); };
    const float ms = time_median_ms(fn, 3, 20);
    std::printf("BENCH adamw global_norm_squared fp32 n=%lld ms=%.4f GB/s=%.1f TFLOP/s=-\n",
                (long long)n, ms, (double)n * sizeof(float) / (ms * 1e-3) / 1e9);
}

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "adamw", "AdamW (v1, v2) and the gradient norm / step guard",
                                 "fewer CHECK sizes (AdamW 1, 7, 1000003; norm 1, 1000003); the same BENCH");
        rc >= 0)
        return rc;
    exit_if_no_gpu("adamw");
    g_failures = 0;  // this run's failures only (the emulation tests call main more than once)
    const bool quick = cli.quick;
    try {
        std::printf("device: %s\n", device_description().c_str());
        if (cli.check) {
            std::vector<int64_t> sizes = {1, 2, 7, 1000, 4099, 1000003};
            if (quick) sizes = {1, 7, 1000003};
            uint64_t seed = 1;
            for (int variant : {1, 2})
                for (int64_t n : sizes) {
                    check_adamw<float>(variant, n, seed++);
                    check_adamw<bf16>(variant, n, seed++);
                }
            std::vector<int64_t> nsizes = {0, 1, 1000, 1000003, 50000017};
            if (quick) nsizes = {1, 1000003};
            for (int64_t n : nsizes) check_norm(n, seed++);
            check_step_guard();
        }
        if (cli.bench) {
            const int64_t N = 400000000;
            for (int variant : {1, 2}) {
                bench_adamw<float>(variant, N);
                bench_adamw<bf16>(variant, N);
            }
            bench_norm(N);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "adamw: error: %s\n", e.what());
        return 1;
    }
    std::printf("adamw: %s (%d failed checks)\n", !cli.check ? "no checks run" : g_failures ? "FAIL" : "PASS",
                g_failures);
    return g_failures ? 1 : 0;
}
