// Unit tests of core/eval: rolling windows (spec example and random N, L against an independent
// closed form of each token's context), batched scoring with models whose output distribution is
// known exactly (a context-hash model: ln p depends on the WHOLE context, so any wrong context,
// padding leak or row mix-up changes the result; a uniform model), and every metric against its
// formula computed here. No data files needed.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>

#include "core/common.h"
#include "core/eval.h"
#include "core/shard.h"
#include "test/helpers.h"

using namespace ldm;
using json = nlohmann::json;

namespace {

// ln p(v | context) of a model whose logits are a pseudo-random function of (context, v):
// z_v = 3 * u(hash(context), v) with u in [-1, 1). Computed independently of core/eval.
struct HashDist {
  static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static uint64_t hash(const int32_t* ctx, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = mix(h ^ uint64_t(uint32_t(ctx[i])));
    return h;
  }
  static std::vector<double> logits(uint64_t h, int V) {
    std::vector<double> z(static_cast<size_t>(V));
    for (int v = 0; v < V; v++) z[size_t(v)] = 3.0 * (double(mix(h + uint64_t(v)) >> 11) / 4503599627370496.0 - 1.0);
    return z;
  }
  // (ln p(target), target is argmax)
  static std::pair<double, bool> score(const std::vector<int32_t>& ctx, int target, int V) {
    std::vector<double> z = logits(hash(ctx.data(), int(ctx.size())), V);
    double mx = z[0];
    int am = 0;
    for (int v = 1; v < V; v++)
      if (z[size_t(v)] > mx) mx = z[size_t(v)], am = v;
    double s = 0;
    for (double x : z) s += std::exp(x - mx);
    return {z[size_t(target)] - mx - std::log(s), am == target};
  }
};

class HashModel : public ScoringModel {
 public:
  HashModel(int V, int L) : V_(V), L_(L) {}
  int max_seq_len() const override { return L_; }
  uint32_t vocab_size() const override { return uint32_t(V_); }
  void forward_logprobs(const int32_t* tokens, const int32_t* targets, int B, int T, double* logprob,
                        uint8_t* is_argmax) override {
    REQUIRE(T <= L_);
    calls++;
    max_B = std::max(max_B, B);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        const size_t i = size_t(b) * T + t;
        if (targets[i] < 0) continue;
        std::vector<int32_t> ctx(tokens + size_t(b) * T, tokens + i + 1);
        auto s = HashDist::score(ctx, targets[i], V_);
        logprob[i] = s.first;
        is_argmax[i] = s.second;
        scored++;
      }
  }
  int V_, L_;
  int calls = 0, max_B = 0;
  int64_t scored = 0;
};

// Every logit equal: ln p = -ln V, argmax = id 0 (first index on ties).
class UniformModel : public ScoringModel {
 public:
  UniformModel(int V, int L) : V_(V), L_(L) {}
  int max_seq_len() const override { return L_; }
  uint32_t vocab_size() const override { return uint32_t(V_); }
  void forward_logprobs(const int32_t*, const int32_t* targets, int B, int T, double* logprob,
                        uint8_t* is_argmax) override {
    for (int i = 0; i < B * T; i++)
      if (targets[i] >= 0) logprob[i] = -std::log(double(V_)), is_argmax[i] = targets[i] == 0;
  }
  int V_, L_;
};

// Independent closed form of evals.md: the context (input tokens up to and including the one
// before it) of document token k, for window length L and prefix token eot.
std::vector<int32_t> expected_context(const std::vector<int32_t>& t, int64_t k, int L, int32_t eot) {
  const int64_t N = int64_t(t.size());
  std::vector<int32_t> c;
  if (k < L) {  // first window: [EOT] + t[0:k]
    c.push_back(eot);
    c.insert(c.end(), t.begin(), t.begin() + k);
    return c;
  }
  const int64_t block_end = std::min<int64_t>(L + (k - L) / L * L + L, N);
  c.assign(t.begin() + (block_end - L - 1), t.begin() + k);  // input starts one before the block
  return c;
}

