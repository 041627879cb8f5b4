// cpu/ops.h — backbone ops of spec §1, forward and hand-written backward, as plain functions
// over raw pointers (reusable by the GPU workbench as its CPU reference).
//
// Conventions:
//   * row-major; N = B*T tokens in (b, t) order; "[N, C]" = N rows of C contiguous values;
//   * weights are [out, in] (y = x W^T + b);
//   * every *_backward ACCUMULATES (+=) into the gradients of inputs and parameters, so callers
//     zero their scratch first; forward outputs are overwritten (=);
//   * R is float or double (explicit instantiations in ops.cpp);
//   * no allocation except per-thread scratch inside attention; no error checking beyond the
//     documented preconditions (the model validates shapes and ids).
#pragma once
#include <cstdint>

namespace ldm {
namespace cpu {

// ---- GEMM through OpenBLAS (cblas_sgemm / cblas_dgemm by overload) -------------------------
// C[M, N] = alpha * op(A) op(B) + beta * C, row-major; op(A) is [M, K], op(B) is [K, N].
template <typename R>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, R alpha, const R* A, int lda,
          const R* B, int ldb, R beta, R* C, int ldc);

// Timing hook: FLOPs (2*M*N*K per call) and wall seconds spent inside gemm() since the last
// reset. Calls made inside an OpenMP parallel region add elapsed / num_threads (their share of
// the wall time), so `seconds` stays comparable with the step's wall time.
struct GemmStats {
    double flops = 0, seconds = 0;
    int64_t calls = 0;
};
GemmStats gemm_stats();
void reset_gemm_stats();

// ---- embedding (spec §1: e = E[token], no scaling) --------------------------------------------
// out [N, C] = wte[tokens[n]]; wte [Vp, C].
template <typename R>
void embedding_forward(R* out, const int32_t* tokens, const R* wte, int N, int C);
// dwte[tokens[n]] += dout[n]  (rows never indexed, e.g. >= V, stay untouched).
template <typename R>
void embedding_backward(R* dwte, const R* dout, const int32_t* tokens, int N, int C);

// ---- RMSNorm: out = w * x * rstd, rstd = 1/sqrt(mean(x^2) + eps), per row of C -------------
// x, out [N, C]; w [C]; rstd [N] saved for the backward. out may not alias x.
template <typename R>
void rmsnorm_forward(R* out, R* rstd, const R* x, const R* w, int N, int C, R eps);
// dx [N, C] += ..., dw [C] += ...
template <typename R>
void rmsnorm_backward(R* dx, R* dw, const R* dout, const R* x, const R* w, const R* rstd, int N,
                      int C);

// ---- linear layer: out [N, OC] = inp [N, IC] W^T (+ bias), W [OC, IC], bias [OC] or nullptr --
// ld_out: row stride of out (>= OC; e.g. Vp for logits computed over the first V columns only).
template <typename R>
void matmul_forward(R* out, const R* inp, const R* W, const R* bias, int N, int IC, int OC,
                    int ld_out = 0);
// dinp [N, IC] += dout W;  dW [OC, IC] += dout^T inp;  dbias [OC] += column sums of dout.
// dinp / dbias may be nullptr (skipped). ld_dout: row stride of dout (0 = OC).
template <typename R>
void matmul_backward(R* dinp, R* dW, R* dbias, const R* dout, const R* inp, const R* W, int N,
                     int IC, int OC, int ld_dout = 0);

// ---- RoPE, rotate-half (spec §1) --------------------------------------------------------------
// Tables cos/sin [T, hd/2]: angle(t, i) = t * theta^(-2i/hd), computed in double.
template <typename R>
void rope_tables(R* cos_t, R* sin_t, int T, int hd, double theta);
// x, out [N, H*hd] (H heads of hd); token n has position n % T. out may alias x.
template <typename R>
void rope_forward(R* out, const R* x, const R* cos_t, const R* sin_t, int N, int T, int H, int hd);
// dx += R^T dout.
template <typename R>
void rope_backward(R* dx, const R* dout, const R* cos_t, const R* sin_t, int N, int T, int H,
                   int hd);

// ---- causal GQA attention (spec §1) -----------------------------------------------------------
// q [N, nh*hd], k, v [N, nkv*hd]; query head h uses kv head h / (nh/nkv). scale 1/sqrt(hd).
// att [B, nh, T, T]: softmax probabilities (0 above the diagonal), saved for the backward.
// out [N, nh*hd]. Per (b, head): two GEMMs (Q K^T, P V) on the full T x T square.
template <typename R>
void attention_forward(R* out, R* att, const R* q, const R* k, const R* v, int B, int T, int nh,
                       int nkv, int hd);
// dq, dk, dv += ... (dk, dv summed over the query heads of their group).
template <typename R>
void attention_backward(R* dq, R* dk, R* dv, const R* dout, const R* att, const R* q, const R* k,
                        const R* v, int B, int T, int nh, int nkv, int hd);

// ---- SwiGLU gate: a = silu(h1) * h3 on the packed h13 [N, 2F] (row n = [h1_n | h3_n]) -------
// h13 is one GEMM's output with the adjacent W1, W3 rows ([2F, d], param_specs order), the GPU
// trainers' layout too. a: [N, F]. The float sigmoid uses exp_fast (vectorised, ~2 ulp);
// double uses exp. swiglu_backward writes (does not accumulate) dh13 [N, 2F].
template <typename R>
void swiglu_forward(R* a, const R* h13, int N, int F);
template <typename R>
void swiglu_backward(R* dh13, const R* da, const R* h13, int N, int F);

// ---- cross-entropy over the real V of padded logits [N, Vp] -----------------------------
// lse[n] = log sum_{v<V} exp(logits[n, v]); returns mean_n (lse[n] - logits[n, targets[n]])
// (accumulated in double; 0 when targets is nullptr). When probs [N, Vp] is given, it receives
// softmax(logits[n]) over columns < V (columns >= V untouched).
template <typename R>
double cross_entropy_forward(R* lse, const R* logits, const int32_t* targets, int N, int V, int Vp,
                             R* probs = nullptr);
// Turns the probs of cross_entropy_forward into dlogits = scale * (probs - onehot(target)) IN
// PLACE (an exception to the += convention; saves a second exp pass and a zero-fill of the [N, Vp]
// buffer). The reference of the GPU classifier kernels; the model uses lm_head_ce_* below.
template <typename R>
void cross_entropy_backward_inplace(R* probs, const int32_t* targets, int N, int V, int Vp, R scale);
// LM head + cross-entropy in tiles of kLmRowTile rows x kLmColTile columns, so that each tile of
// logits is still in cache when the next step reads it (spec §1: logits = RMSNorm_f(y) W_lm^T).
// Forward: logits [N, Vp] = x [N, d] W^T (W [V, d]; columns >= V untouched), and per row lse, the
// maximum row_max and row_inv = 1 / sum_v exp(logits - row_max) (online over the column tiles);
// returns mean_n (lse[n] - logits[n, targets[n]]) in double (0 when targets is nullptr).
// Backward: dx [N, d] += scale G W and dW [V, d] += scale G^T x with G = softmax - onehot(target),
// built a tile at a time in scratch [lm_head_ce_scratch_values(N, V)] from the forward's logits: no
// [N, V] gradient buffer and no extra pass over one. Same values as cross_entropy_forward /
// cross_entropy_backward_inplace + matmul_backward up to rounding.
constexpr int kLmRowTile = 1024, kLmColTile = 1024;
// Values of lm_head_ce_backward's scratch tile for N rows over V columns.
inline int64_t lm_head_ce_scratch_values(int64_t N, int V) {
    return (N < kLmRowTile ? N : kLmRowTile) * (V < kLmColTile ? V : kLmColTile);
}
template <typename R>
double lm_head_ce_forward(R* logits, R* lse, R* row_max, R* row_inv, const R* x, const R* W,
                          const int32_t* targets, int N, int d, int V, int Vp);
template <typename R>
void lm_head_ce_backward(R* dx, R* dW, const R* logits, const R* row_max, const R* row_inv, const R* x,
                         const R* W, const int32_t* targets, int N, int d, int V, int Vp, R scale, R* scratch);
// dlogits[n, v] += scale * (softmax(logits[n])_v - [v == targets[n]]) for v < V; columns >= V
// untouched. `scale` is the per-token weight (e.g. loss scale / N).
template <typename R>
void cross_entropy_backward(R* dlogits, const R* logits, const R* lse, const int32_t* targets,
                            int N, int V, int Vp, R scale);

}  // namespace cpu
}  // namespace ldm
