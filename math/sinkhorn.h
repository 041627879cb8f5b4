// math/sinkhorn.h — Sinkhorn-Knopp of mHC (spec §2.3) with its unrolled backward, per token.
//
// SK(Rt): M = exp(Rt - max(Rt)) (n x n, row-major), then `iters` times: normalise every column to
// sum 1, then every row (paper order; the last step is a row normalisation, so rows sum to 1 up
// to rounding, columns only approximately). Evaluated in the log domain so that no logit
// magnitude over- or underflows: the iterate is kept as L = log X, and a normalisation of a line
// is L <- (L - m) - log(sum exp(L - m)), m = the line's max (the sum is in [1, n]). The backward
// never uses the converged fixed point: it walks back through all 2*iters normalisations (each a
// log-softmax along its line), whose outputs the forward left in `work`. The per-token caller
// stores only Rt and recomputes (spec §2.3). Plain LDM_HD inline functions: no allocation, no
// exceptions, no local arrays; shared with the CUDA kernels (cuda/scheme_hc.cuh).
#pragma once
#include <float.h>

#include "math/elementwise.h"

namespace ldm {

// Most negative finite value: the floor of the log-domain iterate (below, see sinkhorn_forward).
LDM_HD inline float sinkhorn_lowest(float) { return -FLT_MAX; }
LDM_HD inline double sinkhorn_lowest(double) { return -DBL_MAX; }

// The two selections of sinkhorn_forward: the running line max (a > b ? a : b) and the floor
// (d < lo ? lo : d, a NaN stays NaN). Functions, so that the CPU reference can run this file's
// templates on SIMD lanes (cpu/lanes.h overloads them lane by lane).
template <typename R>
LDM_HD inline R sinkhorn_max(R a, R b) { return a > b ? a : b; }
template <typename R>
LDM_HD inline R sinkhorn_floor(R d, R lo) { return d < lo ? lo : d; }

// Scratch values needed by sinkhorn_forward / sinkhorn_backward for an n x n matrix: the running
// log-domain iterate (n*n) and the output of every one of the 2*iters normalisations (n*n each).
LDM_HD inline int sinkhorn_work_size(int n, int iters) { return n * n * (1 + 2 * iters); }

// Rt [n*n] -> out [n*n] = SK(Rt), iters >= 1. work [sinkhorn_work_size(n, iters)]: work[0, n*n)
// holds the log iterate L (starting at Rt), the block 1 + s (s = 0..2*iters-1; even: columns,
// odd: rows) receives step s's output exp(L) = exp(L - m) / sum exp(L - m) (max-shifted, so it
// equals the plain column/row division wherever that stays in R's normal range). The spec's
// shift by max(Rt) is subsumed by the first step's per-column shift (a column normalisation
// ignores any scaling of its column), which keeps each column's information even when another
// column is huge. After that shift an entry is floored at the most negative finite value
// (reached only if a column spans more than the type's range: exp(-huge) = 0 either way); from
// then on every entry of L stays in [lowest, 0], since a step lowers an entry by at most log n.
// Logits must be finite (a NaN propagates to the output).
template <typename R>
LDM_HD inline void sinkhorn_forward(const R* Rt, int n, int iters, R* out, R* work) {
    const int nn = n * n;
    const R lo = sinkhorn_lowest(R(0));
    R* L = work;
    for (int e = 0; e < nn; e++) L[e] = Rt[e];
    R* Y = work;
    for (int s = 0; s < 2 * iters; s++) {
        Y = work + nn * (1 + s);
        const bool cols = (s % 2) == 0;
        for (int a = 0; a < n; a++) {
            // line a: entries a*n + b (row) or b*n + a (column), b = 0..n-1
            const int e0 = cols ? a : a * n, de = cols ? n : 1;
            R m = L[e0];
            for (int b = 1, e = e0 + de; b < n; b++, e += de) m = sinkhorn_max(L[e], m);
            R t = 0;
            for (int b = 0, e = e0; b < n; b++, e += de) {
                const R d = L[e] - m;
                L[e] = sinkhorn_floor(d, lo);  // only step 0 can reach the floor; a NaN stays NaN
                Y[e] = ldm_exp(L[e]);
                t += Y[e];
            }
            const R inv = R(1) / t, lt = ldm_log(t);  // t in [1, n]
            for (int b = 0, e = e0; b < n; b++, e += de) {
                Y[e] = Y[e] * inv;
                L[e] = L[e] - lt;
            }
        }
    }
    for (int e = 0; e < nn; e++) out[e] = Y[e];
}

// Given dout = dL/dSK(Rt) and the work filled by sinkhorn_forward(Rt), writes dRt (=).
// dout is used as scratch (overwritten). Exact gradient of the unrolled steps: out = exp(L_last)
// gives dL = dout * out; each step L' = L - logsumexp(L) along a line has the vector-Jacobian
// product dL = dL' - P * sum(dL') over the line, P = exp(L') its stored output. No division, so
// every magnitude stays finite. The floor of sinkhorn_forward is passed through (it acts only
// where the entry's weight is exp(-huge) = 0).
template <typename R>
LDM_HD inline void sinkhorn_backward(R* dout, int n, int iters, const R* work, R* dRt) {
    const int nn = n * n;
    R* g = dout;
    const R* Pl = work + nn * (2 * iters);
    for (int e = 0; e < nn; e++) g[e] = g[e] * Pl[e];
    for (int s = 2 * iters - 1; s >= 0; s--) {
        const R* P = work + nn * (1 + s);
        const bool cols = (s % 2) == 0;
        for (int a = 0; a < n; a++) {
            const int e0 = cols ? a : a * n, de = cols ? n : 1;
            R t = 0;
            for (int b = 0, e = e0; b < n; b++, e += de) t += g[e];
            for (int b = 0, e = e0; b < n; b++, e += de) g[e] = g[e] - P[e] * t;
        }
    }
    for (int e = 0; e < nn; e++) dRt[e] = g[e];
}

}  // namespace ldm