std::vector<uint32_t> rand_tokens(std::mt19937_64& g, int n, int V) {
  std::vector<uint32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = uint32_t(g() % uint64_t(V));
  return v;
}

BatchOptions batch(int64_t tokens, int rows = 64) {
  BatchOptions o;
  o.batch_tokens = tokens;
  o.max_rows = rows;
  return o;
}

}  // namespace

TEST_CASE("rolling windows: the spec example N = 10, L = 4", "[eval]") {
  // [EOT] t0 t1 t2 -> t0..t3 ; t3..t6 -> t4..t7 ; t5..t8 -> scores t8, t9 (right-aligned).
  auto w = rolling_windows(10, 4);
  REQUIRE(w.size() == 3);
  CHECK(w[0].begin == 0);  // e[0] = EOT
  CHECK(w[0].len == 4);
  CHECK(w[0].n_scored == 4);
  CHECK(w[1].begin == 4);  // e[4] = t3
  CHECK(w[1].len == 4);
  CHECK(w[1].n_scored == 4);
  CHECK(w[2].begin == 6);  // e[6] = t5
  CHECK(w[2].len == 4);
  CHECK(w[2].n_scored == 2);
  // short documents: one window [EOT] + t[0:N-1]
  auto s = rolling_windows(3, 4);
  REQUIRE(s.size() == 1);
  CHECK((s[0].begin == 0 && s[0].len == 3 && s[0].n_scored == 3));
  CHECK(rolling_windows(0, 4).empty());
  // L = 1: every token predicted from its predecessor alone.
  auto one = rolling_windows(3, 1);
  REQUIRE(one.size() == 3);
  for (int i = 0; i < 3; i++) CHECK((one[size_t(i)].begin == i && one[size_t(i)].len == 1 && one[size_t(i)].n_scored == 1));
  CHECK_THROWS_AS(rolling_windows(5, 0), Error);
}

TEST_CASE("rolling windows: random N, L — every token scored once with exactly the documented context", "[eval]") {
  std::mt19937_64 g(7);
  for (int rep = 0; rep < 400; rep++) {
    const int64_t N = 1 + int64_t(g() % 300);
    const int L = 1 + int(g() % 40);
    std::vector<int32_t> t(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; i++) t[size_t(i)] = int32_t(1000 + i);  // distinct ids: contexts identify positions
    const int32_t eot = 7;
    std::vector<int> seen(size_t(N), 0);
    int64_t next = 0;
    for (const auto& w : rolling_windows(N, L)) {
      REQUIRE(w.len >= 1);
      REQUIRE(w.len <= L);
      REQUIRE(w.n_scored >= 1);
      REQUIRE(w.n_scored <= w.len);
      REQUIRE(w.begin >= 0);
      REQUIRE(w.begin + w.len <= N);  // last input token is e[begin+len-1] = t[begin+len-2]; target t[begin+len-1]
      for (int j = w.len - w.n_scored; j < w.len; j++) {
        const int64_t k = w.begin + j;  // target t[k]
        REQUIRE(k == next);             // in order, no gaps
        next++;
        seen[size_t(k)]++;
        std::vector<int32_t> ctx;
        for (int i = 0; i <= j; i++) ctx.push_back(w.begin + i == 0 ? eot : t[size_t(w.begin + i - 1)]);
        INFO("N=" << N << " L=" << L << " k=" << k);
        REQUIRE(ctx == expected_context(t, k, L, eot));
      }
    }
    REQUIRE(next == N);
    for (int c : seen) REQUIRE(c == 1);
  }
}

