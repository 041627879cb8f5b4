// The evaluator on the real eval binaries and from the command line: what eval_cpu reads from the
// WikiText-2 / LAMBADA binaries built by the data tool (documents, words, bytes, every token
// scored once; 5153 LAMBADA examples whose scored targets are tok(" " + last word)), and bad
// inputs (mismatched tokenizer, corrupt eval file, missing/corrupt checkpoint, bad flags) ->
// "error: ..." and exit status 1; the binaries of the byte tokenizer (targets of several tokens)
// against a bigram model's closed form, and eval_cpu / generate_cpu with a byte-level model.
// The format itself is tested by test_evalprep.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>

#include "core/checkpoint.h"
#include "core/config.h"
#include "core/eval.h"
#include "core/evalfile.h"
#include "core/tokenizer.h"
#include "data/prep_eval.h"
#include "cpu/model.h"
#include "test/test_train_shards.h"

using namespace ldm;
using nlohmann::json;

namespace {

// ln p = -ln V for every position; counts what it scores.
class CountingUniform : public ScoringModel {
 public:
  CountingUniform(uint32_t V, int L) : V_(V), L_(L) {}
  int max_seq_len() const override { return L_; }
  uint32_t vocab_size() const override { return V_; }
  void forward_logprobs(const int32_t* tokens, const int32_t* targets, int B, int T, double* logprob,
                        uint8_t* is_argmax) override {
    for (int i = 0; i < B * T; i++)
      if (targets[i] >= 0) logprob[i] = -std::log(double(V_)), is_argmax[i] = 0, scored++;
  }
  uint32_t V_;
  int L_;
  int64_t scored = 0;
};

struct EvalFiles {
  std::string dir, lambada, wikitext;
};

// Binaries built once per test binary with the data tool (build*/ldm_data) from the shared data.
const EvalFiles& eval_files(const std::string& dd) {
  static EvalFiles f;
  if (!f.dir.empty()) return f;
  f.dir = binary_scratch_dir("eval_data");
  const std::string bin = build_dir_of_test();
  f.lambada = f.dir + "/lambada.bin";
  f.wikitext = f.dir + "/wikitext.bin";
  RunResult r = run_cmd(bin + "/ldm_data lambada --tokenizer " + dd + "/gpt2_tokenizer --input " + dd +
                        "/lambada/lambada_test.jsonl --out " + f.lambada);
  INFO(r.out);
  REQUIRE(r.status == 0);
  r = run_cmd(bin + "/ldm_data wikitext --tokenizer " + dd + "/gpt2_tokenizer --input " + dd +
              "/wikitext2/wiki.test.raw --out " + f.wikitext);
  INFO(r.out);
  REQUIRE(r.status == 0);
  return f;
}

void expect_fail(const std::string& cmd, const std::string& needle) {
  RunResult r = run_cmd(cmd);
  INFO("command: " << cmd << "\noutput:\n" << r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("error:") && Catch::Contains(needle));
}

}  // namespace

TEST_CASE("WikiText-2 binary as the evaluator reads it: 62 documents, 241,335 words, 1,290,527 bytes", "[eval][data]") {
  const std::string dd = data_dir_or_skip("real WikiText-2");
  if (dd.empty()) return;
  WikiTextSet s = read_wikitext(eval_files(dd).wikitext);
  CHECK(s.docs.size() == 62);
  CHECK(s.total_words == 241335);
  CHECK(s.total_bytes == 1290527);
  CHECK(s.tok.eot_id == 50256);
  CHECK(s.tok.vocab_size == 50257);
  int64_t ntok = 0;
  for (auto& d : s.docs) ntok += int64_t(d.tokens.size());
  // Uniform model: every token scored exactly once at L = 1024 and L = 64, so
  // bits_per_byte = tokens * log2(V) / bytes and word ppl = V^(tokens / words).
  for (int L : {1024, 64}) {
    CountingUniform u(50257, L);
    BatchOptions o;
    o.batch_tokens = 1 << 16;
    WikiTextResult r = eval_wikitext(u, s, 0, 0, o);
    CHECK(u.scored == ntok);
    CHECK(r.tokens == ntok);
    CHECK(r.docs == 62);
    CHECK(r.words == 241335);
    CHECK(r.bytes == 1290527);
    int64_t windows = 0;
    for (auto& d : s.docs) windows += 1 + (int64_t(d.tokens.size()) - 1) / L;  // ceil(N / L)
    CHECK(r.windows == windows);
    CHECK(r.bits_per_byte == Approx(double(ntok) * std::log2(50257.0) / 1290527.0).epsilon(1e-12));
    CHECK(r.word_perplexity == Approx(std::exp(double(ntok) * std::log(50257.0) / 241335.0)).epsilon(1e-12));
  }
}

