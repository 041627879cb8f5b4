// core/eval.h — the evaluator: validation loss, WikiText-2 rolling-window perplexities, LAMBADA
// and HellaSwag, computed from the eval binaries of core/evalfile.h with the semantics of
// ../shared/spec/evals.md (EleutherAI lm-evaluation-harness, zero-shot). Owner: eval.
// Walkthrough and examples: doc/evaluation.md.
//
// Everything is generic over ScoringModel, the one thing a backend provides: a batched forward
// that returns, for the positions asked for, ln p(target) and whether the target is the argmax.
// The CPU reference plugs in through make_cpu_scoring_model (a few lines); a GPU trainer
// implements forward_logprobs with its own forward pass plus a per-row log-softmax gather, so no
// [B*T, V] logits ever leave the device.
//
// Units: log-likelihoods in nats; perplexities are exp of a mean negative log-likelihood;
// bits_per_byte = -sum ll / bytes / ln 2.
// Error policy: ldm::Error naming the file / flag / example at fault.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/evalfile.h"

namespace ldm {

namespace cpu {
template <typename R>
struct Model;
}

// ---- The scoring-model interface ---------------------------------------------------------------
class ScoringModel {
 public:
  virtual ~ScoringModel() = default;
  // Longest input row (the model's context window, tokens).
  virtual int max_seq_len() const = 0;
  // Number of real token ids V (inputs and targets must be < V).
  virtual uint32_t vocab_size() const = 0;
  // tokens, targets: [B*T] int32 row-major (b, t); T <= max_seq_len(). Causal: position t sees
  // tokens[b, 0..t]. For every position with targets[i] >= 0 writes
  //   logprob[i]   = ln softmax(logits[i, 0:V])[targets[i]]            (nats, double)
  //   is_argmax[i] = 1 if targets[i] == argmax_v logits[i, v] (first index on ties), else 0.
  // Positions with targets[i] < 0 are padding: their outputs are unspecified and need not be
  // computed. Throws ldm::Error on bad ids / shapes.
  virtual void forward_logprobs(const int32_t* tokens, const int32_t* targets, int B, int T,
                                double* logprob, uint8_t* is_argmax) = 0;
};

// The CPU reference model (cpu/model.h) behind ScoringModel: one Model::forward (logits
// only) then a per-row log-softmax over the real V on all cores. The model is borrowed (must
// outlive the adapter); max_seq_len = model.cfg.seq_len.
std::unique_ptr<ScoringModel> make_cpu_scoring_model(cpu::Model<float>& model);
std::unique_ptr<ScoringModel> make_cpu_scoring_model(cpu::Model<double>& model);

// One row's log-softmax gather, shared by backends that have logits on the host:
// logits [V] (any stride beyond V is ignored); returns ln softmax(logits)[target] (computed in
// double) and sets *is_argmax as in forward_logprobs.
template <typename R>
double row_logprob(const R* logits, int V, int target, uint8_t* is_argmax);

// ---- Rolling windows (evals.md "WikiText-2") -------------------------------------------------
// Document of N tokens t[0..N), extended sequence e = [prefix] + t (e[k+1] = t[k]). Window w
// feeds the model e[begin, begin + len) (len <= L) and predicts t[begin, begin + len) (the
// target of input position j is e[begin + j + 1] = t[begin + j]); only the LAST n_scored
// positions count. First window: begin 0, len = n_scored = min(L, N) ([EOT] + t[0:L-1] scores
// t[0:L]); then disjoint blocks of L scored tokens, each input starting one token before its
// block (begin = block_end - L, len = L); the last partial block is right-aligned (full L-token
// input, scores its last r tokens). Every token is scored exactly once, in order.
// L >= 1 (ldm::Error otherwise); N = 0 gives no windows.
struct RollingWindow {
  int64_t begin = 0;  // index into e (0 = the prefix token)
  int len = 0;        // input tokens
  int n_scored = 0;   // scored positions: the last n_scored of the len
};
std::vector<RollingWindow> rolling_windows(int64_t N, int L);

// ---- Batched scoring of (context, continuation) requests -----------------------------------
// A request is a token sequence s (length >= 2) of which the LAST n_scored tokens are scored,
// teacher-forced: input = s[0 : len-1], ll = sum of ln p(s[k] | s[0:k]) over the scored k.
// Callers truncate on the left beforehand so that len - 1 <= max_seq_len (make_request does).
struct ScoreRequest {
  std::vector<int32_t> tokens;
  int n_scored = 0;
};
struct ScoreResult {
  double ll = 0;          // sum of ln p over the scored tokens (nats)
  bool all_argmax = true; // every scored token is the argmax (greedy match)
};
// The harness's request for context `ctx` and continuation `cont`: whole = ctx + cont (ctx empty
// -> [prefix_token]), kept to its last max_len + 1 tokens (left truncation), scores the
// min(|cont|, kept - 1) last tokens. ldm::Error if cont is empty.
ScoreRequest make_request(const std::vector<uint32_t>& ctx, const std::vector<uint32_t>& cont,
                          int max_len, uint32_t prefix_token);

// Progress: called after every batch with (requests done, total, input tokens processed
// (padding excluded), seconds since start).
using ProgressFn = std::function<void(size_t done, size_t total, int64_t tokens, double seconds)>;

struct BatchOptions {
  int64_t batch_tokens = 4096;  // rows per batch = max(1, batch_tokens / T_batch)
  int max_rows = 64;            // cap on B
  int round_T = 16;             // batch T rounded up to a multiple of this (<= max_seq_len):
                                // fewer distinct shapes for backends that re-plan per (B, T)
  ProgressFn progress;          // may be empty
};
// Scores requests in batches: sorted by length (longest first), right-padded (pad token 0,
// target -1: causality makes padding invisible). Results are in the order of `reqs`.
// ldm::Error if a request is longer than max_seq_len + 1 or shorter than 2.
std::vector<ScoreResult> score_requests(ScoringModel& m, const std::vector<ScoreRequest>& reqs,
                                        const BatchOptions& opt);

// ---- The evaluations -----------------------------------------------------------------------
// Tokenizer check of an eval binary against the model: vocab_size must equal model_vocab and
// eot_id must be < vocab; when expected_eot >= 0 (a tokenizer was given) eot_id must equal it;
// when expected_fingerprint and the binary's fingerprint are both non-zero they must be equal
// (core/tokenizer.h tokenizer_fingerprint). ldm::Error naming `path` and both values otherwise.
void check_eval_tokenizer(const EvalTokenizerInfo& t, uint32_t model_vocab, int64_t expected_eot,
                          const std::string& path, uint64_t expected_fingerprint = 0);

struct ValResult {
  int64_t batches = 0, tokens = 0;
  double loss = 0, ppl = 0;  // mean token cross-entropy (nats), exp(loss)
  double seconds = 0;
};
// Validation loss: the first n_batches batches of B x T tokens of the shard glob read in order
// (DataLoader, no shuffling; n_batches <= 0 or more than available = one full pass), scored
// through forward_logprobs (all positions). evals.md "Validation loss / perplexity".
ValResult eval_val(ScoringModel& m, const std::string& pattern, int B, int T, int64_t n_batches,
                   const BatchOptions& opt);

struct WikiTextResult {
  int64_t docs = 0, tokens = 0, windows = 0;
  uint64_t words = 0, bytes = 0;
  double ll = 0;  // sum over the scored tokens (nats)
  double word_perplexity = 0, byte_perplexity = 0, bits_per_byte = 0;
  int max_length = 0;
  double seconds = 0;
};
// Rolling log-likelihood of the first max_docs documents (<= 0: all) with windows of
// max_length tokens (<= 0: the model's max_seq_len; must be <= it) and prefix = set.tok.eot_id.
WikiTextResult eval_wikitext(ScoringModel& m, const WikiTextSet& set, int max_length, int64_t max_docs,
                             const BatchOptions& opt);

struct LambadaResult {
  int64_t examples = 0, target_tokens = 0, correct = 0;
  int64_t truncated_targets = 0;  // examples whose target is longer than the window: its last
                                  // max_seq_len tokens are scored (make_request), ll and acc on those
  double ll = 0;           // sum over examples
  double ppl = 0, acc = 0; // exp(-ll / examples); correct / examples
  double seconds = 0;
};
// ldm::Error on an empty set (no examples / items / words: the means would be NaN).
LambadaResult eval_lambada(ScoringModel& m, const LambadaSet& set, int64_t max_examples,
                           const BatchOptions& opt);

struct HellaSwagResult {
  int64_t items = 0, correct = 0, correct_norm = 0;
  int64_t truncated_endings = 0;  // endings longer than the window: only their last max_seq_len
                                  // tokens are scored (make_request)
  double acc = 0, acc_norm = 0;
  double seconds = 0;
};
// acc: argmax_k ll_k == label; acc_norm: argmax_k ll_k / ending_chars_k == label (first maximum
// on ties, like numpy.argmax). An ending with 0 characters divides by 1.
HellaSwagResult eval_hellaswag(ScoringModel& m, const HellaSwagSet& set, int64_t max_examples,
                               const BatchOptions& opt);

nlohmann::json to_json(const ValResult& r);
nlohmann::json to_json(const WikiTextResult& r);
nlohmann::json to_json(const LambadaResult& r);
nlohmann::json to_json(const HellaSwagResult& r);

// ---- A configured set of evaluations (eval_cpu, in-training evaluation) ----------------------
struct EvalSuite {
  std::string val_data;           // shard glob ("" = skip)
  int val_B = 8, val_T = 0;       // val_T 0 = max_seq_len
  int64_t val_batches = 20;
  std::string wikitext, lambada, hellaswag;  // eval binaries ("" = skip)
  int max_length = 0;             // WikiText window (0 = max_seq_len)
  int64_t max_examples = 0;       // LAMBADA examples / HellaSwag items (0 = all)
  int64_t max_docs = 0;           // WikiText documents (0 = all)
  int64_t expected_eot = -1;      // >= 0: the model's tokenizer's end-of-text id
  uint64_t expected_fingerprint = 0;  // != 0: the model's tokenizer's tokenizer_fingerprint
  BatchOptions batch;
  bool print_progress = false;    // progress line on stderr (examples/s, tokens/s)
};
// Loaded, tokenizer-checked eval binaries of a suite (load once, evaluate many times).
struct LoadedEvalSets {
  std::unique_ptr<WikiTextSet> wikitext;
  std::unique_ptr<LambadaSet> lambada;
  std::unique_ptr<HellaSwagSet> hellaswag;
};
// Reads the suite's binaries and checks each against the model's vocabulary (and expected_eot,
// expected_fingerprint)
// and the binaries' tokenizer fingerprints against each other (when both are non-zero).
LoadedEvalSets load_eval_sets(const EvalSuite& s, uint32_t model_vocab);
// Runs every configured evaluation and returns {"val": {...}, "wikitext": {...},
// "lambada": {...}, "hellaswag": {...}} (only the ones configured).
nlohmann::json run_eval_suite(ScoringModel& m, const EvalSuite& s, const LoadedEvalSets& sets);

// The printed table of a run_eval_suite result: one metric per line, with a reference column
// (chance level, a uniform model's value, the order of magnitude of GPT-2 124M; doc/evaluation.md).
std::string format_results_table(const nlohmann::json& results);

}  // namespace ldm
