// cuda/infer_cli.cuh — the generation / inference-benchmark mode of the GPU trainers
// (cuda/trainer.cuh calls add_infer_flags and, when one of its modes is on, run_infer instead of
// training). Flags follow build/generate_cpu where sensible. Three modes:
//   --generate            text from --prompt (tokenizer) or --prompt-len random ids; prints the
//                         text, the timing and one line GENERATE {json} (generate_cpu's keys)
//   --bench-infer P:G     B = -B sequences: prefill of P random tokens, then G greedy decode steps
//                         (the prompt and sampling flags are refused: they would not apply);
//                         prints BENCH_INFER {json}: prefill tokens/s, decode ms per step (median,
//                         mean), KV cache bytes, peak device memory
//   --infer-check FILE    test hook (test/test_gpu_infer.cpp): B x T random tokens; writes the
//                         full forward's logits, the prefill (P = --prompt-len, default T/2) and
//                         the G = T - P decode steps' logits, greedy tokens and the weights to FILE
//                         (container LDMINFCK, fp32)
// The model: --checkpoint FILE.model, or --resume out/ckpt_000100 (its .model), or a random init
// of the flags' config with --seed (timing). --seed also seeds the random prompt ids and sampling
// (splitmix64 streams of cpu/rng.h, as generate_cpu). Single process (no mpirun).
// Walkthrough: doc/cuda.md "Inference on the GPU".
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint.h"
#include "core/cli.h"
#include "core/common.h"
#include "core/config.h"
#include "core/dist.h"
#include "core/tokenizer.h"
#include "cuda/common.cuh"
#include "cuda/transformer.cuh"
#include "cuda/infer.cuh"
#include "cpu/generate_io.h"
#include "cpu/infer.h"
#include "cpu/rng.h"

namespace ldm {
namespace gpu {

struct InferOptions : cpu::GenerationFlags {  // + --prompt ... --stop-at-eot
    bool generate = false;
    std::string checkpoint, bench_infer, infer_check;
    std::vector<std::string> generation_flags;  // the names add_generation_flags registered
    std::vector<std::string> generation_flags_set;  // those on the command line (note_set_infer_flags)
    bool generation_flags_noted = false;            // note_set_infer_flags ran
    bool active() const { return generate || !bench_infer.empty() || !infer_check.empty(); }
};

inline void add_infer_flags(ArgParser& ap, InferOptions& o) {
    ap.section("Inference on the GPU (instead of training; doc/cuda.md \"Inference on the GPU\")");
    ap.add("--generate", &o.generate,
           "generate text with a KV cache (prefill + incremental decode); prints GENERATE json with prefill "
           "tokens/s and per-token decode latency");
    ap.add("--checkpoint", &o.checkpoint,
           "generation/benchmark model: a .model checkpoint (or use --resume <base>; neither = random init from "
           "the model flags and --seed)");
    const size_t first = ap.flag_names().size();
    cpu::add_generation_flags(
        ap, o, "prompt text (\"\" = start from <|endoftext|>; needs the tokenizer)",
        "instead of --prompt: N random token ids (seeded by --seed); --infer-check: prefill length (0 = T/2)");
    const std::vector<std::string> names = ap.flag_names();
    o.generation_flags.assign(names.begin() + std::ptrdiff_t(first), names.end());
    ap.add("--bench-infer", &o.bench_infer,
           "P:G inference benchmark: -B sequences, prefill of P random tokens then G decode steps; prints "
           "BENCH_INFER json (prefill tokens/s, decode ms/token, KV cache, peak memory)");
    ap.add("--infer-check", &o.infer_check,
           "test hook: write full-forward, prefill and decode logits of B x T random tokens to FILE (LDMINFCK)");
}

// After ap.parse: which generation flags the command line gave (--bench-infer refuses them).
inline void note_set_infer_flags(const ArgParser& ap, InferOptions& o) {
    o.generation_flags_set.clear();
    for (const std::string& f : o.generation_flags)
        if (ap.was_set(f)) o.generation_flags_set.push_back(f);
    o.generation_flags_noted = true;
}

namespace infer_cli_detail {

inline double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

inline int64_t device_used_bytes() {
    size_t f = 0, t = 0;
    CUDA_CHECK(cudaMemGetInfo(&f, &t));
    return int64_t(t - f);
}

inline std::string f32_bytes(const float* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n * 4); }
inline std::string i32_bytes(const int32_t* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n * 4); }

inline void parse_pg(const std::string& s, int* P, int* G) {
    const size_t c = s.find(':');
    int p = 0, g = 0;
    try {
        if (c == std::string::npos) throw Error("");
        size_t u = 0, v = 0;
        p = std::stoi(s.substr(0, c), &u);
        g = std::stoi(s.substr(c + 1), &v);
        if (u != c || v != s.size() - c - 1) throw Error("");
    } catch (...) {
        throw Error("--bench-infer '" + s + "': expected P:G (prompt tokens : decode steps), e.g. 512:128");
    }
    if (p < 1 || g < 1) throw Error("--bench-infer '" + s + "': P and G must be >= 1");
    *P = p;
    *G = g;
}

}  // namespace infer_cli_detail

