// generate_cpu.cpp — text generation on the CPU (build/generate_cpu): loads a model checkpoint
// (or builds a randomly initialised preset, for timing), encodes --prompt with the tokenizer,
// runs a prefill and incremental decode with the KV cache of cpu/infer.h, samples greedily
// or with temperature / top-k / top-p, prints the text and the timing: prefill tokens/s and the
// per-token decode latency (spec performance.md, "inference"), plus one machine-readable line
//   GENERATE {"prompt_tokens":..,"new_tokens":..,"prefill_tokens_per_s":..,"decode_ms_mean":..,...,"tokens":[..]}
//
//   build/generate_cpu --checkpoint runs/ldm/ckpt_000200.model --prompt "The meaning of" --max-new-tokens 64 --top-p 0.9 --temperature 0.8 --seed 1
//   build/generate_cpu --preset small --scheme ldm --prompt-len 256 --max-new-tokens 32 --greedy
//
// Errors (bad flags, missing/corrupt checkpoint, tokenizer mismatch) print "error: ..." and exit 1.
#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint.h"
#include "core/cli.h"
#include "core/common.h"
#include "core/config.h"
#include "core/tokenizer.h"
#include "cpu/generate_io.h"
#include "cpu/infer.h"
#include "cpu/model.h"
#include "cpu/rng.h"

using namespace ldm;
using nlohmann::json;

