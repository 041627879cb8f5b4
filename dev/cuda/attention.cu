// dev/cuda/attention.cu — workbench for cuda/attention.cuh (doc/cuda.md, spec §1).
// Kernels (Kernel below): scalar and mma (the two production families, attention_forward picks by
// dtype and head_dim), mma-plain (the mma kernels with fragments read by plain shared-memory
// loads instead of ldmatrix: the previous production path, kept here to compare), mma-dqfull
// (dev/cuda/attention_dq_fulltile.cuh: the dQ kernel over whole 64-key tiles, production before
// it moved to half tiles; bitwise equal to mma, kept to compare), mma-pipe
// (dev/cuda/attention_pipelined.cuh: cp.async pipelines, diagonal-only masking, larger tiles) and
// wgmma (dev/cuda/attention_wgmma.cuh: sm_90a warpgroup-MMA forward and backward (dK/dV, dQ);
// compute capability 9.0 only, the workbench built for sm_90a).
// The mma kernels are bf16 only (fp32 runs skip them).
// Checks each kernel's forward (out, lse) and backward (dqkv), and the production dispatch, against the
// CPU reference cpu::attention_forward / attention_backward in double (q, k, v split from the
// packed qkv on the host; lse recomputed in double), for float and bf16, at small odd shapes,
// with NaN-poisoned outputs; checks that two backward runs are bit-identical and that mma-plain
// and mma-dqfull give mma's results bit for bit (same MMAs in the same order); then times forward
// and forward+backward at B·T = 16384 tokens (T=2048 llama-400m heads, T=8192 qwen3-1.7b-like).
// Output: CHECK/BENCH lines (doc/cuda.md workbench convention). Exit code 1 if a CHECK failed.
// Usage: attention [--quick] [--check-only | --bench-only] [--help] (workbench.cuh Cli; --quick:
// the first 4 check shapes, no timing)
#include <cstring>

#include "cuda/attention.cuh"
#include "dev/cuda/attention_pipelined.cuh"
#include "dev/cuda/attention_wgmma.cuh"
#include "dev/cuda/attention_plain_frags.cuh"
#include "dev/cuda/attention_dq_fulltile.cuh"
#include "dev/cuda/workbench.cuh"
#include "cpu/ops.h"
#include "cpu/rng.h"

using namespace ldm;
using namespace ldm::gpu;

