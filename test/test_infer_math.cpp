// The LDM_HD math of the GPU decode attention (cuda/infer_math.h, used by cuda/infer.cuh
// cached_attention_kernel), run on the CPU: online softmax add / merge, and one query row with the
// kernel's decomposition (keys split over 1..8 parts, merged in order) against a plain softmax
// attention in double.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda/infer_math.h"

using namespace ldm;

namespace {

// out = softmax(scale q·k_j, j < L) · v, in double.
std::vector<double> attention_double(const std::vector<float>& q, const std::vector<float>& K,
                                     const std::vector<float>& V, long long stride, int L, int hd, double scale) {
    std::vector<double> s((size_t)L), out((size_t)hd, 0.0);
    double mx = -INFINITY;
    for (int j = 0; j < L; j++) {
        double dot = 0;
        for (int c = 0; c < hd; c++) dot += (double)q[(size_t)c] * K[(size_t)(j * stride + c)];
        s[(size_t)j] = dot * scale;
        mx = std::max(mx, s[(size_t)j]);
    }
    double z = 0;
    for (int j = 0; j < L; j++) z += (s[(size_t)j] = std::exp(s[(size_t)j] - mx));
    for (int j = 0; j < L; j++)
        for (int c = 0; c < hd; c++) out[(size_t)c] += s[(size_t)j] / z * V[(size_t)(j * stride + c)];
    return out;
}

}  // namespace

TEST_CASE("infer math: online softmax add and merge", "[infer][cuda_host]") {
    // add: first key -> alpha 0, p 1, l 1, m = s
    float m = -INFINITY, l = 0, alpha = -1, p = -1;
    online_softmax_add(m, l, 2.5f, &alpha, &p);
    CHECK(alpha == 0.f);
    CHECK(p == 1.f);
    CHECK(l == 1.f);
    CHECK(m == 2.5f);
    // a larger score rescales the old sum
    online_softmax_add(m, l, 3.5f, &alpha, &p);
    CHECK(m == 3.5f);
    CHECK(alpha == Approx(std::exp(-1.0)).epsilon(1e-6));
    CHECK(p == 1.f);
    CHECK(l == Approx(1 + std::exp(-1.0)).epsilon(1e-6));
    // a smaller score keeps m
    online_softmax_add(m, l, 1.5f, &alpha, &p);
    CHECK(m == 3.5f);
    CHECK(alpha == 1.f);
    CHECK(p == Approx(std::exp(-2.0)).epsilon(1e-6));
    // merge with an empty state (either side) and of two empty states
    float mm, ll, a1, a2;
    online_softmax_merge(m, l, -INFINITY, 0.f, &mm, &ll, &a1, &a2);
    CHECK(mm == m);
    CHECK(ll == l);
    CHECK(a1 == 1.f);
    CHECK(a2 == 0.f);
    online_softmax_merge(-INFINITY, 0.f, m, l, &mm, &ll, &a1, &a2);
    CHECK(mm == m);
    CHECK(ll == l);
    CHECK(a1 == 0.f);
    CHECK(a2 == 1.f);
    online_softmax_merge(-INFINITY, 0.f, -INFINITY, 0.f, &mm, &ll, &a1, &a2);
    CHECK(mm == -INFINITY);
    CHECK(ll == 0.f);
    CHECK(a1 == 0.f);
    CHECK(a2 == 0.f);
    // merge of two real states: m = max, l = l1 e^{m1-m} + l2 e^{m2-m}
    online_softmax_merge(1.f, 2.f, 3.f, 0.5f, &mm, &ll, &a1, &a2);
    CHECK(mm == 3.f);
    CHECK(a1 == Approx(std::exp(-2.0)).epsilon(1e-6));
    CHECK(a2 == 1.f);
    CHECK(ll == Approx(2 * std::exp(-2.0) + 0.5).epsilon(1e-6));
}

TEST_CASE("infer math: cached attention row (kernel decomposition) == softmax attention in double", "[infer][cuda_host]") {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int hd : {2, 16, 64, 128, 256}) {
        for (int L : {1, 2, 3, 5, 33, 257, 1000}) {
            const long long stride = 3LL * hd + 2;  // rows of a wider buffer (GQA: k heads side by side)
            std::vector<float> q((size_t)hd), K((size_t)(L * stride)), V((size_t)(L * stride));
            for (auto& x : q) x = 2.f * nd(rng);
            for (auto& x : K) x = nd(rng);
            for (auto& x : V) x = nd(rng);
            const float scale = 1.f / std::sqrt((float)hd);
            const std::vector<double> ref = attention_double(q, K, V, stride, L, hd, scale);
            for (int parts : {1, 2, 4, 8}) {
                std::vector<float> out((size_t)hd, NAN);
                cached_attention_row_ref(out.data(), q.data(), K.data(), V.data(), stride, L, hd, scale, parts);
                double num = 0, den = 0;
                for (int c = 0; c < hd; c++) {
                    num += (out[(size_t)c] - ref[(size_t)c]) * (out[(size_t)c] - ref[(size_t)c]);
                    den += ref[(size_t)c] * ref[(size_t)c];
                }
                INFO("hd " << hd << " L " << L << " parts " << parts);
                CHECK(std::isfinite(num));
                CHECK(std::sqrt(num) <= 1e-5 * std::max(1.0, std::sqrt(den)));
            }
        }
    }
}

TEST_CASE("infer math: a row whose scores overflow a plain exp stays finite", "[infer][cuda_host]") {
    const int hd = 8, L = 6;
    std::vector<float> q(hd, 30.f), K((size_t)L * hd), V((size_t)L * hd);
    for (int j = 0; j < L; j++)
        for (int c = 0; c < hd; c++) {
            K[(size_t)(j * hd + c)] = (float)(j + 1);  // scores up to 30·8·6/sqrt(8) ≈ 509: exp overflows fp32
            V[(size_t)(j * hd + c)] = (float)j;
        }
    std::vector<float> out(hd);
    cached_attention_row_ref(out.data(), q.data(), K.data(), V.data(), hd, L, hd, 1.f / std::sqrt((float)hd), 4);
    for (float x : out) CHECK(x == Approx(5.0).margin(1e-4));  // all weight on the last key
}