TEST_CASE("make_request: left truncation to max_len + 1 tokens, empty context -> prefix", "[eval]") {
  std::vector<uint32_t> ctx{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, cont{11, 12, 13};
  ScoreRequest r = make_request(ctx, cont, 5, 99);
  CHECK(r.tokens == std::vector<int32_t>{8, 9, 10, 11, 12, 13});
  CHECK(r.n_scored == 3);
  r = make_request(ctx, cont, 100, 99);
  CHECK(r.tokens.size() == 13);
  CHECK(r.n_scored == 3);
  r = make_request({}, {5, 6}, 100, 99);
  CHECK(r.tokens == std::vector<int32_t>{99, 5, 6});
  CHECK(r.n_scored == 2);
  r = make_request(ctx, {1, 2, 3, 4, 5, 6, 7, 8}, 4, 99);  // continuation longer than the window
  CHECK(r.tokens == std::vector<int32_t>{4, 5, 6, 7, 8});
  CHECK(r.n_scored == 4);
  CHECK_THROWS_AS(make_request(ctx, {}, 4, 99), Error);
}

TEST_CASE("score_requests: results independent of batching and padding; every position scored once", "[eval]") {
  std::mt19937_64 g(11);
  const int V = 17, L = 24;
  std::vector<ScoreRequest> reqs;
  std::vector<ScoreResult> expect;
  int64_t n_scored = 0;
  for (int i = 0; i < 57; i++) {
    ScoreRequest r;
    const int n = 2 + int(g() % uint64_t(L));
    for (int k = 0; k < n; k++) r.tokens.push_back(int32_t(g() % V));
    r.n_scored = 1 + int(g() % uint64_t(n - 1));
    ScoreResult e;
    for (int k = n - r.n_scored; k < n; k++) {
      auto s = HashDist::score(std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + k), r.tokens[size_t(k)], V);
      e.ll += s.first;
      e.all_argmax = e.all_argmax && s.second;
    }
    n_scored += r.n_scored;
    reqs.push_back(r);
    expect.push_back(e);
  }
  for (int64_t bt : {int64_t(1), int64_t(50), int64_t(200), int64_t(100000)}) {
    HashModel m(V, L);
    size_t last_done = 0;
    BatchOptions o = batch(bt, 9);
    o.progress = [&](size_t done, size_t total, int64_t, double) {
      CHECK(done > last_done);
      CHECK(total == reqs.size());
      last_done = done;
    };
    auto got = score_requests(m, reqs, o);
    CHECK(last_done == reqs.size());
    CHECK(m.scored == n_scored);
    CHECK(m.max_B <= 9);
    if (bt == 1) CHECK(m.calls == int(reqs.size()));
    if (bt == 100000) CHECK(m.calls == (int(reqs.size()) + 8) / 9);
    for (size_t i = 0; i < reqs.size(); i++) {
      CHECK(got[i].ll == Approx(expect[i].ll).epsilon(1e-12));
      CHECK(got[i].all_argmax == expect[i].all_argmax);
    }
  }
  HashModel m(V, L);
  ScoreRequest too_long;
  too_long.tokens.assign(size_t(L) + 2, 1);
  too_long.n_scored = 1;
  CHECK_THROWS_AS(score_requests(m, {too_long}, batch(100)), Error);
  ScoreRequest too_short{{1}, 1};
  CHECK_THROWS_AS(score_requests(m, {too_short}, batch(100)), Error);
}

