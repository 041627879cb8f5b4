// dev/cuda/classifier.cu — workbench for cuda/classifier.cuh: fused_classifier ("v2": online
// softmax, 16-byte accesses on aligned rows; "v2_scalar": the same kernel's scalar path, which
// production runs on unaligned rows, forced here on aligned ones) and the workbench-only "v1"
// (simple three-pass kernel below, slower: doc/cuda.md "Kernel variants") against cpu/ops.h
// cross_entropy_forward + cross_entropy_backward_inplace, and sum_losses against a double sum.
// Inputs: random logits (σ = 2) with the padding columns V <= v < Vp set to NaN (they must never
// be read for the statistics and must come back as exact zeros); targets include 0 and V-1.
// Then timings at N = 16384 for V = 50257 (Vp = 50304) and V = 151936.
// Output lines (doc/cuda.md workbench convention):
//   CHECK classifier <variant> <dtype> <shape> rel=<x> max_abs=<y> PASS|FAIL
//   BENCH classifier <variant> <dtype> <shape> ms=<x> GB/s=<y> TFLOP/s=-
// GB/s counts the minimal traffic N·Vp·sizeof(T) read + written once (v2 actually reads twice,
// v1 three times).
// Exit code 1 if any CHECK failed; "skipped: no GPU" and exit 0 without a GPU. Flags (workbench.cuh
// Cli): --quick (fewer check shapes), --check-only, --bench-only, --help.
#include <cstring>
#include <random>

#include "cuda/classifier.cuh"
#include "dev/cuda/workbench.cuh"
#include "cpu/ops.h"

using namespace ldm;
using namespace ldm::gpu;

static int g_failures = 0;

// ---- v1 (workbench only): pass 1 max, pass 2 Σ exp (expf), pass 3 writes; scalar loads ------
// (a named namespace: its kernel keeps external linkage, so that an emulated launch log names it)
namespace classifier_v1 {
using classifier_detail::kThreads;
using classifier_detail::target_logit;

// Block-wide max / sum in a fixed order (shuffle tree in each warp, then warp 0 over the warp
// results); the result is returned to EVERY thread. blockDim.x must be a multiple of 32.
__device__ inline float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ inline float warp_add(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ inline float block_max(float x) {
    __shared__ float sh[32];
    __shared__ float result;
    x = warp_max(x);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        float y = warp_max(lane < nw ? sh[lane] : -FLT_MAX);
        if (lane == 0) result = y;
    }
    __syncthreads();
    return result;
}
__device__ inline float block_sum(float x) {
    __shared__ float sh[32];
    __shared__ float result;
    x = warp_add(x);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        float y = warp_add(lane < nw ? sh[lane] : 0.0f);
        if (lane == 0) result = y;
    }
    __syncthreads();
    return result;
}

// Same contract as fused_classifier (one block per row, any alignment).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    classifier_three_pass_kernel(T* logits, float* losses, const int32_t* targets, int V, int Vp,
                                 float dscale, bool write) {
    T* row = logits + (int64_t)blockIdx.x * Vp;
    const int t = targets[blockIdx.x];
    const float xt = target_logit(row, t, V);
    float mx = -FLT_MAX;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, to_f(row[v]));
    mx = block_max(mx);
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(to_f(row[v]) - mx);
    s = block_sum(s);   // ends with __syncthreads: every read above is done before any write
    if (threadIdx.x == 0 && losses) losses[blockIdx.x] = mx + logf(s) - xt;
    if (!write) return;
    const float inv_s = 1.0f / s;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        const float x = v < V ? to_f(row[v]) : 0.0f;
        const float d = v < V ? dscale * (expf(x - mx) * inv_s - (v == t ? 1.0f : 0.0f)) : 0.0f;
        row[v] = from_f<T>(d);
    }
}

// The kernels compared here: 1 = v1 above, 2 = production fused_classifier, 3 = its scalar path.
const char* variant_name(int variant) {
    return variant == 1 ? "v1" : variant == 2 ? "v2" : "v2_scalar";
}
template <typename T>
void run_variant(int variant, T* logits, float* losses, const int32_t* targets, int64_t N, int V,
                 int Vp, float dscale, bool write) {
    if (variant == 2) return fused_classifier<T>(logits, losses, targets, N, V, Vp, dscale, write, 0);
    if (variant == 3)
        return classifier_detail::launch<T>(false, logits, losses, targets, N, V, Vp, dscale, write, 0);
    if (N == 0) return;
    classifier_three_pass_kernel<T><<<(unsigned)N, kThreads>>>(logits, losses, targets, V, Vp,
                                                               dscale, write);
    LDM_LAUNCH_CHECK();
}
}  // namespace classifier_v1
using namespace classifier_v1;

