// math/ldm_math.h — per token-head math of Linear Depth Memory (spec §2.5), shared by the CPU
// reference (cpu/scheme_ldm.cpp) and the CUDA kernels (cuda/ldm.cuh). Every function is an inline
// template marked LDM_HD; no allocation, no exceptions; scratch comes from the caller (except the
// host-only drift-fallback helpers at the end, which build strings and may throw ldm::Error).
//
// Layouts (one token, one memory head): memory S [dv, dk] row-major (S[a*dk + b]); inverse
// covariance P [dk, dk] row-major, symmetric positive definite; key k [dk], query q [dk],
// value v [dv]; R = float or double (the state has the precision of the build, spec §2.5).
//
// VJP convention: "dS, dP" on entry hold dL/d(state after the step), on exit dL/d(state before
// the step) (overwritten in place); dk, dv, dq, dlam, dbeta are ACCUMULATED (+=).
#pragma once
#include <math.h>
#include <stdio.h>

#include <string>
#include <utility>
#include <vector>

#include "core/common.h"
#include "math/elementwise.h"

namespace ldm {

// ---- L2n(x) = x / sqrt(sum x^2 + 1e-6) (spec notation) --------------------------------------
// y [n] = L2n(x); returns the norm sqrt(sum x^2 + 1e-6) (kept for the backward). y may alias x.
template <typename R>
LDM_HD inline R l2n_forward(const R* x, R* y, int n) {
    R s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    R nrm = ldm_sqrt(s + R(1e-6));
    R inv = R(1) / nrm;
    for (int i = 0; i < n; i++) y[i] = x[i] * inv;
    return nrm;
}
// dx [n] = (dy - y (y.dy)) / nrm  (overwrites dx; dx may alias dy).
template <typename R>
LDM_HD inline void l2n_backward(const R* y, R nrm, const R* dy, R* dx, int n) {
    R yd = 0;
    for (int i = 0; i < n; i++) yd += y[i] * dy[i];
    R inv = R(1) / nrm;
    for (int i = 0; i < n; i++) dx[i] = (dy[i] - y[i] * yd) * inv;
}

// ---- initial state: S = 0, P = I / delta ------------------------------------------------------
template <typename R>
LDM_HD inline void ldm_init_state(R* S, R* P, int dv, int dk, R delta) {
    for (int i = 0; i < dv * dk; i++) S[i] = R(0);
    if (P)
        for (int a = 0; a < dk; a++)
            for (int b = 0; b < dk; b++) P[a * dk + b] = a == b ? R(1) / delta : R(0);
}

// ---- read: r [dv] = S q ; its VJP: dS += dr q^T, dq += S^T dr -------------------------------
template <typename R>
LDM_HD inline void ldm_read(const R* S, const R* q, R* r, int dv, int dk) {
    for (int a = 0; a < dv; a++) {
        R s = 0;
        for (int b = 0; b < dk; b++) s += S[a * dk + b] * q[b];
        r[a] = s;
    }
}
template <typename R>
LDM_HD inline void ldm_read_vjp(const R* S, const R* q, const R* dr, R* dS, R* dq, int dv, int dk) {
    for (int a = 0; a < dv; a++) {
        const R g = dr[a];
        for (int b = 0; b < dk; b++) {
            dS[a * dk + b] += g * q[b];
            dq[b] += S[a * dk + b] * g;
        }
    }
}

// ---- RLS write (spec §2.5, symmetric form) ----------------------------------------------------
//   u = P k;  gamma = lam + k.u;  g = u / gamma;  e = v - S k;  S += e g^T;  P = (P - u u^T/gamma)/lam
// scratch: dk values.
template <typename R>
LDM_HD inline void rls_write(R* S, R* P, const R* k, const R* v, R lam, int dv, int dk, R* u) {
    R kv = 0;
    for (int a = 0; a < dk; a++) {
        R s = 0;
        for (int b = 0; b < dk; b++) s += P[a * dk + b] * k[b];
        u[a] = s;
        kv += k[a] * s;
    }
    const R gamma = lam + kv, ig = R(1) / gamma, il = R(1) / lam;
    for (int a = 0; a < dv; a++) {
        R s = 0;
        for (int b = 0; b < dk; b++) s += S[a * dk + b] * k[b];
        const R e = v[a] - s;
        for (int b = 0; b < dk; b++) S[a * dk + b] += e * (u[b] * ig);
    }
    for (int a = 0; a < dk; a++)
        for (int b = 0; b < dk; b++) P[a * dk + b] = (P[a * dk + b] - u[a] * u[b] * ig) * il;
}

// Exact inverse of rls_write (spec §2.5 "unwind"): from the state after the write and (k, v, lam)
//   g = P k;  a = k.g;  gamma = lam / (1 - a);  P_prev = lam P + gamma g g^T;
//   e' = v - S k;  S_prev = S - (gamma/lam) e' g^T.
// rls_unwind_p is the P part alone (g [dk] out; returns gamma); S's part does not read P, so it
// may follow. scratch g: dk values.
template <typename R>
LDM_HD inline R rls_unwind_p(R* P, const R* k, R lam, int dk, R* g) {
    R a_ = 0;
    for (int a = 0; a < dk; a++) {
        R s = 0;
        for (int b = 0; b < dk; b++) s += P[a * dk + b] * k[b];
        g[a] = s;
        a_ += k[a] * s;
    }
    const R gamma = lam / (R(1) - a_);
    for (int a = 0; a < dk; a++)
        for (int b = 0; b < dk; b++) P[a * dk + b] = lam * P[a * dk + b] + gamma * (g[a] * g[b]);  // symmetric
    return gamma;
}
template <typename R>
LDM_HD inline void rls_unwind(R* S, R* P, const R* k, const R* v, R lam, int dv, int dk, R* g) {
    const R gamma = rls_unwind_p(P, k, lam, dk, g), gl = gamma / lam;
    for (int a = 0; a < dv; a++) {
        R s = 0;
        for (int b = 0; b < dk; b++) s += S[a * dk + b] * k[b];
        const R e = (v[a] - s) * gl;
        for (int b = 0; b < dk; b++) S[a * dk + b] -= e * g[b];
    }
}

// u [dk] = P k; returns k.u (the write's gamma is lam + k.u).
template <typename R>
LDM_HD inline R rls_write_u(const R* P, const R* k, R* u, int dk) {
    R ku = 0;
    for (int a = 0; a < dk; a++) {
        R s = 0;
        for (int b = 0; b < dk; b++) s += P[a * dk + b] * k[b];
        u[a] = s;
        ku += k[a] * s;
    }
    return ku;
}

// P-side part of rls_write_vjp: given dg = dL/dg (g = P k / gamma, summed over the S rows as
// sum_a dS'[a] e[a]) and dP (in: after the write; out: before it), accumulates the key's and
// lam's gradients through u = P k, gamma = lam + k.u and P' = (P - u u^T/gamma)/lam. P is the
// state BEFORE the write; u and k.u come from rls_write_u. scratch du: dk values.
template <typename R>
LDM_HD inline void rls_write_vjp_p(const R* P, const R* k, const R* u, R ku, R lam, const R* dg, R* dP, R* dk_,
                                   R* dlam, int dk, R* du) {
    const R gamma = lam + ku, ig = R(1) / gamma, il = R(1) / lam;
    // P' = (P - u u^T/gamma)/lam.  With Dp = dP'/lam:
    //   dlam = -sum(dP' . P')/lam;  du = -(Dp + Dp^T) u/gamma;  dgamma = u^T Dp u/gamma^2
    R dl = 0, uDu = 0;
    for (int a = 0; a < dk; a++) du[a] = 0;
    for (int a = 0; a < dk; a++)
        for (int b = 0; b < dk; b++) {
            const R Dp = dP[a * dk + b] * il;
            const R Pn = (P[a * dk + b] - u[a] * u[b] * ig) * il;
            dl -= dP[a * dk + b] * Pn * il;
            du[a] -= Dp * u[b] * ig;
            du[b] -= Dp * u[a] * ig;
            uDu += u[a] * Dp * u[b];
        }
    R dgamma = uDu * ig * ig;
    // g = u/gamma
    R dgu = 0;
    for (int a = 0; a < dk; a++) {
        du[a] += dg[a] * ig;
        dgu += dg[a] * u[a];
    }
    dgamma -= dgu * ig * ig;
    // gamma = lam + k.u
    dl += dgamma;
    for (int a = 0; a < dk; a++) {
        dk_[a] += dgamma * u[a];
        du[a] += dgamma * k[a];
    }
    *dlam += dl;
    // dP_prev = dP'/lam + du k^T;  dk += P^T du
    for (int a = 0; a < dk; a++)
        for (int b = 0; b < dk; b++) {
            dP[a * dk + b] = dP[a * dk + b] * il + du[a] * k[b];
            dk_[b] += P[a * dk + b] * du[a];
        }
}

// VJP of rls_write at the state BEFORE the write (S, P): dS/dP in (after) -> out (before);
// dk [dk], dv [dv], *dlam accumulated. scratch: 4*dk + 2*dv values.
template <typename R>
LDM_HD inline void rls_write_vjp(const R* S, const R* P, const R* k, const R* v, R lam, R* dS,
                                 R* dP, R* dk_, R* dv_, R* dlam, int dv, int dk, R* scratch) {
    R* u = scratch;
    R* g = u + dk;
    R* dg = g + dk;
    R* du = dg + dk;
    R* e = du + dk;
    R* de = e + dv;
    const R ku = rls_write_u(P, k, u, dk), ig = R(1) / (lam + ku);
    for (int b = 0; b < dk; b++) {
        g[b] = u[b] * ig;
        dg[b] = 0;
    }
    // S' = S + e g^T,  e = v - S k
    for (int a = 0; a < dv; a++) {
        R s = 0, t = 0;
        for (int b = 0; b < dk; b++) {
            s += S[a * dk + b] * k[b];
            t += dS[a * dk + b] * g[b];
        }
        e[a] = v[a] - s;
        de[a] = t;
        for (int b = 0; b < dk; b++) dg[b] += dS[a * dk + b] * e[a];
    }
    rls_write_vjp_p(P, k, (const R*)u, ku, lam, (const R*)dg, dP, dk_, dlam, dk, du);
    // e = v - S k: dv += de; dS_prev = dS' - de k^T; dk -= S^T de
    for (int a = 0; a < dv; a++) {
        dv_[a] += de[a];
        for (int b = 0; b < dk; b++) {
            dk_[b] -= S[a * dk + b] * de[a];
            dS[a * dk + b] -= de[a] * k[b];
        }
    }
}

// ---- delta rule: S += beta (v - S k) k^T (spec §2.5 `delta`) ------------------------------------
template <typename R>
LDM_HD inline void delta_write(R* S, const R* k, const R* v, R beta, int dv, int dk) {
    for (int a = 0; a < dv; a++) {
        R s = 0;
        for (int b = 0; b < dk; b++) s += S[a * dk + b] * k[b];
        const R e = beta * (v[a] - s);
        for (int b = 0; b < dk; b++) S[a * dk + b] += e * k[b];
    }
}
// VJP at the state before the write; dS in/out; dk, dv, *dbeta accumulated.
template <typename R>
LDM_HD inline void delta_write_vjp(const R* S, const R* k, const R* v, R beta, R* dS, R* dk_,
                                   R* dv_, R* dbeta, int dv, int dk) {
    R db = 0;
    for (int a = 0; a < dv; a++) {
        R s = 0, t = 0;
        for (int b = 0; b < dk; b++) {
            s += S[a * dk + b] * k[b];
            t += dS[a * dk + b] * k[b];
        }
        const R e = v[a] - s;
        db += e * t;  // dbeta = e^T dS' k
        const R de = beta * t;
        dv_[a] += de;
        for (int b = 0; b < dk; b++) {
            dk_[b] += beta * dS[a * dk + b] * e - S[a * dk + b] * de;
            dS[a * dk + b] -= de * k[b];
        }
    }
    *dbeta += db;
}

// ---- outer product: S = lam S + v k^T (spec §2.5 `outer`) ---------------------------------------
template <typename R>
LDM_HD inline void outer_write(R* S, const R* k, const R* v, R lam, int dv, int dk) {
    for (int a = 0; a < dv; a++)
        for (int b = 0; b < dk; b++) S[a * dk + b] = lam * S[a * dk + b] + v[a] * k[b];
}
// Exact inverse: S_prev = (S - v k^T) / lam.
template <typename R>
LDM_HD inline void outer_unwind(R* S, const R* k, const R* v, R lam, int dv, int dk) {
    const R il = R(1) / lam;
    for (int a = 0; a < dv; a++)
        for (int b = 0; b < dk; b++) S[a * dk + b] = (S[a * dk + b] - v[a] * k[b]) * il;
}
template <typename R>
LDM_HD inline void outer_write_vjp(const R* S, const R* k, const R* v, R lam, R* dS, R* dk_, R* dv_,
                                   R* dlam, int dv, int dk) {
    R dl = 0;
    for (int a = 0; a < dv; a++) {
        R t = 0;
        for (int b = 0; b < dk; b++) {
            const R G = dS[a * dk + b];
            dl += G * S[a * dk + b];
            t += G * k[b];
            dk_[b] += G * v[a];
            dS[a * dk + b] = lam * G;
        }
        dv_[a] += t;
    }
    *dlam += dl;
}

// ---- forgetting and delta gates -------------------------------------------------------------
// lam = lam_min + (1 - lam_min) sigmoid(theta); d lam / d theta = (1 - lam_min) s (1 - s).
template <typename R>
LDM_HD inline R ldm_lambda(R theta, R lam_min) { return lam_min + (R(1) - lam_min) * sigmoid(theta); }
template <typename R>
LDM_HD inline R ldm_lambda_grad(R theta, R lam_min) {
    R s = sigmoid(theta);
    return (R(1) - lam_min) * s * (R(1) - s);
}

// ---- small Cholesky (window mode): A = L L^T, L lower, in place over the lower triangle --------
// Returns false if a pivot is not positive. n x n row-major.
template <typename R>
LDM_HD inline bool cholesky_inplace(R* A, int n) {
    for (int j = 0; j < n; j++) {
        R s = A[j * n + j];
        for (int p = 0; p < j; p++) s -= A[j * n + p] * A[j * n + p];
        if (!(s > R(0))) return false;
        const R l = ldm_sqrt(s);
        A[j * n + j] = l;
        for (int i = j + 1; i < n; i++) {
            R t = A[i * n + j];
            for (int p = 0; p < j; p++) t -= A[i * n + p] * A[j * n + p];
            A[i * n + j] = t / l;
        }
    }
    return true;
}

// ---- window mode (spec §2.5 "window w"): deferred writes, Woodbury form ---------------------
// One token-head's pending writes of the current window, m = 0..w-1 (w = the window capacity,
// row strides below use w):
//   Kt [w, dk]  k~_m = k_m / sqrt(c_m)
//   Et [w, dv]  e~_m = (v_m - S k_m) / sqrt(c_m) = v~_m - S k~_m   (S, P = window-start state)
//   L  [w, w]   Cholesky factor (lower, row-major) of C = I + K~^T P K~, grown one row per write
// c_m = prod of the window's lambdas up to and including write m (window_decay). S, P are not
// touched until window_flush. A read after m pending writes sees them exactly:
//   r = S q + E~_m^T C_m^-1 K~_m^T P q   (C_m = leading m x m block of C; its factor is L's block).

// c = prod_{t < count} lam[t * stride] (the window's forgetting product, spec §2.5).
template <typename R>
LDM_HD inline R window_decay(const R* lam, int count, int stride) {
    R c = 1;
    for (int t = 0; t < count; t++) c *= lam[(long long)t * stride];
    return c;
}

// Key part of appending write m (no S needed): Kt row m = k * isc (isc = 1/sqrt(c_m));
// u = P k~_m; row m of L from C[m][b] = k~_b^T u + [b == m]. scratch u: dk values.
template <typename R>
LDM_HD inline void window_append_key(const R* P, const R* k, R isc, R* Kt, R* L, int m, int w,
                                     int dk, R* u) {
    for (int b = 0; b < dk; b++) Kt[m * dk + b] = k[b] * isc;
    for (int a = 0; a < dk; a++) {
        R t = 0;
        for (int b = 0; b < dk; b++) t += P[a * dk + b] * Kt[m * dk + b];
        u[a] = t;
    }
    for (int b = 0; b <= m; b++) {
        R cmb = b == m ? R(1) : R(0);
        for (int a = 0; a < dk; a++) cmb += Kt[b * dk + a] * u[a];
        for (int p = 0; p < b; p++) cmb -= L[m * w + p] * L[b * w + p];
        L[m * w + b] = b == m ? ldm_sqrt(cmb) : cmb / L[b * w + b];
    }
}

// Error row of write m: Et row (dv values) = (v - S k) * isc, S the window-start memory.
template <typename R>
LDM_HD inline void window_append_err(const R* S, const R* k, const R* v, R isc, R* Et_row, int dv,
                                     int dk) {
    for (int a = 0; a < dv; a++) {
        R sk = 0;
        for (int b = 0; b < dk; b++) sk += S[a * dk + b] * k[b];
        Et_row[a] = (v[a] - sk) * isc;
    }
}

// Appends write m (Kt, Et, L rows): the CPU reference's form. scratch u: dk values.
template <typename R>
LDM_HD inline void window_append(const R* S, const R* P, const R* k, const R* v, R isc, R* Kt,
                                 R* Et, R* L, int m, int w, int dv, int dk, R* u) {
    window_append_err(S, k, v, isc, Et + (long long)m * dv, dv, dk);
    window_append_key(P, k, isc, Kt, L, m, w, dk, u);
}

// z [m] = C_m^-1 K~_m^T P q (forward then back substitution with L's leading block); t [dk]
// scratch (holds P q on return).
template <typename R>
LDM_HD inline void window_solve(const R* P, const R* Kt, const R* L, int m, int w, const R* q, R* z,
                                R* t, int dk) {
    for (int a = 0; a < dk; a++) {
        R x = 0;
        for (int b = 0; b < dk; b++) x += P[a * dk + b] * q[b];
        t[a] = x;
    }
    for (int a = 0; a < m; a++) {  // forward substitution L z = K~^T t
        R x = 0;
        for (int b = 0; b < dk; b++) x += Kt[a * dk + b] * t[b];
        for (int p = 0; p < a; p++) x -= L[a * w + p] * z[p];
        z[a] = x / L[a * w + a];
    }
    for (int a = m - 1; a >= 0; a--) {  // back substitution L^T z' = z
        R x = z[a];
        for (int p = a + 1; p < m; p++) x -= L[p * w + a] * z[p];
        z[a] = x / L[a * w + a];
    }
}

// r [dv] += E~_m^T C_m^-1 K~_m^T P q for m pending writes (r already holds S q).
// scratch: dk + m values.
template <typename R>
LDM_HD inline void window_read(const R* P, const R* Kt, const R* Et, const R* L, int m, int w,
                               const R* q, R* r, int dv, int dk, R* scr) {
    R* t = scr;       // P q [dk]
    R* z = scr + dk;  // [m]
    window_solve(P, Kt, L, m, w, q, z, t, dk);
    for (int a = 0; a < m; a++)
        for (int c = 0; c < dv; c++) r[c] += z[a] * Et[(long long)a * dv + c];
}

// Small part of a flush of m writes (no S): X = L^-1 (P K~)^T [m, dk]; Pout = (P - X^T X)/c
// (Pout may alias P: X is complete before Pout is written); then X <- L^-T X, so X = G^T with
// G = P K~ C^-1. The memory update is S += E~^T X (window_flush) or, without E~,
// S += (V~ - S K~) X row by row.
template <typename R>
LDM_HD inline void window_flush_coef(const R* P, const R* Kt, const R* L, int m, int w, R c, R* X,
                                     R* Pout, int dk) {
    for (int a = 0; a < m; a++)
        for (int b = 0; b < dk; b++) {
            R u = 0;
            for (int e = 0; e < dk; e++) u += P[b * dk + e] * Kt[a * dk + e];
            for (int p = 0; p < a; p++) u -= L[a * w + p] * X[p * dk + b];
            X[a * dk + b] = u / L[a * w + a];
        }
    const R ic = R(1) / c;
    for (int a = 0; a < dk; a++)
        for (int b = 0; b < dk; b++) {
            R x = 0;
            for (int p = 0; p < m; p++) x += X[p * dk + a] * X[p * dk + b];
            Pout[a * dk + b] = (P[a * dk + b] - x) * ic;
        }
    for (int a = m - 1; a >= 0; a--)  // X <- L^-T X (in place, rows from the bottom)
        for (int b = 0; b < dk; b++) {
            R x = X[a * dk + b];
            for (int p = a + 1; p < m; p++) x -= L[p * w + a] * X[p * dk + b];
            X[a * dk + b] = x / L[a * w + a];
        }
}

// Applies the window's m pending writes at once (spec §2.5): P <- (P - G K~^T P)/c,
// S <- S + E~^T G^T. c = window_decay over the m writes. scratch X: m*dk values.
template <typename R>
LDM_HD inline void window_flush(R* S, R* P, const R* Kt, const R* Et, const R* L, int m, int w, R c,
                                int dv, int dk, R* X) {
    window_flush_coef((const R*)P, Kt, L, m, w, c, X, P, dk);
    for (int a = 0; a < dv; a++)
        for (int b = 0; b < dk; b++) {
            R x = 0;
            for (int p = 0; p < m; p++) x += Et[(long long)p * dv + a] * X[p * dk + b];
            S[a * dk + b] += x;
        }
}

// ---- window mode without the error rows E~ (the GPU's v2 form; same math, other rounding) ----
// E~ = V~ - S K~ with S the window-start memory, so E~ need not be stored: with v~_p = v_p/sqrt(c_p)
//   read:  r = S q + E~^T z = S (q - K~ z) + V~ z                 (z = window_solve)
//   flush: S_row += sum_p (v~_p[row] - S_row . k~_p) X_p          (X = window_flush_coef)
// so a read moves S once and appending a write does not touch S at all (window_append_key).

// qeff [dk] = q - sum_p z_p k~_p  (m pending writes).
template <typename R>
LDM_HD inline void window_qeff(const R* Kt, const R* z, int m, const R* q, R* qeff, int dk) {
    for (int b = 0; b < dk; b++) {
        R x = q[b];
        for (int p = 0; p < m; p++) x -= z[p] * Kt[p * dk + b];
        qeff[b] = x;
    }
}
// One value of the read: S_row . qeff + sum_p z_p vt[p]  (vt[p] = v~_p[row]).
template <typename R>
LDM_HD inline R window_read_row(const R* Srow, const R* qeff, const R* z, const R* vt, int m, int dk) {
    R x = 0;
    for (int b = 0; b < dk; b++) x += Srow[b] * qeff[b];
    for (int p = 0; p < m; p++) x += z[p] * vt[p];
    return x;
}
// One row of the flush: S_row += sum_p (vt[p] - S_row . k~_p) X_p (S_row on entry = window start).
// scratch e: m values.
template <typename R>
LDM_HD inline void window_flush_row(R* Srow, const R* Kt, const R* X, const R* vt, int m, int dk, R* e) {
    for (int p = 0; p < m; p++) {
        R s = 0;
        for (int b = 0; b < dk; b++) s += Srow[b] * Kt[p * dk + b];
        e[p] = vt[p] - s;
    }
    for (int b = 0; b < dk; b++) {
        R x = 0;
        for (int p = 0; p < m; p++) x += e[p] * X[p * dk + b];
        Srow[b] += x;
    }
}

// ---- windowed backward of rls writes (the unwinding backward over a window in one pass) ---------
// One token-head, a window of m writes t = 0..m-1, write t followed by its read t (query q_t, read
// gradient dr_t): the forward order is write 0, read 0, write 1, ..., write m-1, read m-1. The
// backward starts from the state after write m-1 (S_end, P_end), D_end = dL/dS_end from what
// follows read m-1 (read m-1 itself excluded) and dP_end. Every row of S the backward needs is
// affine in the same row of S_end and of D_end, with d_k x d_k factors and d_k-vectors that
// depend on (k, q, g, c) only, not on the d_v rows:
//   s_t  = row of S before write t           = S_end_row X_t + sum_{l=t..m-1} v_l[row] y_l
//   ds_t = row of dL/dS after write t, read t included
//                                            = D_end_row Y_t + sum_{l=t..m-1} dr_l[row] z_l
// from the unwind (spec §2.5: g_t = P k_t with P after write t, c_t = gamma_t / lam_t,
// S_before = S_after U_t - c_t v_t g_t^T with U_t = I + c_t k_t g_t^T) and the write VJP
// (dS_before = dS_after W_t + [read]: W_t = I - g_t k_t^T):
//   X_t = X_{t+1} U_t (X_m = I),   y_l <- U_t^T y_l (l > t),   y_t = -c_t g_t;
//   Y_t = Y_{t+1} W_{t+1} (Y_{m-1} = I),   z_l <- W_{t+1}^T z_l (l > t),   z_t = q_t.
// A backward step over write t and read t then reads the S_end and D_end rows once (O(d_k + w)
// work per row, wbwd_row below), writes only dv_t (d_v values) and d_k-sized sums, and only the
// window's first step (t = 0) writes the unwound rows S_start = s_0 and D_start = ds_0 W_0
// (wbwd_row_full: O(d_k^2 + w d_k) per row). Same arithmetic as unwinding write by write
// (rls_unwind, ldm_read_vjp, rls_write_vjp), reassociated; the drift check at (0, I/delta) applies
// unchanged. Coefficients of one token-head, capacity w >= m (strides use w):
//   X [dk, dk], Y [dk, dk] row-major; Yv [w, dk] (y_l), Z [w, dk] (z_l), G [w, dk] (g_t), C [w] (c_t).

// Coefficient step t (t = m-1 first, then down to 0): unwinds P through write t (in: after it,
// out: before it; rls_unwind's P part), stores g_t, c_t and advances X, Y, Yv, Z to step t.
// k_next: the key of write t+1 (unused at t = m-1).
template <typename R>
LDM_HD inline void wbwd_coef_step(int t, int m, R* P, const R* k, R lam, const R* q, const R* k_next,
                                  R* X, R* Y, R* Yv, R* Z, R* G, R* C, int dk) {
    R* g = G + t * dk;
    const R c = rls_unwind_p(P, k, lam, dk, g) / lam;
    C[t] = c;
    if (t == m - 1) {
        for (int a = 0; a < dk; a++)
            for (int b = 0; b < dk; b++) X[a * dk + b] = Y[a * dk + b] = a == b ? R(1) : R(0);
    } else {  // Y <- Y W_{t+1}, z_l <- z_l - (g_{t+1}.z_l) k_{t+1}
        const R* gn = G + (t + 1) * dk;
        for (int a = 0; a < dk; a++) {
            R x = 0;
            for (int b = 0; b < dk; b++) x += Y[a * dk + b] * gn[b];
            for (int b = 0; b < dk; b++) Y[a * dk + b] -= x * k_next[b];
        }
        for (int l = t + 1; l < m; l++) {
            R x = 0;
            for (int b = 0; b < dk; b++) x += Z[l * dk + b] * gn[b];
            for (int b = 0; b < dk; b++) Z[l * dk + b] -= x * k_next[b];
        }
    }
    // X <- X U_t, y_l <- y_l + c_t (y_l.k_t) g_t
    for (int a = 0; a < dk; a++) {
        R x = 0;
        for (int b = 0; b < dk; b++) x += X[a * dk + b] * k[b];
        for (int b = 0; b < dk; b++) X[a * dk + b] += c * x * g[b];
    }
    for (int l = t + 1; l < m; l++) {
        R x = 0;
        for (int b = 0; b < dk; b++) x += Yv[l * dk + b] * k[b];
        for (int b = 0; b < dk; b++) Yv[l * dk + b] += c * x * g[b];
    }
    for (int b = 0; b < dk; b++) {
        Yv[t * dk + b] = -c * g[b];
        Z[t * dk + b] = q[b];
    }
}

// What a step needs from the rows is linear in them, so no row needs the d_k x d_k products:
//   s_t.k_t  = Se.(X k_t) + sum_l v_l[row] (y_l.k_t),   ds_t.g_t = De.(Y g_t) + sum_l dr_l[row] (z_l.g_t)
// give the row's e = v_t - s_t.k_t and de = ds_t.g_t (= its dv_t), and the sums over rows
//   A = sum dr_t s_t = aS X + sum_l pv_l y_l,   aS = sum dr_t Se,   pv_l = sum dr_t v_l
//   dg = sum e ds_t  = aD Y + sum_l pe_l z_l,   aD = sum e De,      pe_l = sum e dr_l
//   B = sum de s_t   = bS X + sum_l pd_l y_l,   bS = sum de Se,     pd_l = sum de v_l
// follow from d_k- and w-sized row sums (wbwd_row), applied once per step (wbwd_step_sums):
// read t's dq_t = S_after^T dr_t = A + alpha g_t (alpha = sum dr_t e), write t's dk_t -= B and
// dg into rls_write_vjp_p. Only the window-start rows (step 0) need s_0 and ds_0 in full
// (wbwd_row_full). Loops over the window's writes run l = 0..W-1 and skip l outside [t, m)
// (W >= m, any bound: a kernel with a compile-time W keeps the per-write values in registers).

// Per-step vectors: xk = X k_t, yg = Y g_t [dk]; ykl[l] = y_l.k_t, zgl[l] = z_l.g_t.
template <typename R>
LDM_HD inline void wbwd_step_vectors(int t, int m, int W, const R* X, const R* Y, const R* Yv, const R* Z,
                                     const R* k, const R* g, R* xk, R* yg, R* ykl, R* zgl, int dk) {
    for (int a = 0; a < dk; a++) {
        R x = 0, y = 0;
        for (int b = 0; b < dk; b++) {
            x += X[a * dk + b] * k[b];
            y += Y[a * dk + b] * g[b];
        }
        xk[a] = x;
        yg[a] = y;
    }
    for (int l = 0; l < W; l++) {
        if (l < t || l >= m) continue;
        R x = 0, y = 0;
        for (int b = 0; b < dk; b++) {
            x += Yv[l * dk + b] * k[b];
            y += Z[l * dk + b] * g[b];
        }
        ykl[l] = x;
        zgl[l] = y;
    }
}

// One row of step t: Se, De its S_end and D_end rows, vrow[l], drrow[l] its v_l and dr_l, and
// again vt = vrow[t], drt = drrow[t] (by value: indexing by t would put a kernel's arrays in
// local memory). Returns de (the row's dv_t); *e_out = e; accumulates aS, aD, bS [dk], pv, pe,
// pd [W], *alpha.
template <typename R>
LDM_HD inline R wbwd_row(int t, int m, int W, const R* Se, const R* De, const R* vrow, const R* drrow, R vt,
                         R drt, const R* xk, const R* yg, const R* ykl, const R* zgl, R* aS, R* aD, R* bS,
                         R* pv, R* pe, R* pd, R* alpha, R* e_out, int dk) {
    R sk = 0, de = 0;
    for (int b = 0; b < dk; b++) {
        sk += Se[b] * xk[b];
        de += De[b] * yg[b];
    }
    for (int l = 0; l < W; l++) {
        if (l < t || l >= m) continue;
        sk += vrow[l] * ykl[l];
        de += drrow[l] * zgl[l];
    }
    const R e = vt - sk;
    *alpha += drt * e;
    for (int b = 0; b < dk; b++) {
        aS[b] += drt * Se[b];
        aD[b] += e * De[b];
        bS[b] += de * Se[b];
    }
    for (int l = 0; l < W; l++) {
        if (l < t || l >= m) continue;
        pv[l] += drt * vrow[l];
        pe[l] += e * drrow[l];
        pd[l] += de * vrow[l];
    }
    *e_out = e;
    return de;
}

// Step t's sums over the rows: A, dg, B [dk] from aS, aD, bS [dk] and pv, pe, pd [W].
template <typename R>
LDM_HD inline void wbwd_step_sums(int t, int m, int W, const R* X, const R* Y, const R* Yv, const R* Z,
                                  const R* aS, const R* aD, const R* bS, const R* pv, const R* pe, const R* pd,
                                  R* A, R* dg, R* B, int dk) {
    for (int b = 0; b < dk; b++) {
        R x = 0, y = 0, z = 0;
        for (int a = 0; a < dk; a++) {
            x += aS[a] * X[a * dk + b];
            y += aD[a] * Y[a * dk + b];
            z += bS[a] * X[a * dk + b];
        }
        for (int l = 0; l < W; l++) {
            if (l < t || l >= m) continue;
            x += pv[l] * Yv[l * dk + b];
            y += pe[l] * Z[l * dk + b];
            z += pd[l] * Yv[l * dk + b];
        }
        A[b] = x;
        dg[b] = y;
        B[b] = z;
    }
}

// The full rows s_t = Se X + sum_l v_l y_l and ds_t = De Y + sum_l dr_l z_l (the window's start
// rows at t = 0; then dL/dS before write 0 is ds_0 - de k_0).
template <typename R>
LDM_HD inline void wbwd_row_full(int t, int m, int W, const R* Se, const R* De, const R* vrow, const R* drrow,
                                 const R* X, const R* Y, const R* Yv, const R* Z, R* s, R* ds, int dk) {
    for (int b = 0; b < dk; b++) {
        R x = 0, y = 0;
        for (int a = 0; a < dk; a++) {
            x += Se[a] * X[a * dk + b];
            y += De[a] * Y[a * dk + b];
        }
        for (int l = 0; l < W; l++) {
            if (l < t || l >= m) continue;
            x += vrow[l] * Yv[l * dk + b];
            y += drrow[l] * Z[l * dk + b];
        }
        s[b] = x;
        ds[b] = y;
    }
}

// Reference driver: the whole window's backward for one token-head (the CPU form of the kernels
// built from the functions above). In: S = S_end [dv, dk], P = P_end, dS = D_end, dP = dP_end;
// K [m, dk], V [m, dv], lam [m], Q [m, dk], dR [m, dv]. Out: S, P, dS, dP at the window start
// (dS excludes the previous read, as D_end did). Accumulated: dq [m, dk] (read t's query),
// dkey [m, dk], dval [m, dv], dlam [m]. scratch: 2 dk^2 + 3 w dk + 8 w + 12 dk values.
template <typename R>
LDM_HD inline void rls_window_backward(R* S, R* P, R* dS, R* dP, const R* K, const R* V, const R* lam,
                                       const R* Q, const R* dR, R* dq, R* dkey, R* dval, R* dlam, int m,
                                       int w, int dv, int dk, R* scratch) {
    R* X = scratch;
    R* Y = X + dk * dk;
    R* Yv = Y + dk * dk;
    R* Z = Yv + w * dk;
    R* G = Z + w * dk;
    R* C = G + w * dk;  // [w]
    R* xk = C + w;      // [dk] each: xk, yg, aS, aD, bS, A, dgv, B, u, du, s, ds
    R* yg = xk + dk;
    R* aS = yg + dk;
    R* aD = aS + dk;
    R* bS = aD + dk;
    R* A = bS + dk;
    R* dgv = A + dk;
    R* B = dgv + dk;
    R* u = B + dk;
    R* du = u + dk;
    R* s = du + dk;
    R* ds = s + dk;
    R* ykl = ds + dk;  // [w] each: ykl, zgl, pv, pe, pd, vr, drr
    R* zgl = ykl + w;
    R* pv = zgl + w;
    R* pe = pv + w;
    R* pd = pe + w;
    R* vr = pd + w;
    R* drr = vr + w;
    for (int t = m - 1; t >= 0; t--) {
        const R* k = K + t * dk;
        const R* g = G + t * dk;
        wbwd_coef_step(t, m, P, k, lam[t], Q + t * dk, t + 1 < m ? K + (t + 1) * dk : k, X, Y, Yv, Z, G, C,
                       dk);
        wbwd_step_vectors(t, m, w, X, Y, Yv, Z, k, g, xk, yg, ykl, zgl, dk);
        R alpha = 0;
        for (int b = 0; b < dk; b++) aS[b] = aD[b] = bS[b] = 0;
        for (int l = 0; l < w; l++) pv[l] = pe[l] = pd[l] = 0;
        for (int a = 0; a < dv; a++) {
            for (int l = t; l < m; l++) {
                vr[l] = V[(long long)l * dv + a];
                drr[l] = dR[(long long)l * dv + a];
            }
            R e;
            const R de = wbwd_row(t, m, w, S + a * dk, dS + a * dk, vr, drr, vr[t], drr[t], xk, yg, ykl, zgl, aS, aD,
                                  bS, pv, pe, pd, &alpha, &e, dk);
            dval[(long long)t * dv + a] += de;
            if (t == 0) {
                wbwd_row_full(t, m, w, S + a * dk, dS + a * dk, vr, drr, X, Y, Yv, Z, s, ds, dk);
                for (int b = 0; b < dk; b++) {
                    S[a * dk + b] = s[b];
                    dS[a * dk + b] = ds[b] - de * k[b];
                }
            }
        }
        wbwd_step_sums(t, m, w, X, Y, Yv, Z, aS, aD, bS, pv, pe, pd, A, dgv, B, dk);
        for (int b = 0; b < dk; b++) {
            dq[t * dk + b] += A[b] + alpha * g[b];
            dkey[t * dk + b] -= B[b];
        }
        const R ku = rls_write_u((const R*)P, k, u, dk);
        rls_write_vjp_p((const R*)P, k, (const R*)u, ku, lam[t], (const R*)dgv, dP, dkey + t * dk, dlam + t, dk, du);
    }
}

// ---- unwind drift and the checkpoint fallback (spec §2.5, mode "unwind") --------------------
// |x| for the drift maximum; a non-finite x (an unwound state gone NaN or inf) counts as +inf,
// which a max over values would otherwise drop (max(m, NaN) == m). A zero comes back as +0: the
// GPU takes the maximum of the float bits as unsigned integers, where -0 would beat every value.
template <typename R>
LDM_HD inline R ldm_drift_value(R x) {
    const R a = (x < R(0) ? -x : x) + R(0);  // -0 + 0 == +0
    return a - a == R(0) ? a : R(INFINITY);
}

// Whether an unwind drift is above the tolerance; a NaN drift counts as above.
inline bool ldm_drift_exceeds(double drift, double tol) { return !(drift <= tol); }

// The checkpoint interval for the next step after a backward (host). `exceeded`: its unwind drift
// (max of the S and P drifts) was above --ldm-drift-tol (data parallel: on any rank, so that every
// rank keeps the same states). Within the tolerance, or when nothing unwinds, the interval stays
// `ckpt` (0 = no kept states). Above it: the first fallback keeps every round(sqrt(D+1))-th state
// (window mode: the window-start states, interval w); while the drift of a fallback interval
// still exceeds tol, the interval halves, down to 1 (every state kept: no unwinding error). An
// interval set by --ldm-checkpoint-every (fell_back false, ckpt > 0) and window mode's are kept.
inline int ldm_fallback_interval(bool unwinding, int ckpt, bool fell_back, bool window, int w, int D, bool exceeded) {
    if (!unwinding || !exceeded) return ckpt;
    const int c = (int)lround(sqrt((double)(D + 1)));
    if (ckpt == 0) return window ? w : c > 1 ? c : 1;
    if (fell_back && !window && ckpt > 1) return ckpt / 2;
    return ckpt;
}

// The drift fallback's state as the training state saves it (extra.scheme_state, doc/formats.md):
// {"ldm_fallback_ckpt": c, "ldm_fallback_window": 0|1, "ldm_fallback_settled": 0|1}; empty before
// any fallback (host; settled: a fallback interval's drift has met the tolerance).
inline std::vector<std::pair<std::string, double>> ldm_fallback_saved(bool fell_back, int ckpt, bool window,
                                                                      bool settled) {
    if (!fell_back) return {};
    return {{"ldm_fallback_ckpt", (double)ckpt}, {"ldm_fallback_window", window ? 1.0 : 0.0},
            {"ldm_fallback_settled", settled ? 1.0 : 0.0}};
}

// Restores a saved fallback (ldm_fallback_saved) into a scheme built from the command line (host):
// applied when this run unwinds, in the same mode (window or not), without an interval of its own
// (--ldm-checkpoint-every); window mode takes its own w. Returns the line to print ("" when the
// checkpoint has no fallback). Throws ldm::Error for a malformed entry (interval not an integer
// in 1..D+1, or >= 1 in window mode; a flag not 0 or 1).
inline std::string ldm_restore_fallback(const std::vector<std::pair<std::string, double>>& saved, bool unwinding,
                                        bool window, int w, int D, int& ckpt, bool& fell_back, bool& settled) {
    double c = -1, win = -1, set = -1;
    for (const auto& kv : saved) {
        if (kv.first == "ldm_fallback_ckpt") c = kv.second;
        else if (kv.first == "ldm_fallback_window") win = kv.second;
        else if (kv.first == "ldm_fallback_settled") set = kv.second;
    }
    if (c < 0 && win < 0 && set < 0) return "";
    // (window mode's interval is its w, which may exceed D+1; this run uses its own w)
    if (!(c >= 1 && (win == 1 || c <= D + 1) && c <= 1e9 && c == (double)(int)c) || (win != 0 && win != 1) ||
        (set != 0 && set != 1)) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "the checkpoint's LDM drift fallback (scheme_state: interval %g, window %g, settled %g) is "
                 "malformed: the interval must be an integer in 1..%d (window mode: >= 1), the flags 0 or 1",
                 c, win, set, D + 1);
        throw Error(msg);
    }
    const int ci = (int)c;
    const char* was = win == 1 ? "window" : "unwind";
    char msg[512];
    if (ckpt > 0 && !fell_back) {
        snprintf(msg, sizeof msg,
                 "note: the checkpoint's run had fallen back to checkpointed segments every %d writes (LDM drift); "
                 "this run keeps its own interval %d (--ldm-checkpoint-every)",
                 ci, ckpt);
    } else if (!unwinding || (win == 1) != window) {
        snprintf(msg, sizeof msg,
                 "note: the checkpoint's run had fallen back to checkpointed segments every %d writes (LDM drift, "
                 "%s mode); this run's mode %s, so it is not restored",
                 ci, was, unwinding ? (window ? "is window" : "is unwind") : "keeps its states (no unwinding)");
    } else {
        ckpt = window ? w : ci;
        fell_back = true;
        settled = set == 1;
        snprintf(msg, sizeof msg,
                 "LDM drift fallback restored from the checkpoint: checkpointed segments every %d writes, as the "
                 "run kept them before it",
                 ckpt);
    }
    return msg;
}

// The stderr warning of a change of the interval to c (host; first: the first fallback of the run;
// elsewhere: this rank's drift was within tol, another rank's was not).
inline void ldm_warn_fallback(bool first, double drift_S, double drift_P, double tol, int c, bool elsewhere = false) {
    if (elsewhere) {
        fprintf(stderr,
                "warning: LDM unwind drift above %.3g on another rank (this rank's: %.3g (S) / %.3g (P)): %s every "
                "%d writes from the next step on\n",
                tol, drift_S, drift_P, first ? "falling back to checkpointed segments" : "checkpointed segments", c);
        return;
    }
    fprintf(stderr,
            first ? "warning: LDM unwind drift %.3g (S) / %.3g (P) exceeds %.3g: falling back to checkpointed "
                    "segments every %d writes from the next step on\n"
                  : "warning: LDM unwind drift %.3g (S) / %.3g (P) still exceeds %.3g: checkpointed segments "
                    "every %d writes from the next step on (at 1 every state is kept: store mode's memory)\n",
            drift_S, drift_P, tol, c);
}

}  // namespace ldm
