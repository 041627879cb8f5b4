// End-to-end tests of the data tool (issue #2 item 5): documents -> shards -> DataLoader read
// back token-for-token equal to encoding each document directly (EOT-prefixed); the ldm_data
// binary's subcommands and its errors on bad input.
#include "test/helpers.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/dataloader.h"
#include "core/shard.h"
#include "core/tokenizer.h"
#include "data/prep_shards.h"

using ldm::Error;

namespace {

std::string self_dir() {
    char buf[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    REQUIRE(n > 0);
    std::string p(buf, size_t(n));
    return p.substr(0, p.find_last_of('/'));
}

// build/<...>/test/test_data_tool -> build/<...>/ldm_data
std::string tool() {
    std::string t = self_dir() + "/../ldm_data";
    if (!ldm::file_exists(t)) FAIL("the data tool is not built: " << t << " (make cpu)");
    return t;
}

struct RunResult {
    int rc;
    std::string out, err;
};

RunResult run(const std::string& args, const std::string& tmpdir) {
    std::string o = tmpdir + "/stdout.txt", e = tmpdir + "/stderr.txt";
    std::string cmd = tool() + " " + args + " >'" + o + "' 2>'" + e + "'";
    int st = std::system(cmd.c_str());
    RunResult r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = ldm::file_exists(o) ? ldm::read_file(o) : "";
    r.err = ldm::file_exists(e) ? ldm::read_file(e) : "";
    return r;
}

const ldm::Tokenizer& gpt2(const std::string& data) {
    static ldm::Tokenizer t = ldm::Tokenizer::load(data + "/gpt2_tokenizer");
    return t;
}

std::vector<uint32_t> with_eot(const ldm::Tokenizer& tok, const std::string& text) {
    std::vector<uint32_t> ids = tok.encode(text);
    ids.insert(ids.begin(), tok.eot_id());
    return ids;
}

std::vector<uint32_t> concat_shards(const std::vector<std::string>& paths) {
    std::vector<uint32_t> all;
    for (const auto& p : paths) {
        auto t = ldm::read_shard(p);
        all.insert(all.end(), t.begin(), t.end());
    }
    return all;
}

// Reads every shard matching `pattern` through a sequential DataLoader (B=1, T) and checks each
// window equals the expected shard contents; returns the number of windows checked.
uint64_t check_with_loader(const std::string& pattern, const std::vector<std::vector<uint32_t>>& shard_tokens,
                           int T, uint32_t vocab) {
    ldm::DataLoader dl(pattern, 1, T, 0, 1, false, 0, vocab);
    std::vector<int32_t> x(static_cast<size_t>(T)), y(static_cast<size_t>(T));
    uint64_t checked = 0;
    for (const auto& st : shard_tokens) {
        uint64_t windows = st.size() >= 1 ? (st.size() - 1) / uint64_t(T) : 0;
        for (uint64_t w = 0; w < windows; w++) {
            dl.next_batch(x.data(), y.data());
            std::vector<int32_t> wx(st.begin() + long(w * uint64_t(T)), st.begin() + long(w * uint64_t(T) + T)),
                wy(st.begin() + long(w * uint64_t(T) + 1), st.begin() + long(w * uint64_t(T) + T + 1));
            REQUIRE(x == wx);
            REQUIRE(y == wy);
            checked++;
        }
    }
    REQUIRE(dl.batches_per_epoch() == checked);
    return checked;
}

std::vector<std::string> fineweb_docs(const std::string& data) {
    std::ifstream f(data + "/fineweb_edu_sample/fineweb_edu_sample.jsonl");
    std::vector<std::string> docs;
    std::string line;
    while (std::getline(f, line)) docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    return docs;
}

}  // namespace

TEST_CASE("FineWeb-Edu sample jsonl -> shards -> loader, token-for-token", "[data_tool]") {
    std::string data = data_dir_or_skip("FineWeb-Edu sample shards");
    if (data.empty()) return;
    const auto& tok = gpt2(data);
    std::vector<std::string> docs = fineweb_docs(data);
    REQUIRE(docs.size() == 150);
    std::vector<uint32_t> val, train;
    for (size_t i = 0; i < docs.size(); i++) {
        auto ids = with_eot(tok, docs[i]);
        (i < 12 ? val : train).insert((i < 12 ? val : train).end(), ids.begin(), ids.end());
    }

    std::string d = scratch_dir("tool_fineweb");
    ldm::ShardsOptions o;
    o.inputs = {data + "/fineweb_edu_sample/*.jsonl"};
    o.out_dir = d + "/out";
    o.name = "fw";
    o.val_docs = 12;
    o.shard_tokens = 20000;
    o.threads = 2;
    o.progress = false;
    o.batch_bytes = 50000;  // many parallel batches
    ldm::ShardsSummary s = ldm::prepare_shards(o, &tok);
    REQUIRE(s.docs == 150);
    REQUIRE(s.val_docs == 12);
    REQUIRE(s.val_tokens == val.size());
    REQUIRE(s.train_tokens == train.size());
    REQUIRE(!s.uint32_tokens);
    size_t n_train = (train.size() + 19999) / 20000;
    REQUIRE(s.shards.size() == 1 + n_train);
    REQUIRE(s.shards[0] == o.out_dir + "/fw_val_000000.bin");
    REQUIRE(s.shards[1] == o.out_dir + "/fw_train_000001.bin");
    REQUIRE(ldm::read_shard(s.shards[0]) == val);
    std::vector<std::string> tr(s.shards.begin() + 1, s.shards.end());
    REQUIRE(concat_shards(tr) == train);
    std::vector<std::vector<uint32_t>> per_shard;
    for (size_t k = 0; k < tr.size(); k++) {
        per_shard.push_back(ldm::read_shard(tr[k]));
        REQUIRE(per_shard.back().size() == (k + 1 < tr.size() ? 20000 : train.size() - 20000 * k));
    }
    REQUIRE(check_with_loader(o.out_dir + "/fw_train_*.bin", per_shard, 256, 50257) > 0);
    REQUIRE(check_with_loader(o.out_dir + "/fw_val_*.bin", {val}, 100, 50257) == (val.size() - 1) / 100);

    // The binary, 1 thread, gives byte-identical shards; rerunning with bigger shards removes the
    // now stale train shards of the first run.
    std::string bin_out = d + "/bin";
    RunResult r = run("shards --tokenizer '" + data + "/gpt2_tokenizer' --input '" + data +
                          "/fineweb_edu_sample/fineweb_edu_sample.jsonl' --out-dir '" + bin_out +
                          "' --name fw --val-docs 12 --shard-tokens 20000 --threads 1",
                      d);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("150 documents") != std::string::npos);
    REQUIRE(r.err.find("MB/s") != std::string::npos);  // the progress line
    for (const auto& p : s.shards) {
        std::string q = bin_out + p.substr(p.find_last_of('/'));
        REQUIRE(ldm::read_file(q) == ldm::read_file(p));
    }
    r = run("shards --tokenizer '" + data + "/gpt2_tokenizer' --input '" + data +
                "/fineweb_edu_sample/fineweb_edu_sample.jsonl' --out-dir '" + bin_out +
                "' --name fw --val-tokens 5000 --shard-tokens 1000000 --quiet",
            d);
    REQUIRE(r.rc == 0);
    REQUIRE(!ldm::file_exists(bin_out + "/fw_train_000002.bin"));
    REQUIRE(r.err.find("removed stale shard") != std::string::npos);
    REQUIRE(r.err.find("replaced 2 earlier shards of name fw in") != std::string::npos);  // val, train 1
    // --val-tokens: whole documents until >= 5000 tokens
    auto v = ldm::read_shard(bin_out + "/fw_val_000000.bin");
    size_t acc = 0, ndoc = 0;
    while (acc < 5000) acc += with_eot(tok, docs[ndoc++]).size();
    REQUIRE(v.size() == acc);
    REQUIRE(ldm::read_shard(bin_out + "/fw_train_000001.bin").size() == val.size() + train.size() - acc);