TEST_CASE("LAMBADA binary as the evaluator reads it: 5153 examples, scored targets = tok(\" \" + last word)",
          "[eval][data]") {
  const std::string dd = data_dir_or_skip("real LAMBADA");
  if (dd.empty()) return;
  LambadaSet s = read_lambada(eval_files(dd).lambada);
  REQUIRE(s.examples.size() == 5153);
  Tokenizer tok = Tokenizer::load(dd + "/gpt2_tokenizer");
  std::ifstream in(dd + "/lambada/lambada_test.jsonl");
  std::string line;
  size_t i = 0;
  int64_t target_tokens = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    REQUIRE(i < s.examples.size());
    const std::string text = json::parse(line).at("text").get<std::string>();
    const std::string word = text.substr(text.rfind(' ') + 1);
    // What the evaluator scores: the last |target| tokens of the request, at the model's window.
    ScoreRequest q = make_request(s.examples[i].context, s.examples[i].target, 1024, s.tok.eot_id);
    std::vector<uint32_t> scored(q.tokens.end() - q.n_scored, q.tokens.end());
    INFO("example " << i << ": word '" << word << "'");
    REQUIRE(scored == tok.encode(" " + word));
    target_tokens += int64_t(scored.size());
    i++;
  }
  CHECK(i == 5153);
  CountingUniform u(50257, 1024);
  LambadaResult r = eval_lambada(u, s, 0, BatchOptions());
  CHECK(r.examples == 5153);
  CHECK(r.target_tokens == target_tokens);
  CHECK(u.scored == target_tokens);
  CHECK(r.ppl == Approx(std::exp(double(target_tokens) / 5153.0 * std::log(50257.0))).epsilon(1e-10));
}

