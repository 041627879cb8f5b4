// Unit tests of the trainers' shared helpers: core/cli.h (flag parsing, help, errors) and
// core/logger.h (JSONL lines).
#include <catch2/catch.hpp>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/cli.h"
#include "core/common.h"
#include "core/logger.h"
#include "test/helpers.h"

using namespace ldm;

namespace {
struct Argv {
    std::vector<std::string> s;
    std::vector<char*> p;
    explicit Argv(std::vector<std::string> a) : s(std::move(a)) {
        for (auto& x : s) p.push_back(&x[0]);
    }
    int argc() { return int(p.size()); }
    char** argv() { return p.data(); }
};
}  // namespace

TEST_CASE("ArgParser: values, aliases, = syntax, switches, defaults in help", "[cli]") {
    std::string preset = "tiny";
    int B = 4;
    int64_t steps = 100;
    double lr = 1e-3;
    bool dry = false;
    ArgParser ap("prog", "desc");
    ap.add("--preset", &preset, "preset");
    ap.add("-B,--batch-size", &B, "batch");
    ap.add("--steps", &steps, "steps");
    ap.add("--lr", &lr, "lr");
    ap.add("--dry-run", &dry, "dry");
    std::string h = ap.help();
    CHECK_THAT(h, Catch::Contains("-B, --batch-size INT") && Catch::Contains("(default: 4)") &&
                      Catch::Contains("(default: 0.001)") && Catch::Contains("(default: tiny)"));
    Argv a({"prog", "-B", "16", "--steps=12345678901", "--lr", "3e-4", "--dry-run", "--preset=small"});
    REQUIRE(ap.parse(a.argc(), a.argv()));
    CHECK(B == 16);
    CHECK(steps == 12345678901LL);
    CHECK(lr == 3e-4);
    CHECK(dry);
    CHECK(preset == "small");
    CHECK(ap.was_set("--batch-size"));
    CHECK(ap.was_set("-B"));
    CHECK(!ap.was_set("--nothing"));
    CHECK(ap.flag_names() == std::vector<std::string>{"--preset", "--batch-size", "--steps", "--lr", "--dry-run"});
}

TEST_CASE("ArgParser: errors name the flag", "[cli]") {
    int B = 4;
    double lr = 0;
    ArgParser ap("prog", "desc");
    ap.add("-B,--batch-size", &B, "batch");
    ap.add("--lr", &lr, "lr");
    Argv a1({"prog", "--batch-size", "4x"});
    CHECK_THROWS_WITH(ap.parse(a1.argc(), a1.argv()), Catch::Contains("--batch-size: expected an integer, got '4x'"));
    Argv a2({"prog", "--lr"});
    CHECK_THROWS_WITH(ap.parse(a2.argc(), a2.argv()), Catch::Contains("--lr: missing value"));
    Argv a3({"prog", "--lx", "1"});
    CHECK_THROWS_WITH(ap.parse(a3.argc(), a3.argv()), Catch::Contains("unknown flag '--lx'"));
    Argv a4({"prog", "stray"});
    CHECK_THROWS_WITH(ap.parse(a4.argc(), a4.argv()), Catch::Contains("unexpected argument 'stray'") &&
                                                          !Catch::Contains("quote it"));
    // a pattern the shell expanded: the second path follows the flag's value
    Argv a6({"prog", "--lr", "1", "--batch-size", "2", "d/a_000001.bin", "d/a_000002.bin"});
    CHECK_THROWS_WITH(ap.parse(a6.argc(), a6.argv()),
                      Catch::Contains("unexpected argument 'd/a_000001.bin'") && Catch::Contains("quote it: 'dir/*.bin'"));
    // mistyped flags: the one flag the name begins, else the nearest within 2 edits, else none
    CHECK_THROWS_WITH(ap.parse(a3.argc(), a3.argv()), Catch::Contains("unknown flag '--lx' (did you mean --lr? see --help)"));
    Argv a7({"prog", "--batch"});
    CHECK_THROWS_WITH(ap.parse(a7.argc(), a7.argv()), Catch::Contains("(did you mean --batch-size? see --help)"));
    Argv a8({"prog", "--completely-else"});
    CHECK_THROWS_WITH(ap.parse(a8.argc(), a8.argv()), Catch::Contains("unknown flag '--completely-else' (see --help)"));
    CHECK(ap.suggest("--bach-size") == "--batch-size");
    CHECK(ap.suggest("-b") == "-B");
    Argv a5({"prog", "-B", "99999999999"});
    CHECK_THROWS_WITH(ap.parse(a5.argc(), a5.argv()), Catch::Contains("out of range"));
    CHECK(parse_double("1e-3", "--x") == 1e-3);
    CHECK_THROWS_AS(parse_double("", "--x"), Error);
    for (const char* bad : {"inf", "-inf", "infinity", "nan", "NAN", "1e400"})
        CHECK_THROWS_WITH(parse_double(bad, "--x"), Catch::Contains("--x: expected a"));
    CHECK(parse_double("-0.5", "--x") == -0.5);
    CHECK_THROWS_AS(parse_int("1.5", "--x"), Error);
}

TEST_CASE("JsonlLogger writes one parseable object per line; NaN becomes null", "[cli]") {
    const std::string dir = scratch_dir("logger");
    {
        JsonlLogger l(dir + "/a.jsonl", false);
        l.log({{"type", "config"}, {"x", 1}});
        l.log({{"type", "step"}, {"loss", 2.5}, {"bad", std::nan("")}});
    }
    {
        JsonlLogger l(dir + "/a.jsonl", true);  // append
        l.log({{"type", "resume"}, {"text", "caf\xc3\xa9 \"q\"\n"}});
    }
    std::ifstream in(dir + "/a.jsonl");
    std::vector<nlohmann::json> rows;
    std::string line;
    while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
    REQUIRE(rows.size() == 3);
    CHECK(rows[0]["type"] == "config");
    CHECK(rows[1]["loss"] == 2.5);
    CHECK(rows[1]["bad"].is_null());
    CHECK(rows[2]["text"] == "caf\xc3\xa9 \"q\"\n");
    JsonlLogger off;
    CHECK(!off.enabled());
    off.log({{"a", 1}});  // no-op
    CHECK_THROWS_WITH(JsonlLogger(dir + "/no/such/dir/x.jsonl", false), Catch::Contains("--log: cannot open"));

    // a log whose last line was cut by a kill: the appended record starts a line of its own
    const std::string cut = "{\"type\":\"step\",\"step\":1}\n{\"type\":\"step\",\"st";
    write_file_atomic(dir + "/cut.jsonl", cut.data(), cut.size());
    {
        JsonlLogger l(dir + "/cut.jsonl", true);
        l.log({{"type", "resume"}, {"step", 1}});
    }
    CHECK(slurp(dir + "/cut.jsonl") == cut + "\n{\"step\":1,\"type\":\"resume\"}\n");
    // an empty file or one that ends with its newline gets nothing extra
    write_file_atomic(dir + "/whole.jsonl", "{}\n", 3);
    {
        JsonlLogger l(dir + "/whole.jsonl", true);
        l.log({{"a", 1}});
    }
    CHECK(slurp(dir + "/whole.jsonl") == "{}\n{\"a\":1}\n");
}
