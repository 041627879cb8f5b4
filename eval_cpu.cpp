// eval_cpu.cpp — the CPU evaluator (build/eval_cpu): loads a model checkpoint (core/checkpoint.h,
// any scheme the CPU model implements) and reports validation loss/ppl, WikiText-2 word/byte
// perplexity and bits per byte, LAMBADA ppl/acc and HellaSwag acc/acc_norm from the eval
// binaries of `ldm_data lambada|wikitext|hellaswag`. Semantics: ../shared/spec/evals.md; the
// shared code is core/eval.h; usage: doc/evaluation.md.
//
//   build/eval_cpu --checkpoint out/run/ckpt_000200.model --val-data "out/data/val_*.bin"
//       --wikitext out/eval/wikitext2.bin --lambada out/eval/lambada.bin
//       --hellaswag out/eval/hellaswag.bin --out out/run/eval.json
//
// Errors (bad flags, missing/corrupt checkpoint or eval file, tokenizer mismatch) print
// "error: ..." and exit with status 1.
#include <cblas.h>
#include <omp.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/checkpoint.h"
#include "core/cli.h"
#include "core/common.h"
#include "core/config.h"
#include "core/eval.h"
#include "core/tokenizer.h"
#include "cpu/model.h"

using namespace ldm;
using nlohmann::json;