    // A commit that fails half way (the new fw_train_000002.bin cannot replace a directory of that
    // name) undoes every move: the earlier val and train shards are back, byte for byte, and no
    // new val shard sits beside old train shards.
    const std::string old_val = ldm::read_file(bin_out + "/fw_val_000000.bin"),
                      old_train = ldm::read_file(bin_out + "/fw_train_000001.bin");
    REQUIRE(::system(("mkdir -p '" + bin_out + "/fw_train_000002.bin/x'").c_str()) == 0);
    const std::string small = "shards --tokenizer '" + data + "/gpt2_tokenizer' --input '" + data +
                              "/fineweb_edu_sample/fineweb_edu_sample.jsonl' --out-dir '" + bin_out +
                              "' --name fw --val-docs 40 --shard-tokens 20000 --quiet";
    r = run(small, d);
    INFO(r.err);
    CHECK(r.rc == 1);
    CHECK(r.err.find("cannot move") != std::string::npos);
    CHECK(r.err.find("the earlier shards are back in place") != std::string::npos);
    CHECK(ldm::read_file(bin_out + "/fw_val_000000.bin") == old_val);
    CHECK(ldm::read_file(bin_out + "/fw_train_000001.bin") == old_train);
    CHECK(!ldm::file_exists(bin_out + "/fw_train_000003.bin"));
    CHECK(::system(("ls -d '" + bin_out + "'/.fw.staging.* > /dev/null 2>&1").c_str()) != 0);  // none left
    REQUIRE(::system(("rm -r '" + bin_out + "/fw_train_000002.bin'").c_str()) == 0);
    r = run(small, d);
    CHECK(r.rc == 0);
    CHECK(ldm::read_file(bin_out + "/fw_val_000000.bin") != old_val);  // 40 documents now
    CHECK(ldm::file_exists(bin_out + "/fw_train_000003.bin"));
}

