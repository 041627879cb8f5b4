// cpu/model.cpp — the CPU reference model (spec §1 backbone + a Scheme, spec §2).
// Walkthrough of forward and backward: doc/cpu_reference.md.
#include "cpu/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/common.h"
#include "cpu/ops.h"
#include "cpu/rng.h"

namespace ldm {
namespace cpu {

namespace {
template <typename R>
void zero(std::vector<R>& v) {
    std::fill(v.begin(), v.end(), R(0));
}
}  // namespace

// Pointers into the flat parameter (or gradient) array for one layer.
template <typename R>
struct LayerPtrs {
    R *attn_norm, *wq, *wk, *wv, *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr,
                                 *k_norm = nullptr, *wo, *mlp_norm, *w1, *w3, *w2;
};

// Saved activations of one layer (both sublayers).
template <typename R>
struct LayerAct {
    // attention sublayer (j = 2l+1)
    std::vector<R> x_att, rstd_att, ln_att, q, k, v, rstd_q, rstd_k, qr, kr, att, ao;
    // MLP sublayer (j = 2l+2)
    std::vector<R> x_mlp, rstd_mlp, ln_mlp, h13, a;  // h13 [N, 2F]: [W1 ln | W3 ln]
};

template <typename R>
struct Model<R>::Impl {
    std::unique_ptr<Scheme<R>> scheme;
    std::vector<LayerPtrs<R>> P, G;  // parameter / gradient views per layer
    R *wte, *final_norm, *lm_head, *g_wte, *g_final_norm, *g_lm_head;
    // activations
    int B = 0, T = 0, N = 0;
    bool have_targets = false, backward_done = false;
    std::vector<int32_t> tokens, targets;
    std::vector<R> cos_t, sin_t;
    std::vector<LayerAct<R>> L;
    std::vector<R> emb, o, y, rstd_f, yn, logits, lse, row_max, row_inv;
    // backward scratch; lm_tile: one tile of the LM head's logit gradient (cpu/ops.h lm_head_ce_*),
    // a fixed size not counted in activation_values()
    std::vector<R> lm_tile, dyn, dy, d_o, dln, dx, dao, dq, dk, dv, dqr, dkr, dh13, da;
};

template <typename R>
Model<R>::Model(const ModelConfig& c) : cfg(c), specs(param_specs(c)), impl_(new Impl) {
    Impl& I = *impl_;
    I.scheme = make_scheme<R>(cfg);
    int64_t n = count_params(cfg);
    params.assign(n, R(0));
    grads.assign(n, R(0));
    auto views = [&](std::vector<R>& buf, std::vector<LayerPtrs<R>>& out) {
        out.resize(cfg.n_layer);
        for (int l = 0; l < cfg.n_layer; l++) {
            std::string p = "blocks." + std::to_string(l) + ".";
            auto at = [&](const std::string& s) { return buf.data() + spec(p + s).offset; };
            LayerPtrs<R>& v = out[l];
            v.attn_norm = at("attn_norm.w");
            v.wq = at("attn.wq");
            v.wk = at("attn.wk");
            v.wv = at("attn.wv");
            if (cfg.qkv_bias) {
                v.bq = at("attn.bq");
                v.bk = at("attn.bk");
                v.bv = at("attn.bv");
            }
            if (cfg.qk_norm) {
                v.q_norm = at("attn.q_norm.w");
                v.k_norm = at("attn.k_norm.w");
            }
            v.wo = at("attn.wo");
            v.mlp_norm = at("mlp_norm.w");
            v.w1 = at("mlp.w1");
            v.w3 = at("mlp.w3");
            if (v.w3 != v.w1 + (size_t)cfg.ffn * cfg.d_model)
                throw Error("model: mlp.w1 and mlp.w3 must be adjacent in param_specs");
            v.w2 = at("mlp.w2");
        }
    };
    views(params, I.P);
    views(grads, I.G);
    I.wte = param("wte");
    I.g_wte = grad("wte");
    I.final_norm = param("final_norm.w");
    I.g_final_norm = grad("final_norm.w");
    I.lm_head = cfg.tied ? I.wte : param("lm_head");
    I.g_lm_head = cfg.tied ? I.g_wte : grad("lm_head");
    std::vector<ParamSpec> ss = scheme_param_specs(cfg);
    if (ss.empty()) {
        I.scheme->bind(nullptr, nullptr);
    } else {
        int64_t off = spec(ss.front().name).offset;
        I.scheme->bind(params.data() + off, grads.data() + off);
    }
}

template <typename R>
Model<R>::~Model() = default;

template <typename R>
const ParamSpec& Model<R>::spec(const std::string& name) const {
    for (const auto& s : specs)
        if (s.name == name) return s;
    throw Error("model: no parameter named '" + name + "'");
}

template <typename R>
void init_params(const ModelConfig& cfg, R* params, uint64_t seed) {
    // Spec §1: matrices and E ~ N(0, 0.02); W_o, W_2 ~ N(0, 0.02/sqrt(2 n_layer)); biases 0;
    // norm weights 1. Tensor i uses its own counter-based stream (cpu/rng.h).
    const std::vector<ParamSpec> specs = param_specs(cfg);
    const double std_base = 0.02, std_proj = 0.02 / std::sqrt(2.0 * cfg.n_layer);
    auto ends_with = [](const std::string& s, const std::string& suf) {
        return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
    };
    for (size_t i = 0; i < specs.size(); i++) {
        const ParamSpec& s = specs[i];
        if (s.name.rfind("scheme.", 0) == 0) continue;
        R* p = params + s.offset;
        if (ends_with(s.name, "norm.w")) {
            std::fill(p, p + s.numel, R(1));
        } else if (ends_with(s.name, ".bq") || ends_with(s.name, ".bk") || ends_with(s.name, ".bv")) {
            std::fill(p, p + s.numel, R(0));
        } else {
            double sd = (ends_with(s.name, ".wo") || ends_with(s.name, ".w2")) ? std_proj : std_base;
            uint64_t s0 = init_stream(seed, i);
#pragma omp parallel for schedule(static)
            for (int64_t k = 0; k < s.numel; k++) p[k] = (R)(sd * stream_normal(s0, (uint64_t)k));
        }
    }
    std::vector<ParamSpec> ss = scheme_param_specs(cfg);
    if (!ss.empty()) {
        uint64_t first = specs.size() - ss.size();
        make_scheme<R>(cfg)->init_params(params + specs[first].offset, seed, first);
    }
}

template <typename R>
void Model<R>::init(uint64_t seed) {
    init_params(cfg, params.data(), seed);
}

template <typename R>
void Model<R>::zero_grad() {
    std::fill(grads.begin(), grads.end(), R(0));
}

template <typename R>
const R* Model<R>::logits() const {
    if (impl_->N == 0) throw Error("Model::logits: no forward pass yet");
    return impl_->logits.data();
}

template <typename R>
std::vector<std::pair<std::string, double>> Model<R>::scheme_metrics() const {
    return impl_->scheme->metrics();
}

template <typename R>
Scheme<R>& Model<R>::scheme() {
    return *impl_->scheme;
}

template <typename R>
int64_t Model<R>::activation_values() const {
    const Impl& I = *impl_;
    int64_t n = 0;
    for (const auto& a : I.L)
        for (const std::vector<R>* v :
             {&a.x_att, &a.rstd_att, &a.ln_att, &a.q, &a.k, &a.v, &a.rstd_q, &a.rstd_k, &a.qr, &a.kr,
              &a.att, &a.ao, &a.x_mlp, &a.rstd_mlp, &a.ln_mlp, &a.h13, &a.a})
            n += (int64_t)v->size();
    for (const std::vector<R>* v :
         {&I.emb, &I.o, &I.y, &I.rstd_f, &I.yn, &I.logits, &I.lse, &I.row_max, &I.row_inv, &I.dyn, &I.dy, &I.d_o,
          &I.dln, &I.dx, &I.dao, &I.dq, &I.dk, &I.dv, &I.dqr, &I.dkr, &I.dh13, &I.da})
        n += (int64_t)v->size();
    return n + (int64_t)I.N * I.scheme->state_values_per_token();
}

template <typename R>
double Model<R>::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
    Impl& I = *impl_;
    const ModelConfig& c = cfg;
    if (B <= 0 || T <= 0) throw Error(strprintf("Model::forward: B=%d and T=%d must be positive", B, T));
    if (T > c.seq_len)
        throw Error(strprintf("Model::forward: T=%d exceeds the model's seq_len %d", T, c.seq_len));
    if ((int64_t)B * T > INT32_MAX)
        throw Error(strprintf("Model::forward: B*T = %lld tokens exceed the 2^31 - 1 of one batch",
                              (long long)B * T));
    const int N = B * T, d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(), F = c.ffn,
              nh = c.n_head, nkv = c.n_kv_head, hd = c.head_dim, V = c.vocab_size,
              Vp = c.padded_vocab;
    for (int n = 0; n < N; n++) {
        if (tokens[n] < 0 || tokens[n] >= V)
            throw Error(strprintf("Model::forward: token id %d at position %d is outside [0, %d)",
                                  tokens[n], n, V));
        if (targets && (targets[n] < 0 || targets[n] >= V))
            throw Error(strprintf("Model::forward: target id %d at position %d is outside [0, %d)",
                                  targets[n], n, V));
    }
    // (Re)size activations when (B, T) changes. resize() keeps the capacity, so alternating
    // shapes (training batches and B=1 sampling) do not reallocate every time.
    if (B != I.B || T != I.T) {
        I.B = B;
        I.T = T;
        I.N = N;
        I.cos_t.resize((size_t)T * hd / 2);
        I.sin_t.resize((size_t)T * hd / 2);
        rope_tables(I.cos_t.data(), I.sin_t.data(), T, hd, c.rope_theta);
        I.L.resize(c.n_layer);
        for (auto& a : I.L) {
            a.x_att.resize((size_t)N * d);
            a.rstd_att.resize(N);
            a.ln_att.resize((size_t)N * d);
            a.q.resize((size_t)N * qd);
            a.k.resize((size_t)N * kvd);
            a.v.resize((size_t)N * kvd);
            if (c.qk_norm) {
                a.rstd_q.resize((size_t)N * nh);
                a.rstd_k.resize((size_t)N * nkv);
            }
            a.qr.resize((size_t)N * qd);
            a.kr.resize((size_t)N * kvd);
            a.att.resize((size_t)B * nh * T * T);
            a.ao.resize((size_t)N * qd);
            a.x_mlp.resize((size_t)N * d);
            a.rstd_mlp.resize(N);
            a.ln_mlp.resize((size_t)N * d);
            a.h13.resize((size_t)N * 2 * F);
            a.a.resize((size_t)N * F);
        }
        I.emb.resize((size_t)N * d);
        I.o.resize((size_t)N * d);
        I.y.resize((size_t)N * d);
        I.rstd_f.resize(N);
        I.yn.resize((size_t)N * d);
        I.logits.resize((size_t)N * Vp);  // columns >= V stay 0 forever
        I.lse.resize(N);
        I.row_max.resize(N);
        I.row_inv.resize(N);
        I.lm_tile.resize((size_t)lm_head_ce_scratch_values(N, c.vocab_size));
        for (auto* v : {&I.dyn, &I.dy, &I.d_o, &I.dln, &I.dx}) v->assign((size_t)N * d, R(0));
        for (auto* v : {&I.dao, &I.dq, &I.dqr}) v->assign((size_t)N * qd, R(0));
        for (auto* v : {&I.dk, &I.dv, &I.dkr}) v->assign((size_t)N * kvd, R(0));
        I.dh13.assign((size_t)N * 2 * F, R(0));
        I.da.assign((size_t)N * F, R(0));
    }
    I.tokens.assign(tokens, tokens + N);
    I.have_targets = targets != nullptr;
    I.backward_done = false;
    if (targets) I.targets.assign(targets, targets + N);
    B_ = B;
    T_ = T;
    const R eps = (R)c.norm_eps;
    Scheme<R>& S = *I.scheme;
    S.resize(B, T);

