// cuda/matmul.cuh — GEMMs through cuBLASLt for the linear layers (spec §1: y = x Wᵀ + b), with a
// row-major interface, the bias epilogue, fp32 (no TF32) and bf16 inputs with fp32 or bf16
// outputs, and deterministic column sums for bias gradients. Contract: doc/cuda.md (matmul.cuh).
// CPU reference: cpu::gemm, cpu::matmul_forward, cpu::matmul_backward (cpu/ops.h).
//
// Row-major over column-major: a row-major [r, c] matrix with leading dimension ld is, to cuBLAS,
// the column-major [c, r] matrix (its transpose) with the same ld. So row-major
// C[M,N] = op(A)·op(B) is computed as the column-major product Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ, i.e.
// cuBLASLt's "A" is our B and its "B" is our A, with m = N, n = M, k = K and the same transpose
// flags. The bias epilogue adds a vector over the rows of the column-major D, which are our
// columns: bias[N] broadcast over our rows, as the contract wants.
#pragma once
#include <array>
#include <map>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/pack16.cuh"

namespace ldm {
namespace gpu {

template <typename E>
inline cudaDataType_t cuda_dtype();
template <>
inline cudaDataType_t cuda_dtype<float>() { return CUDA_R_32F; }
template <>
inline cudaDataType_t cuda_dtype<bf16>() { return CUDA_R_16BF; }

// Largest power of two (<= 256) that divides the address; 256 for nullptr.
inline uint32_t pointer_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0) al >>= 1;
    return al;
}

// Owns a cuBLASLt handle, a workspace (used by the GEMMs on whatever stream they are enqueued on,
// so use one Matmul per concurrently running stream) and a cache of (descriptors, algorithm)
// per GEMM shape / layout / dtype / pointer alignment. The algorithm of a new shape comes from
// cublasLtMatmulAlgoGetHeuristic (first result) and is reused afterwards, so a shape always runs
// the same kernel (deterministic run to run). Not thread-safe.
struct Matmul {
    explicit Matmul(size_t workspace_bytes = 64 << 20) : ws_bytes_(workspace_bytes) {
        CUBLAS_CHECK(cublasLtCreate(&handle_));
        if (ws_bytes_ > 0) ws_.alloc((int64_t)ws_bytes_);
    }
    ~Matmul() {
        for (auto& kv : cache_) {
            cublasLtMatrixLayoutDestroy(kv.second.la);
            cublasLtMatrixLayoutDestroy(kv.second.lb);
            cublasLtMatrixLayoutDestroy(kv.second.lc);
            cublasLtMatmulDescDestroy(kv.second.op);
        }
        if (handle_) cublasLtDestroy(handle_);
    }
    Matmul(const Matmul&) = delete;
    Matmul& operator=(const Matmul&) = delete;

    // C[M,N] = alpha·op(A)·op(B) + beta·C (+ bias[N] broadcast over rows), row-major, leading dims
    // in elements: op(A) is [M,K] (A stored [M,K], or [K,M] when trans_a), op(B) is [K,N] (B
    // stored [K,N], or [N,K] when trans_b). (TA, TC) ∈ {(float,float), (bf16,bf16),
    // (bf16,float)}; compute and scaling in fp32, never TF32. bias (type TC) may be nullptr.
    // With beta == 0, C is write-only. M == 0 or N == 0: nothing. Throws ldm::Error on K <= 0,
    // a leading dimension too small, no algorithm found, or a cuBLASLt failure.
    template <typename TA, typename TC>
    void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const TA* A, int64_t lda, const TA* B, int64_t ldb, float beta, TC* C, int64_t ldc,
              const TC* bias, cudaStream_t s) {
        static_assert((std::is_same<TA, float>::value && std::is_same<TC, float>::value) ||
                          (std::is_same<TA, bf16>::value &&
                           (std::is_same<TC, bf16>::value || std::is_same<TC, float>::value)),
                      "Matmul::gemm: (TA, TC) must be (float,float), (bf16,bf16) or (bf16,float)");
        if (M <= 0 || N <= 0) return;
        if (K <= 0) throw Error(strprintf("Matmul::gemm: K = %lld must be > 0", (long long)K));
        const int64_t need_lda = trans_a ? M : K, need_ldb = trans_b ? K : N;
        if (lda < need_lda || ldb < need_ldb || ldc < N)
            throw Error(strprintf("Matmul::gemm: leading dims too small (M=%lld N=%lld K=%lld "
                                  "lda=%lld ldb=%lld ldc=%lld, trans_a=%d trans_b=%d)",
                                  (long long)M, (long long)N, (long long)K, (long long)lda,
                                  (long long)ldb, (long long)ldc, (int)trans_a, (int)trans_b));
        Key key = {(int64_t)cuda_dtype<TA>(), (int64_t)cuda_dtype<TC>(), trans_a, trans_b, M, N,
                   K, lda, ldb, ldc, bias != nullptr, pointer_alignment(A), pointer_alignment(B),
                   pointer_alignment(C), pointer_alignment(bias)};
        auto it = cache_.find(key);
        if (it == cache_.end()) {
            Plan p = make_plan<TA, TC>(trans_a, trans_b, M, N, K, lda, ldb, ldc, A, B, C, bias);
            it = cache_.emplace(key, p).first;
        }
        Plan& p = it->second;
        if (bias) {
            const void* bp = bias;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bp, sizeof(bp)));
        }
        // cuBLASLt "A" = our B, "B" = our A (see the top of this file).
        CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, B, p.la, A, p.lb, &beta, C, p.lc, C,
                                    p.lc, &p.algo, ws_.get(), ws_bytes_, s));
    }

    // Number of cached GEMM plans (for tests and logs).
    size_t plans() const { return cache_.size(); }

  private:
    using Key = std::array<int64_t, 15>;
    struct Plan {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
        cublasLtMatmulAlgo_t algo{};
    };

    template <typename TA, typename TC>
    Plan make_plan(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                   int64_t ldb, int64_t ldc, const void* A, const void* B, const void* C,
                   const void* bias) {
        Plan p;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t opa = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // applies to our B
        cublasOperation_t opb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // applies to our A
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                    sizeof(opa)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                    sizeof(opb)));
        cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof(epi)));
        if (bias) {
            // Bias type = D type (the default); the heuristic reads the pointer's alignment.
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof(bias)));
        }
        // Column-major views of the row-major operands (shape transposed, same ld).
        const uint64_t a_rows = trans_b ? K : N, a_cols = trans_b ? N : K;  // cuBLASLt A = B
        const uint64_t b_rows = trans_a ? M : K, b_cols = trans_a ? K : M;  // cuBLASLt B = A
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, cuda_dtype<TA>(), a_rows, a_cols, ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, cuda_dtype<TA>(), b_rows, b_cols, lda));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, cuda_dtype<TC>(), (uint64_t)N,
                                                (uint64_t)M, ldc));
        cublasLtMatmulPreference_t pref = nullptr;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = ws_bytes_;
        uint32_t al_a = pointer_alignment(B), al_b = pointer_alignment(A),
                 al_c = pointer_alignment(C);
        cublasLtMatmulHeuristicResult_t res{};
        int nres = 0;
        cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.la, p.lb, p.lc, p.lc, pref, 1,
                                                &res, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || nres == 0) {
            cublasLtMatrixLayoutDestroy(p.la);
            cublasLtMatrixLayoutDestroy(p.lb);
            cublasLtMatrixLayoutDestroy(p.lc);
            cublasLtMatmulDescDestroy(p.op);
            throw Error(strprintf(
                "Matmul::gemm: no cuBLASLt algorithm (status %d, %s) for %s->%s M=%lld N=%lld "
                "K=%lld lda=%lld ldb=%lld ldc=%lld trans_a=%d trans_b=%d bias=%d align A/B/C=%u/%u/%u",
                (int)st, cublasGetStatusString(st), dtype_name<TA>(), dtype_name<TC>(),
                (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb,
                (long long)ldc, (int)trans_a, (int)trans_b, (int)(bias != nullptr), al_b, al_a,
                al_c));
        }
        p.algo = res.algo;
        return p;
    }

    cublasLtHandle_t handle_ = nullptr;
    size_t ws_bytes_ = 0;
    DeviceBuffer<char> ws_;
    std::map<Key, Plan> cache_;
};