namespace {

struct Shape {
    int B, T, nh, nkv, hd;
    std::string str() const {
        return strprintf("B=%d,T=%d,nh=%d,nkv=%d,hd=%d", B, T, nh, nkv, hd);
    }
    int64_t N() const { return (int64_t)B * T; }
    int64_t C3() const { return (int64_t)(nh + 2 * nkv) * hd; }
};

int g_failures = 0;

// The kernel families of the workbench; kAuto = the production dispatch (attention_forward).
enum Kernel { kAuto = 0, kScalar = 1, kMmaPlain = 2, kMma = 3, kMmaPipe = 4, kWgmma = 5, kMmaDqFull = 6 };
const char* kernel_name(Kernel k) {
    return k == kAuto        ? "auto"
           : k == kScalar    ? "scalar"
           : k == kMmaPlain  ? "mma-plain"
           : k == kMma       ? "mma"
           : k == kMmaPipe   ? "mma-pipe"
           : k == kMmaDqFull ? "mma-dqfull"
                             : "wgmma";
}
template <typename T>
bool kernel_supported(Kernel k, int hd) {
    if (k == kAuto) return true;
    if (k == kScalar) return attn_detail::scalar_supported<T>(hd);
    if (k == kMmaPipe) return std::is_same<T, bf16>::value && attn_pipe::pipe_supported(hd);
    if (k == kWgmma) return std::is_same<T, bf16>::value && attn_wgmma::wgmma_supported(hd);
    return attn_detail::mma_supported<T>(hd);
}
template <typename T>
void kernel_forward(Kernel k, T* out, float* lse, const T* qkv, int B, int T_, int nh, int nkv, int hd,
                    cudaStream_t s) {
    using namespace attn_detail;
    const float scale = 1.f / sqrtf((float)hd);
    if (k == kAuto) return attention_forward<T>(out, lse, qkv, B, T_, nh, nkv, hd, s);
    if (k == kScalar) return scalar_forward<T>(out, lse, qkv, B, T_, nh, nkv, hd, scale, s);
    if constexpr (std::is_same<T, bf16>::value) {
        if ((k == kMma || k == kMmaDqFull) && hd == 64) mma_forward<64, LdsmFrags>(out, lse, qkv, B, T_, nh, nkv, scale, s);
        if ((k == kMma || k == kMmaDqFull) && hd == 128) mma_forward<128, LdsmFrags>(out, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaPlain && hd == 64) mma_forward<64, PlainFrags>(out, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaPlain && hd == 128) mma_forward<128, PlainFrags>(out, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaPipe && hd == 64) attn_pipe::pipe_forward<64>(out, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaPipe && hd == 128) attn_pipe::pipe_forward<128>(out, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kWgmma && hd == 64) attn_wgmma::wgmma_forward<64>(out, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kWgmma && hd == 128) attn_wgmma::wgmma_forward<128>(out, lse, qkv, B, T_, nh, nkv, scale, s);
    }
}
template <typename T>
void kernel_backward(Kernel k, T* dqkv, float* scratch, const T* dout, const T* out, const float* lse, const T* qkv,
                     int B, int T_, int nh, int nkv, int hd, cudaStream_t s) {
    using namespace attn_detail;
    const float scale = 1.f / sqrtf((float)hd);
    if (k == kAuto) return attention_backward<T>(dqkv, scratch, dout, out, lse, qkv, B, T_, nh, nkv, hd, s);
    rowdot<T>(scratch, dout, out, B, T_, nh, hd, s);
    if (k == kScalar) return scalar_backward<T>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, hd, scale, s);
    if constexpr (std::is_same<T, bf16>::value) {
        if (k == kMma && hd == 64) mma_backward<64, LdsmFrags>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMma && hd == 128) mma_backward<128, LdsmFrags>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaDqFull && hd == 64) dqfull_backward<64>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaDqFull && hd == 128) dqfull_backward<128>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaPlain && hd == 64) mma_backward<64, PlainFrags>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaPlain && hd == 128) mma_backward<128, PlainFrags>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaPipe && hd == 64) attn_pipe::pipe_backward<64>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kMmaPipe && hd == 128) attn_pipe::pipe_backward<128>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kWgmma && hd == 64) attn_wgmma::wgmma_backward<64>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
        if (k == kWgmma && hd == 128) attn_wgmma::wgmma_backward<128>(dqkv, scratch, dout, lse, qkv, B, T_, nh, nkv, scale, s);
    }
}


void report(const char* what, Kernel variant, const char* dtype, const Shape& sh, const Compare& c,
            double tol) {
    const bool ok = c.finite && c.rel <= tol;
    if (!ok) g_failures++;
    std::printf("CHECK attention %s %s %s:%s rel=%.3e max_abs=%.3e %s\n", kernel_name(variant), dtype,
                sh.str().c_str(), what, c.rel, c.max_abs, ok ? "PASS" : "FAIL");
    std::fflush(stdout);
}

// Values rounded through T (so the CPU sees exactly what the GPU sees).
template <typename T>
std::vector<float> random_values(int64_t n, uint64_t seed, double sd) {
    std::vector<float> v((size_t)n);
    const uint64_t s0 = init_stream(seed, 0);
    for (int64_t i = 0; i < n; i++) v[(size_t)i] = to_f(from_f<T>((float)(sd * stream_normal(s0, (uint64_t)i))));
    return v;
}

struct Reference {
    std::vector<float> out, lse, dqkv;
};