namespace {

struct Options {
    std::string checkpoint, out, tokenizer, dtype = "fp32";
    std::string val_data, wikitext, lambada, hellaswag;
    int val_B = 8, val_T = 0, max_length = 0, threads = 0, max_rows = 64;
    int64_t val_batches = 20, max_examples = 0, max_docs = 0, batch_tokens = 4096;
    bool quiet = false;
};

template <typename R>
json run(const Options& o, const ModelCheckpoint& ck, const EvalSuite& suite, const LoadedEvalSets& sets) {
    const ModelConfig& cfg = ck.cfg;
    cpu::Model<R> model(cfg);
    for (size_t i = 0; i < model.params.size(); i++) model.params[i] = R(ck.params[i]);
    std::unique_ptr<ScoringModel> sm = make_cpu_scoring_model(model);
    return run_eval_suite(*sm, suite, sets);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        Options o;
        ArgParser ap("eval_cpu",
                     "Evaluate a model checkpoint on the CPU: validation loss/ppl, WikiText-2 word/byte ppl and "
                     "bits per byte, LAMBADA ppl/acc, HellaSwag acc/acc_norm (doc/evaluation.md).");
        ap.section("Model");
        ap.add("--checkpoint", &o.checkpoint, "model checkpoint ckpt_<step>.model, or its base ckpt_<step> (required)");
        ap.add("--dtype", &o.dtype, "fp32|fp64: precision of the CPU forward pass");
        ap.add("--tokenizer", &o.tokenizer,
               "optional: bytes, a tokenizer dir or tokenizer.json; its vocab size and end-of-text id must "
               "match the model and every eval binary");
        ap.section("Evaluations (each runs when its input is given)");
        ap.add("--val-data", &o.val_data, "glob of validation token shards (read in order, no shuffling)");
        ap.add("--val-batches", &o.val_batches, "validation batches of val-B x val-T tokens (0 = one full pass)");
        ap.add("--val-B", &o.val_B, "validation rows per batch");
        ap.add("--val-T", &o.val_T, "validation sequence length (0 = the model's seq_len)");
        ap.add("--wikitext", &o.wikitext, "WikiText-2 eval binary (ldm_data wikitext)");
        ap.add("--max-length", &o.max_length, "WikiText rolling-window length L (0 = the model's seq_len)");
        ap.add("--max-docs", &o.max_docs, "evaluate only the first N WikiText documents (0 = all)");
        ap.add("--lambada", &o.lambada, "LAMBADA eval binary (ldm_data lambada)");
        ap.add("--hellaswag", &o.hellaswag, "HellaSwag eval binary (ldm_data hellaswag)");
        ap.add("--max-examples", &o.max_examples, "evaluate only the first N LAMBADA examples / HellaSwag items (0 = all)");
        ap.section("Batching, output");
        ap.add("--batch-tokens", &o.batch_tokens, "tokens per forward batch (rows B = batch-tokens / T)");
        ap.add("--max-rows", &o.max_rows, "at most this many rows per forward batch");
        ap.add("--threads", &o.threads, "OpenMP and BLAS threads (0 = all cores)");
        ap.add("--out", &o.out, "write the results as JSON to FILE (atomically)");
        ap.add("--quiet", &o.quiet, "no progress line");
        if (!ap.parse(argc, argv)) return 0;

        if (o.checkpoint.empty()) throw Error("--checkpoint is required (a ckpt_<step>.model file)");
        o.checkpoint = model_file_of(o.checkpoint);  // a checkpoint base (dir/ckpt_000100) too
        if (o.dtype != "fp32" && o.dtype != "fp64") throw Error("--dtype must be fp32 or fp64, got '" + o.dtype + "'");
        if (o.val_data.empty() && o.wikitext.empty() && o.lambada.empty() && o.hellaswag.empty())
            throw Error("nothing to evaluate: give at least one of --val-data, --wikitext, --lambada, --hellaswag");
        if (o.val_B < 1) throw Error("--val-B must be >= 1");
        if (o.val_T < 0 || o.max_length < 0 || o.max_docs < 0 || o.max_examples < 0 || o.val_batches < 0)
            throw Error("--val-T, --max-length, --max-docs, --max-examples and --val-batches must be >= 0");
        if (o.batch_tokens < 1 || o.max_rows < 1) throw Error("--batch-tokens and --max-rows must be >= 1");
        check_threads_flag(o.threads);
        if (!o.out.empty()) {  // checked now, not after the whole evaluation
            const size_t slash = o.out.find_last_of('/');
            prepare_output_dir(slash == std::string::npos ? "." : o.out.substr(0, slash + (slash == 0)), "--out");
            struct stat st;
            if (::stat(o.out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
                throw Error("--out: " + o.out + " is a directory (give a file name)");
        }
        const int threads = o.threads > 0 ? o.threads : omp_get_num_procs();
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);

        ModelCheckpoint ck = load_model(o.checkpoint);
        const uint32_t V = uint32_t(ck.cfg.vocab_size);

        EvalSuite s;
        s.val_data = o.val_data;
        s.val_B = o.val_B;
        s.val_T = o.val_T;
        s.val_batches = o.val_batches;
        s.wikitext = o.wikitext;
        s.lambada = o.lambada;
        s.hellaswag = o.hellaswag;
        s.max_length = o.max_length;
        s.max_examples = o.max_examples;
        s.max_docs = o.max_docs;
        s.batch.batch_tokens = o.batch_tokens;
        s.batch.max_rows = o.max_rows;
        s.print_progress = !o.quiet;
        if (!o.tokenizer.empty()) {
            const std::unique_ptr<Tokenizer> tok = load_tokenizer_flag(o.tokenizer);
            if (tok->vocab_size() != V)
                throw Error(strprintf("--tokenizer %s has %u ids but the model %s has vocab_size %u: tokenizer mismatch",
                                      o.tokenizer.c_str(), tok->vocab_size(), o.checkpoint.c_str(), V));
            s.expected_eot = tok->eot_id();
            s.expected_fingerprint = tokenizer_fingerprint(*tok);
        }
        if (o.max_length > ck.cfg.seq_len)
            throw Error(strprintf("--max-length %d exceeds the model's context (seq_len %d)", o.max_length,
                                  ck.cfg.seq_len));
        if (s.val_T > ck.cfg.seq_len)
            throw Error(strprintf("--val-T %d exceeds the model's seq_len %d", s.val_T, ck.cfg.seq_len));
        LoadedEvalSets sets = load_eval_sets(s, V);

        std::printf("eval_cpu: %s (step %lld) | %s %s | %lld parameters | seq_len %d | %s | %d threads\n",
                    o.checkpoint.c_str(), (long long)ck.step, ck.cfg.preset.c_str(), ck.cfg.scheme.c_str(),
                    (long long)count_params(ck.cfg), ck.cfg.seq_len, o.dtype.c_str(), threads);
        std::fflush(stdout);
        const auto t0 = std::chrono::steady_clock::now();
        json res = o.dtype == "fp64" ? run<double>(o, ck, s, sets) : run<float>(o, ck, s, sets);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

        json out{{"checkpoint", o.checkpoint},
                 {"step", ck.step},
                 {"preset", ck.cfg.preset},
                 {"scheme", ck.cfg.scheme},
                 {"params", count_params(ck.cfg)},
                 {"seq_len", ck.cfg.seq_len},
                 {"config", config_to_json(ck.cfg)},
                 {"dtype", o.dtype},
                 {"threads", threads},
                 {"seconds", sec},
                 {"results", res}};
        std::printf("%s", format_results_table(res).c_str());
        std::printf("total %.1f s\n", sec);
        if (!o.out.empty()) {
            const std::string text = out.dump(2) + "\n";
            write_file_atomic(o.out, text.data(), text.size());
            std::printf("results written to %s\n", o.out.c_str());
        }
        return 0;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
