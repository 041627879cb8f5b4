// cpu/infer.cpp — prefill / decode with a KV cache and sampling (see infer.h).
// The per-step forward mirrors Model<R>::forward (cpu/model.cpp) op by op, with attention
// over the cached keys/values and RoPE at the absolute positions len .. len+n-1.
#include "cpu/infer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/common.h"
#include "math/elementwise.h"
#include "cpu/ops.h"
#include "cpu/rng.h"

namespace ldm {
namespace cpu {

template <typename R>
void KVCache<R>::allocate(const ModelConfig& c, int B_, int max_T_) {
    n_layer = c.n_layer;
    B = B_;
    max_T = max_T_;
    kvd = c.kv_dim();
    len = 0;
    const size_t n = (size_t)n_layer * B * max_T * kvd;
    k.assign(n, R(0));
    v.assign(n, R(0));
}

template <typename R>
Inference<R>::Inference(const Model<R>& model, int B, int max_T)
    : model_(model), cfg_(model.cfg), B_(B), max_T_(max_T) {
    if (B < 1) throw Error(strprintf("Inference: B=%d must be >= 1", B));
    if (max_T < 1 || max_T > cfg_.seq_len)
        throw Error(strprintf("Inference: max_T=%d must be in [1, seq_len=%d]", max_T, cfg_.seq_len));
    if ((int64_t)B * max_T > INT32_MAX)
        throw Error(strprintf("Inference: B*max_T = %lld positions exceed 2^31 - 1", (long long)B * max_T));
    cache_.allocate(cfg_, B, max_T);
    for (const auto& s : model.specs) off_[s.name] = s.offset;
    scheme_ = make_scheme<R>(cfg_);
    int64_t ns = 0;
    for (const auto& s : scheme_param_specs(cfg_)) ns += s.numel;
    scheme_grads_.assign((size_t)ns, R(0));
    const int hd = cfg_.head_dim;
    cos_t_.resize((size_t)max_T * hd / 2);
    sin_t_.resize((size_t)max_T * hd / 2);
    rope_tables(cos_t_.data(), sin_t_.data(), max_T, hd, cfg_.rope_theta);
}

template <typename R>
Inference<R>::~Inference() = default;

template <typename R>
void Inference<R>::reset() {
    cache_.len = 0;
}

template <typename R>
const R* Inference<R>::prefill(const int32_t* tokens, int P, bool all_logits) {
    reset();
    return step(tokens, P, all_logits);
}

template <typename R>
const R* Inference<R>::step(const int32_t* tokens, int n, bool all_logits) {
    const ModelConfig& c = cfg_;
    const int B = B_, N = B * n, d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(), F = c.ffn,
              nh = c.n_head, nkv = c.n_kv_head, hd = c.head_dim, V = c.vocab_size,
              Vp = c.padded_vocab, G = nh / nkv, len = cache_.len, L = len + n;
    if (n < 1) throw Error(strprintf("Inference::step: n=%d must be >= 1", n));
    if (L > max_T_)
        throw Error(strprintf("Inference::step: %d cached + %d new positions exceed max_T=%d", len, n, max_T_));
    for (int i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            throw Error(strprintf("Inference::step: token id %d at position %d is outside [0, %d)", tokens[i], i, V));
    const R eps = (R)c.norm_eps;
    const R* P = model_.params.data();
    auto at = [&](const std::string& name) { return P + off_.at(name); };

    auto fit = [](std::vector<R>& v, size_t n) {
        if (v.size() < n) v.resize(n, R(0));
    };
    fit(emb_, (size_t)N * d);
    fit(x_, (size_t)N * d);
    fit(ln_, (size_t)N * d);
    fit(o_, (size_t)N * d);
    fit(y_, (size_t)N * d);
    fit(q_, (size_t)N * qd);
    fit(qn_, (size_t)N * qd);
    fit(ao_, (size_t)N * qd);
    fit(k_, (size_t)N * kvd);
    fit(kn_, (size_t)N * kvd);
    fit(v_, (size_t)N * kvd);
    fit(rstd_, (size_t)N * std::max(nh, 1));
    fit(h13_, (size_t)N * 2 * F);
    fit(a_, (size_t)N * F);
    const int rows_out = all_logits ? N : B;
    fit(ysel_, (size_t)rows_out * d);
    fit(yn_, (size_t)rows_out * d);
    fit(logits_, (size_t)rows_out * Vp);  // columns >= V stay 0

    // The scheme's parameter block may have moved (params reassigned); bind every call (cheap).
    Scheme<R>& S = *scheme_;
    std::vector<ParamSpec> ss = scheme_param_specs(c);
    if (ss.empty()) S.bind(nullptr, nullptr);
    else S.bind(P + off_.at(ss.front().name), scheme_grads_.data());
    S.resize(B, n);

    embedding_forward(emb_.data(), tokens, at("wte"), N, d);
    S.begin(emb_.data());
    const R* cos_l = cos_t_.data() + (size_t)len * (hd / 2);
    const R* sin_l = sin_t_.data() + (size_t)len * (hd / 2);
    const R scale = R(1) / ldm_sqrt(R(hd));
    for (int l = 0; l < c.n_layer; l++) {
        const std::string p = "blocks." + std::to_string(l) + ".";
        // ---- attention sublayer j = 2l+1
        S.input(2 * l + 1, x_.data());
        rmsnorm_forward(ln_.data(), rstd_.data(), x_.data(), at(p + "attn_norm.w"), N, d, eps);
        const R* bq = c.qkv_bias ? at(p + "attn.bq") : nullptr;
        const R* bk = c.qkv_bias ? at(p + "attn.bk") : nullptr;
        const R* bv = c.qkv_bias ? at(p + "attn.bv") : nullptr;
        matmul_forward(q_.data(), ln_.data(), at(p + "attn.wq"), bq, N, d, qd);
        matmul_forward(k_.data(), ln_.data(), at(p + "attn.wk"), bk, N, d, kvd);
        matmul_forward(v_.data(), ln_.data(), at(p + "attn.wv"), bv, N, d, kvd);
        R* qr = q_.data();
        R* kr = k_.data();
        if (c.qk_norm) {
            rmsnorm_forward(qn_.data(), rstd_.data(), q_.data(), at(p + "attn.q_norm.w"), N * nh, hd, eps);
            rmsnorm_forward(kn_.data(), rstd_.data(), k_.data(), at(p + "attn.k_norm.w"), N * nkv, hd, eps);
            qr = qn_.data();
            kr = kn_.data();
        }
        // Row (b, t) has absolute position len + t: tables offset by len, period n.
        rope_forward(qr, qr, cos_l, sin_l, N, n, nh, hd);
        rope_forward(kr, kr, cos_l, sin_l, N, n, nkv, hd);
        for (int b = 0; b < B; b++) {
            std::copy(kr + (size_t)b * n * kvd, kr + (size_t)(b + 1) * n * kvd,
                      cache_.K(l, b) + (size_t)len * kvd);
            std::copy(v_.data() + (size_t)b * n * kvd, v_.data() + (size_t)(b + 1) * n * kvd,
                      cache_.V(l, b) + (size_t)len * kvd);
        }
        // Causal attention of the n new queries over the L cached positions (query t sees
        // positions 0 .. len+t), per (sequence, query head); GQA: head h reads kv head h / G.
#pragma omp parallel if ((int64_t)B * nh * n * L * hd >= (1 << 20))
        {
            std::vector<R> sc((size_t)n * L);
#pragma omp for schedule(dynamic, 1)
            for (int bh = 0; bh < B * nh; bh++) {
                const int b = bh / nh, h = bh % nh, kh = h / G;
                const R* Q = qr + (size_t)b * n * qd + (size_t)h * hd;
                const R* K = cache_.K(l, b) + (size_t)kh * hd;
                const R* Vc = cache_.V(l, b) + (size_t)kh * hd;
                R* O = ao_.data() + (size_t)b * n * qd + (size_t)h * hd;
                gemm<R>(false, true, n, L, hd, scale, Q, qd, K, kvd, R(0), sc.data(), L);
                for (int t = 0; t < n; t++) {
                    R* row = sc.data() + (size_t)t * L;
                    const int last = len + t;
                    R mx = row[0];
                    for (int s = 1; s <= last; s++) mx = std::max(mx, row[s]);
                    R sum = 0;
                    for (int s = 0; s <= last; s++) {
                        row[s] = exp_fast(row[s] - mx);
                        sum += row[s];
                    }
                    const R inv = R(1) / sum;
                    for (int s = 0; s <= last; s++) row[s] *= inv;
                    for (int s = last + 1; s < L; s++) row[s] = R(0);
                }
                gemm<R>(false, false, n, hd, L, R(1), sc.data(), L, Vc, kvd, R(0), O, qd);
            }
        }
        matmul_forward(o_.data(), ao_.data(), at(p + "attn.wo"), (const R*)nullptr, N, qd, d);
        S.output(2 * l + 1, o_.data());
        // ---- MLP sublayer j = 2l+2
        S.input(2 * l + 2, x_.data());
        rmsnorm_forward(ln_.data(), rstd_.data(), x_.data(), at(p + "mlp_norm.w"), N, d, eps);
        // W1, W3 adjacent in param_specs (checked by the Model): one GEMM into h13 [N, 2F].
        matmul_forward(h13_.data(), ln_.data(), at(p + "mlp.w1"), (const R*)nullptr, N, d, 2 * F);
        swiglu_forward(a_.data(), h13_.data(), N, F);
        matmul_forward(o_.data(), a_.data(), at(p + "mlp.w2"), (const R*)nullptr, N, F, d);
        S.output(2 * l + 2, o_.data());
    }
    S.readout(y_.data());
    const R* yrows = y_.data();
    if (!all_logits) {  // only each sequence's last new row goes through the head
        for (int b = 0; b < B; b++)
            std::copy(y_.data() + ((size_t)b * n + n - 1) * d, y_.data() + ((size_t)b * n + n) * d,
                      ysel_.data() + (size_t)b * d);
        yrows = ysel_.data();
    }
    rmsnorm_forward(yn_.data(), rstd_.data(), yrows, at("final_norm.w"), rows_out, d, eps);
    const R* head = c.tied ? at("wte") : at("lm_head");
    matmul_forward(logits_.data(), yn_.data(), head, (const R*)nullptr, rows_out, d, V, Vp);
    cache_.len = L;
    return logits_.data();
}

// ---- sampling -----------------------------------------------------------------------------

template <typename R>
int32_t argmax_token(const R* logits, int V) {
    int32_t best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    return best;
}

template <typename R>
void sampling_distribution(const R* logits, int V, const SamplingParams& sp, std::vector<int32_t>* ids,
                           std::vector<double>* probs) {
    if (sp.top_k < 0) throw Error(strprintf("sampling: top_k=%d must be >= 0", sp.top_k));
    if (!(sp.top_p > 0 && sp.top_p <= 1)) throw Error(strprintf("sampling: top_p=%g must be in (0, 1]", sp.top_p));
    if (!std::isfinite(sp.temperature))
        throw Error(strprintf("sampling: temperature=%g must be a finite number (<= 0: greedy)", sp.temperature));
    for (int v = 0; v < V; v++)
        if (!std::isfinite((double)logits[v]))
            throw Error(strprintf("sampling: logit %d is %g (not finite)", v, (double)logits[v]));
    ids->clear();
    probs->clear();
    if (sp.greedy || sp.temperature <= 0 || sp.top_k == 1) {
        ids->push_back(argmax_token(logits, V));
        probs->push_back(1.0);
        return;
    }
    double mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = std::max(mx, (double)logits[v]);
    std::vector<double> p((size_t)V);
    for (int v = 0; v < V; v++) p[(size_t)v] = std::exp(((double)logits[v] - mx) / sp.temperature);
    ids->resize((size_t)V);
    std::iota(ids->begin(), ids->end(), 0);
    int K = V;
    if (sp.top_k > 0 || sp.top_p < 1) {
        auto before = [&](int32_t a, int32_t b) { return p[(size_t)a] > p[(size_t)b] || (p[(size_t)a] == p[(size_t)b] && a < b); };
        if (sp.top_k > 0 && sp.top_k < V) {
            K = sp.top_k;
            std::partial_sort(ids->begin(), ids->begin() + K, ids->end(), before);
        } else {
            std::sort(ids->begin(), ids->end(), before);
        }
    }
    double z = 0;
    for (int i = 0; i < K; i++) z += p[(size_t)(*ids)[(size_t)i]];
    if (sp.top_p < 1) {  // nucleus of the (top-k renormalised) distribution
        double c = 0;
        int m = 0;
        while (m < K) {
            c += p[(size_t)(*ids)[(size_t)m]] / z;
            m++;
            if (c >= sp.top_p) break;
        }
        K = m;
        z = 0;
        for (int i = 0; i < K; i++) z += p[(size_t)(*ids)[(size_t)i]];
    }
    ids->resize((size_t)K);
    probs->resize((size_t)K);
    for (int i = 0; i < K; i++) (*probs)[(size_t)i] = p[(size_t)(*ids)[(size_t)i]] / z;
}

template <typename R>
int32_t sample_token(const R* logits, int V, const SamplingParams& sp, double u) {
    std::vector<int32_t> ids;
    std::vector<double> probs;
    sampling_distribution(logits, V, sp, &ids, &probs);
    double c = 0;
    for (size_t i = 0; i < ids.size(); i++) {
        c += probs[i];
        if (u < c) return ids[i];
    }
    return ids.back();  // u within rounding of 1
}

double GenerateStats::mean_decode_ms() const {
    if (decode_ms.empty()) return 0;
    return std::accumulate(decode_ms.begin(), decode_ms.end(), 0.0) / (double)decode_ms.size();
}

double GenerateStats::median_decode_ms() const {
    return decode_ms.empty() ? 0 : median(decode_ms);
}

template <typename R>
std::vector<int32_t> generate(Inference<R>& inf, const std::vector<int32_t>& prompt, int max_new,
                              const SamplingParams& sp, uint64_t seed, int32_t stop_token,
                              GenerateStats* stats) {
    return generate_loop(inf, prompt, max_new, sp, seed, stop_token, stats, "Inference");
}

template struct KVCache<float>;
template struct KVCache<double>;
template class Inference<float>;
template class Inference<double>;
#define LDM_INFER_INST(R)                                                                                  \
    template int32_t argmax_token<R>(const R*, int);                                                      \
    template void sampling_distribution<R>(const R*, int, const SamplingParams&, std::vector<int32_t>*,    \
                                           std::vector<double>*);                                          \
    template int32_t sample_token<R>(const R*, int, const SamplingParams&, double);                       \
    template std::vector<int32_t> generate<R>(Inference<R>&, const std::vector<int32_t>&, int,             \
                                              const SamplingParams&, uint64_t, int32_t, GenerateStats*);
LDM_INFER_INST(float)
LDM_INFER_INST(double)

}  // namespace cpu
}  // namespace ldm
