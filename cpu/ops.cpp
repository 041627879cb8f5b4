// cpu/ops.cpp — backbone ops (spec §1): forward and hand-written backward. See ops.h.
#include "cpu/ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <vector>

#include "math/elementwise.h"

namespace ldm {
namespace cpu {

// ---- GEMM --------------------------------------------------------------------------------------
namespace {
std::mutex g_stats_mu;
GemmStats g_stats;

inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                      const float* A, int lda, const float* B, int ldb, float beta, float* C,
                      int ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
                      const double* A, int lda, const double* B, int ldb, double beta, double* C,
                      int ldc) {
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// OpenBLAS always runs single-threaded (process-wide): all parallelism comes from one
// OpenMP pool. Large GEMMs are split here into one BLAS call per thread along M or N, so a
// pthread BLAS pool never competes with spinning OpenMP threads for the cores.
// Checked on every gemm() outside parallel regions (a global read), so a later
// openblas_set_num_threads(n) elsewhere cannot re-enable nested BLAS threads.
void ensure_blas_single_threaded() {
    if (!omp_in_parallel() && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

template <typename R>
void gemm_split(bool trans_a, bool trans_b, int M, int N, int K, R alpha, const R* A, int lda,
                const R* B, int ldb, R beta, R* C, int ldc) {
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    const double flops = 2.0 * M * N * K;
    if (nt <= 1 || flops < 4e6 || (M < 32 && N < 32)) {
        blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const bool split_m = M >= N;
    const int len = split_m ? M : N;
    int chunk = (len + nt - 1) / nt;
    chunk = (chunk + 15) / 16 * 16;  // keep kernel-friendly widths
    const int nchunks = (len + chunk - 1) / chunk;
#pragma omp parallel for schedule(static, 1) num_threads(nt)
    for (int c = 0; c < nchunks; c++) {
        const int i0 = c * chunk, n = std::min(chunk, len - i0);
        if (split_m) {
            const R* Ac = trans_a ? A + i0 : A + (size_t)i0 * lda;
            blas_gemm(ta, tb, n, N, K, alpha, Ac, lda, B, ldb, beta, C + (size_t)i0 * ldc, ldc);
        } else {
            const R* Bc = trans_b ? B + (size_t)i0 * ldb : B + i0;
            blas_gemm(ta, tb, M, n, K, alpha, A, lda, Bc, ldb, beta, C + i0, ldc);
        }
    }
}
}  // namespace

template <typename R>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, R alpha, const R* A, int lda,
          const R* B, int ldb, R beta, R* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    ensure_blas_single_threaded();
    double t0 = omp_get_wtime();
    if (K <= 0) {  // BLAS would only scale C; do it ourselves for clarity
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] *= beta;
    } else {
        gemm_split(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    double dt = omp_get_wtime() - t0;
    if (omp_in_parallel()) dt /= omp_get_num_threads();
    std::lock_guard<std::mutex> lk(g_stats_mu);
    g_stats.flops += 2.0 * M * N * std::max(K, 0);
    g_stats.seconds += dt;
    g_stats.calls++;
}

GemmStats gemm_stats() {
    std::lock_guard<std::mutex> lk(g_stats_mu);
    return g_stats;
}
void reset_gemm_stats() {
    std::lock_guard<std::mutex> lk(g_stats_mu);
    g_stats = GemmStats();
}

// OpenMP regions are entered only when there is enough work: with tiny shapes (gradient checks)
// the fork/join cost would dominate, and on a loaded machine a spinning barrier costs a time slice.
static const int64_t kParMin = 1 << 15;
#define LDM_PAR(work) if ((int64_t)(work) >= kParMin)

// ---- embedding -------------------------------------------------------------------------------
template <typename R>
void embedding_forward(R* out, const int32_t* tokens, const R* wte, int N, int C) {
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * C)
    for (int n = 0; n < N; n++) std::copy(wte + (size_t)tokens[n] * C, wte + (size_t)(tokens[n] + 1) * C, out + (size_t)n * C);
}

template <typename R>
void embedding_backward(R* dwte, const R* dout, const int32_t* tokens, int N, int C) {
    // Serial over tokens (repeated ids would race); parallel over channels keeps it deterministic.
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * C)
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++) dwte[(size_t)tokens[n] * C + c] += dout[(size_t)n * C + c];
}

// ---- RMSNorm ---------------------------------------------------------------------------------
template <typename R>
void rmsnorm_forward(R* out, R* rstd, const R* x, const R* w, int N, int C, R eps) {
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * C)
    for (int n = 0; n < N; n++) {
        const R* xr = x + (size_t)n * C;
        R* o = out + (size_t)n * C;
        R ss = 0;
        for (int c = 0; c < C; c++) ss += xr[c] * xr[c];
        R s = rms_scale(ss, C, eps);
        rstd[n] = s;
        for (int c = 0; c < C; c++) o[c] = w[c] * (xr[c] * s);
    }
}

template <typename R>
void rmsnorm_backward(R* dx, R* dw, const R* dout, const R* x, const R* w, const R* rstd, int N,
                      int C) {
    // y_c = w_c x_c s, s = (mean(x^2) + eps)^-1/2:
    // dx_c = s w_c dy_c - s^3 / C * x_c * sum_k(w_k dy_k x_k);  dw_c = sum_n dy_c x_c s.
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * C)
    for (int n = 0; n < N; n++) {
        const R* xr = x + (size_t)n * C;
        const R* g = dout + (size_t)n * C;
        R* d = dx + (size_t)n * C;
        R s = rstd[n];
        R dot = 0;
        for (int c = 0; c < C; c++) dot += w[c] * g[c] * xr[c];
        R k = s * s * s * dot / R(C);
        for (int c = 0; c < C; c++) d[c] += s * w[c] * g[c] - k * xr[c];
    }
    // Parameter gradient: fixed summation order over n (deterministic for any thread count).
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * C)
    for (int c = 0; c < C; c++) {
        R acc = 0;
        for (int n = 0; n < N; n++) acc += dout[(size_t)n * C + c] * x[(size_t)n * C + c] * rstd[n];
        dw[c] += acc;
    }
}

