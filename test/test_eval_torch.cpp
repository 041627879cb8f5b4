// build/eval_cpu against the independent PyTorch reference (scripts/torch_eval_ref.py, run live
// with /usr/bin/python3 + Debian's python3-torch, reusing scripts/torch_ref.py's model): the same
// tiny checkpoint on the first 200 LAMBADA examples, 3 WikiText-2 documents and 30 HellaSwag
// items, from eval binaries built from the shared data with the data tool. Relative agreement
// <= 1e-4 on every log-likelihood and perplexity; identical accuracy counts. If torch is missing
// the test FAILS (the script exits 2), it does not skip.
#include <catch2/catch.hpp>

#include <fstream>

#include "core/checkpoint.h"
#include "core/config.h"
#include "cpu/model.h"
#include "test/test_train_shards.h"

using nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

void check_rel(const json& a, const json& b, const char* key) {
  const double x = a.at(key).get<double>(), y = b.at(key).get<double>();
  INFO(key << ": eval_cpu " << x << " torch " << y);
  CHECK_TOL(std::string("eval_cpu vs torch/") + key, std::abs(x - y), 1e-4 * std::abs(y));
}

}  // namespace

TEST_CASE("eval_cpu agrees with the PyTorch reference (LAMBADA 200, WikiText-2 3 docs, HellaSwag 30)", "[eval][torch]") {
  const std::string dd = data_dir_or_skip("eval torch comparison needs the shared data");
  if (dd.empty()) return;
  const std::string bin = build_dir_of_test();
  const std::string dir = scratch_dir("eval_torch");
  const std::string tok = dd + "/gpt2_tokenizer";
  // Eval binaries through the data tool, as a user builds them.
  RunResult r = run_cmd(bin + "/ldm_data lambada --tokenizer " + tok + " --input " + dd +
                        "/lambada/lambada_test.jsonl --out " + dir + "/lambada.bin");
  REQUIRE(r.status == 0);
  r = run_cmd(bin + "/ldm_data wikitext --tokenizer " + tok + " --input " + dd + "/wikitext2/wiki.test.raw --out " +
              dir + "/wikitext.bin");
  REQUIRE(r.status == 0);
  r = run_cmd(bin + "/ldm_data hellaswag --tokenizer " + tok + " --input " + dd +
              "/hellaswag/hellaswag_val_full.txt.bz2 --out " + dir + "/hellaswag.bin");
  REQUIRE(r.status == 0);

  // Tiny checkpoint: spec init, LM head scaled up so the output distribution is far from uniform
  // (non-trivial log-likelihoods and argmaxes).
  ldm::ModelConfig cfg = ldm::preset_config("tiny", 50257);
  cfg.seq_len = 48;  // short window: LAMBADA contexts are truncated on the left, WikiText has many windows
  ldm::cpu::Model<float> m(cfg);
  m.init(42);
  const ldm::ParamSpec& head = m.spec("lm_head");
  for (int64_t i = 0; i < head.numel; i++) m.params[size_t(head.offset + i)] *= 40.0f;
  const std::string ck = dir + "/tiny.model";
  ldm::save_model(ck, cfg, m.params.data(), 0);

  r = run_cmd(bin + "/eval_cpu --checkpoint " + ck + " --lambada " + dir + "/lambada.bin --max-examples 200 --wikitext " +
              dir + "/wikitext.bin --max-docs 3 --quiet --out " + dir + "/cpp.json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  r = run_cmd(bin + "/eval_cpu --checkpoint " + ck + " --hellaswag " + dir + "/hellaswag.bin --max-examples 30 --quiet --out " +
              dir + "/cpp_hs.json");
  REQUIRE(r.status == 0);
  r = run_cmd(std::string("/usr/bin/python3 ") + LDM_SOURCE_DIR + "/scripts/torch_eval_ref.py --checkpoint " + ck +
              " --lambada " + dir + "/lambada.bin --lambada-examples 200 --wikitext " + dir +
              "/wikitext.bin --wikitext-docs 3 --hellaswag " + dir + "/hellaswag.bin --hellaswag-items 30 --out " + dir +
              "/torch.json");
  INFO(r.out);
  REQUIRE(r.status == 0);  // exit 2 = torch not importable: a failure, not a skip

  const json c = read_json(dir + "/cpp.json").at("results");
  const json hs = read_json(dir + "/cpp_hs.json").at("results").at("hellaswag");
  const json t = read_json(dir + "/torch.json");
  const json& cl = c.at("lambada");
  const json& tl = t.at("lambada");
  CHECK(cl.at("examples") == 200);
  CHECK(tl.at("examples") == 200);
  check_rel(cl, tl, "ll");
  check_rel(cl, tl, "ppl");
  CHECK(cl.at("correct") == tl.at("correct"));
  const json& cw = c.at("wikitext");
  const json& tw = t.at("wikitext");
  CHECK(cw.at("docs") == 3);
  CHECK(cw.at("windows") == tw.at("windows"));
  CHECK(cw.at("tokens") == tw.at("tokens"));
  CHECK(cw.at("words") == tw.at("words"));
  CHECK(cw.at("bytes") == tw.at("bytes"));
  CHECK(cw.at("max_length") == 48);
  check_rel(cw, tw, "ll");
  check_rel(cw, tw, "word_perplexity");
  check_rel(cw, tw, "byte_perplexity");
  check_rel(cw, tw, "bits_per_byte");
  const json& th = t.at("hellaswag");
  CHECK(hs.at("items") == 30);
  CHECK(hs.at("correct") == th.at("correct"));
  CHECK(hs.at("correct_norm") == th.at("correct_norm"));
  WARN("LAMBADA ppl " << cl.at("ppl") << " vs " << tl.at("ppl") << ", acc " << cl.at("acc") << "; WikiText word ppl "
                      << cw.at("word_perplexity") << " vs " << tw.at("word_perplexity") << "; HellaSwag acc_norm "
                      << hs.at("acc_norm") << " vs " << th.at("acc_norm"));
}