TEST_CASE("tiny Shakespeare as text: split into pieces for threads, same tokens as one encode", "[data_tool]") {
    std::string data = data_dir_or_skip("tiny Shakespeare shards");
    if (data.empty()) return;
    std::string text = ldm::read_file(data + "/tinyshakespeare/input.txt");
    std::string d = scratch_dir("tool_shakespeare");
    struct Tk {
        const char* name;
        std::string path;
        ldm::Tokenizer tok;
        bool splits;
    };
    // A variant of the OLMo tokenizer with add_prefix_space: cutting a document would change its
    // tokens (each piece would get a prefix space), so the tool must encode documents whole.
    nlohmann::json j =
        nlohmann::json::parse(ldm::read_file(data + "/olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json"));
    j["pre_tokenizer"]["add_prefix_space"] = true;
    std::string tj = j.dump();
    ldm::write_file_atomic(d + "/prefix.json", tj.data(), tj.size());
    std::string olmo = data + "/olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json";
    std::vector<Tk> toks = {{"gpt2", data + "/gpt2_tokenizer", gpt2(data), true},
                            {"olmo", olmo, ldm::Tokenizer::load(olmo), true},
                            {"prefix", d + "/prefix.json", ldm::Tokenizer::load(d + "/prefix.json"), false}};
    for (auto& tk : toks) {
        std::vector<uint32_t> expect = with_eot(tk.tok, text);
        for (size_t piece : {size_t(1000), size_t(1 << 18)}) {
            ldm::ShardsOptions o;
            o.inputs = {data + "/tinyshakespeare/input.txt"};
            o.tokenizer = tk.path;
            o.format = "text";
            o.out_dir = d;
            o.name = std::string("ts_") + tk.name;
            o.val_tokens = 30000;  // one document: it all goes to val
            o.threads = 2;
            o.progress = false;
            o.piece_bytes = piece;
            o.batch_bytes = 100000;
            ldm::ShardsSummary s = ldm::prepare_shards(o, &tk.tok);
            INFO(tk.name << " piece " << piece);
            REQUIRE(s.docs == 1);
            REQUIRE(s.shards.size() == 1);
            if (tk.splits) REQUIRE(s.pieces >= text.size() / piece / 2);  // really cut into pieces
            else REQUIRE(s.pieces == 1);
            REQUIRE(ldm::read_shard(s.shards[0]) == expect);
            if (std::string(tk.name) == "gpt2") REQUIRE(expect.size() == 338025 + 1);
            check_with_loader(s.shards[0], {expect}, 1024, tk.tok.vocab_size());
        }
    }
}

TEST_CASE("text --text-split blank: paragraphs are documents", "[data_tool]") {
    std::string data = data_dir_or_skip("paragraph split");
    if (data.empty()) return;
    const auto& tok = gpt2(data);
    std::string d = scratch_dir("tool_blank");
    // two files; blank lines include whitespace-only ones; the second file has no final newline
    std::string a = "\n\nFirst para line one.\nline two\n \t\n\n Second para.\n\n", b = "Third\r\nstill third";
    ldm::write_file_atomic(d + "/a.txt", a.data(), a.size());
    ldm::write_file_atomic(d + "/b.txt", b.data(), b.size());
    std::vector<std::string> paras = {"First para line one.\nline two\n", " Second para.\n", "Third\r\nstill third"};
    std::vector<uint32_t> expect;
    for (auto& p : paras) {
        auto ids = with_eot(tok, p);
        expect.insert(expect.end(), ids.begin(), ids.end());
    }
    ldm::ShardsOptions o;
    o.inputs = {d + "/a.txt", d + "/b.txt"};
    o.format = "text";
    o.text_split = "blank";
    o.out_dir = d + "/out";
    o.name = "p";
    o.val_tokens = 0;
    o.progress = false;
    ldm::ShardsSummary s = ldm::prepare_shards(o, &tok);
    REQUIRE(s.docs == 3);
    REQUIRE(s.val_docs == 0);
    REQUIRE(s.shards == std::vector<std::string>{o.out_dir + "/p_train_000001.bin"});
    REQUIRE(ldm::read_shard(s.shards[0]) == expect);
    // file mode: each file one document, verbatim
    o.text_split = "file";
    o.name = "f";
    s = ldm::prepare_shards(o, &tok);
    auto ea = with_eot(tok, a), eb = with_eot(tok, b);
    ea.insert(ea.end(), eb.begin(), eb.end());
    REQUIRE(ldm::read_shard(s.shards[0]) == ea);
}

