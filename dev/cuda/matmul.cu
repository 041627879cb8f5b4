// dev/cuda/matmul.cu — workbench for cuda/matmul.cuh: validates Matmul::gemm (v2 cuBLASLt) and
// the workbench-only v1 naive GEMM below in all four transpose combinations with bias / beta /
// padded leading dims, linear_forward / linear_backward and bias_grad (v2 two-pass colsum; v1,
// workbench only: one thread per column) against the CPU reference (cpu::gemm,
// cpu::matmul_forward, cpu::matmul_backward), then times them and prints the peak bf16 GEMM
// rate used for MFU:
//   BENCH matmul peak bf16 8192x8192x8192 ms=.. GB/s=- TFLOP/s=..
// Usage: build/cuda/matmul [--quick] [--check-only | --bench-only] [--help] (workbench.cuh Cli).
// Output format: doc/cuda.md.
#include "cuda/matmul.cuh"
#include "cpu/ops.h"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;
using wb::Report;
using wb::Rng;

// ---- v1 naive GEMM (workbench only; one thread per output, fp32 accumulation) ----------------
// Same semantics as Matmul::gemm; an independent check of the cuBLASLt row-major layout.
template <typename TA, typename TC>
__global__ void gemm_naive_kernel(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                  float alpha, const TA* A, int64_t lda, const TA* B, int64_t ldb,
                                  float beta, TC* C, int64_t ldc, const TC* bias) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t i = blockIdx.y * (int64_t)blockDim.y + threadIdx.y;
    if (i >= M || j >= N) return;
    float acc = 0.f;
    for (int64_t k = 0; k < K; k++) {
        float a = to_f(trans_a ? A[k * lda + i] : A[i * lda + k]);
        float b = to_f(trans_b ? B[j * ldb + k] : B[k * ldb + j]);
        acc += a * b;
    }
    float v = alpha * acc;
    if (beta != 0.f) v += beta * to_f(C[i * ldc + j]);
    if (bias) v += to_f(bias[j]);
    C[i * ldc + j] = from_f<TC>(v);
}
template <typename TA, typename TC>
static void gemm_naive(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const TA* A, int64_t lda, const TA* B, int64_t ldb, float beta, TC* C,
                       int64_t ldc, const TC* bias, cudaStream_t s) {
    if (M <= 0 || N <= 0) return;
    dim3 block(32, 8);
    dim3 grid((unsigned)ceil_div(N, 32), (unsigned)ceil_div(M, 8));
    gemm_naive_kernel<TA, TC><<<grid, block, 0, s>>>(trans_a, trans_b, M, N, K, alpha, A, lda, B,
                                                     ldb, beta, C, ldc, bias);
    LDM_LAUNCH_CHECK();
}

// ---- v1 bias gradient (workbench only): one thread per column, rows summed in order ---------
// (no scratch; slow for large N: one thread walks all N rows).
template <typename T>
__global__ void bias_grad_thread_kernel(float* dbias, const T* dout, int64_t N, int OC, int64_t ld) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float acc = 0.f;
    for (int64_t n = 0; n < N; n++) acc += to_f(dout[n * ld + c]);
    dbias[c] += acc;
}
// v = 1: the kernel above; v = 2: production bias_grad (colsum). Same contract as bias_grad.
template <typename T>
static void bias_grad_variant(int v, float* dbias, float* scratch, const T* dout, int64_t N, int OC,
                              int64_t ld, cudaStream_t s) {
    if (v == 2) return bias_grad<T>(dbias, scratch, dout, N, OC, ld, s);
    if (ld == 0) ld = OC;
    if (N <= 0 || OC <= 0) return;
    bias_grad_thread_kernel<T><<<(unsigned)ceil_div(OC, 256), 256, 0, s>>>(dbias, dout, N, OC, ld);
    LDM_LAUNCH_CHECK();
}

template <typename TA, typename TC>
static std::string pair_name() {
    if (std::is_same<TA, TC>::value) return dtype_name<TA>();
    return std::string(dtype_name<TA>()) + "-" + dtype_name<TC>();
}