// CPU reference in double from the packed host qkv.
Reference cpu_reference(const Shape& sh, const std::vector<float>& qkv, const std::vector<float>& dout) {
    const int64_t N = sh.N(), C3 = sh.C3();
    const int qd = sh.nh * sh.hd, kvd = sh.nkv * sh.hd;
    std::vector<double> q((size_t)(N * qd)), k((size_t)(N * kvd)), v((size_t)(N * kvd));
    for (int64_t n = 0; n < N; n++) {
        const float* r = qkv.data() + n * C3;
        for (int c = 0; c < qd; c++) q[(size_t)(n * qd + c)] = r[c];
        for (int c = 0; c < kvd; c++) {
            k[(size_t)(n * kvd + c)] = r[qd + c];
            v[(size_t)(n * kvd + c)] = r[qd + kvd + c];
        }
    }
    std::vector<double> out((size_t)(N * qd)), att((size_t)sh.B * sh.nh * sh.T * sh.T);
    cpu::attention_forward<double>(out.data(), att.data(), q.data(), k.data(), v.data(), sh.B, sh.T,
                                   sh.nh, sh.nkv, sh.hd);
    Reference ref;
    ref.out.assign(out.begin(), out.end());
    // lse[b, h, t] = log Σ_{j<=t} exp(scale q_t·k_j), in double with the max subtracted.
    const double scale = 1.0 / std::sqrt((double)sh.hd);
    const int G = sh.nh / sh.nkv;
    ref.lse.resize((size_t)sh.B * sh.nh * sh.T);
    std::vector<double> sc((size_t)sh.T);
    for (int b = 0; b < sh.B; b++)
        for (int h = 0; h < sh.nh; h++)
            for (int t = 0; t < sh.T; t++) {
                const double* qr = q.data() + ((int64_t)b * sh.T + t) * qd + (int64_t)h * sh.hd;
                double mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const double* kr = k.data() + ((int64_t)b * sh.T + j) * kvd + (int64_t)(h / G) * sh.hd;
                    double s = 0;
                    for (int d = 0; d < sh.hd; d++) s += qr[d] * kr[d];
                    sc[(size_t)j] = scale * s;
                    mx = std::max(mx, sc[(size_t)j]);
                }
                double sum = 0;
                for (int j = 0; j <= t; j++) sum += std::exp(sc[(size_t)j] - mx);
                ref.lse[((size_t)b * sh.nh + h) * sh.T + t] = (float)(mx + std::log(sum));
            }
    std::vector<double> dO(dout.begin(), dout.end());
    std::vector<double> dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    cpu::attention_backward<double>(dq.data(), dk.data(), dv.data(), dO.data(), att.data(), q.data(),
                                    k.data(), v.data(), sh.B, sh.T, sh.nh, sh.nkv, sh.hd);
    ref.dqkv.resize((size_t)(N * C3));
    for (int64_t n = 0; n < N; n++) {
        float* r = ref.dqkv.data() + n * C3;
        for (int c = 0; c < qd; c++) r[c] = (float)dq[(size_t)(n * qd + c)];
        for (int c = 0; c < kvd; c++) {
            r[qd + c] = (float)dk[(size_t)(n * kvd + c)];
            r[qd + kvd + c] = (float)dv[(size_t)(n * kvd + c)];
        }
    }
    return ref;
}

template <typename T>
void check_shape_dtype(const Shape& sh, const std::vector<Kernel>& variants, uint64_t seed) {
    const int64_t N = sh.N(), C3 = sh.C3(), OC = (int64_t)sh.nh * sh.hd;
    const int64_t nlse = (int64_t)sh.B * sh.nh * sh.T;
    std::vector<float> qkv_h = random_values<T>(N * C3, seed, 1.0);
    std::vector<float> dout_h = random_values<T>(N * OC, seed + 1, 1.0);
    Reference ref = cpu_reference(sh, qkv_h, dout_h);
    const bool is_f32 = std::is_same<T, float>::value;
    const double tol = is_f32 ? 1e-4 : 2e-2, tol_lse = is_f32 ? 1e-5 : 1e-4;

    DeviceBuffer<T> qkv(N * C3), dout(N * OC), out(N * OC), dqkv(N * C3);
    DeviceBuffer<float> lse(nlse), scratch(attention_backward_scratch(sh.B, sh.T, sh.nh, sh.nkv, sh.hd));
    upload(qkv.get(), qkv_h.data(), N * C3);
    upload(dout.get(), dout_h.data(), N * OC);
    std::vector<float> mma_out, mma_dqkv;  // kMma's results, for the variants that must equal them bit for bit
    for (Kernel v : variants) {
        if (!kernel_supported<T>(v, sh.hd)) continue;
        fill(out.get(), out.n, NAN, 0);
        fill(lse.get(), lse.n, NAN, 0);
        fill(dqkv.get(), dqkv.n, NAN, 0);
        fill(scratch.get(), scratch.n, NAN, 0);
        kernel_forward<T>(v, out.get(), lse.get(), qkv.get(), sh.B, sh.T, sh.nh, sh.nkv, sh.hd, 0);
        kernel_backward<T>(v, dqkv.get(), scratch.get(), dout.get(), out.get(), lse.get(), qkv.get(), sh.B, sh.T,
                           sh.nh, sh.nkv, sh.hd, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> o = download(out.get(), out.n), l = download(lse.get(), lse.n);
        std::vector<float> d1 = download(dqkv.get(), dqkv.n);
        report("out", v, dtype_name<T>(), sh, compare(o.data(), ref.out.data(), out.n), tol);
        report("lse", v, dtype_name<T>(), sh, compare(l.data(), ref.lse.data(), lse.n), tol_lse);
        report("dqkv", v, dtype_name<T>(), sh, compare(d1.data(), ref.dqkv.data(), dqkv.n), tol);
        if (v == kMma) {
            mma_out = o;
            mma_dqkv = d1;
        } else if ((v == kMmaPlain || v == kMmaDqFull) && !mma_dqkv.empty()) {
            const bool same = std::memcmp(o.data(), mma_out.data(), o.size() * sizeof(float)) == 0 &&
                              std::memcmp(d1.data(), mma_dqkv.data(), d1.size() * sizeof(float)) == 0;
            report("out_dqkv_bitwise_vs_mma", v, dtype_name<T>(), sh, compare(d1.data(), mma_dqkv.data(), dqkv.n),
                   same ? 1.0 : -1.0);
        }
        // Determinism: a second backward (after re-poisoning) must be bit-identical.
        fill(dqkv.get(), dqkv.n, NAN, 0);
        fill(scratch.get(), scratch.n, NAN, 0);
        kernel_backward<T>(v, dqkv.get(), scratch.get(), dout.get(), out.get(), lse.get(), qkv.get(), sh.B, sh.T,
                           sh.nh, sh.nkv, sh.hd, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> d2 = download(dqkv.get(), dqkv.n);
        Compare c = compare(d2.data(), d1.data(), dqkv.n);
        const bool same = std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)) == 0;
        report("dqkv_rerun_bitwise", v, dtype_name<T>(), sh, c, same ? 1.0 : -1.0);
    }
}