// ---- bias gradient: dbias[c] += Σ_n dout[n, c] (fp32, deterministic) --------------------------
template <typename T>
struct ColumnOp {
    const T* d;
    int64_t ld;
    __device__ float operator()(int64_t r, int c) const { return to_f(d[r * ld + c]); }
};

// dbias[OC] += column sums of dout [N, OC] (row stride ld, 0 = OC), by the deterministic
// two-pass chunked reduction (colsum, pack16.cuh) with scratch >= colsum_scratch(N, OC) floats.
template <typename T>
void bias_grad(float* dbias, float* scratch, const T* dout, int64_t N, int OC, int64_t ld,
               cudaStream_t s) {
    if (ld == 0) ld = OC;
    if (N <= 0 || OC <= 0) return;
    colsum(dbias, scratch, ColumnOp<T>{dout, ld}, N, OC, s);
}

// ---- linear layer ---------------------------------------------------------------------------
// out[N,OC] (row stride ld_out, 0 = OC) = inp[N,IC]·Wᵀ (+ bias[OC]); W [OC, IC] row-major.
template <typename T>
void linear_forward(Matmul& mm, T* out, const T* inp, const T* W, const T* bias, int64_t N, int IC,
                    int OC, cudaStream_t s, int64_t ld_out = 0) {
    if (ld_out == 0) ld_out = OC;
    mm.gemm<T, T>(false, true, N, OC, IC, 1.f, inp, IC, W, IC, 0.f, out, ld_out, bias, s);
}

// Scratch floats for linear_backward's bias gradient.
inline int64_t linear_backward_scratch(int64_t N, int OC) { return colsum_scratch(N, OC); }

// dinp[N,IC] = (or += when accumulate_dinp) dout·W ; dW[OC,IC] += doutᵀ·inp (fp32, bf16 inputs
// for T = bf16) ; dbias[OC] += column sums of dout (fp32, deterministic, needs scratch >=
// linear_backward_scratch(N, OC) floats). dinp / dbias may be nullptr (skipped; scratch may then
// be nullptr too). dout has row stride ld_dout (0 = OC).
template <typename T>
void linear_backward(Matmul& mm, T* dinp, float* dW, float* dbias, const T* dout, const T* inp,
                     const T* W, int64_t N, int IC, int OC, bool accumulate_dinp, float* scratch,
                     cudaStream_t s, int64_t ld_dout = 0) {
    if (ld_dout == 0) ld_dout = OC;
    if (N <= 0) return;
    if (dinp)
        mm.gemm<T, T>(false, false, N, IC, OC, 1.f, dout, ld_dout, W, IC,
                      accumulate_dinp ? 1.f : 0.f, dinp, IC, (const T*)nullptr, s);
    mm.gemm<T, float>(true, false, OC, IC, N, 1.f, dout, ld_dout, inp, IC, 1.f, dW, IC,
                      (const float*)nullptr, s);
    if (dbias) bias_grad(dbias, scratch, dout, N, OC, ld_dout, s);
}

}  // namespace gpu
}  // namespace ldm
