// test/test_generate_cli.cpp — build/generate_cpu end to end: the generated ids equal
// cpu::generate on the same model (built here from the preset and init seed), the text and the
// GENERATE report are printed, the random prompt of --prompt-len is cpu::random_token_ids, and
// bad input (context, prompt length, checkpoint, tokenizer) exits 1 with an error line. Also the
// shared helpers of cpu/generate_io.h directly.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common.h"
#include "core/checkpoint.h"
#include "core/config.h"
#include "core/tokenizer.h"
#include "cpu/generate_io.h"
#include "cpu/infer.h"
#include "cpu/model.h"
#include "test/test_train_shards.h"

using namespace ldm;
using nlohmann::json;

namespace {

// The GENERATE {json} line of a generate_cpu run.
json generate_line(const std::string& out) {
    const size_t p = out.rfind("GENERATE {");
    REQUIRE(p != std::string::npos);
    const size_t e = out.find('\n', p);
    return json::parse(out.substr(p + 9, e == std::string::npos ? std::string::npos : e - p - 9));
}

ModelConfig tiny_config(const std::string& scheme, int V, int T) {
    ModelConfig c = preset_config("tiny", V);
    c.seq_len = T;
    c.scheme = scheme;
    c.validate();
    return c;
}

}  // namespace

TEST_CASE("generate_cpu: greedy ids equal cpu::generate on the same model; text and report printed", "[generate]") {
    const std::string dd = data_dir_or_skip("generate_cpu test needs the GPT-2 tokenizer");
    if (dd.empty()) return;
    const Tokenizer tok = Tokenizer::load(dd + "/gpt2_tokenizer");
    const std::string bin = build_dir_of_test() + "/generate_cpu";
    const std::string text = "The history of the printing press";
    for (const std::string scheme : {"preln", "ldm"}) {
        INFO("scheme " << scheme);
        const ModelConfig cfg = tiny_config(scheme, (int)tok.vocab_size(), 64);
        cpu::Model<double> m(cfg);
        m.init(3);
        const std::vector<int32_t> prompt = cpu::generation_prompt(&tok, text, 0, 1, cfg.vocab_size);
        REQUIRE(prompt.size() >= 5);
        cpu::Inference<double> inf(m, 1, 64);
        cpu::SamplingParams sp;
        sp.greedy = true;
        const std::vector<int32_t> want = cpu::generate(inf, prompt, 7, sp, 1);
        REQUIRE(want.size() == 7);

        RunResult r = run_cmd("'" + bin + "' --preset tiny --scheme " + scheme +
                              " --seq-len 64 --init-seed 3 --dtype fp64 --greedy --max-new-tokens 7 --threads 1 --prompt '" +
                              text + "'");
        INFO(r.out);
        REQUIRE(r.status == 0);
        CHECK_THAT(r.out, Catch::Contains(text) && Catch::Contains("\n---\n") && Catch::Contains("ms/token"));
        const json g = generate_line(r.out);
        CHECK(g.at("tokens").get<std::vector<int32_t>>() == want);
        CHECK(g.at("prompt_tokens") == (int)prompt.size());
        CHECK(g.at("new_tokens") == 7);
        CHECK(g.at("decode_steps") == 6);
        CHECK(g.at("scheme") == scheme);
        CHECK(g.at("dtype") == "fp64");
        CHECK(g.at("kv_cache_bytes").get<int64_t>() == inf.cache().bytes());
        CHECK(g.at("prefill_tokens_per_s").get<double>() > 0);
    }
}