TEST_CASE("eval_cpu: JSON output, table, and bad input -> error and exit 1", "[eval][cli]") {
  const std::string dd = data_dir_or_skip("eval_cpu CLI tests");
  if (dd.empty()) return;
  const EvalFiles& f = eval_files(dd);
  const std::string dir = scratch_dir("eval_cli");
  const std::string exe = build_dir_of_test() + "/eval_cpu";
  ModelConfig cfg = preset_config("tiny", 50257);
  cfg.seq_len = 32;
  cpu::Model<float> m(cfg);
  m.init(3);
  const std::string ck = dir + "/tiny.model";
  save_model(ck, cfg, m.params.data(), 7);

  // A working run: JSON file with every requested section, printed table, progress line.
  RunResult r = run_cmd(exe + " --checkpoint " + ck + " --lambada " + f.lambada + " --max-examples 20 --wikitext " +
                        f.wikitext + " --max-docs 1 --max-length 16 --tokenizer " + dd + "/gpt2_tokenizer --out " + dir +
                        "/r.json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("lambada acc") && Catch::Contains("wikitext2 word ppl") &&
                        Catch::Contains("examples/s"));
  // the table's reference column: chance levels next to the numbers
  CHECK_THAT(r.out, Catch::Contains("reference") && Catch::Contains("chance: ~0") && Catch::Contains("uniform bytes: 8"));
  // progress lines before the end carry an ETA (77 windows of 16 tokens, in batches of 64)
  CHECK_THAT(r.out, Catch::Matches("(.|\n)*wikitext +64/[0-9]+ windows \\|[^\n]*\\| ETA [0-9]+s(.|\n)*"));
  json j = json::parse(read_file(dir + "/r.json"));
  CHECK(j.at("step") == 7);
  CHECK(j.at("params") == count_params(cfg));
  CHECK(j.at("results").at("lambada").at("examples") == 20);
  CHECK(j.at("results").at("wikitext").at("max_length") == 16);
  CHECK(j.at("results").at("wikitext").at("docs") == 1);
  CHECK(!j.at("results").contains("hellaswag"));
  CHECK(run_cmd(exe + " --help").status == 0);

  // Mismatched tokenizer: a LAMBADA binary of a 50280-id tokenizer (OLMo sizes) vs a GPT-2 model.
  LambadaSet olmo;
  olmo.tok.vocab_size = 50280;
  olmo.tok.eot_id = 50279;
  olmo.tok.name = "olmo";
  olmo.examples.push_back({{1, 2, 3}, {50270}});
  write_lambada(dir + "/olmo_lambada.bin", olmo);
  expect_fail(exe + " --checkpoint " + ck + " --lambada " + dir + "/olmo_lambada.bin", "tokenizer mismatch");
  expect_fail(exe + " --checkpoint " + ck + " --lambada " + f.lambada + " --tokenizer " + dd +
                  "/olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json",
              "mismatch");
  // Corrupt eval files: truncated, wrong kind, garbage.
  std::string bytes = read_file(f.lambada);
  write_file_atomic(dir + "/cut.bin", bytes.data(), bytes.size() - 3);
  expect_fail(exe + " --checkpoint " + ck + " --lambada " + dir + "/cut.bin", "cut.bin");
  expect_fail(exe + " --checkpoint " + ck + " --wikitext " + f.lambada, "lambada.bin");
  write_file_atomic(dir + "/junk.bin", "hello world, not an eval file", 29);
  expect_fail(exe + " --checkpoint " + ck + " --hellaswag " + dir + "/junk.bin", "junk.bin");
  // Missing / corrupt checkpoint.
  expect_fail(exe + " --checkpoint " + dir + "/nope.model --lambada " + f.lambada, "nope.model");
  expect_fail(exe + " --checkpoint " + dir + "/nope.model", "nope.model does not exist");  // before the flags
  std::string ckb = read_file(ck);
  ckb[ckb.size() / 2] ^= 0x5a;
  write_file_atomic(dir + "/bad.model", ckb.data(), ckb.size());
  expect_fail(exe + " --checkpoint " + dir + "/bad.model --lambada " + f.lambada, "bad.model");
  // Flags.
  expect_fail(exe + " --lambada " + f.lambada, "--checkpoint");
  expect_fail(exe + " --checkpoint " + ck, "nothing to evaluate");
  expect_fail(exe + " --checkpoint " + ck + " --wikitext " + f.wikitext + " --max-length 33", "--max-length");
  expect_fail(exe + " --checkpoint " + ck + " --lambada " + f.lambada + " --bogus 1", "--bogus");
  expect_fail(exe + " --checkpoint " + ck + " --val-data '" + dir + "/none_*.bin'", "none_");
  // An unwritable --out is refused before the evaluation runs, not after it.
  expect_fail(exe + " --checkpoint " + ck + " --lambada " + f.lambada + " --out " + dir + "/cut.bin/r.json",
              "--out: cannot write into");
  expect_fail(exe + " --checkpoint " + ck + " --lambada " + f.lambada + " --out " + dir, "is a directory");
  RunResult early = run_cmd(exe + " --checkpoint " + ck + " --lambada " + f.lambada + " --out " + dir + "/cut.bin/r.json");
  CHECK_THAT(early.out, !Catch::Contains("lambada acc"));
}