TEST_CASE("WikiText: word/byte perplexity and bits per byte equal their formulas over the documented windows",
          "[eval]") {
  std::mt19937_64 g(3);
  const int V = 23;
  WikiTextSet set;
  set.tok.vocab_size = V;
  set.tok.eot_id = 22;
  for (int d = 0; d < 6; d++) {
    WikiTextDoc doc;
    doc.tokens = rand_tokens(g, 1 + int(g() % 90), V - 1);
    doc.words = 1 + g() % 50;
    doc.bytes = doc.words * 5 + g() % 9;
    set.total_words += doc.words;
    set.total_bytes += doc.bytes;
    set.docs.push_back(doc);
  }
  for (int L : {1, 4, 16, 32}) {
    for (int64_t max_docs : {int64_t(0), int64_t(4)}) {
      const size_t nd = max_docs ? 4 : set.docs.size();
      double ll = 0;
      uint64_t words = 0, bytes = 0;
      int64_t tokens = 0;
      for (size_t d = 0; d < nd; d++) {
        std::vector<int32_t> t(set.docs[d].tokens.begin(), set.docs[d].tokens.end());
        for (int64_t k = 0; k < int64_t(t.size()); k++)
          ll += HashDist::score(expected_context(t, k, L, 22), t[size_t(k)], V).first;
        words += set.docs[d].words;
        bytes += set.docs[d].bytes;
        tokens += int64_t(t.size());
      }
      HashModel m(V, 32);
      WikiTextResult r = eval_wikitext(m, set, L, max_docs, batch(64));
      INFO("L=" << L << " max_docs=" << max_docs);
      CHECK(r.docs == int64_t(nd));
      CHECK(r.tokens == tokens);
      CHECK(m.scored == tokens);
      CHECK(r.words == words);
      CHECK(r.bytes == bytes);
      CHECK(r.max_length == L);
      CHECK(r.ll == Approx(ll).epsilon(1e-12));
      CHECK(r.word_perplexity == Approx(std::exp(-ll / double(words))).epsilon(1e-12));
      CHECK(r.byte_perplexity == Approx(std::exp(-ll / double(bytes))).epsilon(1e-12));
      CHECK(r.bits_per_byte == Approx(-ll / double(bytes) / std::log(2.0)).epsilon(1e-12));
    }
  }
  // Uniform model: ll = -tokens ln V exactly.
  UniformModel u(V, 8);
  WikiTextResult r = eval_wikitext(u, set, 0, 0, batch(64));
  int64_t ntok = 0;
  for (auto& d : set.docs) ntok += int64_t(d.tokens.size());
  CHECK(r.max_length == 8);
  CHECK(r.word_perplexity == Approx(std::exp(double(ntok) * std::log(double(V)) / double(set.total_words))));
  CHECK(r.bits_per_byte == Approx(double(ntok) * std::log2(double(V)) / double(set.total_bytes)));
  HashModel m(V, 8);
  CHECK_THROWS_AS(eval_wikitext(m, set, 9, 0, batch(64)), Error);  // window longer than the model
}

TEST_CASE("LAMBADA: ppl = exp(-mean ll per example), acc = all target tokens argmax, left truncation", "[eval]") {
  std::mt19937_64 g(5);
  const int V = 19, L = 12;
  LambadaSet set;
  set.tok.vocab_size = V;
  set.tok.eot_id = 18;
  for (int i = 0; i < 300; i++) {
    LambadaExample e;
    e.context = rand_tokens(g, int(g() % 20), V);  // some empty, some longer than L
    e.target = rand_tokens(g, 1 + int(g() % 3), V);
    set.examples.push_back(e);
  }
  double ll_sum = 0;
  int64_t correct = 0;
  for (const auto& e : set.examples) {
    std::vector<int32_t> whole;
    if (e.context.empty()) whole.push_back(18);
    for (auto x : e.context) whole.push_back(int32_t(x));
    for (auto x : e.target) whole.push_back(int32_t(x));
    const size_t start = whole.size() > size_t(L) + 1 ? whole.size() - size_t(L) - 1 : 0;
    bool all = true;
    for (size_t p = whole.size() - e.target.size(); p < whole.size(); p++) {
      auto s = HashDist::score(std::vector<int32_t>(whole.begin() + ptrdiff_t(start), whole.begin() + ptrdiff_t(p)),
                               whole[p], V);
      ll_sum += s.first;
      all = all && s.second;
    }
    correct += all;
  }
  HashModel m(V, L);
  LambadaResult r = eval_lambada(m, set, 0, batch(40));
  CHECK(r.examples == 300);
  CHECK(r.ll == Approx(ll_sum).epsilon(1e-12));
  CHECK(r.ppl == Approx(std::exp(-ll_sum / 300)).epsilon(1e-12));
  CHECK(r.correct == correct);
  CHECK(r.correct > 0);  // the hash model's argmax hits the target sometimes
  CHECK(r.acc == Approx(double(correct) / 300));
  // Uniform: ppl = exp(mean target length * ln V); acc = fraction of targets made of id 0 only.
  UniformModel u(V, L);
  for (auto& e : set.examples)
    if (g() % 5 == 0) e.target.assign(e.target.size(), 0);
  double mean_len = 0, zeros = 0;
  for (auto& e : set.examples) {
    mean_len += double(e.target.size()) / 300;
    bool z = true;
    for (auto x : e.target) z = z && x == 0;
    zeros += z;
  }
  LambadaResult ru = eval_lambada(u, set, 0, batch(40));
  CHECK(ru.ppl == Approx(std::exp(mean_len * std::log(double(V)))).epsilon(1e-12));
  CHECK(ru.acc == Approx(zeros / 300));
  CHECK(eval_lambada(u, set, 50, batch(40)).examples == 50);
}

