// core/eval.cpp — see core/eval.h and doc/evaluation.md.
#include "core/eval.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include "core/common.h"
#include "core/dataloader.h"
#include "core/train_loop.h"  // train::format_duration
#include "cpu/model.h"

namespace ldm {

using nlohmann::json;

// ---- row log-softmax -------------------------------------------------------------------------
template <typename R>
double row_logprob(const R* logits, int V, int target, uint8_t* is_argmax) {
  if (target < 0 || target >= V) throw Error(strprintf("row_logprob: target %d outside [0, %d)", target, V));
  int am = 0;
  double mx = double(logits[0]);
  for (int v = 1; v < V; v++)
    if (double(logits[v]) > mx) mx = double(logits[v]), am = v;
  double z = 0;
  for (int v = 0; v < V; v++) z += std::exp(double(logits[v]) - mx);
  if (is_argmax) *is_argmax = am == target ? 1 : 0;
  return double(logits[target]) - mx - std::log(z);
}
template double row_logprob<float>(const float*, int, int, uint8_t*);
template double row_logprob<double>(const double*, int, int, uint8_t*);

namespace {

template <typename R>
class CpuScoringModel final : public ScoringModel {
 public:
  explicit CpuScoringModel(cpu::Model<R>& m) : m_(m) {}
  int max_seq_len() const override { return m_.cfg.seq_len; }
  uint32_t vocab_size() const override { return uint32_t(m_.cfg.vocab_size); }
  void forward_logprobs(const int32_t* tokens, const int32_t* targets, int B, int T, double* logprob,
                        uint8_t* is_argmax) override {
    m_.forward(tokens, nullptr, B, T);
    const R* lg = m_.logits();
    const int V = m_.cfg.vocab_size;
    const size_t Vp = size_t(m_.cfg.padded_vocab);
    const int64_t N = int64_t(B) * T;
    for (int64_t i = 0; i < N; i++)  // validate before the parallel loop (no throw inside omp)
      if (targets[i] >= V) throw Error(strprintf("forward_logprobs: target id %d at position %lld is >= V = %d",
                                                 targets[i], (long long)i, V));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++)
      if (targets[i] >= 0) logprob[i] = row_logprob(lg + size_t(i) * Vp, V, targets[i], is_argmax + i);
  }

