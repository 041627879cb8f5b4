// math/sinkhorn.h — Sinkhorn-Knopp of mHC (spec §2.3) with its unrolled backward, per token.
//
// Forward: M = exp(Rt - max(Rt)) (n x n, row-major), then `iters` times: divide every column by
// its sum, then every row by its sum (paper order; the last step is a row normalisation, so rows
// sum to 1 up to rounding, columns only approximately). The backward never uses the converged
// fixed point: it walks back through all 2*iters normalisations, whose outputs and divisors the
// forward left in `work`. The per-token caller stores only Rt and recomputes (spec §2.3).
// Plain LDM_HD inline functions: no allocation, no exceptions; shared with the CUDA kernels.
#pragma once
#include "math/elementwise.h"

namespace ldm {

// Scratch values needed by sinkhorn_forward / sinkhorn_backward for an n x n matrix.
LDM_HD inline int sinkhorn_work_size(int n, int iters) { return n * n + 2 * iters * (n * n + n); }

// Rt [n*n] -> out [n*n] = SK(Rt). work [sinkhorn_work_size(n, iters)] receives exp(Rt - max) and,
// for step s = 0..2*iters-1 (even: columns, odd: rows), its output matrix and its n divisors.
template <typename R>
LDM_HD inline void sinkhorn_forward(const R* Rt, int n, int iters, R* out, R* work) {
    const int nn = n * n;
    R mx = Rt[0];
    for (int e = 1; e < nn; e++) mx = Rt[e] > mx ? Rt[e] : mx;
    R* M = work;
    for (int e = 0; e < nn; e++) M[e] = ldm_exp(Rt[e] - mx);
    const R* X = M;
    for (int s = 0; s < 2 * iters; s++) {
        R* Y = work + nn + s * (nn + n);
        R* sum = Y + nn;
        const bool cols = (s % 2) == 0;
        for (int a = 0; a < n; a++) {
            R t = 0;
            for (int b = 0; b < n; b++) t += cols ? X[b * n + a] : X[a * n + b];
            sum[a] = t;
            R inv = R(1) / t;
            for (int b = 0; b < n; b++) {
                int e = cols ? b * n + a : a * n + b;
                Y[e] = X[e] * inv;
            }
        }
        X = Y;
    }
    for (int e = 0; e < nn; e++) out[e] = X[e];
}

// Given dout = dL/dSK(Rt) and the work filled by sinkhorn_forward(Rt), writes dRt (=).
// dout is used as scratch (overwritten). Each normalisation Y = X / s (s = sum along the line)
// has the vector-Jacobian product dX = (dY - <dY, Y>_line) / s.
template <typename R>
LDM_HD inline void sinkhorn_backward(R* dout, int n, int iters, const R* work, R* dRt) {
    const int nn = n * n;
    R* dY = dout;
    for (int s = 2 * iters - 1; s >= 0; s--) {
        const R* Y = work + nn + s * (nn + n);
        const R* sum = Y + nn;
        const bool cols = (s % 2) == 0;
        for (int a = 0; a < n; a++) {
            R dot = 0;
            for (int b = 0; b < n; b++) {
                int e = cols ? b * n + a : a * n + b;
                dot += dY[e] * Y[e];
            }
            R inv = R(1) / sum[a];
            for (int b = 0; b < n; b++) {
                int e = cols ? b * n + a : a * n + b;
                dY[e] = (dY[e] - dot) * inv;
            }
        }
    }
    // M = exp(Rt - max): dRt = dM * M. The max is a constant shift; SK is invariant to scaling M,
    // so its derivative contributes nothing.
    const R* M = work;
    for (int e = 0; e < nn; e++) dRt[e] = dY[e] * M[e];
}

}  // namespace ldm
