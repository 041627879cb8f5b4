// dev/cuda/embedding.cu — workbench for cuda/embedding.cuh, both production kernels of each
// direction (v2 where C and the alignment allow 16-byte packs, v1 the fallback for any C):
// embedding_forward (v1 thread per element, v2 warp per row with 16-byte packs) and
// embedding_backward (v1 thread per (bucket, column), v2 block per bucket with packs) against
// cpu::embedding_forward / embedding_backward, then timing on a llama-400m-like batch
// (N = 8·2048, C = 1024, Vp = 50304).
// Usage: build/cuda/embedding [--quick] [--check-only | --bench-only] [--help] (workbench.cuh Cli).
// Output format: doc/cuda.md.
#include <chrono>

#include "cuda/embedding.cuh"
#include "cpu/ops.h"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;
using wb::Report;
using wb::Rng;

// Token ids in [0, Vp) with many repeats: a quarter of them from the first 8 ids.
static std::vector<int32_t> random_tokens(Rng& rng, int64_t N, int Vp) {
    std::vector<int32_t> t((size_t)N);
    for (auto& x : t) {
        uint64_t r = rng.next();
        x = (r & 3) == 0 ? (int32_t)((r >> 8) % std::min(8, Vp)) : (int32_t)((r >> 8) % Vp);
    }
    return t;
}

// v = 1: the scalar kernels, v = 2: the packed ones; each through embedding_forward / _backward
// where that is what they pick for these buffers, else through the embedding_detail launcher.
template <typename T>
static void forward_variant(int v, T* out, const int32_t* tokens, const T* wte, int64_t N, int C,
                            cudaStream_t s) {
    if ((v == 2) == embedding_detail::packed_ok<T>(C, out, wte))
        return embedding_forward<T>(out, tokens, wte, N, C, s);
    if (v == 2) embedding_detail::forward_packed<T>(out, tokens, wte, N, C, s);  // throws
    else embedding_detail::forward_scalar<T>(out, tokens, wte, N, C, s);
}
template <typename T>
static void backward_variant(int v, float* dwte, const T* dout, const int32_t* uniq,
                             const int32_t* start, const int32_t* pos, int U, int C,
                             cudaStream_t s, const int32_t* count = nullptr) {
    if ((v == 2) == embedding_detail::packed_ok<T>(C, dout, dwte))
        return embedding_backward<T>(dwte, dout, uniq, start, pos, U, C, s, count);
    if (v == 2) embedding_detail::backward_packed<T>(dwte, dout, uniq, start, pos, U, C, s, count);
    else embedding_detail::backward_scalar<T>(dwte, dout, uniq, start, pos, U, C, s, count);
}