namespace {

// A bigram model over the byte vocabulary: ln p(v | context) depends only on the last context
// token, from a fixed pseudo-random table (logits in [-3, 3)), except that next[a] >= 0 makes
// that byte the unique argmax after a (logit 4). Since every scored token's previous token is in
// its input, the evaluator's sums have a closed form over the raw text.
class BigramModel : public ScoringModel {
 public:
  BigramModel(int L, const std::vector<int>& next) : L_(L), lp_(size_t(V) * V), am_(V) {
    uint64_t s = 0x1234567ull;
    for (uint32_t a = 0; a < V; a++) {
      std::vector<double> z(V);
      double mx = -1e300;
      for (uint32_t v = 0; v < V; v++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        z[v] = 6.0 * (double(s >> 11) / 9007199254740992.0) - 3.0;
        if (next[a] == int(v)) z[v] = 4.0;
        if (z[v] > mx) mx = z[v], am_[a] = v;
      }
      double sum = 0;
      for (double x : z) sum += std::exp(x - mx);
      for (uint32_t v = 0; v < V; v++) lp_[size_t(a) * V + v] = z[v] - mx - std::log(sum);
    }
  }
  static constexpr uint32_t V = 257;
  int max_seq_len() const override { return L_; }
  uint32_t vocab_size() const override { return V; }
  double lp(uint32_t prev, uint32_t next) const { return lp_[size_t(prev) * V + next]; }
  bool argmax(uint32_t prev, uint32_t next) const { return am_[prev] == next; }
  void forward_logprobs(const int32_t* tokens, const int32_t* targets, int B, int T, double* logprob,
                        uint8_t* is_argmax) override {
    REQUIRE(T <= L_);
    for (int i = 0; i < B * T; i++) {
      if (targets[i] < 0) continue;
      REQUIRE(uint32_t(targets[i]) < V);
      logprob[i] = lp(uint32_t(tokens[i]), uint32_t(targets[i]));
      is_argmax[i] = argmax(uint32_t(tokens[i]), uint32_t(targets[i]));
    }
  }

 private:
  int L_;
  std::vector<double> lp_;
  std::vector<uint32_t> am_;
};

std::vector<uint32_t> bytes_of_u(const std::string& s) {
  std::vector<uint32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

}  // namespace

TEST_CASE("--tokenizer bytes eval binaries: multi-token LAMBADA targets and WikiText scored per word and byte",
          "[eval][data]") {
  const std::string dd = data_dir_or_skip("byte-level eval binaries");
  if (dd.empty()) return;
  const std::string dir = scratch_dir("eval_bytes");
  const std::string bin = build_dir_of_test();
  for (const char* kind : {"lambada", "wikitext"}) {
    const std::string in = std::string(kind) == "lambada" ? dd + "/lambada/lambada_test.jsonl" : dd + "/wikitext2/wiki.test.raw";
    RunResult r = run_cmd(bin + "/ldm_data " + kind + " --tokenizer bytes --input " + in + " --out " + dir + "/" + kind + ".bin");
    INFO(r.out);
    REQUIRE(r.status == 0);
  }
  const Tokenizer bytes = Tokenizer::bytes();
  // LAMBADA: context = the bytes before the last space, target = the bytes of " " + last word
  LambadaSet L = read_lambada(dir + "/lambada.bin");
  REQUIRE(L.examples.size() == 5153);
  CHECK(L.tok.vocab_size == 257);
  CHECK(L.tok.eot_id == 256);
  CHECK(L.tok.name == "bytes");
  CHECK(L.tok.fingerprint == evalprep::tokenizer_fingerprint(bytes));
  // Successors chosen so that some targets are the model's greedy continuation (all their bytes
  // argmax): over the distinct (last context byte, target) pairs, most frequent first, each one
  // whose byte pairs agree with the successors chosen so far adds its own.
  std::vector<std::pair<std::string, std::string>> texts;  // (context, target)
  {
    std::ifstream f(dd + "/lambada/lambada_test.jsonl");
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      const std::string text = json::parse(line).at("text").get<std::string>();
      const size_t sp = text.rfind(' ');
      texts.push_back({text.substr(0, sp), text.substr(sp)});
    }
  }
  REQUIRE(texts.size() == 5153);
  std::map<std::pair<unsigned char, std::string>, int> freq;
  for (const auto& t : texts) freq[{(unsigned char)t.first.back(), t.second}]++;
  std::vector<std::pair<int, std::pair<unsigned char, std::string>>> by_freq;
  for (const auto& kv : freq) by_freq.push_back({-kv.second, kv.first});
  std::sort(by_freq.begin(), by_freq.end());
  std::vector<int> next(257, -1);
  for (const auto& e : by_freq) {
    std::vector<int> trial = next;
    unsigned char prev = e.second.first;
    bool ok = true;
    for (unsigned char c : e.second.second) {
      if (trial[prev] >= 0 && trial[prev] != c) ok = false;
      trial[prev] = c;
      prev = c;
    }
    if (ok) next = trial;
  }
  BigramModel m(64, next);
  size_t i = 0;
  double ll = 0;
  int64_t correct = 0, target_bytes = 0;
  for (const auto& t : texts) {
    const std::string &ctx = t.first, &tgt = t.second;
    INFO("example " << i);
    REQUIRE(L.examples[i].context == bytes_of_u(ctx));
    REQUIRE(L.examples[i].target == bytes_of_u(tgt));
    REQUIRE(tgt.size() >= 2);      // every target is several tokens
    REQUIRE(tgt.size() + 1 <= 64);  // the bigram closed form needs the token before the target
    uint32_t prev = uint32_t((unsigned char)ctx.back());
    bool all = true;
    for (unsigned char c : tgt) {
      ll += m.lp(prev, c);
      all = all && m.argmax(prev, c);
      prev = c;
    }
    correct += all;
    target_bytes += int64_t(tgt.size());
    i++;
  }
  REQUIRE(i == 5153);
  CHECK(correct > 10);  // the accuracy check is not vacuous
  CHECK(correct < 5153);
  BatchOptions o;
  o.batch_tokens = 1 << 14;
  LambadaResult lr = eval_lambada(m, L, 0, o);
  CHECK(lr.target_tokens == target_bytes);
  CHECK(lr.correct == correct);
  CHECK(lr.ll == Approx(ll).epsilon(1e-12));
  CHECK(lr.ppl == Approx(std::exp(-ll / 5153.0)).epsilon(1e-10));  // per word (one word per example)

