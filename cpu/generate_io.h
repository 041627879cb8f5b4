// The command-line side of text generation, shared by generate_cpu and the GPU trainers'
// --generate (cuda/infer_cli.cuh): building the prompt, checking the context, printing the text
// and the one-line GENERATE {json} report. The generation itself is cpu::generate_loop
// (cpu/infer.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cli.h"
#include "core/common.h"
#include "core/tokenizer.h"
#include "cpu/infer.h"
#include "cpu/rng.h"

namespace ldm {
namespace cpu {

// The prompt and sampling flags of generate_cpu and of the GPU trainers' --generate.
struct GenerationFlags {
    std::string prompt;
    int prompt_len = 0, max_new = 64, max_len = 0, top_k = 0;
    double temperature = 1.0, top_p = 1.0;
    bool greedy = false, stop_at_eot = false;

    SamplingParams sampling() const {
        SamplingParams sp;
        sp.greedy = greedy;
        sp.temperature = temperature;
        sp.top_k = top_k;
        sp.top_p = top_p;
        return sp;
    }
};

// Adds --prompt, --prompt-len, --max-new-tokens, --max-len, --greedy, --temperature, --top-k,
// --top-p, --stop-at-eot. The two prompt flags' help texts come from the program.
inline void add_generation_flags(ArgParser& ap, GenerationFlags& g, const char* prompt_help,
                                 const char* prompt_len_help) {
    ap.add("--prompt", &g.prompt, prompt_help);
    ap.add("--prompt-len", &g.prompt_len, prompt_len_help);
    ap.add("--max-new-tokens", &g.max_new, "tokens to generate");
    ap.add("--max-len", &g.max_len, "context (KV cache) length; 0 = the model's seq_len");
    ap.add("--greedy", &g.greedy, "argmax decoding (same as --temperature 0 or --top-k 1)");
    ap.add("--temperature", &g.temperature, "softmax temperature (<= 0: greedy)");
    ap.add("--top-k", &g.top_k, "sample among the k most probable tokens (0 = all)");
    ap.add("--top-p", &g.top_p, "nucleus sampling: smallest set with this probability mass (1 = all)");
    ap.add("--stop-at-eot", &g.stop_at_eot, "stop after generating <|endoftext|>");
}

// Range checks of those flags; throws ldm::Error naming the flag.
inline void check_generation_flags(const GenerationFlags& g) {
    if (g.max_new < 1) throw Error("--max-new-tokens must be >= 1");
    if (g.top_k < 0) throw Error("--top-k must be >= 0");
    if (!(g.top_p > 0 && g.top_p <= 1)) throw Error("--top-p must be in (0, 1]");
    if (!std::isfinite(g.temperature)) throw Error("--temperature must be a finite number (<= 0: greedy)");
    if (g.prompt_len < 0) throw Error("--prompt-len must be >= 0");
    if (g.prompt_len > 0 && !g.prompt.empty()) throw Error("give --prompt or --prompt-len, not both");
    if (g.max_len < 0) throw Error("--max-len must be >= 0");
}

// n token ids drawn uniformly from [0, V) with the splitmix64 stream (seed, 7) (cpu/rng.h):
// the synthetic prompts of --prompt-len (timing, and the GPU --infer-check inputs).
inline std::vector<int32_t> random_token_ids(uint64_t seed, int64_t n, int V) {
    std::vector<int32_t> ids((size_t)n);
    const uint64_t s0 = init_stream(seed, 7);
    for (int64_t i = 0; i < n; i++) ids[(size_t)i] = int32_t(stream_uniform(s0, (uint64_t)i) * V);
    return ids;
}

// The prompt of a generation run: prompt_len > 0 gives random_token_ids(seed, prompt_len, V);
// otherwise `text` encoded by tok (an empty text starts from <|endoftext|>). Throws ldm::Error
// without a tokenizer for a text prompt, or for a token id >= V (tokenizer/model mismatch).
inline std::vector<int32_t> generation_prompt(const Tokenizer* tok, const std::string& text, int prompt_len,
                                              uint64_t seed, int V) {
    if (prompt_len > 0) return random_token_ids(seed, prompt_len, V);
    if (!tok)
        throw Error("--prompt needs the tokenizer (--tokenizer or the data directory's gpt2_tokenizer; or use "
                    "--prompt-len N for random ids)");
    std::vector<uint32_t> ids = tok->encode(text, "--prompt");
    if (ids.empty()) ids.push_back(tok->eot_id());
    std::vector<int32_t> prompt;
    for (uint32_t id : ids) {
        if (id >= (uint32_t)V) throw Error(strprintf("--prompt: token id %u is outside the model's vocabulary (%d)", id, V));
        prompt.push_back((int32_t)id);
    }
    return prompt;
}

// The KV-cache length: max_len (> 0) or the model's seq_len. Throws ldm::Error when it exceeds
// seq_len or the prompt does not fit.
inline int generation_context(int max_len, int seq_len, size_t prompt_tokens) {
    const int ctx = max_len > 0 ? max_len : seq_len;
    if (ctx > seq_len) throw Error(strprintf("--max-len %d exceeds the model's seq_len %d", ctx, seq_len));
    if ((int64_t)prompt_tokens > ctx)
        throw Error(strprintf("the prompt has %zu tokens, more than the context of %d", prompt_tokens, ctx));
    return ctx;
}

// Writes the text of `ids` to stdout as raw bytes (a NUL byte included); an id the tokenizer has
// no entry for (a random-init model with --vocab-size above the tokenizer's) is written as
// "[id N]".
inline void write_decoded(const Tokenizer& tok, const std::vector<int32_t>& ids) {
    std::vector<uint32_t> run;
    auto flush = [&] {
        const std::string text = tok.decode(run);
        std::fwrite(text.data(), 1, text.size(), stdout);
        run.clear();
    };
    for (int32_t t : ids) {
        if (t >= 0 && uint32_t(t) < tok.vocab_size()) {
            run.push_back(uint32_t(t));
        } else {
            flush();
            std::printf("[id %d]", t);
        }
    }
    flush();
}

// Prints the prompt and the generated text (a random prompt is shown as "[random prompt] "), or
// the generated ids without a tokenizer, then a "---" line.
inline void print_generation(const Tokenizer* tok, const std::vector<int32_t>& prompt, const std::vector<int32_t>& out,
                             bool random_prompt) {
    if (tok) {
        if (!random_prompt) write_decoded(*tok, prompt);
        if (random_prompt) std::printf("[random prompt] ");
        write_decoded(*tok, out);
        std::printf("\n");
    } else {
        for (int32_t t : out) std::printf("%d ", t);
        std::printf("\n");
    }
    std::printf("---\n");
}

// --stop-at-eot needs the tokenizer's <|endoftext|> id: ldm::Error without a tokenizer.
inline void check_stop_at_eot(const GenerationFlags& g, const Tokenizer* tok) {
    if (g.stop_at_eot && !tok)
        throw Error("--stop-at-eot needs a tokenizer (its <|endoftext|> id): pass --tokenizer");
}

// The checks of a generation run that need no model or prompt yet (so that nothing is allocated
// first): check_stop_at_eot, and a --prompt-len that does not fit the context
// (generation_context). Throws ldm::Error naming the flag.
inline void check_generation_setup(const GenerationFlags& g, const Tokenizer* tok, int seq_len) {
    check_stop_at_eot(g, tok);
    if (g.prompt_len > 0) (void)generation_context(g.max_len, seq_len, size_t(g.prompt_len));
}

// Says once on stderr when the context (ctx tokens) filled up and the rest was generated on a
// sliding window of the last ctx tokens (cpu::generate_loop), so that the change of conditioning
// (and of speed: one prefill per token) is not a surprise.
inline void note_context_window(const GenerateStats& st, int ctx) {
    if (st.window_steps == 0) return;
    std::fprintf(stderr, "note: the context of %d tokens (--max-len, the model's seq_len) filled after %d new tokens; "
                         "the last %d were each predicted from the previous %d tokens (sliding window, re-prefilled "
                         "per token)\n",
                 ctx, st.new_tokens - st.window_steps, st.window_steps, ctx);
}

// The GENERATE report's common keys: scheme, prompt/new tokens, prefill ms and tokens/s, decode
// steps, mean/median ms per token and tokens/s, KV-cache bytes, dtype. Callers add their own.
inline nlohmann::json generate_report(const std::string& scheme, const GenerateStats& st, int64_t kv_cache_bytes,
                                      const std::string& dtype) {
    const double dmean = st.mean_decode_ms();
    return nlohmann::json{{"scheme", scheme},
                          {"prompt_tokens", st.prompt_tokens},
                          {"new_tokens", st.new_tokens},
                          {"prefill_ms", st.prefill_s * 1e3},
                          {"prefill_tokens_per_s", st.prefill_tokens_per_s()},
                          {"decode_steps", (int64_t)st.decode_ms.size()},
                          {"decode_ms_mean", dmean},
                          {"decode_ms_median", st.median_decode_ms()},
                          {"decode_tokens_per_s", dmean > 0 ? 1e3 / dmean : 0.0},
                          {"window_steps", st.window_steps},
                          {"window_ms", st.window_s * 1e3},
                          {"kv_cache_bytes", kv_cache_bytes},
                          {"dtype", dtype}};
}

}  // namespace cpu
}  // namespace ldm