TEST_CASE("generate_cpu: --prompt-len draws cpu::random_token_ids; bad input exits 1", "[generate]") {
    const std::string dd = data_dir_or_skip("generate_cpu test needs the GPT-2 tokenizer");
    if (dd.empty()) return;
    const std::string exe = "'" + build_dir_of_test() + "/generate_cpu'";
    const std::string bin = exe + " --preset tiny --seq-len 32 --threads 1";
    // random prompt: 12 ids from the stream of --seed; greedy from it equals the library's
    const ModelConfig cfg = tiny_config("preln", 50257, 32);
    const std::vector<int32_t> prompt = cpu::random_token_ids(5, 12, cfg.vocab_size);
    cpu::Model<double> m(cfg);
    m.init(1);
    cpu::Inference<double> inf(m, 1, 32);
    cpu::SamplingParams sp;
    sp.greedy = true;
    const std::vector<int32_t> want = cpu::generate(inf, prompt, 4, sp, 5);
    RunResult r = run_cmd(bin + " --dtype fp64 --greedy --prompt-len 12 --seed 5 --max-new-tokens 4");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("[random prompt] "));
    CHECK(generate_line(r.out).at("tokens").get<std::vector<int32_t>>() == want);

    auto fails = [&](const std::string& flags, const std::string& needle) {
        RunResult b = run_cmd((flags.rfind("--checkpoint", 0) == 0 ? exe : bin) + " " + flags);
        INFO(flags << "\n" << b.out);
        CHECK(b.status == 1);
        CHECK_THAT(b.out, Catch::Contains("error:") && Catch::Contains(needle));
    };
    fails("--max-len 33", "exceeds the model's seq_len 32");
    fails("--prompt-len 20 --max-len 16", "more than the context of 16");
    fails("--checkpoint /nonexistent/x.model", "does not exist");
    fails("--tokenizer /nonexistent/tok", "does not exist");
    fails("--max-new-tokens 0", "--max-new-tokens");
    fails("--temperature nan", "--temperature: expected a finite number, got 'nan'");
    fails("--threads 100000", "--threads must be between 0 (all cores) and 4096, got 100000");
    fails("--n-layer -1", "--n-layer must be >= 0 (0 = the preset's), got -1");
    fails("--d-model -64", "--d-model must be >= 0 (0 = the preset's), got -64");
    fails("--vocab-size 100", "--vocab-size 100 is smaller than the tokenizer's 50257 ids");
    fails("--prompt hello --prompt-len 3", "give --prompt or --prompt-len, not both");
    // a huge --prompt-len is refused before anything is allocated (not std::bad_alloc)
    fails("--prompt-len 1000000000", "the prompt has 1000000000 tokens, more than the context of 32");
    // a random-init model with more ids than the tokenizer: those ids are printed as [id N]
    RunResult big = run_cmd(exe + " --preset tiny --seq-len 32 --threads 1 --tokenizer bytes --vocab-size 2000 "
                                  "--prompt ab --max-new-tokens 20 --seed 3");
    INFO(big.out);
    CHECK(big.status == 0);
    CHECK_THAT(big.out, Catch::Contains("[id ") && Catch::Contains("GENERATE "));
    // a generation past the context slides its window and says so once (12 prompt tokens + 21
    // new fill 32 positions: 19 more on the window of the last 32)
    RunResult full = run_cmd(bin + " --greedy --prompt-len 12 --max-new-tokens 40 --quiet");
    INFO(full.out);
    CHECK(full.status == 0);
    CHECK_THAT(full.out, Catch::Contains("note: the context of 32 tokens (--max-len, the model's seq_len) filled after 21 "
                                         "new tokens; the last 19 were each predicted from the previous 32 tokens"));
    size_t notes = 0;
    for (size_t p = full.out.find("note: the context"); p != std::string::npos; p = full.out.find("note: the context", p + 1))
        notes++;
    CHECK(notes == 1);
    const json gl = generate_line(full.out);
    CHECK(gl.at("new_tokens") == 40);
    CHECK(gl.at("window_steps") == 19);
    CHECK(gl.at("decode_steps") == 20);
}

TEST_CASE("print_generation writes every byte (NUL too) and names ids beyond the tokenizer", "[generate]") {
    const Tokenizer tok = Tokenizer::bytes();  // id b < 256 is byte b
    const std::string path = train_scratch("generate_print") + "/stdout.txt";
    std::fflush(stdout);
    const int saved = ::dup(1);
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f);
    ::dup2(::fileno(f), 1);
    cpu::print_generation(&tok, {'a', 'b'}, {0, 'c', 300, 'd'}, false);
    cpu::print_generation(&tok, {1, 2}, {'e'}, true);
    std::fflush(stdout);
    ::dup2(saved, 1);
    ::close(saved);
    std::fclose(f);
    CHECK(slurp(path) == std::string("ab") + '\0' + "c[id 300]d\n---\n[random prompt] e\n---\n");
}

TEST_CASE("check_generation_setup: --stop-at-eot needs a tokenizer, --prompt-len must fit", "[generate]") {
    cpu::GenerationFlags g;
    const Tokenizer tok = Tokenizer::bytes();
    cpu::check_generation_setup(g, nullptr, 64);
    g.stop_at_eot = true;
    CHECK_THROWS_WITH(cpu::check_generation_setup(g, nullptr, 64), Catch::Contains("--stop-at-eot needs a tokenizer"));
    cpu::check_generation_setup(g, &tok, 64);
    g.prompt_len = 64;
    cpu::check_generation_setup(g, &tok, 64);
    g.prompt_len = 65;
    CHECK_THROWS_WITH(cpu::check_generation_setup(g, &tok, 64), Catch::Contains("more than the context of 64"));
    g.prompt_len = 20;
    g.max_len = 16;
    CHECK_THROWS_WITH(cpu::check_generation_setup(g, &tok, 64), Catch::Contains("more than the context of 16"));
    g.max_len = 65;
    CHECK_THROWS_WITH(cpu::check_generation_setup(g, &tok, 64), Catch::Contains("exceeds the model's seq_len 64"));
}