template <typename T>
void bench(const Shape& sh, Kernel variant, int warmup, int reps) {
    if (!kernel_supported<T>(variant, sh.hd)) return;
    const int64_t N = sh.N(), C3 = sh.C3(), OC = (int64_t)sh.nh * sh.hd;
    DeviceBuffer<T> qkv(N * C3), dout(N * OC), out(N * OC), dqkv(N * C3);
    DeviceBuffer<float> lse((int64_t)sh.B * sh.nh * sh.T),
        scratch(attention_backward_scratch(sh.B, sh.T, sh.nh, sh.nkv, sh.hd));
    // Random inputs (uniform, unit variance; cheap to generate at this size) made on the host.
    {
        auto uniform = [](int64_t n, uint64_t seed) {
            std::vector<float> h((size_t)n);
            const uint64_t s0 = init_stream(seed, 0);
            for (int64_t i = 0; i < n; i++)
                h[(size_t)i] = (float)(3.4641016 * (stream_uniform(s0, (uint64_t)i) - 0.5));
            return h;
        };
        std::vector<float> h = uniform(N * C3, 7);
        upload(qkv.get(), h.data(), N * C3);
        h = uniform(N * OC, 8);
        upload(dout.get(), h.data(), N * OC);
    }
    const double fwd_flops = 2.0 * 2.0 * sh.B * sh.nh * (double)sh.T * sh.T * sh.hd / 2.0;
    auto fwd = [&] {
        kernel_forward<T>(variant, out.get(), lse.get(), qkv.get(), sh.B, sh.T, sh.nh, sh.nkv, sh.hd, 0);
    };
    auto fwdbwd = [&] {
        fwd();
        kernel_backward<T>(variant, dqkv.get(), scratch.get(), dout.get(), out.get(), lse.get(), qkv.get(), sh.B,
                           sh.T, sh.nh, sh.nkv, sh.hd, 0);
    };
    float ms = time_median_ms(fwd, warmup, reps);
    std::printf("BENCH attention %s %s %s:fwd ms=%.3f GB/s=- TFLOP/s=%.1f\n", kernel_name(variant),
                dtype_name<T>(), sh.str().c_str(), ms, fwd_flops / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
    ms = time_median_ms(fwdbwd, warmup, reps);
    std::printf("BENCH attention %s %s %s:fwd+bwd ms=%.3f GB/s=- TFLOP/s=%.1f\n", kernel_name(variant),
                dtype_name<T>(), sh.str().c_str(), ms, 3.5 * fwd_flops / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    wb::Cli cli;
    cli.quick_times_nothing = true;
    if (const int rc = cli.parse(argc, argv, "attention",
                                 "causal GQA attention forward and backward, every variant (wgmma last, on sm_90 only)",
                                 "the first 4 CHECK shapes, no BENCH");
        rc >= 0)
        return rc;
    exit_if_no_gpu("attention");
    g_failures = 0;  // this run's failures only (the emulation tests call main more than once)
    const bool quick = cli.quick;
    try {
        std::printf("device: %s\n", device_description().c_str());
        // wgmma runs after every other variant's checks and benches: it has not run on a GPU yet,
        // and a fault there (a sticky CUDA error) must not cost the other variants' results.
        const std::vector<Kernel> variants = {kAuto, kScalar, kMma, kMmaPlain, kMmaDqFull, kMmaPipe};
        std::printf("production kernels: fp32 hd=64 %s, bf16 hd=64 %s, bf16 hd=128 %s, bf16 hd=16 %s\n",
                    attention_uses_mma<float>(64) ? "mma" : "scalar", attention_uses_mma<bf16>(64) ? "mma" : "scalar",
                    attention_uses_mma<bf16>(128) ? "mma" : "scalar", attention_uses_mma<bf16>(16) ? "mma" : "scalar");
        {
            using namespace attn_pipe;
            std::printf("mma-pipe shared memory per block (bytes): forward hd64 %d hd128 %d, dq hd64 %d hd128 %d, "
                        "dkdv hd64 %d hd128 %d\n",
                        pipe_fwd_smem<64>(), pipe_fwd_smem<128>(), pipe_dq_smem<64>(), pipe_dq_smem<128>(),
                        pipe_dkdv_smem<64>(), pipe_dkdv_smem<128>());
            std::printf("wgmma shared memory per block (bytes): forward hd64 %d hd128 %d, dq hd64 %d hd128 %d, "
                        "dkdv hd64 %d hd128 %d; wgmma %s on this device\n",
                        attn_wgmma::wgmma_fwd_smem<64>(), attn_wgmma::wgmma_fwd_smem<128>(),
                        attn_wgmma::wgmma_dq_smem<64>(), attn_wgmma::wgmma_dq_smem<128>(),
                        attn_wgmma::wgmma_dkdv_smem<64>(), attn_wgmma::wgmma_dkdv_smem<128>(),
                        attn_wgmma::wgmma_supported(64) ? "runs" : "does not run (needs compute capability 9.0)");
        }
        std::vector<Shape> shapes = {
            {1, 1, 2, 1, 64},    {2, 37, 4, 2, 16},    {1, 130, 4, 4, 64},  {2, 257, 8, 2, 128},
            {1, 64, 2, 2, 64},   {3, 100, 6, 2, 128},  {1, 65, 3, 1, 6},    {1, 200, 2, 1, 256},
            {2, 129, 4, 1, 64},  {1, 1, 4, 2, 128},    {1, 203, 4, 2, 64},  {2, 150, 4, 2, 128},
            {1, 461, 2, 1, 64},  {1, 333, 4, 1, 128},
        };
        if (quick) shapes.resize(4);
        uint64_t seed = 1000;
        if (cli.check)
            for (const Shape& sh : shapes) {
                check_shape_dtype<float>(sh, variants, seed++);
                check_shape_dtype<bf16>(sh, variants, seed++);
            }
        const Shape llama{8, 2048, 16, 16, 64}, qwen{2, 8192, 16, 8, 128};
        if (!quick && cli.bench) {
            bench<float>(llama, kScalar, 1, 3);
            bench<bf16>(llama, kScalar, 1, 3);
            for (Kernel v : {kMmaPlain, kMma, kMmaDqFull, kMmaPipe}) {
                bench<bf16>(llama, v, 3, 20);
                bench<bf16>(qwen, v, 3, 20);
            }
        }
        // wgmma: its checks, then its benches, after every other variant's BENCH lines are out
        if (cli.check)
            for (const Shape& sh : shapes) check_shape_dtype<bf16>(sh, {kWgmma}, seed++);
        if (!quick && cli.bench) {
            bench<bf16>(llama, kWgmma, 3, 20);
            bench<bf16>(qwen, kWgmma, 3, 20);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "attention: %s\n", e.what());
        return 1;
    }
    std::printf("attention: %d failed checks%s\n", g_failures, cli.check ? "" : " (no checks run)");
    return g_failures ? 1 : 0;
}