 private:
  cpu::Model<R>& m_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::unique_ptr<ScoringModel> make_cpu_scoring_model(cpu::Model<float>& model) {
  return std::unique_ptr<ScoringModel>(new CpuScoringModel<float>(model));
}
std::unique_ptr<ScoringModel> make_cpu_scoring_model(cpu::Model<double>& model) {
  return std::unique_ptr<ScoringModel>(new CpuScoringModel<double>(model));
}

// ---- rolling windows --------------------------------------------------------------------------
std::vector<RollingWindow> rolling_windows(int64_t N, int L) {
  if (L < 1) throw Error(strprintf("rolling_windows: window length must be >= 1, got %d", L));
  if (N < 0) throw Error("rolling_windows: negative token count");
  std::vector<RollingWindow> w;
  if (N == 0) return w;
  // First window: input [EOT] + t[0 : first-1] (e[0 : first]), scores t[0 : first].
  const int first = int(std::min<int64_t>(L, N));
  w.push_back({0, first, first});
  int64_t predicted = first;
  while (predicted < N) {
    const int r = int(std::min<int64_t>(N - predicted, L));
    const int64_t end = predicted + r;  // block t[predicted, end)
    // input t[end-L-1 : end-1] = e[end-L : end]; predicts t[end-L : end], scores the last r.
    w.push_back({end - L, L, r});
    predicted = end;
  }
  return w;
}

// ---- requests ---------------------------------------------------------------------------------
ScoreRequest make_request(const std::vector<uint32_t>& ctx, const std::vector<uint32_t>& cont, int max_len,
                          uint32_t prefix_token) {
  if (cont.empty()) throw Error("make_request: empty continuation");
  if (max_len < 1) throw Error("make_request: max_len must be >= 1");
  std::vector<int32_t> whole;
  whole.reserve(ctx.size() + cont.size() + 1);
  if (ctx.empty()) whole.push_back(int32_t(prefix_token));
  for (uint32_t x : ctx) whole.push_back(int32_t(x));
  for (uint32_t x : cont) whole.push_back(int32_t(x));
  ScoreRequest r;
  const size_t keep = std::min(whole.size(), size_t(max_len) + 1);
  r.tokens.assign(whole.end() - ptrdiff_t(keep), whole.end());
  r.n_scored = int(std::min(cont.size(), keep - 1));
  return r;
}

std::vector<ScoreResult> score_requests(ScoringModel& m, const std::vector<ScoreRequest>& reqs,
                                        const BatchOptions& opt) {
  const int L = m.max_seq_len();
  std::vector<ScoreResult> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); i++) {
    const auto& r = reqs[i];
    if (r.tokens.size() < 2 || r.tokens.size() > size_t(L) + 1)
      throw Error(strprintf("score_requests: request %zu has %zu tokens (need 2 .. max_seq_len + 1 = %d)", i,
                            r.tokens.size(), L + 1));
    if (r.n_scored < 1 || size_t(r.n_scored) > r.tokens.size() - 1)
      throw Error(strprintf("score_requests: request %zu scores %d of %zu tokens", i, r.n_scored, r.tokens.size() - 1));
  }
  // Longest first (like the harness): the first batch shows the peak memory.
  std::vector<size_t> order(reqs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return reqs[a].tokens.size() > reqs[b].tokens.size(); });
  const auto t0 = std::chrono::steady_clock::now();
  const int rt = std::max(1, opt.round_T);
  std::vector<int32_t> tok, tgt;
  std::vector<double> lp;
  std::vector<uint8_t> am;
  int64_t tokens_done = 0;
  size_t pos = 0;
  while (pos < order.size()) {
    const int len0 = int(reqs[order[pos]].tokens.size()) - 1;  // longest input of this batch
    const int T = std::min(L, (len0 + rt - 1) / rt * rt);
    int B = int(std::max<int64_t>(1, opt.batch_tokens / T));
    B = std::max(1, std::min({B, opt.max_rows, int(order.size() - pos)}));
    tok.assign(size_t(B) * T, 0);
    tgt.assign(size_t(B) * T, -1);
    lp.assign(size_t(B) * T, 0.0);
    am.assign(size_t(B) * T, 0);
    for (int b = 0; b < B; b++) {
      const ScoreRequest& r = reqs[order[pos + size_t(b)]];
      const int n = int(r.tokens.size()) - 1;
      for (int t = 0; t < n; t++) tok[size_t(b) * T + t] = r.tokens[size_t(t)];
      for (int t = n - r.n_scored; t < n; t++) tgt[size_t(b) * T + t] = r.tokens[size_t(t) + 1];
      tokens_done += n;
    }
    m.forward_logprobs(tok.data(), tgt.data(), B, T, lp.data(), am.data());
    for (int b = 0; b < B; b++) {
      const ScoreRequest& r = reqs[order[pos + size_t(b)]];
      const int n = int(r.tokens.size()) - 1;
      ScoreResult& res = out[order[pos + size_t(b)]];
      for (int t = n - r.n_scored; t < n; t++) {
        res.ll += lp[size_t(b) * T + t];
        res.all_argmax = res.all_argmax && am[size_t(b) * T + t] != 0;
      }
    }
    pos += size_t(B);
    if (opt.progress) opt.progress(pos, order.size(), tokens_done, seconds_since(t0));
  }
  return out;
}

// ---- evaluations ------------------------------------------------------------------------------
void check_eval_tokenizer(const EvalTokenizerInfo& t, uint32_t model_vocab, int64_t expected_eot,
                          const std::string& path, uint64_t expected_fingerprint) {
  if (t.vocab_size != model_vocab)
    throw Error(strprintf("%s: eval binary was made with a tokenizer of %u ids (%s, eot %u) but the model has "
                          "vocab_size %u: tokenizer mismatch",
                          path.c_str(), t.vocab_size, t.name.c_str(), t.eot_id, model_vocab));
  if (t.eot_id >= model_vocab)
    throw Error(strprintf("%s: eot id %u is outside the model's vocabulary (%u ids)", path.c_str(), t.eot_id, model_vocab));
  if (expected_eot >= 0 && int64_t(t.eot_id) != expected_eot)
    throw Error(strprintf("%s: eval binary's end-of-text id is %u but the model's tokenizer has %lld: tokenizer "
                          "mismatch",
                          path.c_str(), t.eot_id, (long long)expected_eot));
  if (expected_fingerprint != 0 && t.fingerprint != 0 && t.fingerprint != expected_fingerprint)
    throw Error(strprintf("%s: eval binary was made with another tokenizer (%s, fingerprint %016llx) than the "
                          "model's (fingerprint %016llx): tokenizer mismatch",
                          path.c_str(), t.name.empty() ? "unnamed" : t.name.c_str(), (unsigned long long)t.fingerprint,
                          (unsigned long long)expected_fingerprint));
}