// ---- linear layer ----------------------------------------------------------------------------
template <typename R>
void matmul_forward(R* out, const R* inp, const R* W, const R* bias, int N, int IC, int OC,
                    int ld_out) {
    if (ld_out == 0) ld_out = OC;
    gemm<R>(false, true, N, OC, IC, R(1), inp, IC, W, IC, R(0), out, ld_out);
    if (bias) {
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * OC)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) out[(size_t)n * ld_out + o] += bias[o];
    }
}

template <typename R>
void matmul_backward(R* dinp, R* dW, R* dbias, const R* dout, const R* inp, const R* W, int N,
                     int IC, int OC, int ld_dout) {
    if (ld_dout == 0) ld_dout = OC;
    if (dinp) gemm<R>(false, false, N, IC, OC, R(1), dout, ld_dout, W, IC, R(1), dinp, IC);
    gemm<R>(true, false, OC, IC, N, R(1), dout, ld_dout, inp, IC, R(1), dW, IC);
    if (dbias) {
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * OC)
        for (int o = 0; o < OC; o++) {
            R acc = 0;
            for (int n = 0; n < N; n++) acc += dout[(size_t)n * ld_dout + o];
            dbias[o] += acc;
        }
    }
}

// ---- RoPE ------------------------------------------------------------------------------------
template <typename R>
void rope_tables(R* cos_t, R* sin_t, int T, int hd, double theta) {
    const int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double inv_freq = std::pow(theta, -2.0 * i / hd);
            double a = (double)t * inv_freq;
            cos_t[(size_t)t * half + i] = (R)std::cos(a);
            sin_t[(size_t)t * half + i] = (R)std::sin(a);
        }
}

template <typename R>
void rope_forward(R* out, const R* x, const R* cos_t, const R* sin_t, int N, int T, int H, int hd) {
    const int half = hd / 2;
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * H * hd)
    for (int n = 0; n < N; n++) {
        const R* c = cos_t + (size_t)(n % T) * half;
        const R* s = sin_t + (size_t)(n % T) * half;
        for (int h = 0; h < H; h++) {
            const R* xi = x + ((size_t)n * H + h) * hd;
            R* o = out + ((size_t)n * H + h) * hd;
            for (int i = 0; i < half; i++) {
                R y1, y2;
                rope_rotate(xi[i], xi[i + half], c[i], s[i], &y1, &y2);
                o[i] = y1;
                o[i + half] = y2;
            }
        }
    }
}

