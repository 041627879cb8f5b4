// core/config.cpp — presets, validation, parameter layout and dry-run estimates (spec §1, §2).
#include "core/config.h"

#include <sstream>

#include "core/common.h"

namespace ldm {

int pad_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

void ModelConfig::validate() const {
    auto fail = [&](const std::string& msg) {
        throw Error("model config (preset '" + preset + "'): " + msg);
    };
    auto pos = [&](const char* name, int v) {
        if (v <= 0) fail(strprintf("%s must be positive, got %d", name, v));
    };
    pos("vocab_size", vocab_size);
    pos("padded_vocab", padded_vocab);
    pos("d_model", d_model);
    pos("n_layer", n_layer);
    pos("n_head", n_head);
    pos("n_kv_head", n_kv_head);
    pos("head_dim", head_dim);
    pos("ffn", ffn);
    pos("seq_len", seq_len);
    if (padded_vocab < vocab_size)
        fail(strprintf("padded_vocab %d < vocab_size %d", padded_vocab, vocab_size));
    if (n_head % n_kv_head != 0)
        fail(strprintf("n_head %d is not divisible by n_kv_head %d", n_head, n_kv_head));
    if (head_dim % 2 != 0) fail(strprintf("head_dim %d must be even (RoPE rotates pairs)", head_dim));
    if (!(norm_eps >= 0)) fail("norm_eps must be >= 0");
    if (!(rope_theta > 0)) fail("rope_theta must be > 0");
    if (scheme != "preln" && scheme != "hc" && scheme != "mhc" && scheme != "attnres-full" &&
        scheme != "attnres-block" && scheme != "ldm")
        fail("unknown scheme '" + scheme +
             "' (valid: preln, hc, mhc, attnres-full, attnres-block, ldm)");
    if (scheme == "hc" || scheme == "mhc") pos("hc_streams", hc_streams);
    if (scheme == "mhc") pos("sinkhorn_iters", sinkhorn_iters);
    if (scheme == "attnres-block") pos("attnres_blocks", attnres_blocks);
    if (scheme == "ldm") {
        if (ldm_rule != "rls" && ldm_rule != "delta" && ldm_rule != "outer")
            fail("unknown ldm_rule '" + ldm_rule + "' (valid: rls, delta, outer)");
        pos("ldm_heads", ldm_heads);
        pos("ldm_dk", ldm_dk);
        if (d_model % ldm_heads != 0)
            fail(strprintf("ldm_heads %d does not divide d_model %d", ldm_heads, d_model));
        if (!(ldm_delta > 0)) fail("ldm_delta must be > 0");
        if (!(ldm_lambda_min > 0 && ldm_lambda_min <= 1))
            fail(strprintf("ldm_lambda_min must be in (0, 1], got %g", ldm_lambda_min));
        if (ldm_mode != "store" && ldm_mode != "unwind" && ldm_mode != "window")
            fail("unknown ldm_mode '" + ldm_mode + "' (valid: store, unwind, window)");
        if (ldm_window < 1) fail(strprintf("ldm_window must be >= 1, got %d", ldm_window));
        if (ldm_checkpoint_every < 0)
            fail(strprintf("ldm_checkpoint_every must be >= 0, got %d", ldm_checkpoint_every));
        if (!(ldm_drift_tol > 0)) fail("ldm_drift_tol must be > 0");
        if (ldm_rule == "delta" && ldm_mode != "store")
            fail("ldm_mode '" + ldm_mode + "' is not available for the delta rule (its write is "
                 "not invertible): use --ldm-mode store, optionally with --ldm-checkpoint-every c");
    }
}

std::vector<std::string> preset_names() {
    return {"tiny", "small", "llama-400m", "qwen-1.5b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b",
            "qwen3-14b"};
}

ModelConfig preset_config(const std::string& name, int vocab_size) {
    struct Row {
        const char* name;
        int d, n_layer, n_head, n_kv_head, head_dim, ffn;
        bool tied, qkv_bias, qk_norm;
        double theta, eps;
    };
    // Spec §1 preset table, verbatim.
    static const Row rows[] = {
        {"tiny", 64, 2, 4, 2, 16, 160, false, false, false, 1e4, 1e-5},
        {"small", 256, 4, 4, 4, 64, 688, false, false, false, 1e4, 1e-5},
        {"llama-400m", 1024, 24, 16, 16, 64, 2816, false, false, false, 1e4, 1e-5},
        {"qwen-1.5b", 1536, 28, 12, 2, 128, 8960, true, true, false, 1e6, 1e-6},
        {"qwen3-1.7b", 2048, 28, 16, 8, 128, 6144, true, false, true, 1e6, 1e-6},
        {"qwen3-4b", 2560, 36, 32, 8, 128, 9728, true, false, true, 1e6, 1e-6},
        {"qwen3-8b", 4096, 36, 32, 8, 128, 12288, false, false, true, 1e6, 1e-6},
        {"qwen3-14b", 5120, 40, 40, 8, 128, 17408, false, false, true, 1e6, 1e-6},
    };
    for (const Row& r : rows) {
        if (name != r.name) continue;
        ModelConfig c;
        c.preset = r.name;
        c.vocab_size = vocab_size;
        c.padded_vocab = pad_vocab(vocab_size);
        c.d_model = r.d;
        c.n_layer = r.n_layer;
        c.n_head = r.n_head;
        c.n_kv_head = r.n_kv_head;
        c.head_dim = r.head_dim;
        c.ffn = r.ffn;
        c.tied = r.tied;
        c.qkv_bias = r.qkv_bias;
        c.qk_norm = r.qk_norm;
        c.rope_theta = r.theta;
        c.norm_eps = r.eps;
        c.seq_len = 1024;
        return c;
    }
    std::string valid;
    for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    throw Error("unknown preset '" + name + "' (valid: " + valid + ")");
}

namespace {

struct Builder {
    std::vector<ParamSpec> out;
    int64_t off = 0;
    void add(const std::string& name, std::vector<int64_t> shape, bool decay) {
        ParamSpec p;
        p.name = name;
        p.shape = std::move(shape);
        p.numel = 1;
        for (int64_t s : p.shape) p.numel *= s;
        p.offset = off;
        p.decay = decay;
        off += p.numel;
        out.push_back(std::move(p));
    }
};

void add_scheme_specs(const ModelConfig& c, Builder& b) {
    const int64_t d = c.d_model, D = c.n_sublayers();
    if (c.scheme == "preln") return;
    if (c.scheme == "hc") {  // spec §2.2 (proposed layout; the HC issue may refine it)
        const int64_t n = c.hc_streams;
        for (int64_t j = 1; j <= D; j++) {
            std::string p = "scheme.hc." + std::to_string(j) + ".";
            b.add(p + "w_m", {1, d}, true);
            b.add(p + "w_r", {n, d}, true);
            b.add(p + "w_b", {1, d}, true);
            b.add(p + "s_a", {1}, false);
            b.add(p + "s_b", {1}, false);
            b.add(p + "a_m0", {n}, false);
            b.add(p + "a_r0", {n, n}, false);
            b.add(p + "b0", {n}, false);
        }
    } else if (c.scheme == "mhc") {  // spec §2.3
        const int64_t n = c.hc_streams;
        for (int64_t j = 1; j <= D; j++) {
            std::string p = "scheme.mhc." + std::to_string(j) + ".";
            b.add(p + "phi_pre", {n, n * d}, true);
            b.add(p + "phi_post", {n, n * d}, true);
            b.add(p + "phi_res", {n * n, n * d}, true);
            b.add(p + "a_pre", {1}, false);
            b.add(p + "a_post", {1}, false);
            b.add(p + "a_res", {1}, false);
            b.add(p + "b_pre", {n}, false);
            b.add(p + "b_post", {n}, false);
            b.add(p + "b_res", {n, n}, false);
        }
    } else if (c.scheme == "attnres-full" || c.scheme == "attnres-block") {  // spec §2.4
        for (int64_t j = 1; j <= D; j++) {
            std::string p = "scheme.attnres." + std::to_string(j) + ".";
            b.add(p + "w", {d}, false);
            b.add(p + "g", {d}, false);
        }
        b.add("scheme.attnres.f.w", {d}, false);
        b.add("scheme.attnres.f.g", {d}, false);
    } else if (c.scheme == "ldm") {  // spec §2.5
        const int64_t hk = (int64_t)c.ldm_heads * c.ldm_dk, Hm = c.ldm_heads;
        for (int64_t i = 0; i <= D; i++)
            b.add("scheme.ldm.wk." + std::to_string(i), {hk, d}, true);
        for (int64_t j = 1; j <= D; j++) {
            b.add("scheme.ldm.wq." + std::to_string(j), {hk, d}, true);
            if (c.ldm_residual) b.add("scheme.ldm.a." + std::to_string(j), {d}, false);
        }
        b.add("scheme.ldm.wq.f", {hk, d}, true);
        if (c.ldm_residual) b.add("scheme.ldm.a.f", {d}, false);
        if (c.ldm_rule == "delta") {
            for (int64_t i = 0; i <= D; i++) {
                b.add("scheme.ldm.wbeta." + std::to_string(i), {Hm, d}, true);
                b.add("scheme.ldm.bbeta." + std::to_string(i), {Hm}, false);
            }
        } else if (c.ldm_forget) {
            b.add("scheme.ldm.theta", {D + 1, Hm}, false);  // a table of scalars: no decay
        }
    }
}

}  // namespace

std::vector<ParamSpec> scheme_param_specs(const ModelConfig& c) {
    c.validate();
    Builder b;
    add_scheme_specs(c, b);
    return b.out;
}

std::vector<ParamSpec> param_specs(const ModelConfig& c) {
    c.validate();
    Builder b;
    const int64_t d = c.d_model, Vp = c.padded_vocab, qd = c.q_dim(), kvd = c.kv_dim(),
                  hd = c.head_dim, F = c.ffn;
    b.add("wte", {Vp, d}, true);
    for (int l = 0; l < c.n_layer; l++) {
        std::string p = "blocks." + std::to_string(l) + ".";
        b.add(p + "attn_norm.w", {d}, false);
        b.add(p + "attn.wq", {qd, d}, true);
        b.add(p + "attn.wk", {kvd, d}, true);
        b.add(p + "attn.wv", {kvd, d}, true);
        if (c.qkv_bias) {
            b.add(p + "attn.bq", {qd}, false);
            b.add(p + "attn.bk", {kvd}, false);
            b.add(p + "attn.bv", {kvd}, false);
        }
        if (c.qk_norm) {
            b.add(p + "attn.q_norm.w", {hd}, false);
            b.add(p + "attn.k_norm.w", {hd}, false);
        }
        b.add(p + "attn.wo", {d, qd}, true);
        b.add(p + "mlp_norm.w", {d}, false);
        b.add(p + "mlp.w1", {F, d}, true);
        b.add(p + "mlp.w3", {F, d}, true);
        b.add(p + "mlp.w2", {d, F}, true);
    }
    b.add("final_norm.w", {d}, false);
    if (!c.tied) b.add("lm_head", {Vp, d}, true);
    add_scheme_specs(c, b);
    return b.out;
}

int64_t count_params(const ModelConfig& c) {
    int64_t n = 0;
    for (const auto& p : param_specs(c)) n += p.numel;
    return n;
}

ParamCounts count_params_detailed(const ModelConfig& c) {
    ParamCounts r;
    for (const auto& p : param_specs(c)) {
        r.total += p.numel;
        if (p.name == "wte") r.embedding += p.numel;
        else if (p.name == "lm_head") { r.embedding += p.numel; r.lm_head += p.numel; }
        else if (p.name.rfind("scheme.", 0) == 0) r.scheme += p.numel;
        else {
            r.backbone_nonembed += p.numel;
            if (p.name.rfind("blocks.0.attn", 0) == 0) r.attn_per_layer += p.numel;
            if (p.name.rfind("blocks.0.mlp", 0) == 0) r.mlp_per_layer += p.numel;
        }
    }
    return r;
}

int64_t activation_values_per_token(const ModelConfig& c, int T) {
    c.validate();
    const int64_t d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(), F = c.ffn, Vp = c.padded_vocab,
                  nh = c.n_head, nkv = c.n_kv_head, D = c.n_sublayers();
    // Saved per attention sublayer (names as in cpu/model.cpp LayerAct): x, rstd, ln, q, k, v,
    // qr, kr (after QK-norm and RoPE), att probabilities (a full T x T square per head), ao;
    // with QK-norm also the per-head rstd of q and k.
    int64_t attn = d + 1 + d + qd + 2 * kvd + qd + kvd + nh * (int64_t)T + qd;
    if (c.qk_norm) attn += nh + nkv;
    // Saved per MLP sublayer: x, rstd, ln, h1 = W1 ln, h3 = W3 ln, a = silu(h1)*h3.
    int64_t mlp = d + 1 + d + 3 * F;
    // Head: readout y, rstd, normalised y, logits, log-sum-exp, the softmax's row maximum and
    // inverse sum (the LM head's gradient goes through a fixed-size tile, cpu/ops.h lm_head_ce_*).
    int64_t head = d + 1 + d + Vp + 3;
    // Buffers shared by all layers: emb, o and the backward scratch (dyn, dy, d_o, dln, dx,
    // dao, dq, dqr, dk, dv, dkr, dh1, dh3, da).
    int64_t scratch = 7 * d + 3 * qd + 3 * kvd + 3 * F;
    // Scheme state per token (estimates for the later schemes, in their `store` form).
    int64_t scheme = 2 * d;  // PreLN: h and dh
    // HC / mHC / AttnRes: exactly what cpu/scheme_hc.cpp / scheme_attnres.cpp allocate.
    const int64_t n = c.hc_streams, m = 2 * n + n * n;
    if (c.scheme == "hc")
        scheme = (D + 1) * n * d + D * d + D * n + D * n * (n + 2) + 4 * n * d + 2 * n * (n + 2);
    else if (c.scheme == "mhc")
        scheme = (D + 1) * n * d + D * d + D + D * m + 3 * n * d + 2 * m;
    else if (c.scheme == "attnres-full" || c.scheme == "attnres-block") {
        const bool blk = c.scheme == "attnres-block";
        const int64_t K = (blk ? std::min<int64_t>(c.attnres_blocks, D) : D) + 1;
        scheme = 2 * K * d + K + (blk ? D * d + D + 2 * d : 0);
    }
    else if (c.scheme == "ldm") {
        // Same count as ldm_scheme_values_per_token (cpu/scheme_ldm.cpp; tested equal):
        // h, v of every write, normalised q/k + norms (+ beta), live state, kept states, dS,
        // dh, tmp, projection scratch.
        const int64_t dv = d / c.ldm_heads, dk = c.ldm_dk, Hm = c.ldm_heads, HK = Hm * dk,
                      W = D + 1, ST = Hm * (dv * dk + (c.ldm_rule == "rls" ? dk * dk : 0)),
                      ce = c.ldm_checkpoint_every,
                      win = c.ldm_mode == "window" ? c.ldm_window : 0,
                      kept = win > 0 ? (ce > 0 ? (W + win - 1) / win : 0)  // window: unwinds
                                     : ce > 0 ? (W + ce - 1) / ce : (c.ldm_mode == "unwind" ? 0 : W);
        scheme = d + W * d + 2 * W * HK + 2 * W * Hm + (c.ldm_rule == "delta" ? W * Hm : 0) + ST +
                 kept * ST + ST + 2 * d + 2 * HK + Hm + Hm * (win * dk + win * dv + win * win);
    }
    return c.n_layer * (attn + mlp) + head + scratch + scheme;
}

std::string describe(const ModelConfig& c, int T) {
    c.validate();
    if (T <= 0) throw Error(strprintf("describe: sequence length T must be positive, got %d", T));
    ParamCounts pc = count_params_detailed(c);
    std::ostringstream o;
    auto M = [](double x) { return strprintf("%.3f M", x / 1e6); };
    auto GiB = [](double bytes) { return strprintf("%.3f GiB", bytes / (1024.0 * 1024 * 1024)); };
    o << "model: preset=" << c.preset << " scheme=" << c.scheme << "\n";
    o << strprintf("  d_model=%d n_layer=%d n_head=%d n_kv_head=%d head_dim=%d ffn=%d\n", c.d_model,
                   c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.ffn);
    o << strprintf("  vocab=%d padded=%d tied=%d qkv_bias=%d qk_norm=%d rope_theta=%g eps=%g T=%d\n",
                   c.vocab_size, c.padded_vocab, (int)c.tied, (int)c.qkv_bias, (int)c.qk_norm,
                   c.rope_theta, c.norm_eps, T);
    o << "parameters: total " << pc.total << " (" << M(pc.total) << ")\n";
    o << "  embedding (wte" << (c.tied ? ", tied head" : " + lm_head") << ", Vp rows): "
      << pc.embedding << " (" << M(pc.embedding) << ")\n";
    o << "  non-embedding backbone: " << pc.backbone_nonembed << " (" << M(pc.backbone_nonembed)
      << "); per layer attention " << pc.attn_per_layer << ", mlp " << pc.mlp_per_layer << "\n";
    o << "  scheme '" << c.scheme << "': " << pc.scheme << "\n";
    double pbytes = 4.0 * pc.total;
    o << "memory (fp32): params " << GiB(pbytes) << ", +grads " << GiB(pbytes) << ", +AdamW m,v "
      << GiB(2 * pbytes) << " = " << GiB(4 * pbytes) << "\n";
    int64_t apt = activation_values_per_token(c, T);
    o << "activations per token (training, CPU reference layout): " << apt << " values = "
      << strprintf("%.1f KiB", apt * 4.0 / 1024) << " fp32; per sequence of T=" << T << ": "
      << GiB(apt * 4.0 * T) << "\n";
    // Model FLOPs per token (spec performance.md): 6*N_nonembed + 6*N_head + 12*n_layer*d*T.
    double n_head_mat = (double)c.padded_vocab * c.d_model;
    double flops = 6.0 * (pc.backbone_nonembed + pc.scheme) + 6.0 * n_head_mat +
                   12.0 * c.n_layer * c.d_model * (double)T;
    o << strprintf("training FLOPs per token: %.3f GFLOP\n", flops / 1e9);
    return o.str();
}

}  // namespace ldm