TEST_CASE("bad inputs give a clear error, exit 1, and leave no shard", "[data_tool]") {
    std::string data = data_dir_or_skip("data tool errors");
    if (data.empty()) return;
    std::string d = scratch_dir("tool_bad");
    std::string tk = "--tokenizer '" + data + "/gpt2_tokenizer' --out-dir '" + d + "/out' --name bad --quiet ";
    auto write = [&](const std::string& name, const std::string& s) {
        ldm::write_file_atomic(d + "/" + name, s.data(), s.size());
        return d + "/" + name;
    };
    std::string good = "{\"text\": \"hello\"}\n";
    struct Case {
        std::string args, must1, must2;
    };
    std::vector<Case> cases = {
        {"--input '" + d + "/nope.jsonl'", "nope.jsonl", "does not exist"},
        {"--input '" + d + "/nomatch*.jsonl'", "no input files match", "nomatch"},
        {"--input '" + write("badjson.jsonl", good + good + "{\"text\": \"x\",,}\n" + good) + "'", "badjson.jsonl:3",
         "bad JSON"},
        {"--input '" + write("nofield.jsonl", good + "{\"body\": \"x\"}\n") + "'", "nofield.jsonl:2",
         "missing text field 'text'"},
        {"--input '" + write("notstr.jsonl", "{\"text\": 5}\n") + "'", "notstr.jsonl:1", "not a string"},
        {"--input '" + write("array.jsonl", "[1,2]\n") + "'", "array.jsonl:1", "not an object"},
        {"--input '" + write("utf8.jsonl", good + "{\"text\": \"ab\xff\"}\n") + "'", "utf8.jsonl:2", "UTF-8"},
        {"--format text --input '" + write("utf8.txt", std::string(5000, 'a') + "\n\xc3\x28 tail\n") + "'",
         "utf8.txt", "5001"},
        {"--input '" + write("ok.jsonl", good) + "' --format csv", "--format", "jsonl or text"},
        {"--input '" + write("ok2.jsonl", good) + "' --text-split lines --format text", "--text-split", "blank"},
        {"--input '" + write("empty.jsonl", "\n\n") + "'", "no documents", ""},
    };
    for (auto& c : cases) {
        RunResult r = run("shards " + tk + c.args, d);
        INFO(c.args << "\n" << r.err);
        REQUIRE(r.rc == 1);
        REQUIRE(r.err.find("error: ") != std::string::npos);
        REQUIRE(r.err.find(c.must1) != std::string::npos);
        REQUIRE(r.err.find(c.must2) != std::string::npos);
        // nothing at a final shard name, no temp files left behind: the output directory this
        // run would have created does not exist
        RunResult ls = run("info '" + d + "/out/bad_val_000000.bin'", d);
        REQUIRE(ls.rc == 1);
        REQUIRE(!ldm::file_exists(d + "/out"));
    }
    // usage errors exit 2
    REQUIRE(run("shards " + tk + "--input x --bogus 1", d).rc == 2);
    REQUIRE(run("shards --input x", d).rc == 2);
    REQUIRE(run("shards " + tk + "--input '" + d + "/ok.jsonl' --val-docs 1 --val-tokens 3", d).rc == 2);
    // counts without a digit, above INT64_MAX (read as negative = unset before), or a val shard
    // above 2^31 - 1 tokens: refused before any work
    const std::vector<std::pair<std::string, std::string>> bad_counts = {
        {"--val-docs ,", "--val-docs expects a non-negative integer"},
        {"--val-docs _", "--val-docs expects a non-negative integer"},
        {"--val-docs 9223372036854775808", "--val-docs is out of range"},
        {"--val-tokens 2147483648", "--val-tokens must be at most 2147483647"},
        {"--val-docs 9223372036854775808 --val-tokens 9223372036854775809", "--val-tokens must be at most"}};
    for (const auto& b : bad_counts) {
        RunResult u = run("shards " + tk + "--input '" + d + "/ok.jsonl' " + b.first, d);
        INFO(b.first << "\n" << u.err);
        CHECK(u.rc == 2);
        CHECK(u.err.find(b.second) != std::string::npos);
        CHECK(!ldm::file_exists(d + "/out"));
    }
    REQUIRE(run("nosuchcommand", d).rc == 2);
    REQUIRE(run("", d).rc == 2);
    // a bad tokenizer path
    RunResult r = run("shards --tokenizer '" + d + "/none' --input '" + d + "/ok.jsonl' --out-dir '" + d +
                          "/out' --name x",
                      d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find(d + "/none") != std::string::npos);
}

TEST_CASE("--help for the tool and each subcommand", "[data_tool]") {
    std::string d = scratch_dir("tool_help");
    RunResult r = run("--help", d);
    REQUIRE(r.rc == 0);
    for (const char* sub : {"shards", "info", "encode", "decode", "lambada", "wikitext", "hellaswag"})
        REQUIRE(r.out.find(sub) != std::string::npos);
    REQUIRE(r.out.find("bytes") != std::string::npos);  // the tokenizers are listed
    for (const char* sub : {"shards", "info", "encode", "decode", "lambada", "wikitext", "hellaswag"}) {
        RunResult h = run(std::string(sub) + " --help", d);
        INFO(sub << ": " << h.err);
        REQUIRE(h.rc == 0);
        REQUIRE(h.out.find("usage") != std::string::npos);
        REQUIRE(h.out.find("bytes") != std::string::npos);  // --tokenizer bytes
    }
    REQUIRE(run("shards --help", d).out.find("--skip-bad-docs") != std::string::npos);
}