template <typename R>
void rope_backward(R* dx, const R* dout, const R* cos_t, const R* sin_t, int N, int T, int H,
                   int hd) {
    const int half = hd / 2;
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * H * hd)
    for (int n = 0; n < N; n++) {
        const R* c = cos_t + (size_t)(n % T) * half;
        const R* s = sin_t + (size_t)(n % T) * half;
        for (int h = 0; h < H; h++) {
            const R* g = dout + ((size_t)n * H + h) * hd;
            R* d = dx + ((size_t)n * H + h) * hd;
            for (int i = 0; i < half; i++) {
                R d1, d2;
                rope_rotate_back(g[i], g[i + half], c[i], s[i], &d1, &d2);
                d[i] += d1;
                d[i + half] += d2;
            }
        }
    }
}

// ---- attention -------------------------------------------------------------------------------
// Rows are processed in blocks of kRowBlock; block [t0, t1) only needs key columns [0, t1), so
// the GEMMs skip most of the masked upper triangle.
static const int kRowBlock = 64;

template <typename R>
void attention_forward(R* out, R* att, const R* q, const R* k, const R* v, int B, int T, int nh,
                       int nkv, int hd) {
    const int qd = nh * hd, kvd = nkv * hd, G = nh / nkv;
    const R scale = R(1) / ldm_sqrt(R(hd));
#pragma omp parallel for schedule(dynamic, 1) LDM_PAR((int64_t)B * nh * T * T * hd)
    for (int bh = 0; bh < B * nh; bh++) {
        const int b = bh / nh, h = bh % nh, kh = h / G;
        const R* Q = q + (size_t)b * T * qd + (size_t)h * hd;
        const R* K = k + (size_t)b * T * kvd + (size_t)kh * hd;
        const R* V = v + (size_t)b * T * kvd + (size_t)kh * hd;
        R* P = att + (size_t)bh * T * T;
        R* O = out + (size_t)b * T * qd + (size_t)h * hd;
        for (int t0 = 0; t0 < T; t0 += kRowBlock) {
            const int t1 = std::min(T, t0 + kRowBlock), L = t1;
            gemm<R>(false, true, t1 - t0, L, hd, scale, Q + (size_t)t0 * qd, qd, K, kvd, R(0),
                    P + (size_t)t0 * T, T);
            for (int t = t0; t < t1; t++) {
                R* row = P + (size_t)t * T;
                R mx = row[0];
#pragma omp simd reduction(max : mx)
                for (int s = 1; s <= t; s++) mx = std::max(mx, row[s]);
                R sum = 0;
#pragma omp simd reduction(+ : sum)
                for (int s = 0; s <= t; s++) {
                    row[s] = exp_fast(row[s] - mx);
                    sum += row[s];
                }
                R inv = R(1) / sum;
#pragma omp simd
                for (int s = 0; s <= t; s++) row[s] *= inv;
                for (int s = t + 1; s < T; s++) row[s] = R(0);
            }
            gemm<R>(false, false, t1 - t0, hd, L, R(1), P + (size_t)t0 * T, T, V, kvd, R(0),
                    O + (size_t)t0 * qd, qd);
        }
    }
}