  // WikiText-2: tokens = the bytes of the detokenized page; word / byte counts of the original
  WikiTextSet W = read_wikitext(dir + "/wikitext.bin");
  REQUIRE(W.docs.size() == 62);
  CHECK(W.total_words == 241335);
  CHECK(W.total_bytes == 1290527);
  CHECK(W.tok.eot_id == 256);
  const std::vector<std::string> pages = evalprep::wikitext_split_pages(evalprep::universal_newlines(read_file(dd + "/wikitext2/wiki.test.raw")));
  REQUIRE(pages.size() == 62);
  double wll = 0;
  for (size_t d = 0; d < pages.size(); d++) {
    const std::string det = evalprep::wikitext_detokenize(pages[d]);
    REQUIRE(W.docs[d].tokens == bytes_of_u(det));
    REQUIRE(W.docs[d].bytes == pages[d].size());
    uint32_t prev = 256;  // the first byte of a page is predicted from the EOT prefix
    for (unsigned char c : det) {
      wll += m.lp(prev, c);
      prev = c;
    }
  }
  for (int Lw : {64, 17}) {  // every byte scored once with its previous byte in the window
    INFO("window " << Lw);
    WikiTextResult wr = eval_wikitext(m, W, Lw, 0, o);
    CHECK(wr.ll == Approx(wll).epsilon(1e-11));
    CHECK(wr.word_perplexity == Approx(std::exp(-wll / 241335.0)).epsilon(1e-10));
    CHECK(wr.byte_perplexity == Approx(std::exp(-wll / 1290527.0)).epsilon(1e-10));
    CHECK(wr.bits_per_byte == Approx(-wll / 1290527.0 / std::log(2.0)).epsilon(1e-10));
  }
}