ValResult eval_val(ScoringModel& m, const std::string& pattern, int B, int T, int64_t n_batches,
                   const BatchOptions& opt) {
  if (B < 1 || T < 1) throw Error(strprintf("eval_val: B and T must be >= 1 (got %d, %d)", B, T));
  if (T > m.max_seq_len())
    throw Error(strprintf("eval_val: T = %d exceeds the model's max_seq_len %d", T, m.max_seq_len()));
  const auto t0 = std::chrono::steady_clock::now();
  DataLoader dl(pattern, B, T, 0, 1, false, 0, m.vocab_size());
  const int64_t avail = int64_t(dl.batches_per_epoch());
  const int64_t nb = (n_batches <= 0 || n_batches > avail) ? avail : n_batches;
  if (n_batches > avail)
    std::fprintf(stderr, "note: --val-batches %lld: the val shards hold %lld batches of %d x %d tokens; all are used\n",
                 (long long)n_batches, (long long)avail, B, T);
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  std::vector<double> lp(size_t(B) * T);
  std::vector<uint8_t> am(size_t(B) * T);
  ValResult r;
  double sum = 0;
  for (int64_t b = 0; b < nb; b++) {
    dl.next_batch(in.data(), tg.data());
    m.forward_logprobs(in.data(), tg.data(), B, T, lp.data(), am.data());
    double s = 0;
    for (double x : lp) s += x;
    sum -= s;
    r.tokens += int64_t(B) * T;
    r.batches++;
    if (opt.progress) opt.progress(size_t(b + 1), size_t(nb), r.tokens, seconds_since(t0));
  }
  r.loss = r.tokens ? sum / double(r.tokens) : NAN;
  r.ppl = std::exp(r.loss);
  r.seconds = seconds_since(t0);
  return r;
}

WikiTextResult eval_wikitext(ScoringModel& m, const WikiTextSet& set, int max_length, int64_t max_docs,
                             const BatchOptions& opt) {
  const int L = max_length > 0 ? max_length : m.max_seq_len();
  if (L > m.max_seq_len())
    throw Error(strprintf("--max-length %d exceeds the model's context (seq_len %d)", L, m.max_seq_len()));
  const auto t0 = std::chrono::steady_clock::now();
  const size_t nd = max_docs > 0 ? std::min(set.docs.size(), size_t(max_docs)) : set.docs.size();
  WikiTextResult r;
  r.max_length = L;
  std::vector<ScoreRequest> reqs;
  for (size_t d = 0; d < nd; d++) {
    const WikiTextDoc& doc = set.docs[d];
    const int64_t N = int64_t(doc.tokens.size());
    r.docs++;
    r.tokens += N;
    r.words += doc.words;
    r.bytes += doc.bytes;
    for (const RollingWindow& w : rolling_windows(N, L)) {
      ScoreRequest q;
      q.tokens.resize(size_t(w.len) + 1);
      for (int j = 0; j <= w.len; j++) {
        const int64_t e = w.begin + j;  // index into [EOT] + doc
        q.tokens[size_t(j)] = int32_t(e == 0 ? set.tok.eot_id : doc.tokens[size_t(e - 1)]);
      }
      q.n_scored = w.n_scored;
      reqs.push_back(std::move(q));
    }
  }
  if (r.words == 0 || r.bytes == 0)
    throw Error("eval_wikitext: no words or bytes to normalise by (an empty WikiText set)");
  r.windows = int64_t(reqs.size());
  for (const ScoreResult& s : score_requests(m, reqs, opt)) r.ll += s.ll;
  r.word_perplexity = std::exp(-r.ll / double(r.words));
  r.byte_perplexity = std::exp(-r.ll / double(r.bytes));
  r.bits_per_byte = -r.ll / double(r.bytes) / std::log(2.0);
  r.seconds = seconds_since(t0);
  return r;
}