template <typename R>
void attention_backward(R* dq, R* dk, R* dv, const R* dout, const R* att, const R* q, const R* k,
                        const R* v, int B, int T, int nh, int nkv, int hd) {
    const int qd = nh * hd, kvd = nkv * hd, G = nh / nkv;
    const R scale = R(1) / ldm_sqrt(R(hd));
    // One task per (b, kv head): the G query heads sharing dk/dv run in order (no races).
#pragma omp parallel LDM_PAR((int64_t)B * nh * T * T * hd)
    {
        std::vector<R> dS((size_t)kRowBlock * T);
#pragma omp for schedule(dynamic, 1)
        for (int bk = 0; bk < B * nkv; bk++) {
            const int b = bk / nkv, kh = bk % nkv;
            const R* K = k + (size_t)b * T * kvd + (size_t)kh * hd;
            const R* V = v + (size_t)b * T * kvd + (size_t)kh * hd;
            R* dK = dk + (size_t)b * T * kvd + (size_t)kh * hd;
            R* dV = dv + (size_t)b * T * kvd + (size_t)kh * hd;
            for (int g = 0; g < G; g++) {
                const int h = kh * G + g;
                const R* Q = q + (size_t)b * T * qd + (size_t)h * hd;
                const R* dO = dout + (size_t)b * T * qd + (size_t)h * hd;
                R* dQ = dq + (size_t)b * T * qd + (size_t)h * hd;
                const R* P = att + ((size_t)b * nh + h) * T * T;
                for (int t0 = 0; t0 < T; t0 += kRowBlock) {
                    const int t1 = std::min(T, t0 + kRowBlock), L = t1, M = t1 - t0;
                    const R* Pb = P + (size_t)t0 * T;
                    // dP = dO V^T (rows t0..t1, columns 0..L), into dS (ld T).
                    gemm<R>(false, true, M, L, hd, R(1), dO + (size_t)t0 * qd, qd, V, kvd, R(0),
                            dS.data(), T);
                    // dV += P^T dO.
                    gemm<R>(true, false, L, hd, M, R(1), Pb, T, dO + (size_t)t0 * qd, qd, R(1), dV,
                            kvd);
                    // Softmax backward: dS = P * (dP - sum_s P dP) * scale (0 above the diagonal).
                    for (int t = t0; t < t1; t++) {
                        const R* pr = P + (size_t)t * T;
                        R* dr = dS.data() + (size_t)(t - t0) * T;
                        R dot = 0;
#pragma omp simd reduction(+ : dot)
                        for (int s = 0; s <= t; s++) dot += pr[s] * dr[s];
#pragma omp simd
                        for (int s = 0; s <= t; s++) dr[s] = pr[s] * (dr[s] - dot) * scale;
                        for (int s = t + 1; s < L; s++) dr[s] = R(0);
                    }
                    // dQ += dS K;  dK += dS^T Q.
                    gemm<R>(false, false, M, hd, L, R(1), dS.data(), T, K, kvd, R(1),
                            dQ + (size_t)t0 * qd, qd);
                    gemm<R>(true, false, L, hd, M, R(1), dS.data(), T, Q + (size_t)t0 * qd, qd, R(1),
                            dK, kvd);
                }
            }
        }
    }
}

// ---- SwiGLU ----------------------------------------------------------------------------------
namespace {
// sigmoid with exp_fast: vectorises in an omp simd loop (libm's expf does not); for double the
// same as sigmoid(). Arguments below -88 give ~6e-39 instead of ~0: silu is then ~0 either way.
template <typename R>
inline R sigmoid_fast(R z) {
    return R(1) / (R(1) + exp_fast(-z));
}
}  // namespace

template <typename R>
void swiglu_forward(R* a, const R* h13, int N, int F) {
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * F)
    for (int n = 0; n < N; n++) {
        const R* h1 = h13 + (size_t)n * 2 * F;
        const R* h3 = h1 + F;
        R* o = a + (size_t)n * F;
#pragma omp simd
        for (int c = 0; c < F; c++) o[c] = h1[c] * sigmoid_fast(h1[c]) * h3[c];
    }
}

template <typename R>
void swiglu_backward(R* dh13, const R* da, const R* h13, int N, int F) {
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * F)
    for (int n = 0; n < N; n++) {
        const R* h1 = h13 + (size_t)n * 2 * F;
        const R* h3 = h1 + F;
        const R* g = da + (size_t)n * F;
        R* d1 = dh13 + (size_t)n * 2 * F;
        R* d3 = d1 + F;
#pragma omp simd
        for (int c = 0; c < F; c++) {
            // d silu/dz = s (1 + z (1 - s)) and silu(z) = z s share one sigmoid
            const R z = h1[c], s = sigmoid_fast(z);
            d1[c] = g[c] * h3[c] * (s * (R(1) + z * (R(1) - s)));
            d3[c] = g[c] * (z * s);
        }
    }
}

