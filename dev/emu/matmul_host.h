// dev/emu/matmul_host.h — host stand-in for cuda/matmul.cuh's cuBLASLt `Matmul` under emulation
// (dev/emu/gen.py substitutes it for the struct in the emulation copy of matmul.cuh). Same public
// API and semantics as Matmul::gemm: C[M,N] = alpha·op(A)·op(B) + beta·C (+ bias[N]), row-major,
// (TA, TC) ∈ {(float,float), (bf16,bf16), (bf16,float)}, fp32 products summed in k order in
// double then rounded to TC (cuBLASLt's summation order differs: compare with tolerances).
// Included inside namespace ldm::gpu of the generated matmul.cuh.
struct Matmul {
    explicit Matmul(size_t workspace_bytes = 64 << 20) { (void)workspace_bytes; }
    Matmul(const Matmul&) = delete;
    Matmul& operator=(const Matmul&) = delete;
    template <typename TA, typename TC>
    void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const TA* A, int64_t lda, const TA* B, int64_t ldb, float beta, TC* C, int64_t ldc,
              const TC* bias, cudaStream_t s) {
        if (M <= 0 || N <= 0) return;
        if (K <= 0) throw Error(strprintf("Matmul::gemm: K = %lld must be > 0", (long long)K));
        const int64_t need_lda = trans_a ? M : K, need_ldb = trans_b ? K : N;
        if (lda < need_lda || ldb < need_ldb || ldc < N)
            throw Error("Matmul::gemm (emulated): leading dims too small");
        plans_++;
        // during a stream capture: recorded, computed at graph replay (emu::record)
        if (::emu::record(s, "Matmul::gemm", [=] { compute(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias); }))
            return;
        compute(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    }
    size_t plans() const { return plans_ ? 1 : 0; }

  private:
    template <typename TA, typename TC>
    static void compute(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const TA* A,
                        int64_t lda, const TA* B, int64_t ldb, float beta, TC* C, int64_t ldc, const TC* bias) {
        if (::emu::launch_only()) return;  // (shapes checked, nothing computed: $EMU_LAUNCH_ONLY)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    const float a = to_f(trans_a ? A[k * lda + i] : A[i * lda + k]);
                    const float b = to_f(trans_b ? B[j * ldb + k] : B[k * ldb + j]);
                    acc += (double)a * b;
                }
                double c = alpha * acc;
                if (beta != 0.f) c += (double)beta * to_f(C[i * ldc + j]);
                if (bias) c += to_f(bias[j]);
                C[i * ldc + j] = from_f<TC>((float)c);
            }
    }
    size_t plans_ = 0;
};