// Flag checks that need no GPU (called before the GPU check, so the errors show on any machine):
// one mode, value ranges, the checkpoint file exists, --bench-infer parses, a --prompt-len prompt
// fits the context (-T or --max-len; a checkpoint's seq_len is checked again in run_infer).
inline void check_infer_options(const InferOptions& io, const std::string& resume, int T_flag) {
    if ((io.generate ? 1 : 0) + (io.bench_infer.empty() ? 0 : 1) + (io.infer_check.empty() ? 0 : 1) != 1)
        throw Error("give only one of --generate, --bench-infer, --infer-check");
    if (!io.checkpoint.empty() && !resume.empty()) throw Error("give only one of --checkpoint and --resume");
    cpu::check_generation_flags(io);
    if (!io.checkpoint.empty() && !file_exists(io.checkpoint))
        throw Error("--checkpoint: " + io.checkpoint + " does not exist");
    if (!resume.empty() && io.checkpoint.empty()) {
        const std::string m = dist::checkpoint_base(resume) + ".model";
        if (!file_exists(m)) throw Error("--resume: " + m + " does not exist");
    }
    const bool own_model = io.checkpoint.empty() && resume.empty();  // the model flags' model (-T)
    if (own_model && io.max_len > T_flag)
        throw Error(strprintf("--max-len %d exceeds the model's seq_len %d (-T)", io.max_len, T_flag));
    if (!io.generation_flags_noted)  // a caller that skipped it would lose the refusal below
        throw Error("internal error: note_set_infer_flags(ap, options) must run after ArgParser::parse");
    if (!io.bench_infer.empty()) {
        // the benchmark decodes greedily from random prompts into a cache of P + G: the generation
        // flags, which would change that, are refused rather than silently not applied
        std::string unused;
        for (const std::string& f : io.generation_flags_set) unused += " " + f;
        if (!unused.empty())
            throw Error("--bench-infer P:G times greedy decoding of P random tokens then G steps (cache P + G); it "
                        "does not use" + unused + " (drop them, or use --generate)");
        int P = 0, G = 0;
        infer_cli_detail::parse_pg(io.bench_infer, &P, &G);
        if (own_model && P + G > T_flag)
            throw Error(strprintf("--bench-infer %d:%d needs a context of %d > the model's seq_len %d (raise -T)", P, G,
                                  P + G, T_flag));
    }
    if (io.generate && io.prompt_len > 0 && own_model) {
        const int ctx = io.max_len > 0 ? io.max_len : T_flag;
        if (io.max_len > T_flag) throw Error(strprintf("--max-len %d exceeds the model's seq_len %d (-T)", io.max_len, T_flag));
        if (io.prompt_len > ctx)
            throw Error(strprintf("the prompt has %d tokens, more than the context of %d", io.prompt_len, ctx));
    }
}