TEST_CASE("generate_io helpers: prompt, context, report", "[generate]") {
    // random ids: in range, deterministic, different seeds differ
    const auto a = cpu::random_token_ids(9, 200, 1000), b = cpu::random_token_ids(9, 200, 1000);
    CHECK(a == b);
    CHECK(a != cpu::random_token_ids(10, 200, 1000));
    for (int32_t x : a) CHECK((x >= 0 && x < 1000));
    CHECK(cpu::generation_prompt(nullptr, "", 7, 9, 1000) == cpu::random_token_ids(9, 7, 1000));
    CHECK_THROWS_AS(cpu::generation_prompt(nullptr, "text", 0, 1, 1000), Error);  // text needs a tokenizer
    CHECK(cpu::generation_context(0, 64, 10) == 64);
    CHECK(cpu::generation_context(16, 64, 16) == 16);
    CHECK_THROWS_AS(cpu::generation_context(65, 64, 1), Error);
    CHECK_THROWS_AS(cpu::generation_context(16, 64, 17), Error);
    cpu::GenerateStats st;
    st.prompt_tokens = 10;
    st.new_tokens = 4;
    st.prefill_s = 0.5;
    st.decode_ms = {2.0, 4.0, 9.0};
    const json r = cpu::generate_report("mhc", st, 1234, "fp32");
    CHECK(r.at("prefill_tokens_per_s").get<double>() == Approx(20.0));
    CHECK(r.at("decode_ms_mean").get<double>() == Approx(5.0));
    CHECK(r.at("decode_ms_median").get<double>() == Approx(4.0));
    CHECK(r.at("decode_tokens_per_s").get<double>() == Approx(200.0));
    CHECK(r.at("decode_steps") == 3);
    CHECK(r.at("kv_cache_bytes") == 1234);
    CHECK(r.at("scheme") == "mhc");

    const std::string dd = data_dir_or_skip("tokenizer prompt check needs the GPT-2 tokenizer");
    if (dd.empty()) return;
    const Tokenizer tok = Tokenizer::load(dd + "/gpt2_tokenizer");
    // an empty prompt starts from <|endoftext|>; ids beyond the model's vocabulary are refused
    CHECK(cpu::generation_prompt(&tok, "", 0, 1, 50257) == std::vector<int32_t>{(int32_t)tok.eot_id()});
    CHECK(cpu::generation_prompt(&tok, "Hello world", 0, 1, 50257) == std::vector<int32_t>{15496, 995});
    CHECK_THROWS_AS(cpu::generation_prompt(&tok, "Hello world", 0, 1, 1000), Error);
}

TEST_CASE("generate_cpu: a byte-level checkpoint (257 ids) needs no --tokenizer", "[generate]") {
    const std::string bin = build_dir_of_test() + "/generate_cpu";
    const std::string dir = train_scratch("generate_bytes");
    const ModelConfig cfg = tiny_config("preln", 257, 32);
    cpu::Model<float> m(cfg);
    m.init(5);
    save_model<float>(dir + "/bytes.model", cfg, m.params.data(), 0);
    RunResult r = run_cmd("'" + bin + "' --checkpoint " + dir + "/bytes.model --greedy --max-new-tokens 4 --threads 1 "
                          "--prompt 'To be'");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("note: the model has 257 ids: --tokenizer bytes"));
    CHECK(generate_line(r.out).at("prompt_tokens") == 5);  // one id per byte
    // any other vocabulary still needs its tokenizer (the default, GPT-2's, does not fit 300 ids)
    const ModelConfig c300 = tiny_config("preln", 300, 32);
    cpu::Model<float> m300(c300);
    m300.init(5);
    save_model<float>(dir + "/v300.model", c300, m300.params.data(), 0);
    const std::string dd = data_dir_or_skip("the default tokenizer");
    if (dd.empty()) return;
    r = run_cmd("'" + bin + "' --checkpoint " + dir + "/v300.model --max-new-tokens 4 --threads 1 --prompt 'To be'");
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("has 50257 ids but the model has vocab_size 300: tokenizer mismatch"));
}