TEST_CASE("HellaSwag: acc = argmax sum ll, acc_norm = argmax ll / chars (first maximum on ties)", "[eval]") {
  std::mt19937_64 g(9);
  const int V = 29, L = 40;
  HellaSwagSet set;
  set.tok.vocab_size = V;
  set.tok.eot_id = 28;
  for (int i = 0; i < 150; i++) {
    HellaSwagItem it;
    it.context = rand_tokens(g, 1 + int(g() % 20), V);
    for (int k = 0; k < 4; k++) {
      it.endings[size_t(k)] = rand_tokens(g, 1 + int(g() % 6), V);
      it.ending_chars[size_t(k)] = uint32_t(1 + g() % 30);
    }
    it.label = uint32_t(g() % 4);
    set.items.push_back(it);
  }
  int64_t c = 0, cn = 0;
  for (const auto& it : set.items) {
    double ll[4];
    for (int k = 0; k < 4; k++) {
      std::vector<int32_t> whole(it.context.begin(), it.context.end());
      whole.insert(whole.end(), it.endings[size_t(k)].begin(), it.endings[size_t(k)].end());
      ll[k] = 0;
      for (size_t p = it.context.size(); p < whole.size(); p++)
        ll[k] += HashDist::score(std::vector<int32_t>(whole.begin(), whole.begin() + ptrdiff_t(p)), whole[p], V).first;
    }
    int a = 0, an = 0;
    for (int k = 1; k < 4; k++) {
      if (ll[k] > ll[a]) a = k;
      if (ll[k] / it.ending_chars[size_t(k)] > ll[an] / it.ending_chars[size_t(an)]) an = k;
    }
    c += uint32_t(a) == it.label;
    cn += uint32_t(an) == it.label;
  }
  HashModel m(V, L);
  HellaSwagResult r = eval_hellaswag(m, set, 0, batch(100));
  CHECK(r.items == 150);
  CHECK(r.correct == c);
  CHECK(r.correct_norm == cn);
  CHECK(r.acc == Approx(double(c) / 150));
  CHECK(r.acc_norm == Approx(double(cn) / 150));
  CHECK(r.correct != r.correct_norm);  // the length normalisation matters on this data
  // Uniform model: ll_k = -len_k ln V; all endings of equal length tie -> first (0) wins.
  for (auto& it : set.items)
    for (auto& e : it.endings) e.assign(3, 1);
  UniformModel u(V, L);
  HellaSwagResult ru = eval_hellaswag(u, set, 0, batch(100));
  int64_t label0 = 0, norm_expect = 0;
  for (const auto& it : set.items) {
    label0 += it.label == 0;
    // acc_norm = argmax of -3 ln V / chars: the ending with the MOST characters (first on ties).
    int an = 0;
    for (int k = 1; k < 4; k++)
      if (-3.0 / it.ending_chars[size_t(k)] > -3.0 / it.ending_chars[size_t(an)]) an = k;
    norm_expect += uint32_t(an) == it.label;
  }
  CHECK(ru.correct == label0);
  CHECK(ru.correct_norm == norm_expect);
}