// Matmul::gemm (v2) and gemm_naive (v1) vs cpu::gemm on one configuration.
template <typename TA, typename TC>
static void check_gemm(Report& R, Matmul& mm, Rng& rng, bool ta, bool tb, int M, int N, int K,
                       bool with_bias, float beta, int pad) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const int64_t na = (int64_t)(ta ? K : M) * lda, nb = (int64_t)(tb ? N : K) * ldb,
                  nc = (int64_t)M * ldc;
    const float alpha = 0.75f;
    std::vector<float> A = wb::round_to<TA>(wb::random_vec(rng, na));
    std::vector<float> B = wb::round_to<TA>(wb::random_vec(rng, nb));
    std::vector<float> C0 = wb::round_to<TC>(wb::random_vec(rng, nc));
    std::vector<float> bias = wb::round_to<TC>(wb::random_vec(rng, N));
    std::vector<float> ref = C0;
    cpu::gemm<float>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, ref.data(), ldc);
    if (with_bias)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) ref[(size_t)i * ldc + j] += bias[j];
    auto dA = wb::to_device<TA>(A);
    auto dB = wb::to_device<TA>(B);
    auto dbias = wb::to_device<TC>(bias);
    DeviceBuffer<TC> dC(nc);
    const std::string shape = strprintf("%dx%dx%d_t%d%d_bias%d_beta%g_pad%d", M, N, K, (int)ta,
                                        (int)tb, (int)with_bias, beta, pad);
    for (int v = 1; v <= 2; v++) {
        upload(dC.get(), C0.data(), nc);
        if (beta == 0.f) {  // C is write-only then: poison the M x N block (pad columns kept)
            std::vector<float> p = C0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) p[(size_t)i * ldc + j] = NAN;
            upload(dC.get(), p.data(), nc);
        }
        const TC* bp = with_bias ? dbias.get() : nullptr;
        try {
            if (v == 1)
                gemm_naive<TA, TC>(ta, tb, M, N, K, alpha, dA.get(), lda, dB.get(), ldb, beta,
                                   dC.get(), ldc, bp, 0);
            else
                mm.gemm<TA, TC>(ta, tb, M, N, K, alpha, dA.get(), lda, dB.get(), ldb, beta,
                                dC.get(), ldc, bp, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
        } catch (const Error& e) {  // e.g. no cuBLASLt algorithm for an odd layout: FAIL, go on
            std::printf("matmul: error: %s\n", e.what());
            R.check("matmul", v == 1 ? "gemm_v1_naive" : "gemm_v2_cublaslt",
                    pair_name<TA, TC>().c_str(), shape, {}, ref, 0.0);
            continue;
        }
        R.check("matmul", v == 1 ? "gemm_v1_naive" : "gemm_v2_cublaslt",
                pair_name<TA, TC>().c_str(), shape, download(dC.get(), nc), ref,
                wb::tol<typename std::conditional<std::is_same<TC, float>::value &&
                                                      std::is_same<TA, float>::value,
                                                  float, bf16>::type>());
    }
}

// Rows [N] of the first `cols` columns of a [N, ld] matrix.
static std::vector<float> first_cols(const std::vector<float>& m, int64_t N, int cols, int64_t ld) {
    std::vector<float> o((size_t)N * cols);
    for (int64_t n = 0; n < N; n++)
        for (int c = 0; c < cols; c++) o[(size_t)(n * cols + c)] = m[(size_t)(n * ld + c)];
    return o;
}