template <typename T>
static void check(Report& R, Rng& rng, int N, int C, int Vp) {
    const char* dt = dtype_name<T>();
    const std::string shape = strprintf("N=%d,C=%d,Vp=%d", N, C, Vp);
    std::vector<int32_t> tok = random_tokens(rng, N, Vp);
    std::vector<float> wte = wb::round_to<T>(wb::random_vec(rng, (int64_t)Vp * C));
    std::vector<float> dout = wb::round_to<T>(wb::random_vec(rng, (int64_t)N * C));
    std::vector<float> dwte0 = wb::random_vec(rng, (int64_t)Vp * C);
    std::vector<float> ref_out((size_t)N * C), ref_dwte = dwte0;
    cpu::embedding_forward<float>(ref_out.data(), tok.data(), wte.data(), N, C);
    cpu::embedding_backward<float>(ref_dwte.data(), dout.data(), tok.data(), N, C);

    DeviceBuffer<int32_t> d_tok(N);
    CUDA_CHECK(cudaMemcpy(d_tok.get(), tok.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
    auto d_wte = wb::to_device<T>(wte);
    auto d_dout = wb::to_device<T>(dout);
    DeviceBuffer<T> out((int64_t)N * C);
    const bool vec_ok = C % Pack<T>::n == 0;
    for (int v = 1; v <= 2; v++) {
        if (v == 2 && !vec_ok) continue;
        fill(out.get(), out.n, NAN, 0);
        forward_variant<T>(v, out.get(), d_tok.get(), d_wte.get(), N, C, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        R.check("embedding", strprintf("forward_v%d", v), dt, shape, download(out.get(), out.n),
                ref_out, 0.0);  // a copy: exact
    }
    EmbeddingBuckets b = EmbeddingBuckets::build(tok.data(), N);
    DeviceBuffer<int32_t> d_uniq(b.U()), d_start(b.U() + 1), d_pos(N);
    CUDA_CHECK(cudaMemcpy(d_uniq.get(), b.uniq.data(), b.uniq.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_start.get(), b.start.data(), b.start.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_pos.get(), b.pos.data(), b.pos.size() * 4, cudaMemcpyHostToDevice));
    for (int v = 1; v <= 2; v++) {
        if (v == 2 && !vec_ok) continue;
        auto dwte = wb::to_device<float>(dwte0);
        backward_variant<T>(v, dwte.get(), d_dout.get(), d_uniq.get(), d_start.get(), d_pos.get(),
                            b.U(), C, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> got = download(dwte.get(), dwte.n);
        R.check("embedding", strprintf("backward_v%d", v), dt, shape, got, ref_dwte,
                wb::tol<float>());
        upload(dwte.get(), dwte0.data(), dwte.n);
        backward_variant<T>(v, dwte.get(), d_dout.get(), d_uniq.get(), d_start.get(), d_pos.get(),
                            b.U(), C, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        R.check_same("embedding", strprintf("backward_v%d", v), dt, shape,
                     download(dwte.get(), dwte.n), got);
        // the bucket count on the device, the launch sized for U = N (the CUDA-graph form): the
        // same result bit for bit (the blocks / columns past the count do nothing)
        DeviceBuffer<int32_t> d_count(1);
        const int32_t U = b.U();
        CUDA_CHECK(cudaMemcpy(d_count.get(), &U, 4, cudaMemcpyHostToDevice));
        upload(dwte.get(), dwte0.data(), dwte.n);
        backward_variant<T>(v, dwte.get(), d_dout.get(), d_uniq.get(), d_start.get(), d_pos.get(),
                            N, C, 0, d_count.get());
        CUDA_CHECK(cudaDeviceSynchronize());
        R.check_same("embedding", strprintf("backward_v%d", v), dt, shape + ",count_on_device",
                     download(dwte.get(), dwte.n), got);
    }
}

template <typename T>
static void bench(Report& R, Rng& rng, int N, int C, int Vp) {
    const char* dt = dtype_name<T>();
    const std::string shape = strprintf("N=%d,C=%d,Vp=%d", N, C, Vp);
    std::vector<int32_t> tok = random_tokens(rng, N, Vp);
    DeviceBuffer<int32_t> d_tok(N);
    CUDA_CHECK(cudaMemcpy(d_tok.get(), tok.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
    DeviceBuffer<T> wte((int64_t)Vp * C), out((int64_t)N * C), dout((int64_t)N * C);
    DeviceBuffer<float> dwte((int64_t)Vp * C);
    fill(wte.get(), wte.n, 0.5f, 0);
    fill(dout.get(), dout.n, 0.5f, 0);
    fill(dwte.get(), dwte.n, 0.f, 0);
    EmbeddingBuckets b = EmbeddingBuckets::build(tok.data(), N);
    DeviceBuffer<int32_t> d_uniq(b.U()), d_start(b.U() + 1), d_pos(N);
    CUDA_CHECK(cudaMemcpy(d_uniq.get(), b.uniq.data(), b.uniq.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_start.get(), b.start.data(), b.start.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_pos.get(), b.pos.data(), b.pos.size() * 4, cudaMemcpyHostToDevice));
    for (int v = 1; v <= 2; v++) {
        float ms = time_median_ms([&] { forward_variant<T>(v, out.get(), d_tok.get(), wte.get(), N,
                                                           C, 0); },
                                  wb::kWarmup, wb::kReps);
        R.bench("embedding", strprintf("forward_v%d", v), dt, shape, ms,
                2.0 * N * C * sizeof(T), -1);
    }
    for (int v = 1; v <= 2; v++) {
        float ms = time_median_ms(
            [&] { backward_variant<T>(v, dwte.get(), dout.get(), d_uniq.get(), d_start.get(),
                                      d_pos.get(), b.U(), C, 0); },
            wb::kWarmup, wb::kReps);
        R.bench("embedding", strprintf("backward_v%d", v), dt, shape + strprintf(",U=%d", b.U()),
                ms, (double)N * C * sizeof(T) + 2.0 * b.U() * C * sizeof(float), -1);
    }
    float ms = 0;
    {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 5; i++) b = EmbeddingBuckets::build(tok.data(), N);
        ms = (float)std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count() / 5;
    }
    R.bench("embedding", "buckets_build_host", "-", strprintf("N=%d", N), ms, -1, -1);
}

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "embedding", "the token embedding forward and backward",
                                 "2 CHECK shapes (not 4099 x 1024); BENCH bf16 only");
        rc >= 0)
        return rc;
    exit_if_no_gpu("embedding");
    const bool quick = cli.quick;
    try {
        std::printf("embedding: %s\n", device_description().c_str());
        Report R;
        Rng rng(99);
        if (cli.check) {
            check<float>(R, rng, 77, 37, 53);
            check<bf16>(R, rng, 77, 37, 53);
            check<float>(R, rng, 300, 64, 100);
            check<bf16>(R, rng, 300, 64, 100);
            if (!quick) {
                check<float>(R, rng, 4099, 1024, 517);
                check<bf16>(R, rng, 4099, 1024, 517);
            }
        }
        if (cli.bench) {
            Rng bench_rng(100);  // (its own: the tokens, and so the buckets timed, do not depend on the checks run)
            bench<bf16>(R, bench_rng, 16384, 1024, 50304);
            if (!quick) bench<float>(R, bench_rng, 16384, 1024, 50304);
        }
        return R.finish("embedding");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "embedding: error: %s\n", e.what());
        return 1;
    }
}