// Runs the selected inference mode on GPU 0. cfg: the model flags' config (replaced by the
// checkpoint's when one is given); T_flag / B_flag: -T / -B; seed: --seed; resume: --resume
// (a checkpoint base or path). Returns the exit code (errors throw ldm::Error).
template <typename T>
int run_infer(const InferOptions& io, ModelConfig cfg, int B_flag, int T_flag, uint64_t seed,
              const std::string& resume, const std::string& dtype, const Tokenizer* tok) {
    using nlohmann::json;
    using namespace infer_cli_detail;
    if (dist::world() > 1) throw Error("inference modes run in one process (start them without mpirun/srun)");
    check_infer_options(io, resume, T_flag);
    CUDA_CHECK(cudaSetDevice(0));
    const std::string device = device_description(0);

    std::vector<float> ck_params;
    std::string source = "random init (seed " + std::to_string(seed) + ")";
    const std::string ckpath = !io.checkpoint.empty() ? io.checkpoint
                               : !resume.empty()      ? dist::checkpoint_base(resume) + ".model"
                                                      : std::string();
    if (!ckpath.empty()) {
        if (!file_exists(ckpath)) throw Error("checkpoint " + ckpath + " does not exist");
        ModelCheckpoint mc = load_model(ckpath);
        cfg = mc.cfg;
        ck_params = std::move(mc.params);
        source = ckpath;
        if (tok && tok->vocab_size() != (uint32_t)cfg.vocab_size)
            throw Error(strprintf("the tokenizer has %u ids but the model %s has vocab_size %d: tokenizer mismatch",
                                  tok->vocab_size(), ckpath.c_str(), cfg.vocab_size));
    }
    const int V = cfg.vocab_size;
    auto load = [&](Transformer<T>& m) {
        if (ck_params.empty()) m.init(seed);
        else m.set_master(ck_params.data());
    };
    const int64_t used0 = device_used_bytes();

    // ---------------------------------------------------------------- --infer-check (test hook)
    if (!io.infer_check.empty()) {
        const int B = B_flag, Tn = T_flag;
        if (Tn > cfg.seq_len) throw Error(strprintf("--infer-check: -T %d exceeds the model's seq_len %d", Tn, cfg.seq_len));
        const int P = io.prompt_len > 0 ? io.prompt_len : Tn / 2;
        if (P < 1 || P >= Tn) throw Error(strprintf("--infer-check: the prefill length %d must be in [1, T-1 = %d]", P, Tn - 1));
        const int G = Tn - P, Vp = cfg.padded_vocab;
        Transformer<T> model(cfg, B, Tn, 0);
        load(model);
        const std::vector<int32_t> tokens = cpu::random_token_ids(seed, (int64_t)B * Tn, V);
        // one training step's loss and gradients (targets: the next token, cyclically), before and
        // after the inference below: they must be bitwise equal (inference leaves training alone)
        std::vector<int32_t> targets(tokens.size());
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tn; t++) targets[(size_t)b * Tn + t] = tokens[(size_t)b * Tn + (t + 1) % Tn];
        auto train_step = [&](double* loss) {
            model.zero_grad();
            *loss = model.forward(tokens.data(), targets.data(), B, Tn, 1.0);
            model.backward(1.0);
            return model.get_grads();
        };
        double loss0 = 0, loss1 = 0;
        train_step(&loss0);  // twice: a scheme that adapts after a backward (LDM drift fallback) is settled
        const std::vector<float> grads0 = train_step(&loss0);
        model.forward(tokens.data(), nullptr, B, Tn, 0.0);
        const std::vector<float> full = model.logits_host();
        GpuInference<T> inf(model, B, Tn);
        std::vector<int32_t> prompt((size_t)B * P), col((size_t)B);
        for (int b = 0; b < B; b++)
            std::copy(tokens.begin() + (size_t)b * Tn, tokens.begin() + (size_t)b * Tn + P, prompt.begin() + (size_t)b * P);
        const float* lg = inf.prefill(prompt.data(), P, true);
        std::vector<float> pre(lg, lg + (size_t)B * P * Vp), dec;
        dec.reserve((size_t)G * B * Vp);
        for (int g = 0; g < G; g++) {
            for (int b = 0; b < B; b++) col[(size_t)b] = tokens[(size_t)b * Tn + P + g];
            lg = inf.decode_step(col.data());
            dec.insert(dec.end(), lg, lg + (size_t)B * Vp);
        }
        // greedy generation of sequence 0 from its first P tokens (a B = 1 instance)
        GpuInference<T> inf1(model, 1, Tn);
        cpu::SamplingParams sp;
        sp.greedy = true;
        std::vector<int32_t> p0(tokens.begin(), tokens.begin() + P);
        std::vector<int32_t> greedy = gpu_generate(inf1, p0, G, sp, seed);
        // the model's own forward and training step are unchanged by the inference (bitwise)
        model.forward(tokens.data(), nullptr, B, Tn, 0.0);
        const std::vector<float> again = model.logits_host();
        auto bitwise = [](const std::vector<float>& x, const std::vector<float>& y) {
            return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
        };
        const std::vector<float> grads1 = train_step(&loss1);
        const bool unchanged = bitwise(full, again) && bitwise(grads0, grads1) &&
                               std::memcmp(&loss0, &loss1, sizeof(double)) == 0;
        const std::vector<float> params = model.get_master();
        json h{{"config", config_to_json(cfg)}, {"dtype", dtype}, {"B", B}, {"T", Tn}, {"P", P}, {"G", G},
               {"seed", seed}, {"forward_unchanged", unchanged}, {"device", device}};
        h["config"]["ldm_mode"] = cfg.ldm_mode;  // training options, left out of config_to_json
        h["config"]["ldm_window"] = cfg.ldm_window;
        std::vector<CkptTensor> ts;
        ts.push_back({"params", "f32", {(int64_t)params.size()}, f32_bytes(params.data(), params.size())});
        ts.push_back({"tokens", "i32", {B, Tn}, i32_bytes(tokens.data(), tokens.size())});
        ts.push_back({"full_logits", "f32", {(int64_t)B * Tn, Vp}, f32_bytes(full.data(), full.size())});
        ts.push_back({"prefill_logits", "f32", {(int64_t)B * P, Vp}, f32_bytes(pre.data(), pre.size())});
        ts.push_back({"decode_logits", "f32", {G, B, Vp}, f32_bytes(dec.data(), dec.size())});
        ts.push_back({"greedy", "i32", {(int64_t)greedy.size()}, i32_bytes(greedy.data(), greedy.size())});
        write_container(io.infer_check, "LDMINFCK", h, ts);
        std::printf("infer check (%s, %s, B=%d T=%d P=%d G=%d, forward and training step unchanged: %s) written to %s\n",
                    cfg.scheme.c_str(), dtype.c_str(), B, Tn, P, G, unchanged ? "yes" : "NO", io.infer_check.c_str());
        return 0;
    }

    // ---------------------------------------------------------------- --bench-infer P:G
    if (!io.bench_infer.empty()) {
        int P = 0, G = 0;
        parse_pg(io.bench_infer, &P, &G);
        const int B = B_flag, ctx = P + G;
        if (ctx > cfg.seq_len)
            throw Error(strprintf("--bench-infer %d:%d needs a context of %d > the model's seq_len %d (raise -T)", P, G, ctx,
                                  cfg.seq_len));
        Transformer<T> model(cfg, 1, 1, 0);  // the weights (its training buffers are for one token)
        load(model);
        GpuInference<T> inf(model, B, ctx);
        const std::vector<int32_t> prompt = cpu::random_token_ids(seed, (int64_t)B * P, V);
        std::vector<int32_t> next((size_t)B);
        auto pick = [&](const float* lg) {
            for (int b = 0; b < B; b++) next[(size_t)b] = cpu::argmax_token<float>(lg + (size_t)b * cfg.padded_vocab, V);
        };
        using clock = std::chrono::steady_clock;
        // warm-up (cuBLASLt heuristics, allocations): one prefill and two decode steps
        pick(inf.prefill(prompt.data(), P));
        for (int i = 0; i < std::min(2, G); i++) pick(inf.decode_step(next.data()));
        std::vector<double> pre_ms;
        const float* lg = nullptr;
        for (int r = 0; r < 3; r++) {
            CUDA_CHECK(cudaDeviceSynchronize());
            auto t0 = clock::now();
            lg = inf.prefill(prompt.data(), P);
            pre_ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
        }
        pick(lg);
        cpu::GenerateStats st;
        for (int g = 0; g < G; g++) {
            auto t0 = clock::now();
            lg = inf.decode_step(next.data());
            st.decode_ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
            pick(lg);
        }
        const double pms = median(pre_ms);
        const double dmean = st.mean_decode_ms(), dmed = st.median_decode_ms();
        const int64_t peak = std::max(device_used_bytes(), used0);
        json r{{"type", "bench_infer"}, {"trainer", "gpu"}, {"preset", cfg.preset}, {"scheme", cfg.scheme},
               {"dtype", dtype}, {"B", B}, {"prompt_tokens", P}, {"decode_steps", G}, {"model", source},
               {"prefill_ms", pms}, {"prefill_tokens_per_s", double(B) * P / (pms / 1e3)},
               {"decode_ms_mean", dmean}, {"decode_ms_median", dmed},
               {"decode_tokens_per_s", dmed > 0 ? double(B) * 1e3 / dmed : 0.0},
               {"kv_cache_bytes", inf.cache_bytes()}, {"infer_alloc_gib", gib(double(inf.allocated_bytes()))},
               {"model_alloc_gib", gib(double(model.allocated_bytes()))},
               {"peak_mem_gib", gib(double(peak))}, {"device", device}};
        std::printf("inference %s %s %s B=%d: prefill %d tokens in %.2f ms (%.0f tokens/s) | decode %.3f ms/step median "
                    "(%.3f mean, %.0f tokens/s) | KV cache %.1f MiB | device memory used %.2f GiB\n",
                    cfg.preset.c_str(), cfg.scheme.c_str(), dtype.c_str(), B, P, pms, double(B) * P / (pms / 1e3), dmed,
                    dmean, dmed > 0 ? double(B) * 1e3 / dmed : 0.0, double(inf.cache_bytes()) / (1 << 20), gib(double(peak)));
        std::printf("BENCH_INFER %s\n", r.dump().c_str());
        return 0;
    }

    // ---------------------------------------------------------------- --generate
    cpu::check_generation_setup(io, tok, cfg.seq_len);
    const std::vector<int32_t> prompt = cpu::generation_prompt(tok, io.prompt, io.prompt_len, seed, V);
    const int ctx = cpu::generation_context(io.max_len, cfg.seq_len, prompt.size());
    Transformer<T> model(cfg, 1, 1, 0);
    load(model);
    GpuInference<T> inf(model, 1, ctx);
    const cpu::SamplingParams sp = io.sampling();
    const int32_t stop = (io.stop_at_eot && tok) ? (int32_t)tok->eot_id() : -1;
    cpu::GenerateStats st;
    std::vector<int32_t> out = gpu_generate(inf, prompt, io.max_new, sp, seed, stop, &st);
    cpu::print_generation(tok, prompt, out, io.prompt_len > 0);
    cpu::note_context_window(st, ctx);
    const double dmean = st.mean_decode_ms(), dmed = st.median_decode_ms();
    const int64_t peak = std::max(device_used_bytes(), used0);
    std::printf("prefill: %d tokens in %.2f ms (%.1f tokens/s) | decode: %zu steps, %.3f ms/token mean, %.3f ms median "
                "(%.1f tokens/s) | KV cache %.2f MiB (%s, %s) | model %s\n",
                st.prompt_tokens, st.prefill_s * 1e3, st.prefill_tokens_per_s(), st.decode_ms.size(), dmean, dmed,
                dmean > 0 ? 1e3 / dmean : 0.0, double(inf.cache_bytes()) / (1 << 20), dtype.c_str(), device.c_str(),
                source.c_str());
    json r = cpu::generate_report(cfg.scheme, st, inf.cache_bytes(), dtype);
    r["peak_mem_gib"] = gib(double(peak));
    r["device"] = device;
    r["tokens"] = out;
    std::printf("GENERATE %s\n", r.dump().c_str());
    return 0;
}

}  // namespace gpu
}  // namespace ldm