// linear_forward / linear_backward / bias_grad vs cpu::matmul_forward / matmul_backward.
template <typename T>
static void check_linear(Report& R, Matmul& mm, Rng& rng, int N, int IC, int OC, int ld_pad,
                         bool with_bias) {
    const char* dt = dtype_name<T>();
    const int ld = OC + ld_pad;
    const std::string shape = strprintf("N=%d,IC=%d,OC=%d,ld=%d,bias=%d", N, IC, OC, ld,
                                        (int)with_bias);
    std::vector<float> inp = wb::round_to<T>(wb::random_vec(rng, (int64_t)N * IC));
    std::vector<float> W = wb::round_to<T>(wb::random_vec(rng, (int64_t)OC * IC, 0.1f));
    std::vector<float> b = wb::round_to<T>(wb::random_vec(rng, OC));
    auto d_inp = wb::to_device<T>(inp);
    auto d_W = wb::to_device<T>(W);
    auto d_b = wb::to_device<T>(b);
    // forward
    {
        std::vector<float> ref((size_t)N * ld, 0.f);
        cpu::matmul_forward<float>(ref.data(), inp.data(), W.data(), with_bias ? b.data() : nullptr,
                                   N, IC, OC, ld);
        DeviceBuffer<T> out((int64_t)N * ld);
        fill(out.get(), out.n, NAN, 0);
        linear_forward<T>(mm, out.get(), d_inp.get(), d_W.get(), with_bias ? d_b.get() : nullptr, N,
                          IC, OC, 0, ld == OC ? 0 : ld);
        CUDA_CHECK(cudaDeviceSynchronize());
        R.check("matmul", "linear_forward", dt, shape,
                first_cols(download(out.get(), out.n), N, OC, ld), first_cols(ref, N, OC, ld),
                wb::tol<T>());
    }
    // backward, with dinp overwritten and accumulated
    std::vector<float> dout = wb::round_to<T>(wb::random_vec(rng, (int64_t)N * ld));
    std::vector<float> dinp0 = wb::round_to<T>(wb::random_vec(rng, (int64_t)N * IC));
    std::vector<float> dW0 = wb::random_vec(rng, (int64_t)OC * IC);
    std::vector<float> db0 = wb::random_vec(rng, OC);
    auto d_dout = wb::to_device<T>(dout);
    for (int acc = 0; acc <= 1; acc++) {
        std::vector<float> rdinp = acc ? dinp0 : std::vector<float>((size_t)N * IC, 0.f);
        std::vector<float> rdW = dW0, rdb = db0;
        cpu::matmul_backward<float>(rdinp.data(), rdW.data(), with_bias ? rdb.data() : nullptr,
                                    dout.data(), inp.data(), W.data(), N, IC, OC, ld);
        DeviceBuffer<T> dinp((int64_t)N * IC);
        if (acc)
            upload(dinp.get(), dinp0.data(), dinp.n);
        else
            fill(dinp.get(), dinp.n, NAN, 0);
        auto dW = wb::to_device<float>(dW0);
        auto db = wb::to_device<float>(db0);
        DeviceBuffer<float> scratch(linear_backward_scratch(N, OC));
        linear_backward<T>(mm, dinp.get(), dW.get(), with_bias ? db.get() : nullptr, d_dout.get(),
                           d_inp.get(), d_W.get(), N, IC, OC, acc != 0, scratch.get(), 0,
                           ld == OC ? 0 : ld);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::string sh = shape + (acc ? ",acc" : ",set");
        R.check("matmul", "linear_backward_dinp", dt, sh, download(dinp.get(), dinp.n), rdinp,
                wb::tol<T>());
        R.check("matmul", "linear_backward_dW", dt, sh, download(dW.get(), dW.n), rdW, wb::tol<T>());
        if (with_bias)
            R.check("matmul", "linear_backward_dbias", dt, sh, download(db.get(), db.n), rdb,
                    wb::tol<T>());
        if (acc) {  // run-to-run bit-identical (same inputs, same plan)
            std::vector<float> dW1 = download(dW.get(), dW.n), db1 = download(db.get(), db.n),
                               dinp1 = download(dinp.get(), dinp.n);
            upload(dinp.get(), dinp0.data(), dinp.n);
            upload(dW.get(), dW0.data(), dW.n);
            upload(db.get(), db0.data(), db.n);
            linear_backward<T>(mm, dinp.get(), dW.get(), with_bias ? db.get() : nullptr,
                               d_dout.get(), d_inp.get(), d_W.get(), N, IC, OC, true,
                               scratch.get(), 0, ld == OC ? 0 : ld);
            CUDA_CHECK(cudaDeviceSynchronize());
            R.check_same("matmul", "linear_backward_dinp", dt, sh, download(dinp.get(), dinp.n),
                         dinp1);
            R.check_same("matmul", "linear_backward_dW", dt, sh, download(dW.get(), dW.n), dW1);
            if (with_bias)
                R.check_same("matmul", "linear_backward_dbias", dt, sh, download(db.get(), db.n),
                             db1);
        }
    }
    // bias_grad variants alone (dbias += column sums over the first OC columns)
    std::vector<float> rdb = db0;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < OC; c++) rdb[c] += dout[(size_t)n * ld + c];
    for (int v = 1; v <= 2; v++) {
        auto db = wb::to_device<float>(db0);
        DeviceBuffer<float> scratch(linear_backward_scratch(N, OC));
        bias_grad_variant<T>(v, db.get(), scratch.get(), d_dout.get(), N, OC, ld, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        R.check("matmul", v == 1 ? "bias_grad_v1" : "bias_grad_v2", dt, shape,
                download(db.get(), db.n), rdb, wb::tol<float>());
    }
}

template <typename T>
static void bench_linear(Report& R, Matmul& mm, int N, int IC, int OC) {
    const char* dt = dtype_name<T>();
    const std::string shape = strprintf("N=%d,IC=%d,OC=%d", N, IC, OC);
    DeviceBuffer<T> inp((int64_t)N * IC), W((int64_t)OC * IC), b(OC), out((int64_t)N * OC),
        dinp((int64_t)N * IC), dout((int64_t)N * OC);
    DeviceBuffer<float> dW((int64_t)OC * IC), db(OC), scratch(linear_backward_scratch(N, OC));
    fill(inp.get(), inp.n, 0.01f, 0);
    fill(W.get(), W.n, 0.01f, 0);
    fill(b.get(), b.n, 0.01f, 0);
    fill(dout.get(), dout.n, 0.01f, 0);
    fill(dW.get(), dW.n, 0.f, 0);
    fill(db.get(), db.n, 0.f, 0);
    const double flops = 2.0 * N * IC * OC;
    float ms = time_median_ms([&] { linear_forward<T>(mm, out.get(), inp.get(), W.get(), b.get(),
                                                      N, IC, OC, 0); },
                              wb::kWarmup, wb::kReps);
    R.bench("matmul", "linear_forward", dt, shape, ms, -1, flops);
    ms = time_median_ms([&] { linear_backward<T>(mm, dinp.get(), dW.get(), db.get(), dout.get(),
                                                 inp.get(), W.get(), N, IC, OC, false,
                                                 scratch.get(), 0); },
                        wb::kWarmup, wb::kReps);
    R.bench("matmul", "linear_backward", dt, shape, ms, -1, 2 * flops);
    for (int v = 1; v <= 2; v++) {
        ms = time_median_ms([&] { bias_grad_variant<T>(v, db.get(), scratch.get(), dout.get(), N, OC, 0, 0); },
                            wb::kWarmup, wb::kReps);
        R.bench("matmul", v == 1 ? "bias_grad_v1" : "bias_grad_v2", dt, shape, ms,
                (double)N * OC * sizeof(T), -1);
    }
}