TEST_CASE("encode, decode and info subcommands", "[data_tool]") {
    std::string data = data_dir_or_skip("encode/decode");
    if (data.empty()) return;
    std::string d = scratch_dir("tool_encode");
    std::string tk = "--tokenizer '" + data + "/gpt2_tokenizer' ";
    // GPT-2 ids of "Hello world" are 15496 995 (published in countless tutorials / tiktoken docs)
    RunResult r = run("encode " + tk + "--text 'Hello world'", d);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out == "15496 995\n");
    r = run("encode " + tk + "--eot --text 'Hello world'", d);
    REQUIRE(r.out == "50256 15496 995\n");
    std::string text = "Caf\xc3\xa9 \xe2\x80\x94 na\xc3\xafve 12345!\n\tend";
    ldm::write_file_atomic(d + "/t.txt", text.data(), text.size());
    r = run("encode " + tk + "--file '" + d + "/t.txt'", d);
    REQUIRE(r.rc == 0);
    std::string ids = r.out;
    ids.pop_back();
    const auto& tok = gpt2(data);
    std::string want;
    for (uint32_t v : tok.encode(text)) want += (want.empty() ? "" : " ") + std::to_string(v);
    REQUIRE(ids == want);
    r = run("decode " + tk + ids, d);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out == text);
    r = run("decode " + tk + "15496 50257", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("50257") != std::string::npos);
    r = run("decode " + tk + "12x", d);
    REQUIRE(r.rc == 1);
    std::string bad = "ab\xe2\x82";
    ldm::write_file_atomic(d + "/bad.txt", bad.data(), bad.size());
    r = run("encode " + tk + "--file '" + d + "/bad.txt'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("bad.txt") != std::string::npos);

    std::vector<uint32_t> t = {50256, 7, 7, 9, 50256, 3};
    ldm::write_shard(d + "/s.bin", t.data(), t.size(), false);
    r = run("info '" + d + "/s.bin'", d);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("magic 20240520, version 1") != std::string::npos);
    REQUIRE(r.out.find("tokens:   6") != std::string::npos);
    REQUIRE(r.out.find("min 3, max 50256, 4 distinct") != std::string::npos);
    REQUIRE(r.out.find("docs:     2") != std::string::npos);
    REQUIRE(run("info '" + d + "/s.bin' --vocab 50000", d).rc == 1);
    std::string junk(2000, 'j');
    ldm::write_file_atomic(d + "/j.bin", junk.data(), junk.size());
    r = run("info '" + d + "/j.bin'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("wrong magic") != std::string::npos);
}

TEST_CASE("a vocabulary over 65536 ids gives uint32 shards end to end", "[data_tool]") {
    std::string data = data_dir_or_skip("uint32 shards");
    if (data.empty()) return;
    // A synthetic HF tokenizer: the OLMo tokenizer plus filler vocab entries up to id 69999 and a
    // (non-special, so matched in document text) added token <|big|> = 70000, so vocab_size =
    // 70001 > 65536.
    nlohmann::json j =
        nlohmann::json::parse(ldm::read_file(data + "/olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json"));
    for (int id = 50280; id < 70000; id++) j["model"]["vocab"][ldm::strprintf("zzfill%d", id)] = id;
    j["added_tokens"].push_back({{"id", 70000}, {"content", "<|big|>"}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", false}});
    std::string d = scratch_dir("tool_u32");
    std::string tj = j.dump();
    ldm::write_file_atomic(d + "/big.json", tj.data(), tj.size());
    ldm::Tokenizer tok = ldm::Tokenizer::load(d + "/big.json");
    REQUIRE(tok.vocab_size() == 70001);
    std::vector<std::string> docs = {"Hello<|big|> world", "second <|big|><|big|> doc", "third"};
    std::string jsonl;
    std::vector<uint32_t> expect;
    for (auto& s : docs) {
        jsonl += nlohmann::json({{"text", s}}).dump() + "\n";
        auto ids = with_eot(tok, s);
        expect.insert(expect.end(), ids.begin(), ids.end());
    }
    REQUIRE(std::count(expect.begin(), expect.end(), 70000u) == 3);
    ldm::write_file_atomic(d + "/in.jsonl", jsonl.data(), jsonl.size());
    RunResult r = run("shards --tokenizer '" + d + "/big.json' --input '" + d + "/in.jsonl' --out-dir '" + d +
                          "/out' --name big --val-tokens 0 --quiet",
                      d);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("uint32") != std::string::npos);
    ldm::ShardInfo info = ldm::read_shard_info(d + "/out/big_train_000001.bin");
    REQUIRE(info.magic == 20240801);
    REQUIRE(info.version == 7);
    REQUIRE(info.token_bytes == 4);
    REQUIRE(ldm::read_shard(info.path) == expect);
    check_with_loader(info.path, {expect}, 4, 70001);
    // id 70000 >= vocab: error when the loader is constructed
    REQUIRE_THROWS_AS(ldm::DataLoader(info.path, 1, 4, 0, 1, false, 0, 70000), Error);
}

TEST_CASE("streaming: peak memory does not grow with the input size", "[data_tool]") {
    std::string data = data_dir_or_skip("streaming memory");
    if (data.empty()) return;
    std::string d = scratch_dir("tool_stream");
    std::string sample = ldm::read_file(data + "/fineweb_edu_sample/fineweb_edu_sample.jsonl");
    {
        std::string small, big;
        for (int i = 0; i < 4; i++) small += sample;  // 1.7 MB
        for (int i = 0; i < 48; i++) big += sample;   // 20 MB
        ldm::write_file_atomic(d + "/small.jsonl", small.data(), small.size());
        ldm::write_file_atomic(d + "/big.jsonl", big.data(), big.size());
    }
    // Runs the tool as a direct child and returns that child's own peak RSS (wait4).
    auto peak_kb = [&](const std::string& in) {
        std::vector<std::string> args = {tool(), "shards", "--tokenizer", data + "/gpt2_tokenizer", "--input",
                                         d + "/" + in, "--out-dir", d + "/out", "--name", "s", "--val-docs", "10",
                                         "--shard-tokens", "1000000", "--threads", "1", "--quiet"};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(&a[0]);
        argv.push_back(nullptr);
        pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            if (!std::freopen("/dev/null", "w", stdout)) _exit(126);
#ifdef __SANITIZE_ADDRESS__
            // ASan's quarantine keeps freed memory resident, which would look like growth.
            ::setenv("ASAN_OPTIONS", "quarantine_size_mb=0", 1);
#endif
            ::execv(argv[0], argv.data());
            _exit(127);
        }
        int status = 0;
        struct rusage ru;
        REQUIRE(::wait4(pid, &status, 0, &ru) == pid);
        REQUIRE(WIFEXITED(status));
        REQUIRE(WEXITSTATUS(status) == 0);
        return long(ru.ru_maxrss);
    };
    long small_kb = peak_kb("small.jsonl");
    long big_kb = peak_kb("big.jsonl");
    INFO("peak RSS small input " << small_kb << " kB, 12x larger input " << big_kb << " kB");
    // Holding the extra 18 MB of input, or its ~4M tokens, would add >= 16 MB.
    REQUIRE(big_kb - small_kb < 8 * 1024);
    REQUIRE(ldm::read_shard_info(d + "/out/s_train_000004.bin").num_tokens == 1000000);
}