// ---- cross-entropy ---------------------------------------------------------------------------
// Softmax statistics of one row, online over blocks of kCeBlock columns (each block's maximum
// first, the running sum rescaled when the maximum grows; a block is re-read from L1): updates
// (mx, sum) with columns [0, n) of l, sum = sum_v exp(l_v - mx). `first` starts a row.
constexpr int kCeBlock = 512;

template <typename R>
inline void softmax_stats_update(const R* l, int n, bool first, R& mx, double& sum) {
    for (int v0 = 0; v0 < n; v0 += kCeBlock) {
        const int v1 = std::min(n, v0 + kCeBlock);
        R bm = l[v0];
#pragma omp simd reduction(max : bm)
        for (int v = v0 + 1; v < v1; v++) bm = l[v] > bm ? l[v] : bm;  // (std::max does not vectorise)
        if (first && v0 == 0) {
            mx = bm;
            sum = 0;
        } else if (bm > mx) {
            sum *= std::exp((double)mx - (double)bm);
            mx = bm;
        }
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int v = v0; v < v1; v++) s += (double)exp_fast(l[v] - mx);
        sum += s;
    }
}

// Rows are read once for max and sum together, then once more to write the probabilities.
template <typename R>
double cross_entropy_forward(R* lse, const R* logits, const int32_t* targets, int N, int V, int Vp,
                             R* probs) {
    std::vector<double> loss(N);
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * V)
    for (int n = 0; n < N; n++) {
        const R* l = logits + (size_t)n * Vp;
        R mx = 0;
        double sum = 0;
        softmax_stats_update(l, V, true, mx, sum);
        if (probs) {
            R* p = probs + (size_t)n * Vp;
            const R inv = (R)(1.0 / sum);
#pragma omp simd
            for (int v = 0; v < V; v++) p[v] = exp_fast(l[v] - mx) * inv;
        }
        double ls = (double)mx + std::log(sum);
        lse[n] = (R)ls;
        loss[n] = targets ? ls - (double)l[targets[n]] : 0.0;
    }
    double total = 0;
    for (int n = 0; n < N; n++) total += loss[n];
    return total / N;
}

// ---- LM head + cross-entropy, tiled -----------------------------------------------------------
template <typename R>
double lm_head_ce_forward(R* logits, R* lse, R* row_max, R* row_inv, const R* x, const R* W,
                          const int32_t* targets, int N, int d, int V, int Vp) {
    std::vector<double> sum(N, 0.0);
    for (int r0 = 0; r0 < N; r0 += kLmRowTile) {
        const int rows = std::min(kLmRowTile, N - r0);
        for (int c0 = 0; c0 < V; c0 += kLmColTile) {
            const int cols = std::min(kLmColTile, V - c0);
            R* tile = logits + (size_t)r0 * Vp + c0;
            gemm<R>(false, true, rows, cols, d, R(1), x + (size_t)r0 * d, d, W + (size_t)c0 * d, d, R(0), tile, Vp);
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)rows * cols)
            for (int i = 0; i < rows; i++)
                softmax_stats_update(tile + (size_t)i * Vp, cols, c0 == 0, row_max[r0 + i], sum[r0 + i]);
        }
    }
    double total = 0;
    for (int n = 0; n < N; n++) {
        const double ls = (double)row_max[n] + std::log(sum[n]);
        lse[n] = (R)ls;
        row_inv[n] = (R)(1.0 / sum[n]);
        if (targets) total += ls - (double)logits[(size_t)n * Vp + targets[n]];
    }
    return total / N;
}

