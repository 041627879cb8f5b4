// cuda/infer_math.h — per-element math of the GPU decode attention (cuda/infer.cuh
// cached_attention_kernel), shared by the kernel and the CPU tests (test/test_cuda_host_math.cpp):
// an online softmax over the keys of one query row, split into `parts` partial states (one per
// warp: part w takes the keys j with j % parts == w) that are merged at the end. Plain header, no
// CUDA includes: LDM_HD (math/elementwise.h) is __host__ __device__ under nvcc, nothing else.
//
// State of one part: running max m of the scaled scores seen (-inf before the first key), the sum
// l = Σ exp(s_j - m) and the accumulator acc = Σ exp(s_j - m) v_j (hd values). The output of the
// row is acc / l after the merge. Spec §1: softmax(q kᵀ / sqrt(hd)) v, fp32 arithmetic.
#pragma once
#include <math.h>

#include "math/elementwise.h"

namespace ldm {

// Adds the scaled score s of one key to the state (m, l): *alpha is the factor the accumulator must
// be multiplied by (0 on the first key, m = -inf), *p the weight of the new key's value
// (acc = acc·alpha + p·v). s must be finite.
LDM_HD inline void online_softmax_add(float& m, float& l, float s, float* alpha, float* p) {
    const float mn = s > m ? s : m;
    *alpha = m == -INFINITY ? 0.f : expf(m - mn);
    *p = expf(s - mn);
    l = l * (*alpha) + *p;
    m = mn;
}

// Merges two states: (m, l) = merge((m1, l1), (m2, l2)); the merged accumulator is
// acc1·(*a1) + acc2·(*a2). A state that saw no key (m = -inf, l = 0) gets factor 0; two empty
// states give m = -inf, l = 0.
LDM_HD inline void online_softmax_merge(float m1, float l1, float m2, float l2, float* m, float* l, float* a1,
                                        float* a2) {
    const float mn = m1 > m2 ? m1 : m2;
    *a1 = m1 == -INFINITY ? 0.f : expf(m1 - mn);
    *a2 = m2 == -INFINITY ? 0.f : expf(m2 - mn);
    *m = mn;
    *l = l1 * (*a1) + l2 * (*a2);
}

// Host/device reference of one query row with the kernel's decomposition (for the CPU tests and as
// the kernel's specification): out[0..hd) = softmax over keys 0..L-1 of scale·q·k_j, times v_j.
// K, V: key/value rows of stride `stride` values; parts >= 1 partial states (at most 8, as in the
// kernel's 4 warps with room to test more), merged in order 0, 1, ..., parts-1. hd <= 256.
// Scores are dot products summed in order of the dims (the kernel sums over lanes, a different
// order; equal within fp32 rounding).
LDM_HD inline void cached_attention_row_ref(float* out, const float* q, const float* K, const float* V,
                                            long long stride, int L, int hd, float scale, int parts) {
    float m[8], l[8];
    float acc[8][256];
    if (parts < 1) parts = 1;
    if (parts > 8) parts = 8;
    for (int w = 0; w < parts; w++) {
        m[w] = -INFINITY;
        l[w] = 0.f;
        for (int c = 0; c < hd; c++) acc[w][c] = 0.f;
    }
    for (int j = 0; j < L; j++) {
        const int w = j % parts;
        float dot = 0.f;
        for (int c = 0; c < hd; c++) dot += q[c] * K[(long long)j * stride + c];
        float alpha, p;
        online_softmax_add(m[w], l[w], dot * scale, &alpha, &p);
        for (int c = 0; c < hd; c++) acc[w][c] = acc[w][c] * alpha + p * V[(long long)j * stride + c];
    }
    float M = m[0], Lsum = l[0];
    for (int w = 1; w < parts; w++) {
        float mm, ll, a1, a2;
        online_softmax_merge(M, Lsum, m[w], l[w], &mm, &ll, &a1, &a2);
        for (int c = 0; c < hd; c++) acc[0][c] = acc[0][c] * a1 + acc[w][c] * a2;
        M = mm;
        Lsum = ll;
    }
    const float inv = Lsum > 0.f ? 1.f / Lsum : 0.f;
    for (int c = 0; c < hd; c++) out[c] = acc[0][c] * inv;
}

}  // namespace ldm