// Square GEMM C = A·Bᵀ (the linear_forward orientation), TA in, TC out.
template <typename TA, typename TC>
static void bench_square(Report& R, Matmul& mm, int n, const char* variant, bool naive) {
    DeviceBuffer<TA> A((int64_t)n * n), B((int64_t)n * n);
    DeviceBuffer<TC> C((int64_t)n * n);
    fill(A.get(), A.n, 0.01f, 0);
    fill(B.get(), B.n, 0.01f, 0);
    float ms = time_median_ms(
        [&] {
            if (naive)
                gemm_naive<TA, TC>(false, true, n, n, n, 1.f, A.get(), n, B.get(), n, 0.f, C.get(),
                                   n, nullptr, 0);
            else
                mm.gemm<TA, TC>(false, true, n, n, n, 1.f, A.get(), n, B.get(), n, 0.f, C.get(), n,
                                nullptr, 0);
        },
        wb::kWarmup, wb::kReps);
    R.bench("matmul", variant, pair_name<TA, TC>().c_str(), strprintf("%dx%dx%d", n, n, n), ms, -1,
            2.0 * n * n * (double)n);
}

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "matmul",
                                 "cuBLASLt GEMMs (every transpose pair, bias, beta) and the linear layer",
                                 "the small CHECK shapes; BENCH the bf16 8192 peak only");
        rc >= 0)
        return rc;
    exit_if_no_gpu("matmul");
    const bool quick = cli.quick;
    try {
        std::printf("matmul: %s\n", device_description().c_str());
        Report R;
        Matmul mm;
        Rng rng(1234);
        if (cli.check) {
            // gemm: every transpose pair, odd shapes, bias, beta, padded leading dims.
            for (int ta = 0; ta <= 1; ta++)
                for (int tb = 0; tb <= 1; tb++) {
                    check_gemm<float, float>(R, mm, rng, ta, tb, 37, 53, 29, true, 0.f, 0);
                    check_gemm<bf16, bf16>(R, mm, rng, ta, tb, 37, 53, 29, true, 0.f, 0);
                    check_gemm<bf16, float>(R, mm, rng, ta, tb, 37, 53, 29, false, 1.f, 0);
                    if (!quick) {
                        check_gemm<float, float>(R, mm, rng, ta, tb, 130, 96, 200, false, 1.f, 3);
                        check_gemm<bf16, bf16>(R, mm, rng, ta, tb, 128, 256, 64, true, 0.5f, 8);
                        check_gemm<bf16, float>(R, mm, rng, ta, tb, 257, 64, 320, true, 0.f, 0);
                    }
                }
            // linear layer shapes: odd N, padded output (logits-like), bias on/off.
            check_linear<float>(R, mm, rng, 77, 48, 40, 0, true);
            check_linear<bf16>(R, mm, rng, 77, 48, 40, 0, true);
            check_linear<float>(R, mm, rng, 131, 64, 50, 14, false);
            check_linear<bf16>(R, mm, rng, 131, 64, 50, 14, false);
            if (!quick) {
                check_linear<float>(R, mm, rng, 1000, 256, 192, 0, true);
                check_linear<bf16>(R, mm, rng, 1000, 256, 192, 0, true);
            }
        }
        if (cli.bench) {
            bench_square<bf16, bf16>(R, mm, 8192, "peak", false);
            if (!quick) {
                bench_square<float, float>(R, mm, 4096, "gemm_v2_cublaslt", false);
                bench_square<bf16, bf16>(R, mm, 1024, "gemm_v1_naive", true);
                bench_square<bf16, bf16>(R, mm, 1024, "gemm_v2_cublaslt", false);
                bench_linear<bf16>(R, mm, 16384, 1024, 3072);
                bench_linear<float>(R, mm, 16384, 1024, 3072);
                bench_linear<bf16>(R, mm, 16384, 1024, 5632);
            }
        }
        return R.finish("matmul");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "matmul: error: %s\n", e.what());
        return 1;
    }
}