template <typename R>
void lm_head_ce_backward(R* dx, R* dW, const R* logits, const R* row_max, const R* row_inv, const R* x,
                         const R* W, const int32_t* targets, int N, int d, int V, int Vp, R scale, R* scratch) {
    for (int r0 = 0; r0 < N; r0 += kLmRowTile) {
        const int rows = std::min(kLmRowTile, N - r0);
        for (int c0 = 0; c0 < V; c0 += kLmColTile) {
            const int cols = std::min(kLmColTile, V - c0);
            // scratch [rows, cols] = softmax - onehot of this tile (scale goes into the GEMMs)
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)rows * cols)
            for (int i = 0; i < rows; i++) {
                const int n = r0 + i;
                const R* l = logits + (size_t)n * Vp + c0;
                R* p = scratch + (size_t)i * cols;
                const R m = row_max[n], inv = row_inv[n];
#pragma omp simd
                for (int v = 0; v < cols; v++) p[v] = exp_fast(l[v] - m) * inv;
                const int t = targets[n] - c0;
                if (t >= 0 && t < cols) p[t] -= R(1);
            }
            gemm<R>(false, false, rows, d, cols, scale, scratch, cols, W + (size_t)c0 * d, d, R(1), dx + (size_t)r0 * d, d);
            gemm<R>(true, false, cols, d, rows, scale, scratch, cols, x + (size_t)r0 * d, d, R(1), dW + (size_t)c0 * d, d);
        }
    }
}

template <typename R>
void cross_entropy_backward_inplace(R* probs, const int32_t* targets, int N, int V, int Vp, R scale) {
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * V)
    for (int n = 0; n < N; n++) {
        R* p = probs + (size_t)n * Vp;
#pragma omp simd
        for (int v = 0; v < V; v++) p[v] *= scale;
        p[targets[n]] -= scale;
    }
}

template <typename R>
void cross_entropy_backward(R* dlogits, const R* logits, const R* lse, const int32_t* targets,
                            int N, int V, int Vp, R scale) {
#pragma omp parallel for schedule(static) LDM_PAR((int64_t)N * V)
    for (int n = 0; n < N; n++) {
        const R* l = logits + (size_t)n * Vp;
        R* d = dlogits + (size_t)n * Vp;
        const R m = lse[n];
        for (int v = 0; v < V; v++) d[v] += scale * exp_fast(l[v] - m);
        d[targets[n]] -= scale;
    }
}

// ---- explicit instantiations -----------------------------------------------------------------
#define LDM_INSTANTIATE(R)                                                                       \
    template void gemm<R>(bool, bool, int, int, int, R, const R*, int, const R*, int, R, R*, int); \
    template void embedding_forward<R>(R*, const int32_t*, const R*, int, int);                  \
    template void embedding_backward<R>(R*, const R*, const int32_t*, int, int);                 \
    template void rmsnorm_forward<R>(R*, R*, const R*, const R*, int, int, R);                   \
    template void rmsnorm_backward<R>(R*, R*, const R*, const R*, const R*, const R*, int, int); \
    template void matmul_forward<R>(R*, const R*, const R*, const R*, int, int, int, int);       \
    template void matmul_backward<R>(R*, R*, R*, const R*, const R*, const R*, int, int, int, int); \
    template void rope_tables<R>(R*, R*, int, int, double);                                      \
    template void rope_forward<R>(R*, const R*, const R*, const R*, int, int, int, int);         \
    template void rope_backward<R>(R*, const R*, const R*, const R*, int, int, int, int);        \
    template void attention_forward<R>(R*, R*, const R*, const R*, const R*, int, int, int, int, int); \
    template void attention_backward<R>(R*, R*, R*, const R*, const R*, const R*, const R*,      \
                                        const R*, int, int, int, int, int);                      \
    template void swiglu_forward<R>(R*, const R*, int, int);                                     \
    template void swiglu_backward<R>(R*, const R*, const R*, int, int);                          \
    template double cross_entropy_forward<R>(R*, const R*, const int32_t*, int, int, int, R*);   \
    template double lm_head_ce_forward<R>(R*, R*, R*, R*, const R*, const R*, const int32_t*, int, int, int, int); \
    template void lm_head_ce_backward<R>(R*, R*, const R*, const R*, const R*, const R*, const R*, const int32_t*, \
                                         int, int, int, int, R, R*);                                \
    template void cross_entropy_backward_inplace<R>(R*, const int32_t*, int, int, int, R);       \
    template void cross_entropy_backward<R>(R*, const R*, const R*, const int32_t*, int, int, int, R);
LDM_INSTANTIATE(float)
LDM_INSTANTIATE(double)

}  // namespace cpu
}  // namespace ldm