static void report_check(const char* variant, const char* dtype, const std::string& shape,
                         double rel, double max_abs, bool pass) {
    std::printf("CHECK classifier %s %s %s rel=%.3e max_abs=%.3e %s\n", variant, dtype,
                shape.c_str(), rel, max_abs, pass ? "PASS" : "FAIL");
    if (!pass) g_failures++;
}

// x[n, v] = σ·(hash uniform in [-√3, √3)) (unit variance times σ) for v < V, `pad` for v >= V.
template <typename T>
__global__ void logits_fill_kernel(T* x, int64_t N, int V, int Vp, uint64_t seed, float sigma,
                                   float pad) {
    const int64_t total = N * Vp, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += stride) {
        const int v = (int)(i % Vp);
        uint64_t z = (uint64_t)i + seed * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        x[i] = from_f<T>(v < V ? sigma * 1.7320508f * u : pad);
    }
}
template <typename T>
static void logits_fill(T* x, int64_t N, int V, int Vp, uint64_t seed, float sigma, float pad) {
    logits_fill_kernel<T><<<(unsigned)std::min<int64_t>(ceil_div(N * Vp, 256), 8192), 256>>>(
        x, N, V, Vp, seed, sigma, pad);
    LDM_LAUNCH_CHECK();
}

static std::vector<int32_t> make_targets(int64_t N, int V, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> t((size_t)N);
    for (int64_t n = 0; n < N; n++) t[n] = (int32_t)(rng() % (uint64_t)V);
    t[0] = 0;
    if (N > 1) t[N - 1] = V - 1;
    return t;
}

template <typename T>
static void check_shape(int64_t N, int V, int Vp, uint64_t seed, const std::vector<int>& variants) {
    const char* dt = dtype_name<T>();
    const std::string shape = strprintf("N=%lld,V=%d,Vp=%d", (long long)N, V, Vp);
    const int64_t total = N * (int64_t)Vp;
    const float dscale = (float)(1.0 / (double)N);
    DeviceBuffer<T> orig(total), work(total);
    DeviceBuffer<float> losses(N), lsum(1);
    DeviceBuffer<int32_t> tgt(N);
    logits_fill<T>(orig.get(), N, V, Vp, seed, 2.0f, NAN);
    const std::vector<int32_t> targets = make_targets(N, V, seed + 1);
    CUDA_CHECK(cudaMemcpy(tgt.get(), targets.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));

    // CPU reference on the exact (already rounded to T) logits.
    std::vector<float> logits = download(orig.get(), total);
    std::vector<float> lse((size_t)N), dref = logits;
    cpu::cross_entropy_forward<float>(lse.data(), logits.data(), targets.data(), (int)N, V, Vp,
                                      dref.data());
    cpu::cross_entropy_backward_inplace<float>(dref.data(), targets.data(), (int)N, V, Vp, dscale);
    std::vector<float> loss_ref((size_t)N);
    for (int64_t n = 0; n < N; n++) {
        loss_ref[n] = lse[n] - logits[n * Vp + targets[n]];
        for (int v = V; v < Vp; v++) dref[n * Vp + v] = 0.0f;
    }
    const double tol_loss = 1e-5;   // fp32 arithmetic on identical inputs for both dtypes
    const double tol_d = std::is_same<T, float>::value ? 1e-5 : 1e-2;

    for (int variant : variants) {
        const std::string vn = variant_name(variant);
        // losses + dlogits
        CUDA_CHECK(cudaMemcpy(work.get(), orig.get(), total * sizeof(T), cudaMemcpyDeviceToDevice));
        fill<float>(losses.get(), N, NAN, 0);
        run_variant<T>(variant, work.get(), losses.get(), tgt.get(), N, V, Vp, dscale, true);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> lg = download(losses.get(), N), dg = download(work.get(), total);
        const Compare cl = compare(lg.data(), loss_ref.data(), N);
        report_check(vn.c_str(), dt, shape + ",loss", cl.rel, cl.max_abs, cl.finite && cl.rel <= tol_loss);
        const Compare cd = compare(dg.data(), dref.data(), total);
        report_check(vn.c_str(), dt, shape + ",dlogits", cd.rel, cd.max_abs, cd.finite && cd.rel <= tol_d);
        int64_t bad_pad = 0;
        for (int64_t n = 0; n < N; n++)
            for (int v = V; v < Vp; v++) {
                const float x = dg[n * Vp + v];
                if (!(x == 0.0f) || std::signbit(x)) bad_pad++;
            }
        report_check(vn.c_str(), dt, shape + ",pad_zero", (double)bad_pad, 0.0, bad_pad == 0);

        // sum_losses vs a double sum of the same GPU losses; run twice, identical bits
        fill<float>(lsum.get(), 1, NAN, 0);
        sum_losses(lsum.get(), losses.get(), N, 0);
        const float s1 = download(lsum.get(), 1)[0];
        sum_losses(lsum.get(), losses.get(), N, 0);
        const float s2 = download(lsum.get(), 1)[0];
        double sref = 0;
        for (float x : lg) sref += x;
        const double err = std::fabs((double)s1 - sref);
        report_check(vn.c_str(), dt, shape + ",sum_losses", err / std::max(std::fabs(sref), 1e-30), err,
                     std::isfinite(s1) && std::memcmp(&s1, &s2, sizeof s1) == 0 &&
                         err <= 1e-6 * std::fabs(sref) + 1e-30);

        // losses only: the logits stay untouched (bitwise)
        CUDA_CHECK(cudaMemcpy(work.get(), orig.get(), total * sizeof(T), cudaMemcpyDeviceToDevice));
        fill<float>(losses.get(), N, NAN, 0);
        run_variant<T>(variant, work.get(), losses.get(), tgt.get(), N, V, Vp, dscale, false);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> lg2 = download(losses.get(), N), after = download(work.get(), total);
        const Compare cl2 = compare(lg2.data(), loss_ref.data(), N);
        int64_t changed = 0;
        for (int64_t i = 0; i < total; i++)
            if (std::memcmp(&after[i], &logits[i], sizeof(float)) != 0) changed++;
        report_check(vn.c_str(), dt, shape + ",loss_only", cl2.rel, cl2.max_abs,
                     cl2.finite && cl2.rel <= tol_loss && changed == 0 &&
                         std::memcmp(lg2.data(), lg.data(), N * sizeof(float)) == 0);
    }
}