    embedding_forward(I.emb.data(), tokens, I.wte, N, d);
    S.begin(I.emb.data());
    for (int l = 0; l < c.n_layer; l++) {
        LayerAct<R>& a = I.L[l];
        const LayerPtrs<R>& p = I.P[l];
        // ---- attention sublayer j = 2l+1
        S.input(2 * l + 1, a.x_att.data());
        rmsnorm_forward(a.ln_att.data(), a.rstd_att.data(), a.x_att.data(), p.attn_norm, N, d, eps);
        matmul_forward(a.q.data(), a.ln_att.data(), p.wq, p.bq, N, d, qd);
        matmul_forward(a.k.data(), a.ln_att.data(), p.wk, p.bk, N, d, kvd);
        matmul_forward(a.v.data(), a.ln_att.data(), p.wv, p.bv, N, d, kvd);
        const R* qin = a.q.data();
        const R* kin = a.k.data();
        if (c.qk_norm) {  // RMSNorm over head_dim per head, before RoPE; written into qr/kr
            rmsnorm_forward(a.qr.data(), a.rstd_q.data(), a.q.data(), p.q_norm, N * nh, hd, eps);
            rmsnorm_forward(a.kr.data(), a.rstd_k.data(), a.k.data(), p.k_norm, N * nkv, hd, eps);
            qin = a.qr.data();
            kin = a.kr.data();
        }
        rope_forward(a.qr.data(), qin, I.cos_t.data(), I.sin_t.data(), N, T, nh, hd);
        rope_forward(a.kr.data(), kin, I.cos_t.data(), I.sin_t.data(), N, T, nkv, hd);
        attention_forward(a.ao.data(), a.att.data(), a.qr.data(), a.kr.data(), a.v.data(), B, T,
                          nh, nkv, hd);
        matmul_forward(I.o.data(), a.ao.data(), p.wo, (const R*)nullptr, N, qd, d);
        S.output(2 * l + 1, I.o.data());
        // ---- MLP sublayer j = 2l+2
        S.input(2 * l + 2, a.x_mlp.data());
        rmsnorm_forward(a.ln_mlp.data(), a.rstd_mlp.data(), a.x_mlp.data(), p.mlp_norm, N, d, eps);
        // W1 and W3 are adjacent rows of one [2F, d] matrix (param_specs order): one GEMM.
        matmul_forward(a.h13.data(), a.ln_mlp.data(), p.w1, (const R*)nullptr, N, d, 2 * F);
        swiglu_forward(a.a.data(), a.h13.data(), N, F);
        matmul_forward(I.o.data(), a.a.data(), p.w2, (const R*)nullptr, N, F, d);
        S.output(2 * l + 2, I.o.data());
    }
    S.readout(I.y.data());
    rmsnorm_forward(I.yn.data(), I.rstd_f.data(), I.y.data(), I.final_norm, N, d, eps);
    // LM head over the real V rows only (ld = Vp; columns >= V are never written) and the softmax
    // statistics, tile by tile while each tile of logits is in cache.
    double loss = lm_head_ce_forward(I.logits.data(), I.lse.data(), I.row_max.data(), I.row_inv.data(),
                                     I.yn.data(), I.lm_head, targets, N, d, V, Vp);
    return targets ? loss : std::numeric_limits<double>::quiet_NaN();
}

template <typename R>
void Model<R>::backward(double scale) {
    Impl& I = *impl_;
    const ModelConfig& c = cfg;
    if (I.N == 0 || !I.have_targets)
        throw Error("Model::backward: needs a preceding forward() with targets");
    const int B = I.B, T = I.T, N = I.N, d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(),
              F = c.ffn, nh = c.n_head, nkv = c.n_kv_head, hd = c.head_dim, V = c.vocab_size,
              Vp = c.padded_vocab;
    Scheme<R>& S = *I.scheme;
    const int32_t* tokens = I.tokens.data();

    // Head: dlogits = scale/N (softmax - onehot) over the real V, a tile at a time into the LM
    // head's two GEMMs; then RMSNorm_f.
    if (I.backward_done)
        throw Error("Model::backward: called twice after one forward (run forward again)");
    I.backward_done = true;
    zero(I.dyn);
    lm_head_ce_backward(I.dyn.data(), I.g_lm_head, I.logits.data(), I.row_max.data(), I.row_inv.data(),
                        I.yn.data(), I.lm_head, I.targets.data(), N, d, V, Vp, (R)(scale / N), I.lm_tile.data());
    zero(I.dy);
    rmsnorm_backward(I.dy.data(), I.g_final_norm, I.dyn.data(), I.y.data(), I.final_norm,
                     I.rstd_f.data(), N, d);
    S.readout_backward(I.dy.data());

    for (int l = c.n_layer - 1; l >= 0; l--) {
        LayerAct<R>& a = I.L[l];
        const LayerPtrs<R>& p = I.P[l];
        const LayerPtrs<R>& g = I.G[l];
        // ---- MLP sublayer j = 2l+2
        S.output_backward(2 * l + 2, I.d_o.data());
        zero(I.da);
        matmul_backward(I.da.data(), g.w2, (R*)nullptr, I.d_o.data(), a.a.data(), p.w2, N, F, d);
        swiglu_backward(I.dh13.data(), I.da.data(), a.h13.data(), N, F);
        zero(I.dln);
        matmul_backward(I.dln.data(), g.w1, (R*)nullptr, I.dh13.data(), a.ln_mlp.data(), p.w1, N,
                        d, 2 * F);
        zero(I.dx);
        rmsnorm_backward(I.dx.data(), g.mlp_norm, I.dln.data(), a.x_mlp.data(), p.mlp_norm,
                         a.rstd_mlp.data(), N, d);
        S.input_backward(2 * l + 2, I.dx.data());
        // ---- attention sublayer j = 2l+1
        S.output_backward(2 * l + 1, I.d_o.data());
        zero(I.dao);
        matmul_backward(I.dao.data(), g.wo, (R*)nullptr, I.d_o.data(), a.ao.data(), p.wo, N, qd, d);
        zero(I.dqr);
        zero(I.dkr);
        zero(I.dv);
        attention_backward(I.dqr.data(), I.dkr.data(), I.dv.data(), I.dao.data(), a.att.data(),
                           a.qr.data(), a.kr.data(), a.v.data(), B, T, nh, nkv, hd);
        // RoPE is linear: rotate the gradients back (into dq/dk, or into dqr/dkr-sized
        // temporaries first when QK-norm sits in between).
        zero(I.dq);
        zero(I.dk);
        if (c.qk_norm) {
            // Gradient w.r.t. the QK-normed q/k goes through dao, free again here ([N, qd] >= [N, kvd]).
            std::vector<R>& dqn = I.dao;
            zero(dqn);
            rope_backward(dqn.data(), I.dqr.data(), I.cos_t.data(), I.sin_t.data(), N, T, nh, hd);
            rmsnorm_backward(I.dq.data(), g.q_norm, dqn.data(), a.q.data(), p.q_norm,
                             a.rstd_q.data(), N * nh, hd);
            zero(dqn);
            rope_backward(dqn.data(), I.dkr.data(), I.cos_t.data(), I.sin_t.data(), N, T, nkv, hd);
            rmsnorm_backward(I.dk.data(), g.k_norm, dqn.data(), a.k.data(), p.k_norm,
                             a.rstd_k.data(), N * nkv, hd);
        } else {
            rope_backward(I.dq.data(), I.dqr.data(), I.cos_t.data(), I.sin_t.data(), N, T, nh, hd);
            rope_backward(I.dk.data(), I.dkr.data(), I.cos_t.data(), I.sin_t.data(), N, T, nkv, hd);
        }
        zero(I.dln);
        matmul_backward(I.dln.data(), g.wq, g.bq, I.dq.data(), a.ln_att.data(), p.wq, N, d, qd);
        matmul_backward(I.dln.data(), g.wk, g.bk, I.dk.data(), a.ln_att.data(), p.wk, N, d, kvd);
        matmul_backward(I.dln.data(), g.wv, g.bv, I.dv.data(), a.ln_att.data(), p.wv, N, d, kvd);
        zero(I.dx);
        rmsnorm_backward(I.dx.data(), g.attn_norm, I.dln.data(), a.x_att.data(), p.attn_norm,
                         a.rstd_att.data(), N, d);
        S.input_backward(2 * l + 1, I.dx.data());
    }
    // Embedding: de lands in dx (scratch [N, d]).
    S.begin_backward(I.dx.data());
    embedding_backward(I.g_wte, I.dx.data(), tokens, N, d);
}

template struct Model<float>;
template struct Model<double>;
template void init_params<float>(const ModelConfig&, float*, uint64_t);
template void init_params<double>(const ModelConfig&, double*, uint64_t);

}  // namespace cpu
}  // namespace ldm