LambadaResult eval_lambada(ScoringModel& m, const LambadaSet& set, int64_t max_examples, const BatchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n = max_examples > 0 ? std::min(set.examples.size(), size_t(max_examples)) : set.examples.size();
  if (n == 0) throw Error("eval_lambada: the LAMBADA set has no examples");
  std::vector<ScoreRequest> reqs;
  reqs.reserve(n);
  LambadaResult r;
  for (size_t i = 0; i < n; i++) {
    const LambadaExample& e = set.examples[i];
    reqs.push_back(make_request(e.context, e.target, m.max_seq_len(), set.tok.eot_id));
    r.target_tokens += int64_t(e.target.size());
    r.truncated_targets += size_t(reqs.back().n_scored) < e.target.size() ? 1 : 0;
  }
  for (const ScoreResult& s : score_requests(m, reqs, opt)) {
    r.ll += s.ll;
    r.correct += s.all_argmax ? 1 : 0;
  }
  r.examples = int64_t(n);
  r.ppl = std::exp(-r.ll / double(n));
  r.acc = double(r.correct) / double(n);
  r.seconds = seconds_since(t0);
  return r;
}

HellaSwagResult eval_hellaswag(ScoringModel& m, const HellaSwagSet& set, int64_t max_examples,
                               const BatchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n = max_examples > 0 ? std::min(set.items.size(), size_t(max_examples)) : set.items.size();
  if (n == 0) throw Error("eval_hellaswag: the HellaSwag set has no items");
  std::vector<ScoreRequest> reqs;
  reqs.reserve(4 * n);
  HellaSwagResult r;
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 4; k++) {
      const std::vector<uint32_t>& ending = set.items[i].endings[size_t(k)];
      reqs.push_back(make_request(set.items[i].context, ending, m.max_seq_len(), set.tok.eot_id));
      r.truncated_endings += size_t(reqs.back().n_scored) < ending.size() ? 1 : 0;
    }
  const std::vector<ScoreResult> s = score_requests(m, reqs, opt);
  for (size_t i = 0; i < n; i++) {
    const HellaSwagItem& it = set.items[i];
    int best = 0, best_norm = 0;
    double bv = -INFINITY, bn = -INFINITY;
    for (int k = 0; k < 4; k++) {
      const double ll = s[4 * i + size_t(k)].ll;
      const double nl = ll / double(std::max<uint32_t>(1, it.ending_chars[size_t(k)]));
      if (ll > bv) bv = ll, best = k;
      if (nl > bn) bn = nl, best_norm = k;
    }
    r.correct += uint32_t(best) == it.label ? 1 : 0;
    r.correct_norm += uint32_t(best_norm) == it.label ? 1 : 0;
  }
  r.items = int64_t(n);
  r.acc = double(r.correct) / double(n);
  r.acc_norm = double(r.correct_norm) / double(n);
  r.seconds = seconds_since(t0);
  return r;
}

json to_json(const ValResult& r) {
  return json{{"batches", r.batches}, {"tokens", r.tokens}, {"loss", r.loss}, {"ppl", r.ppl}, {"seconds", r.seconds},
              {"tokens_per_s", r.seconds > 0 ? double(r.tokens) / r.seconds : 0.0}};
}
json to_json(const WikiTextResult& r) {
  return json{{"docs", r.docs},
              {"tokens", r.tokens},
              {"windows", r.windows},
              {"words", r.words},
              {"bytes", r.bytes},
              {"max_length", r.max_length},
              {"ll", r.ll},
              {"word_perplexity", r.word_perplexity},
              {"byte_perplexity", r.byte_perplexity},
              {"bits_per_byte", r.bits_per_byte},
              {"seconds", r.seconds},
              {"docs_per_s", r.seconds > 0 ? double(r.docs) / r.seconds : 0.0},
              {"tokens_per_s", r.seconds > 0 ? double(r.tokens) / r.seconds : 0.0}};
}
json to_json(const LambadaResult& r) {
  return json{{"examples", r.examples},
              {"target_tokens", r.target_tokens},
              {"correct", r.correct},
              {"truncated_targets", r.truncated_targets},
              {"ll", r.ll},
              {"ppl", r.ppl},
              {"acc", r.acc},
              {"seconds", r.seconds},
              {"examples_per_s", r.seconds > 0 ? double(r.examples) / r.seconds : 0.0}};
}
json to_json(const HellaSwagResult& r) {
  return json{{"items", r.items},
              {"correct", r.correct},
              {"correct_norm", r.correct_norm},
              {"truncated_endings", r.truncated_endings},
              {"acc", r.acc},
              {"acc_norm", r.acc_norm},
              {"seconds", r.seconds},
              {"examples_per_s", r.seconds > 0 ? double(r.items) / r.seconds : 0.0}};
}