namespace {
std::string ls_dir(const std::string& d) {
    std::string out = d + ".ls";
    std::system(("ls -A '" + d + "' > '" + out + "' 2>&1").c_str());
    std::string s = ldm::read_file(out);
    std::remove(out.c_str());
    return s;
}
}  // namespace

TEST_CASE("a failed run leaves an existing output directory as it was (no partial shards)", "[data_tool]") {
    std::string data = data_dir_or_skip("failed run keeps old shards");
    if (data.empty()) return;
    std::string d = scratch_dir("tool_keep");
    std::string docs;
    for (int i = 0; i < 40; i++) docs += nlohmann::json({{"text", "document number " + std::to_string(i)}}).dump() + "\n";
    ldm::write_file_atomic(d + "/good.jsonl", docs.data(), docs.size());
    // many documents, then a bad one: shards are finished before the error is reached
    std::string bad = docs + "{\"text\": \"oops \xc3\x28\"}\n" + docs;
    ldm::write_file_atomic(d + "/bad.jsonl", bad.data(), bad.size());
    const std::string args = "--tokenizer bytes --out-dir '" + d + "/out' --name k --val-docs 5 --shard-tokens 64 "
                             "--quiet --threads 1 ";
    RunResult r = run("shards " + args + "--input '" + d + "/good.jsonl'", d);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const std::string before = ls_dir(d + "/out");
    std::vector<std::string> names;
    {
        std::istringstream in(before);
        std::string n;
        while (std::getline(in, n)) names.push_back(n);
    }
    REQUIRE(names.size() > 5);  // the val shard and several train shards
    std::vector<std::string> contents;
    for (auto& n : names) contents.push_back(ldm::read_file(d + "/out/" + n));
    r = run("shards " + args + "--input '" + d + "/bad.jsonl'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("bad.jsonl:41") != std::string::npos);
    REQUIRE(r.err.find("--skip-bad-docs") != std::string::npos);  // the hint
    REQUIRE(ls_dir(d + "/out") == before);  // no staging directory, no temp file, no new shard
    for (size_t i = 0; i < names.size(); i++) REQUIRE(ldm::read_file(d + "/out/" + names[i]) == contents[i]);
    // a nested output path that did not exist: nothing of it remains
    r = run("shards --tokenizer bytes --out-dir '" + d + "/new/a/b' --name k --quiet --input '" + d + "/bad.jsonl'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(!ldm::file_exists(d + "/new"));
}

TEST_CASE("--skip-bad-docs leaves out bad documents, counts and names them", "[data_tool]") {
    std::string data = data_dir_or_skip("skip bad documents");
    if (data.empty()) return;
    std::string d = scratch_dir("tool_skip");
    const auto& tok = gpt2(data);
    // jsonl: invalid UTF-8, bad JSON, missing field, non-string field, non-object among good docs
    std::vector<std::string> good = {"first good", "second good \xc3\xa9", "third", "fourth one"};
    std::string in = nlohmann::json({{"text", good[0]}}).dump() + "\n" + "{\"text\": \"bad \xff utf8\"}\n" +
                     nlohmann::json({{"text", good[1]}}).dump() + "\n" + "{\"text\": \"x\",,}\n" + "{\"body\": \"x\"}\n" +
                     nlohmann::json({{"text", good[2]}}).dump() + "\n" + "{\"text\": 7}\n" + "[1]\n" +
                     nlohmann::json({{"text", good[3]}}).dump() + "\n";
    ldm::write_file_atomic(d + "/mixed.jsonl", in.data(), in.size());
    const std::string tk = "--tokenizer '" + data + "/gpt2_tokenizer' --name m --val-tokens 0 --threads 2 ";
    // default: the first bad document fails the run
    RunResult r = run("shards " + tk + "--quiet --out-dir '" + d + "/strict' --input '" + d + "/mixed.jsonl'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("mixed.jsonl:2: invalid UTF-8 at byte 14") != std::string::npos);
    REQUIRE(!ldm::file_exists(d + "/strict"));
    r = run("shards " + tk + "--skip-bad-docs --out-dir '" + d + "/out' --input '" + d + "/mixed.jsonl'", d);
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    std::vector<uint32_t> expect;
    for (auto& g : good) {
        auto ids = with_eot(tok, g);
        expect.insert(expect.end(), ids.begin(), ids.end());
    }
    REQUIRE(ldm::read_shard(d + "/out/m_train_000001.bin") == expect);
    REQUIRE(r.out.find("shards: 4 documents") != std::string::npos);
    REQUIRE(r.out.find("skipped: 5 bad documents (--skip-bad-docs)") != std::string::npos);
    for (const char* where : {"mixed.jsonl:2: invalid UTF-8", "mixed.jsonl:4: bad JSON", "mixed.jsonl:5: missing text field",
                              "mixed.jsonl:7: text field 'text' is not a string", "mixed.jsonl:8: bad JSON line: not an object"}) {
        INFO(where);
        REQUIRE(r.out.find(where) != std::string::npos);  // in the summary
        REQUIRE(r.err.find(where) != std::string::npos);  // and on stderr as it happens
    }
    REQUIRE(r.err.find("skipped 5 bad documents") != std::string::npos);
    // the library reports the same
    ldm::ShardsOptions o;
    o.inputs = {d + "/mixed.jsonl"};
    o.out_dir = d + "/lib";
    o.name = "m";
    o.val_tokens = 0;
    o.progress = false;
    o.skip_bad_docs = true;
    ldm::ShardsSummary s = ldm::prepare_shards(o, &tok);
    REQUIRE(s.docs == 4);
    REQUIRE(s.skipped_docs == 5);
    REQUIRE(s.skipped_examples.size() == 5);
    REQUIRE(s.skipped_examples[0].find("mixed.jsonl:2") != std::string::npos);

    // plain text, paragraphs: the bad paragraph is dropped whole (even when longer than a piece)
    std::string para_ok1 = "Good paragraph one.\n", para_bad = std::string(3000, 'b') + "\n" + "bad \xed\xa0\x80 here\n" +
                                                                   std::string(3000, 'c') + "\n",
                para_ok2 = "Good paragraph two.\n";
    std::string txt = para_ok1 + "\n" + para_bad + "\n" + para_ok2;
    ldm::write_file_atomic(d + "/p.txt", txt.data(), txt.size());
    o.inputs = {d + "/p.txt"};
    o.format = "text";
    o.text_split = "blank";
    o.piece_bytes = 1000;
    o.out_dir = d + "/text";
    s = ldm::prepare_shards(o, &tok);
    REQUIRE(s.docs == 2);
    REQUIRE(s.skipped_docs == 1);
    REQUIRE(s.skipped_examples[0].find("p.txt: invalid UTF-8 at byte offset 3026") != std::string::npos);
    expect = with_eot(tok, para_ok1);
    auto e2 = with_eot(tok, para_ok2);
    expect.insert(expect.end(), e2.begin(), e2.end());
    REQUIRE(ldm::read_shard(s.shards[0]) == expect);
    // every document bad: an error, nothing written
    o.inputs = {d + "/mixed.jsonl"};
    std::string allbad = "{\"text\": \"\xff\"}\n[2]\n";
    ldm::write_file_atomic(d + "/allbad.jsonl", allbad.data(), allbad.size());
    o.inputs = {d + "/allbad.jsonl"};
    o.format = "jsonl";
    o.out_dir = d + "/none";
    REQUIRE_THROWS_WITH(ldm::prepare_shards(o, &tok), Catch::Contains("no documents") && Catch::Contains("2 bad"));
    REQUIRE(!ldm::file_exists(d + "/none"));
}

TEST_CASE("document text holding \"<|endoftext|>\": N documents give exactly N EOT ids, every tokenizer",
          "[data_tool]") {
    std::string data = data_dir_or_skip("EOT literal in documents");
    if (data.empty()) return;
    std::string d = scratch_dir("tool_eot_literal");
    const std::vector<std::string> docs = {"Plain first document.", "one literal <|endoftext|> inside",
                                           "<|endoftext|>starts and ends<|endoftext|>", "padding <|padding|> too"};
    std::string in;
    for (auto& t : docs) in += nlohmann::json({{"text", t}}).dump() + "\n";
    ldm::write_file_atomic(d + "/docs.jsonl", in.data(), in.size());
    for (const std::string& tk : {data + "/gpt2_tokenizer", data + "/gpt_neox_20b_tokenizer/20B_tokenizer.json",
                                  data + "/olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json", std::string("bytes")}) {
        INFO(tk);
        const ldm::Tokenizer tok = ldm::Tokenizer::load(tk);
        const std::string out = d + "/out_" + std::to_string(tok.vocab_size()) + "_" + std::to_string(tok.eot_id());
        RunResult r = run("shards --tokenizer '" + tk + "' --input '" + d + "/docs.jsonl' --out-dir '" + out +
                              "' --name e --val-tokens 0 --quiet",
                          d);
        INFO(r.err);
        REQUIRE(r.rc == 0);
        const std::vector<uint32_t> t = ldm::read_shard(out + "/e_train_000001.bin");
        REQUIRE(std::count(t.begin(), t.end(), tok.eot_id()) == long(docs.size()));
        // the EOTs are exactly the document starts, and each document decodes to its text
        std::vector<size_t> at;
        for (size_t i = 0; i < t.size(); i++)
            if (t[i] == tok.eot_id()) at.push_back(i);
        REQUIRE(at.size() == docs.size());
        at.push_back(t.size());
        REQUIRE(at[0] == 0);
        for (size_t k = 0; k < docs.size(); k++)
            REQUIRE(tok.decode(t.data() + at[k] + 1, at[k + 1] - at[k] - 1) == docs[k]);
        // the encode subcommand agrees (no special-token matching there either)
        r = run("encode --tokenizer '" + tk + "' --text 'x<|endoftext|>y'", d);
        REQUIRE(r.rc == 0);
        std::istringstream ids(r.out);
        std::vector<uint32_t> got;
        uint32_t v;
        while (ids >> v) got.push_back(v);
        REQUIRE(got == tok.encode("x<|endoftext|>y"));
        REQUIRE(std::count(got.begin(), got.end(), tok.eot_id()) == 0);
    }
}

TEST_CASE("bytes: tiny Shakespeare shards hold the file's bytes; encode, decode, info", "[data_tool]") {
    std::string data = data_dir_or_skip("byte tokenizer shards");
    if (data.empty()) return;
    std::string d = scratch_dir("tool_bytes");
    const std::string path = data + "/tinyshakespeare/input.txt";
    const std::string text = ldm::read_file(path);
    RunResult r = run("shards --tokenizer bytes --format text --input '" + path + "' --out-dir '" + d +
                          "/out' --name ts --val-tokens 100000 --threads 2 --quiet",
                      d);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("uint16") != std::string::npos);
    // [EOT 256] + one id per byte; all of it one document in the val shard
    std::vector<uint32_t> expect(1, 256u);
    for (unsigned char c : text) expect.push_back(c);
    REQUIRE(expect.size() == 1115394 + 1);
    REQUIRE(ldm::read_shard(d + "/out/ts_val_000000.bin") == expect);
    check_with_loader(d + "/out/ts_val_000000.bin", {expect}, 1024, 257);
    // split into pieces for the threads: same ids
    ldm::ShardsOptions o;
    o.inputs = {path};
    o.tokenizer = "bytes";
    o.format = "text";
    o.out_dir = d + "/lib";
    o.name = "ts";
    o.shard_tokens = 300000;
    o.val_tokens = 0;
    o.threads = 2;
    o.progress = false;
    o.piece_bytes = 4096;
    ldm::ShardsSummary s = ldm::prepare_shards(o);
    REQUIRE(s.pieces > 100);
    REQUIRE(s.shards.size() == 4);
    REQUIRE(concat_shards(s.shards) == expect);
    r = run("info --tokenizer bytes '" + s.shards[0] + "'", d);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("docs:     1 (EOT id 256)") != std::string::npos);
    REQUIRE(r.out.find("max 256") != std::string::npos);
    r = run("info --tokenizer bytes --eot 50256 '" + s.shards[0] + "'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("disagrees") != std::string::npos);
    std::vector<uint32_t> big = {256, 65, 300};
    ldm::write_shard(d + "/big.bin", big.data(), big.size(), false);
    r = run("info --tokenizer bytes '" + d + "/big.bin'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("token id 300 at index 2 is >= --vocab 257") != std::string::npos);
    // encode / decode
    r = run("encode --tokenizer bytes --eot --text 'H\xc3\xa9!'", d);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out == "256 72 195 169 33\n");
    r = run("decode --tokenizer bytes 72 195 169 256 255", d);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out == "H\xc3\xa9<|endoftext|>\xff");
    r = run("decode --tokenizer bytes 72 257", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("257") != std::string::npos);
    r = run("encode --tokenizer bytes --text 'a\xff'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("invalid UTF-8") != std::string::npos);
}
