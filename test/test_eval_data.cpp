// The evaluator on the real eval binaries and from the command line: what eval_cpu reads from the
// WikiText-2 / LAMBADA binaries built by the data tool (documents, words, bytes, every token
// scored once; 5153 LAMBADA examples whose scored targets are tok(" " + last word)), and bad
// inputs (mismatched tokenizer, corrupt eval file, missing/corrupt checkpoint, bad flags) ->
// "error: ..." and exit status 1. The format itself is tested by test_evalprep.
#include <catch2/catch.hpp>

#include <fstream>

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