TEST_CASE("LAMBADA and HellaSwag: continuations longer than the window are counted, their last L tokens scored",
          "[eval]") {
  std::mt19937_64 g(13);
  const int V = 23, L = 3;
  LambadaSet ls;
  ls.tok.vocab_size = V;
  ls.tok.eot_id = 22;
  HellaSwagSet hs;
  hs.tok.vocab_size = V;
  hs.tok.eot_id = 22;
  // Expected: a continuation of n > L tokens keeps its last L tokens as the scored part, with the
  // one token before them as the only context (whole = ctx + cont, last L + 1 tokens kept).
  auto expected_ll = [&](const std::vector<uint32_t>& ctx, const std::vector<uint32_t>& cont) {
    std::vector<int32_t> whole;
    if (ctx.empty()) whole.push_back(22);
    for (auto x : ctx) whole.push_back(int32_t(x));
    for (auto x : cont) whole.push_back(int32_t(x));
    const size_t scored = std::min(cont.size(), size_t(L));
    const size_t first = whole.size() - scored, start = whole.size() - std::min(whole.size(), size_t(L) + 1);
    double ll = 0;
    for (size_t p = first; p < whole.size(); p++)
      ll += HashDist::score(std::vector<int32_t>(whole.begin() + ptrdiff_t(start), whole.begin() + ptrdiff_t(p)),
                            whole[p], V).first;
    return ll;
  };
  int64_t long_targets = 0, long_endings = 0;
  double ll_sum = 0;
  for (int i = 0; i < 60; i++) {
    LambadaExample e;
    e.context = rand_tokens(g, int(g() % 5), V);
    e.target = rand_tokens(g, 1 + int(g() % 6), V);  // 1..6 tokens, window 3
    long_targets += e.target.size() > size_t(L);
    ll_sum += expected_ll(e.context, e.target);
    ls.examples.push_back(e);
    HellaSwagItem it;
    it.context = rand_tokens(g, 1 + int(g() % 4), V);
    for (int k = 0; k < 4; k++) {
      it.endings[size_t(k)] = rand_tokens(g, 1 + int(g() % 6), V);
      it.ending_chars[size_t(k)] = 5;
      long_endings += it.endings[size_t(k)].size() > size_t(L);
    }
    it.label = uint32_t(g() % 4);
    hs.items.push_back(it);
  }
  REQUIRE(long_targets > 0);
  REQUIRE(long_targets < 60);
  HashModel m(V, L);
  LambadaResult r = eval_lambada(m, ls, 0, batch(12));
  CHECK(r.truncated_targets == long_targets);
  CHECK(r.ll == Approx(ll_sum).epsilon(1e-12));
  HellaSwagResult h = eval_hellaswag(m, hs, 0, batch(12));
  CHECK(h.truncated_endings == long_endings);
  // In the JSON and, only when non-zero, in the printed table.
  json res{{"lambada", to_json(r)}, {"hellaswag", to_json(h)}};
  CHECK(res["lambada"]["truncated_targets"].get<int64_t>() == long_targets);
  CHECK(res["hellaswag"]["truncated_endings"].get<int64_t>() == long_endings);
  const std::string table = format_results_table(res);
  CHECK_THAT(table, Catch::Contains(strprintf("lambada truncated targets %17lld", (long long)long_targets)));
  CHECK_THAT(table, Catch::Contains("hellaswag truncated endings"));
  HashModel wide(V, 12);
  LambadaResult rw = eval_lambada(wide, ls, 0, batch(40));
  CHECK(rw.truncated_targets == 0);
  CHECK(format_results_table(json{{"lambada", to_json(rw)}}).find("truncated") == std::string::npos);
}