namespace {

struct Options : cpu::GenerationFlags {  // + --prompt ... --stop-at-eot
    std::string checkpoint, tokenizer, dtype = "fp32";
    // random-init model (no --checkpoint)
    std::string preset, scheme = "preln", ldm_rule = "rls";
    bool ldm_no_residual = false, print_config = false;
    int seq_len = 1024, init_seed = 1, n_layer = 0, d_model = 0, vocab_size = 0;
    int threads = 0;
    bool quiet = false;
    int64_t seed = 1;
    ModelConfig cfg_over;  // scheme options of the random-init model (defaults of ModelConfig)
};

template <typename R>
int run(const Options& o, const ModelConfig& cfg, const std::vector<float>* ck_params, const Tokenizer* tok) {
    cpu::check_generation_setup(o, tok, cfg.seq_len);  // before the model and prompt are allocated
    cpu::Model<R> model(cfg);
    if (ck_params) {
        for (size_t i = 0; i < model.params.size(); i++) model.params[i] = R((*ck_params)[i]);
    } else {
        model.init((uint64_t)o.init_seed);
    }
    const int V = cfg.vocab_size;
    const std::vector<int32_t> prompt = cpu::generation_prompt(tok, o.prompt, o.prompt_len, (uint64_t)o.seed, V);
    const int ctx = cpu::generation_context(o.max_len, cfg.seq_len, prompt.size());
    cpu::Inference<R> inf(model, 1, ctx);
    const cpu::SamplingParams sp = o.sampling();
    const int32_t stop = (o.stop_at_eot && tok) ? (int32_t)tok->eot_id() : -1;
    cpu::GenerateStats st;
    std::vector<int32_t> out = cpu::generate(inf, prompt, o.max_new, sp, (uint64_t)o.seed, stop, &st);

    if (!o.quiet) cpu::print_generation(tok, prompt, out, o.prompt_len > 0);
    cpu::note_context_window(st, ctx);
    const double dmean = st.mean_decode_ms(), dmed = st.median_decode_ms();
    std::printf("prefill: %d tokens in %.2f ms (%.1f tokens/s) | decode: %zu steps, %.3f ms/token mean, "
                "%.3f ms median (%.1f tokens/s) | KV cache %.2f MiB (%s, %d threads)\n",
                st.prompt_tokens, st.prefill_s * 1e3, st.prefill_tokens_per_s(), st.decode_ms.size(), dmean,
                dmed, dmean > 0 ? 1e3 / dmean : 0.0, double(inf.cache().bytes()) / (1 << 20), o.dtype.c_str(),
                omp_get_max_threads());
    json r = cpu::generate_report(cfg.scheme, st, inf.cache().bytes(), o.dtype);
    r["threads"] = omp_get_max_threads();
    r["tokens"] = out;
    std::printf("GENERATE %s\n", r.dump().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        Options o;
        ArgParser ap("generate_cpu",
                     "Generate text on the CPU with a KV cache (prefill + incremental decode); prints prefill "
                     "tokens/s and per-token decode latency. See doc/benchmarks.md.");
        ap.section("Model");
        ap.add("--checkpoint", &o.checkpoint, "model checkpoint (.model, or its base ckpt_<step>) to load");
        ap.add("--preset", &o.preset, "without --checkpoint: a randomly initialised preset (timing only)");
        ap.add("--scheme", &o.scheme, "random-init model: preln|hc|mhc|attnres-full|attnres-block|ldm");
        ap.add("--ldm-rule", &o.ldm_rule, "random-init model: rls|delta|outer");
        ap.add("--no-residual", &o.ldm_no_residual, "random-init model: LDM without the residual (as train_cpu)");
        ap.add("--ldm-no-residual", &o.ldm_no_residual, "same as --no-residual (older spelling)");
        ap.add("--seq-len", &o.seq_len, "random-init model: context length");
        ap.add("--n-layer", &o.n_layer, "random-init model: override the preset's number of blocks (0 = preset)");
        ap.add("--d-model", &o.d_model, "random-init model: override the preset's width d (0 = preset)");
        ap.add("--vocab-size", &o.vocab_size, "random-init model: V (0 = the tokenizer's, else 50257)");
        ap.add("--hc-streams", &o.cfg_over.hc_streams, "random-init model: HC/mHC streams n");
        ap.add("--sinkhorn-iters", &o.cfg_over.sinkhorn_iters, "random-init model: mHC Sinkhorn iterations");
        ap.add("--attnres-blocks", &o.cfg_over.attnres_blocks, "random-init model: Block AttnRes blocks N");
        ap.add("--ldm-heads", &o.cfg_over.ldm_heads, "random-init model: LDM memory heads");
        ap.add("--ldm-dk", &o.cfg_over.ldm_dk, "random-init model: LDM key size d_k");
        ap.add("--ldm-mode", &o.cfg_over.ldm_mode, "random-init model: LDM mode store|unwind|window");
        ap.add("--ldm-window", &o.cfg_over.ldm_window, "random-init model: LDM window w");
        ap.add("--print-config", &o.print_config,
               "print {\"config\", \"param_specs\", \"param_count\"} of the model as one JSON line and exit "
               "(scripts/torch_bench.py builds its PyTorch peer from it)");
        ap.add("--init-seed", &o.init_seed, "random-init model: init seed");
        ap.add("--dtype", &o.dtype, "fp32|fp64");
        ap.section("Prompt and sampling");
        ap.add("--tokenizer", &o.tokenizer,
               "bytes (256 byte ids + EOT), tokenizer dir (encoder.json + vocab.bpe) or tokenizer.json "
               "(\"\" = <data dir>/gpt2_tokenizer)");
        cpu::add_generation_flags(ap, o, "prompt text (\"\" = start from <|endoftext|>)",
                                  "instead of --prompt: N random token ids (timing)");
        ap.add("--seed", &o.seed, "sampling seed (and of --prompt-len ids)");
        ap.section("Run");
        ap.add("--threads", &o.threads, "OpenMP and BLAS threads (0 = all cores)");
        ap.add("--quiet", &o.quiet, "print only the timing lines");
        if (!ap.parse(argc, argv)) return 0;

        if (o.dtype != "fp32" && o.dtype != "fp64") throw Error("--dtype must be fp32 or fp64, got '" + o.dtype + "'");
        cpu::check_generation_flags(o);
        check_threads_flag(o.threads);
        if (o.checkpoint.empty() == o.preset.empty()) throw Error("give exactly one of --checkpoint and --preset");
        for (const auto& [flag, v] : {std::pair<const char*, int>{"--n-layer", o.n_layer}, {"--d-model", o.d_model}})
            if (v < 0) throw Error(strprintf("%s must be >= 0 (0 = the preset's), got %d", flag, v));
        if (o.vocab_size < 0)
            throw Error(strprintf("--vocab-size must be >= 0 (0 = the tokenizer's, else 50257), got %d", o.vocab_size));
        const int threads = o.threads > 0 ? o.threads : omp_get_num_procs();
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);

        ModelCheckpoint ck;
        if (!o.checkpoint.empty()) {
            o.checkpoint = model_file_of(o.checkpoint);  // a checkpoint base (dir/ckpt_000100) too
            ck = load_model(o.checkpoint);
            // a byte-level model (257 ids: only the byte tokenizer has that many) needs no --tokenizer
            if (o.tokenizer.empty() && ck.cfg.vocab_size == 257) {
                o.tokenizer = "bytes";
                std::fprintf(stderr, "note: the model has 257 ids: --tokenizer bytes\n");
            }
        }
        std::unique_ptr<Tokenizer> tok;
        if (!(o.print_config && o.tokenizer.empty())) tok = load_tokenizer_flag(o.tokenizer);
        if (!tok && o.prompt_len == 0 && !o.print_config)
            throw Error("--tokenizer: none given and no gpt2_tokenizer in the data directory (or use --prompt-len)");

        ModelConfig cfg;
        if (!o.checkpoint.empty()) {
            cfg = ck.cfg;
            if (tok && tok->vocab_size() != (uint32_t)cfg.vocab_size)
                throw Error(strprintf("--tokenizer %s has %u ids but the model has vocab_size %d: tokenizer mismatch%s",
                                      o.tokenizer.empty() ? "<data dir>/gpt2_tokenizer" : o.tokenizer.c_str(),
                                      tok->vocab_size(), cfg.vocab_size,
                                      cfg.vocab_size == 257 ? " (257 ids is the byte tokenizer: --tokenizer bytes)" : ""));
        } else {
            if (tok && o.vocab_size > 0 && uint32_t(o.vocab_size) < tok->vocab_size())
                throw Error(strprintf("--vocab-size %d is smaller than the tokenizer's %u ids", o.vocab_size,
                                      tok->vocab_size()));
            cfg = preset_config(o.preset, o.vocab_size > 0 ? o.vocab_size : tok ? (int)tok->vocab_size() : 50257);
            if (o.n_layer > 0) cfg.n_layer = o.n_layer;
            if (o.d_model > 0) cfg.d_model = o.d_model;
            cfg.seq_len = o.seq_len;
            cfg.scheme = o.scheme;
            cfg.hc_streams = o.cfg_over.hc_streams;
            cfg.sinkhorn_iters = o.cfg_over.sinkhorn_iters;
            cfg.attnres_blocks = o.cfg_over.attnres_blocks;
            cfg.ldm_rule = o.ldm_rule;
            cfg.ldm_residual = !o.ldm_no_residual;
            cfg.ldm_heads = o.cfg_over.ldm_heads;
            cfg.ldm_dk = o.cfg_over.ldm_dk;
            cfg.ldm_mode = o.cfg_over.ldm_mode;
            cfg.ldm_window = o.cfg_over.ldm_window;
            cfg.validate();
        }
        if (o.print_config) {
            json specs = json::array();
            for (const ParamSpec& s : param_specs(cfg)) specs.push_back({{"name", s.name}, {"shape", s.shape}});
            json cj = config_to_json(cfg);
            cj["ldm_mode"] = cfg.ldm_mode;  // training options, left out of config_to_json on purpose
            cj["ldm_window"] = cfg.ldm_window;
            std::printf("%s\n", json{{"config", cj}, {"param_specs", specs}, {"param_count", count_params(cfg)}}.dump().c_str());
            return 0;
        }
        if (!o.quiet)
            std::printf("generate_cpu: %s | %s | %lld parameters | seq_len %d | %s | %d threads\n",
                        o.checkpoint.empty() ? ("random " + o.preset).c_str() : o.checkpoint.c_str(),
                        cfg.scheme.c_str(), (long long)count_params(cfg), cfg.seq_len, o.dtype.c_str(), threads);
        const std::vector<float>* p = o.checkpoint.empty() ? nullptr : &ck.params;
        return o.dtype == "fp64" ? run<double>(o, cfg, p, tok.get()) : run<float>(o, cfg, p, tok.get());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
