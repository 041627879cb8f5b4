// In-training evaluation (train_cpu --eval-every with --eval-lambada/--eval-wikitext/
// --eval-hellaswag, logged as {"type":"eval"} JSONL events) and scripts/plot_losses.py on the
// JSONL logs of real CPU runs.
#include <catch2/catch.hpp>

#include "core/eval.h"
#include "core/evalfile.h"
#include "test/test_train_shards.h"

using nlohmann::json;

namespace {

std::string png_magic(const std::string& path) {
  std::string b = ldm::file_exists(path) ? ldm::read_file(path) : std::string();
  return b.substr(0, 8);
}

}  // namespace

TEST_CASE("train_cpu --eval-every logs LAMBADA / WikiText / HellaSwag results; plot_losses draws the runs",
          "[eval][train]") {
  const std::string dd = data_dir_or_skip("in-training eval needs the shared data");
  if (dd.empty()) return;
  const std::string bin = build_dir_of_test();
  const std::string dir = scratch_dir("eval_train");
  const std::string shards = dir + "/shards";
  run_cmd("mkdir -p '" + shards + "'");
  REQUIRE(make_fineweb_shards(shards, dd, 40));
  const std::string tok = dd + "/gpt2_tokenizer";
  REQUIRE(run_cmd(bin + "/ldm_data lambada --tokenizer " + tok + " --input " + dd + "/lambada/lambada_test.jsonl --out " +
                  dir + "/lambada.bin").status == 0);
  REQUIRE(run_cmd(bin + "/ldm_data wikitext --tokenizer " + tok + " --input " + dd + "/wikitext2/wiki.test.raw --out " +
                  dir + "/wikitext.bin").status == 0);
  REQUIRE(run_cmd(bin + "/ldm_data hellaswag --tokenizer " + tok + " --input " + dd +
                  "/hellaswag/hellaswag_val_full.txt.bz2 --out " + dir + "/hellaswag.bin").status == 0);
  const std::string base = bin + "/train_cpu --preset tiny -B 2 -T 32 --train-data '" + shards + "/train.bin' --val-data '" +
                           shards + "/val.bin' --val-batches 2 --val-every 2 --quiet --sample-every -1";
  RunResult r = run_cmd(base + " --steps 4 --eval-every 2 --eval-lambada " + dir + "/lambada.bin --eval-wikitext " + dir +
                        "/wikitext.bin --eval-hellaswag " + dir + "/hellaswag.bin --eval-max-examples 4 --out-dir " + dir +
                        "/run1 --log " + dir + "/run1/log.jsonl");
  INFO(r.out);
  REQUIRE(r.status == 0);
  std::vector<json> evals;
  for (const json& e : read_jsonl(dir + "/run1/log.jsonl"))
    if (e.at("type") == "eval") evals.push_back(e);
  REQUIRE(evals.size() == 2);  // step 2 and the end (step 4)
  CHECK(evals[0].at("step") == 2);
  CHECK(evals[1].at("step") == 4);
  for (const json& e : evals) {
    const json& res = e.at("results");
    CHECK(res.at("lambada").at("examples") == 4);
    CHECK(res.at("hellaswag").at("items") == 4);
    CHECK(res.at("wikitext").at("docs") == 4);
    CHECK(res.at("wikitext").at("max_length") == 32);
    CHECK(res.at("lambada").at("ppl").get<double>() > 1.0);
  }
  // The logged LAMBADA result at the end equals eval_cpu on the final checkpoint.
  r = run_cmd(bin + "/eval_cpu --checkpoint " + dir + "/run1/ckpt_000004.model --lambada " + dir +
              "/lambada.bin --max-examples 4 --quiet --out " + dir + "/final.json");
  REQUIRE(r.status == 0);
  json fin = json::parse(ldm::read_file(dir + "/final.json"));
  const double ll_final = fin.at("results").at("lambada").at("ll").get<double>(),
               ll_logged = evals[1].at("results").at("lambada").at("ll").get<double>();
  CHECK_TOL("in-training lambada ll == eval_cpu", std::fabs(ll_final - ll_logged), 1e-9 * std::fabs(ll_logged));
  // the checkpoint's base (as --resume takes it) names the same model file
  r = run_cmd(bin + "/eval_cpu --checkpoint " + dir + "/run1/ckpt_000004 --lambada " + dir +
              "/lambada.bin --max-examples 4 --quiet --out " + dir + "/base.json");
  REQUIRE(r.status == 0);
  CHECK(json::parse(ldm::read_file(dir + "/base.json")).at("results").at("lambada").at("ll").get<double>() == ll_final);

  // Errors: a mismatched eval binary fails at startup; --eval-every without a file is refused.
  ldm::LambadaSet olmo;
  olmo.tok.vocab_size = 50280;
  olmo.tok.eot_id = 50279;
  olmo.examples.push_back({{1, 2}, {3}});
  ldm::write_lambada(dir + "/olmo.bin", olmo);
  r = run_cmd(base + " --steps 2 --eval-lambada " + dir + "/olmo.bin");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("error:") && Catch::Contains("olmo.bin"));
  // Same vocabulary and end-of-text id as GPT-2 but another tokenizer's fingerprint: refused too.
  ldm::LambadaSet other;
  other.tok.vocab_size = 50257;
  other.tok.eot_id = 50256;
  other.tok.fingerprint = 0x0123456789abcdefull;
  other.examples.push_back({{1, 2}, {3}});
  ldm::write_lambada(dir + "/other.bin", other);
  r = run_cmd(base + " --steps 2 --eval-lambada " + dir + "/other.bin");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("other.bin") && Catch::Contains("fingerprint 0123456789abcdef") &&
                        Catch::Contains("tokenizer mismatch"));
  r = run_cmd(base + " --steps 2 --eval-every 1");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("--eval-every"));

  // plot_losses on two CPU runs' logs (the one above and a second, shorter run).
  REQUIRE(run_cmd(base + " --steps 3 --lr 3e-3 --log " + dir + "/run2/log.jsonl").status == 0);
  const std::string py = std::string("/usr/bin/python3 ") + LDM_SOURCE_DIR + "/scripts/plot_losses.py ";
  r = run_cmd(py + dir + "/run1/log.jsonl " + dir + "/run2/log.jsonl --smooth 0.5 --out " + dir + "/losses.png");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(png_magic(dir + "/losses.png") == "\x89PNG\r\n\x1a\n");
  CHECK_THAT(r.out, Catch::Contains("4 train steps") && Catch::Contains("3 train steps") &&
                        Catch::Contains("3 val points"));  // val at steps 0, 2 and the end
  ldm::write_file_atomic(dir + "/bad.jsonl", "{\"type\":\"step\"\n", 15);
  CHECK(run_cmd(py + dir + "/bad.jsonl --out " + dir + "/x.png").status == 1);
  CHECK(run_cmd(py + dir + "/missing.jsonl --out " + dir + "/x.png").status == 1);
  CHECK(!ldm::file_exists(dir + "/x.png"));
}