TEST_CASE("validation loss: mean token cross-entropy over fixed sequential batches", "[eval]") {
  std::string dir = scratch_dir("eval_val");
  std::mt19937_64 g(13);
  const int V = 31, B = 3, T = 8;
  std::vector<uint32_t> toks = rand_tokens(g, 200, V);
  write_shard(dir + "/val_000000.bin", toks.data(), toks.size(), false);
  // Windows of B*T+1 tokens starting at k*B*T (doc/formats.md "Data loader"); 199/24 = 8 batches.
  auto expected = [&](int nb) {
    double s = 0;
    for (int k = 0; k < nb; k++)
      for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
          const size_t p = size_t(k) * B * T + size_t(b) * T + size_t(t);
          std::vector<int32_t> ctx(toks.begin() + ptrdiff_t(size_t(k) * B * T + size_t(b) * T), toks.begin() + ptrdiff_t(p) + 1);
          s -= HashDist::score(ctx, int32_t(toks[p + 1]), V).first;
        }
    return s / double(nb * B * T);
  };
  HashModel m(V, T);
  ValResult r = eval_val(m, dir + "/val_*.bin", B, T, 3, batch(100));
  CHECK(r.batches == 3);
  CHECK(r.tokens == 3 * B * T);
  CHECK(r.loss == Approx(expected(3)).epsilon(1e-12));
  CHECK(r.ppl == Approx(std::exp(expected(3))).epsilon(1e-12));
  ValResult again = eval_val(m, dir + "/val_*.bin", B, T, 3, batch(100));
  CHECK(again.loss == r.loss);  // same batches every time
  ValResult all = eval_val(m, dir + "/val_*.bin", B, T, 0, batch(100));
  CHECK(all.batches == 8);
  CHECK(all.loss == Approx(expected(8)).epsilon(1e-12));
  CHECK_THROWS_AS(eval_val(m, dir + "/val_*.bin", B, T + 1, 3, batch(100)), Error);  // T > model context
  CHECK_THROWS_AS(eval_val(m, dir + "/nothing_*.bin", B, T, 3, batch(100)), Error);
}

TEST_CASE("tokenizer checks and row_logprob", "[eval]") {
  EvalTokenizerInfo t;
  t.vocab_size = 50257;
  t.eot_id = 50256;
  t.name = "gpt2_tokenizer";
  CHECK_NOTHROW(check_eval_tokenizer(t, 50257, -1, "x.bin"));
  CHECK_NOTHROW(check_eval_tokenizer(t, 50257, 50256, "x.bin"));
  CHECK_THROWS_WITH(check_eval_tokenizer(t, 50280, -1, "x.bin"), Catch::Contains("x.bin") && Catch::Contains("mismatch"));
  CHECK_THROWS_WITH(check_eval_tokenizer(t, 50257, 50279, "x.bin"), Catch::Contains("mismatch"));
  // Fingerprints: compared only when both are recorded (non-zero).
  t.fingerprint = 0x1234;
  CHECK_NOTHROW(check_eval_tokenizer(t, 50257, 50256, "x.bin", 0x1234));
  CHECK_NOTHROW(check_eval_tokenizer(t, 50257, 50256, "x.bin", 0));
  CHECK_THROWS_WITH(check_eval_tokenizer(t, 50257, 50256, "x.bin", 0x1235),
                    Catch::Contains("x.bin") && Catch::Contains("fingerprint 0000000000001234") &&
                        Catch::Contains("0000000000001235") && Catch::Contains("tokenizer mismatch"));
  t.fingerprint = 0;
  CHECK_NOTHROW(check_eval_tokenizer(t, 50257, 50256, "x.bin", 0x1235));
  // row_logprob: log-softmax in double against a direct formula; first index wins ties.
  std::vector<float> z{1.5f, -2.f, 3.25f, 3.25f, 0.f};
  double s = 0;
  for (float x : z) s += std::exp(double(x));
  uint8_t am = 9;
  CHECK(row_logprob(z.data(), 5, 1, &am) == Approx(-2.0 - std::log(s)).epsilon(1e-12));
  CHECK(am == 0);
  CHECK(row_logprob(z.data(), 5, 2, &am) == Approx(3.25 - std::log(s)).epsilon(1e-12));
  CHECK(am == 1);
  row_logprob(z.data(), 5, 3, &am);
  CHECK(am == 0);
  CHECK_THROWS_AS(row_logprob(z.data(), 5, 5, &am), Error);
}