template <typename T>
static void bench(int variant, int64_t N, int V, int Vp, bool write) {
    const int64_t total = N * (int64_t)Vp;
    DeviceBuffer<T> x(total);
    DeviceBuffer<float> losses(N);
    DeviceBuffer<int32_t> tgt(N);
    logits_fill<T>(x.get(), N, V, Vp, 99, 2.0f, 0.0f);
    const std::vector<int32_t> targets = make_targets(N, V, 98);
    CUDA_CHECK(cudaMemcpy(tgt.get(), targets.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
    // In place: after the first call the rows hold dlogits; the work per call is the same.
    auto fn = [&]() {
        run_variant<T>(variant, x.get(), losses.get(), tgt.get(), N, V, Vp, 1.0f / (float)N, write);
    };
    const float ms = time_median_ms(fn, 3, 20);
    const double bytes = (double)total * sizeof(T) * (write ? 2.0 : 1.0);
    std::printf("BENCH classifier %s %s N=%lld,V=%d,Vp=%d%s ms=%.4f GB/s=%.1f TFLOP/s=-\n", variant_name(variant),
                dtype_name<T>(), (long long)N, V, Vp, write ? "" : ",loss_only", ms,
                bytes / (ms * 1e-3) / 1e9);
}

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "classifier", "the fused softmax cross-entropy forward + backward (v1-v3)",
                                 "4 CHECK shapes (not the N = 4096 and tiny-V ones); the same BENCH");
        rc >= 0)
        return rc;
    exit_if_no_gpu("classifier");
    g_failures = 0;  // this run's failures only (the emulation tests call main more than once)
    const bool quick = cli.quick;
    try {
        std::printf("device: %s\n", device_description().c_str());
        const std::vector<int> variants = {1, 2, 3};
        struct Shape {
            int64_t N;
            int V, Vp;
        };
        // {6, 999, 1001}: rows not 16-byte aligned, production runs the scalar path.
        std::vector<Shape> shapes = {{3, 50257, 50304}, {7, 1000, 1024}, {5, 1001, 1008},
                                     {6, 999, 1001},    {2, 3, 8},       {4096, 50257, 50257}};
        if (quick) shapes = {{3, 50257, 50304}, {7, 1000, 1024}, {5, 1001, 1008}, {6, 999, 1001}};
        uint64_t seed = 1;
        if (cli.check)
            for (const Shape& sh : shapes) {
                check_shape<float>(sh.N, sh.V, sh.Vp, seed++, variants);
                check_shape<bf16>(sh.N, sh.V, sh.Vp, seed++, variants);
            }
        const int64_t N = 16384;
        if (cli.bench) {
            for (int variant : variants) {
                bench<float>(variant, N, 50257, 50304, true);
                bench<bf16>(variant, N, 50257, 50304, true);
                bench<float>(variant, N, 151936, 151936, true);
                bench<bf16>(variant, N, 151936, 151936, true);
            }
            bench<bf16>(2, N, 50257, 50304, false);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "classifier: error: %s\n", e.what());
        return 1;
    }
    std::printf("classifier: %s (%d failed checks)\n", !cli.check ? "no checks run" : g_failures ? "FAIL" : "PASS",
                g_failures);
    return g_failures ? 1 : 0;
}