// ---- suites -----------------------------------------------------------------------------------
LoadedEvalSets load_eval_sets(const EvalSuite& s, uint32_t model_vocab) {
  LoadedEvalSets L;
  std::vector<std::pair<std::string, const EvalTokenizerInfo*>> infos;
  if (!s.wikitext.empty()) {
    L.wikitext.reset(new WikiTextSet(read_wikitext(s.wikitext)));
    check_eval_tokenizer(L.wikitext->tok, model_vocab, s.expected_eot, s.wikitext, s.expected_fingerprint);
    infos.push_back({s.wikitext, &L.wikitext->tok});
  }
  if (!s.lambada.empty()) {
    L.lambada.reset(new LambadaSet(read_lambada(s.lambada)));
    check_eval_tokenizer(L.lambada->tok, model_vocab, s.expected_eot, s.lambada, s.expected_fingerprint);
    infos.push_back({s.lambada, &L.lambada->tok});
  }
  if (!s.hellaswag.empty()) {
    L.hellaswag.reset(new HellaSwagSet(read_hellaswag(s.hellaswag)));
    check_eval_tokenizer(L.hellaswag->tok, model_vocab, s.expected_eot, s.hellaswag, s.expected_fingerprint);
    infos.push_back({s.hellaswag, &L.hellaswag->tok});
  }
  for (size_t i = 1; i < infos.size(); i++) {
    const EvalTokenizerInfo& a = *infos[0].second;
    const EvalTokenizerInfo& b = *infos[i].second;
    if (a.eot_id != b.eot_id || (a.fingerprint != 0 && b.fingerprint != 0 && a.fingerprint != b.fingerprint))
      throw Error(strprintf("eval binaries %s and %s were made with different tokenizers (%s, fingerprint %016llx "
                            "vs %s, %016llx)",
                            infos[0].first.c_str(), infos[i].first.c_str(), a.name.c_str(),
                            (unsigned long long)a.fingerprint, b.name.c_str(), (unsigned long long)b.fingerprint));
  }
  return L;
}