TEST_CASE("eval_cpu and generate_cpu with a byte-level model (--tokenizer bytes)", "[eval][cli]") {
  const std::string dd = data_dir_or_skip("byte-level eval_cpu");
  if (dd.empty()) return;
  const std::string dir = scratch_dir("eval_bytes_cli");
  const std::string bin = build_dir_of_test();
  for (const char* kind : {"lambada", "wikitext"}) {
    const std::string in = std::string(kind) == "lambada" ? dd + "/lambada/lambada_test.jsonl" : dd + "/wikitext2/wiki.test.raw";
    REQUIRE(run_cmd(bin + "/ldm_data " + kind + " --tokenizer bytes --input " + in + " --out " + dir + "/" + kind + ".bin").status == 0);
  }
  REQUIRE(run_cmd(bin + "/ldm_data hellaswag --tokenizer bytes --input " + dd + "/hellaswag/hellaswag_val_full.txt.bz2 --out " +
                  dir + "/hellaswag.bin").status == 0);
  HellaSwagSet H = read_hellaswag(dir + "/hellaswag.bin");
  REQUIRE(H.items.size() == 10042);
  for (size_t k = 0; k < 4; k++) CHECK(H.items[0].endings[k].size() >= H.items[0].ending_chars[k] + 1);  // " " + choice, >= 1 byte per char
  ModelConfig cfg = preset_config("tiny", 257);
  CHECK(cfg.padded_vocab == 384);
  cfg.seq_len = 32;
  cpu::Model<float> m(cfg);
  m.init(5);
  const std::string ck = dir + "/bytes.model";
  save_model(ck, cfg, m.params.data(), 3);
  REQUIRE(run_cmd(bin + "/ldm_data shards --tokenizer bytes --format text --input " + dd +
                  "/tinyshakespeare/input.txt --out-dir " + dir + "/ts --name ts --val-tokens 3000 --quiet").status == 0);
  RunResult r = run_cmd(bin + "/eval_cpu --checkpoint " + ck + " --tokenizer bytes --lambada " + dir + "/lambada.bin" +
                        " --max-examples 10 --wikitext " + dir + "/wikitext.bin --max-docs 1 --hellaswag " + dir +
                        "/hellaswag.bin --val-data '" + dir + "/ts/ts_val_*.bin' --val-batches 2 --out " + dir + "/r.json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  json j = json::parse(read_file(dir + "/r.json"));
  // the uniform model's loss ln V is recorded and printed next to the val loss
  CHECK(j.at("results").at("val").at("uniform_loss").get<double>() == Approx(std::log(257.0)).epsilon(1e-12));
  CHECK_THAT(r.out, Catch::Contains("ln V = 5.5491") && Catch::Contains("chance (4 endings): 0.25"));
  CHECK(j.at("config").at("vocab_size") == 257);
  CHECK(j.at("results").at("lambada").at("examples") == 10);
  CHECK(j.at("results").at("wikitext").at("docs") == 1);
  CHECK(j.at("results").at("hellaswag").at("items") == 10);
  // a random-init model is close to uniform over 257 ids: about ln(257) nats per byte
  const double bpb = j.at("results").at("wikitext").at("bits_per_byte").get<double>();
  CHECK(bpb > 0.8 * std::log2(257.0));
  CHECK(bpb < 1.25 * std::log2(257.0));
  // mismatches: GPT-2 tokenizer with the byte model, byte binaries with a GPT-2 model
  expect_fail(bin + "/eval_cpu --checkpoint " + ck + " --tokenizer " + dd + "/gpt2_tokenizer --lambada " + dir + "/lambada.bin",
              "tokenizer mismatch");
  ModelConfig g = preset_config("tiny", 50257);
  g.seq_len = 32;
  cpu::Model<float> mg(g);
  mg.init(5);
  save_model(dir + "/gpt2.model", g, mg.params.data(), 1);
  expect_fail(bin + "/eval_cpu --checkpoint " + dir + "/gpt2.model --wikitext " + dir + "/wikitext.bin", "tokenizer mismatch");
  // generate_cpu: the prompt is encoded as bytes and the output decodes as bytes
  r = run_cmd(bin + "/generate_cpu --checkpoint " + ck + " --tokenizer bytes --prompt 'ROMEO:' --max-new-tokens 8 "
              "--temperature 0 --threads 1");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("ROMEO:"));
  // without --tokenizer: a 257-id model is read with the byte tokenizer, and says so
  RunResult nt = run_cmd(bin + "/generate_cpu --checkpoint " + ck + " --prompt 'ROMEO:' --max-new-tokens 8 "
                         "--temperature 0 --threads 1");
  INFO(nt.out);
  REQUIRE(nt.status == 0);
  CHECK_THAT(nt.out, Catch::Contains("note: the model has 257 ids: --tokenizer bytes"));
  auto text_of = [](const std::string& out) {  // the generated text: from the prompt to the "---" line
    const size_t a = out.find("ROMEO:");
    return a == std::string::npos ? std::string() : out.substr(a, out.find("\n---\n", a) - a);
  };
  CHECK(!text_of(r.out).empty());
  CHECK(text_of(nt.out) == text_of(r.out));  // the same greedy text
}