namespace {
BatchOptions with_progress(const BatchOptions& base, bool on, const std::string& what, const std::string& unit) {
  BatchOptions o = base;
  if (!on) return o;
  // On a terminal one line rewritten in place; into a file or pipe (logs, CI) one line per tenth
  // of the work, so that a captured log is not thousands of \r-joined updates.
  const bool tty = ::isatty(2) != 0;
  auto last_tenth = std::make_shared<int64_t>(-1);
  o.progress = [what, unit, tty, last_tenth](size_t done, size_t total, int64_t tokens, double sec) {
    if (!tty) {
      const int64_t tenth = total ? int64_t(done * 10 / total) : 10;
      if (tenth == *last_tenth && done != total) return;
      *last_tenth = tenth;
    }
    const double s = std::max(sec, 1e-9);
    // ETA from the mean rate so far (requests run longest first, so it errs on the long side)
    const std::string eta =
        done > 0 && done < total ? " | ETA " + train::format_duration(sec / double(done) * double(total - done)) : "";
    std::fprintf(stderr, "%s%-10s %zu/%zu %s | %.1f %s/s | %.0f tokens/s | %.1f s%s%s", tty ? "\r" : "", what.c_str(),
                 done, total, unit.c_str(), double(done) / s, unit.c_str(), double(tokens) / s, sec, eta.c_str(),
                 tty ? "   " : "\n");
    if (tty && done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
  return o;
}
}  // namespace

json run_eval_suite(ScoringModel& m, const EvalSuite& s, const LoadedEvalSets& sets) {
  json out = json::object();
  if (!s.val_data.empty()) {
    const int T = s.val_T > 0 ? s.val_T : m.max_seq_len();
    out["val"] = to_json(eval_val(m, s.val_data, s.val_B, T, s.val_batches,
                                  with_progress(s.batch, s.print_progress, "val", "batches")));
    out["val"]["B"] = s.val_B;
    out["val"]["T"] = T;
    out["val"]["uniform_loss"] = std::log(double(m.vocab_size()));  // a model that knows nothing: ln V
  }
  if (sets.wikitext)
    out["wikitext"] = to_json(eval_wikitext(m, *sets.wikitext, s.max_length, s.max_docs,
                                            with_progress(s.batch, s.print_progress, "wikitext", "windows")));
  if (sets.lambada)
    out["lambada"] = to_json(eval_lambada(m, *sets.lambada, s.max_examples,
                                          with_progress(s.batch, s.print_progress, "lambada", "examples")));
  if (sets.hellaswag)
    out["hellaswag"] = to_json(eval_hellaswag(m, *sets.hellaswag, s.max_examples,
                                              with_progress(s.batch, s.print_progress, "hellaswag", "requests")));
  return out;
}

std::string format_results_table(const json& r) {
  // Third column: what the number means for a small model (chance, a model that knows nothing,
  // and the order of magnitude of GPT-2 124M, lm-evaluation-harness zero-shot).
  std::string t = strprintf("%-28s %14s   %s\n", "metric", "value", "reference");
  auto row = [&](const char* name, double v, const char* fmt, const std::string& ref = "") {
    t += strprintf("%-28s ", name) + strprintf(fmt, v) + (ref.empty() ? "" : "   " + ref) + "\n";
  };
  auto count = [&](const char* name, int64_t v) { t += strprintf("%-28s %14lld\n", name, (long long)v); };
  // Continuations longer than the model's window: only their last max_seq_len tokens were scored.
  auto truncated = [&](const char* set, int64_t n, const char* what) {
    if (n > 0)
      t += strprintf("%-28s %14lld   longer than the window L: only their last L tokens scored\n",
                     strprintf("%s truncated %s", set, what).c_str(), (long long)n);
  };
  if (r.contains("val")) {
    const json& v = r["val"];
    const double u = v.value("uniform_loss", 0.0);
    row("val loss (nats/token)", v["loss"].get<double>(), "%14.4f",
        u > 0 ? strprintf("uniform over the vocabulary: ln V = %.4f", u) : "");
    row("val ppl", v["ppl"].get<double>(), "%14.3f", u > 0 ? strprintf("uniform: V = %.0f", std::exp(u)) : "");
    count("val tokens", v["tokens"].get<int64_t>());
  }
  if (r.contains("wikitext")) {
    const json& v = r["wikitext"];
    row("wikitext2 word ppl", v["word_perplexity"].get<double>(), "%14.3f", "GPT-2 124M: ~30-40");
    row("wikitext2 byte ppl", v["byte_perplexity"].get<double>(), "%14.4f", "uniform bytes: 256");
    row("wikitext2 bits/byte", v["bits_per_byte"].get<double>(), "%14.4f", "uniform bytes: 8");
    count("wikitext2 docs", v["docs"].get<int64_t>());
    count("wikitext2 max_length", v["max_length"].get<int>());
  }
  if (r.contains("lambada")) {
    const json& v = r["lambada"];
    row("lambada ppl", v["ppl"].get<double>(), "%14.3f", "GPT-2 124M: ~35-40");
    row("lambada acc", v["acc"].get<double>(), "%14.4f", "chance: ~0; GPT-2 124M: ~0.33");
    count("lambada examples", v["examples"].get<int64_t>());
    truncated("lambada", v.value("truncated_targets", int64_t(0)), "targets");
  }
  if (r.contains("hellaswag")) {
    const json& v = r["hellaswag"];
    row("hellaswag acc", v["acc"].get<double>(), "%14.4f", "chance (4 endings): 0.25; GPT-2 124M: ~0.29");
    row("hellaswag acc_norm", v["acc_norm"].get<double>(), "%14.4f", "chance: 0.25; GPT-2 124M: ~0.31");
    count("hellaswag items", v["items"].get<int64_t>());
    truncated("hellaswag", v.value("truncated_endings", int64_t(0)), "endings");
  }
  if (r.contains("wikitext") || r.contains("lambada") || r.contains("hellaswag"))
    t += "(a model trained for minutes on a CPU sits near chance on LAMBADA and HellaSwag; compare models\n"
         " trained alike with each other, not with the reference column)\n";
  return t;
}

}  // namespace ldm
