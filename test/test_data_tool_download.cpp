// Tests of scripts/download_data.sh's offline path (issue #2 item 8): --from a local copy of the
// data into a scratch directory, with sha256 verification; --help; bad sources.
#include "test/helpers.h"

#include <sys/wait.h>

namespace {

std::string script() { return std::string(LDM_SOURCE_DIR) + "/scripts/download_data.sh"; }

struct RunResult {
    int rc;
    std::string out, err;
};

RunResult run_script(const std::string& args, const std::string& tmpdir) {
    std::string o = tmpdir + "/dl_stdout.txt", e = tmpdir + "/dl_stderr.txt";
    std::string cmd = "bash '" + script() + "' " + args + " >'" + o + "' 2>'" + e + "' </dev/null";
    int st = std::system(cmd.c_str());
    RunResult r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = ldm::read_file(o);
    r.err = ldm::read_file(e);
    return r;
}

std::string sha256_of(const std::string& path) {
    std::string cmd = "sha256sum '" + path + "' | cut -c1-64";
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[128] = {0};
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, p);
    ::pclose(p);
    std::string s(buf, n);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

// The sha256 sums published in shared/data/SOURCES.md (official where one exists).
const std::vector<std::pair<std::string, std::string>> kFiles = {
    {"gpt2_tokenizer/encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"},
    {"gpt2_tokenizer/vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"},
    {"lambada/lambada_test.jsonl", "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226"},
    {"wikitext2/wiki.test.raw", "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08"},
    {"tinyshakespeare/input.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"},
    {"hellaswag/hellaswag_val_full.txt.bz2", "50b637899e4263c2bc456c2dc726c95d2c8cd8e2a552ea5bd7719ce3cb03fe5b"},
    {"olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json",
     "9ad33b4b39a9f83973c3f8c42a01948dd5b877a28ac9a5356956c4ff4ed0b714"},
    {"fineweb_edu_sample/fineweb_edu_sample.jsonl", "a8130ba3d67c92ecb46865f133391505fb410d6ac379f4e3c4974794197bae48"},
};

}  // namespace

TEST_CASE("download script --help and usage errors", "[download]") {
    std::string d = scratch_dir("dl_help");
    RunResult r = run_script("--help", d);
    REQUIRE(r.rc == 0);
    for (const char* w : {"gpt2-tokenizer", "lambada", "wikitext2", "hellaswag", "fineweb-edu", "--from", "100BT"})
        REQUIRE(r.out.find(w) != std::string::npos);
    REQUIRE(run_script("", d).rc == 2);
    REQUIRE(run_script("lambada --bogus", d).rc == 2);
    REQUIRE(run_script("nosuchdataset", d).rc == 2);
    r = run_script("lambada --from '" + d + "/nonexistent' --out '" + d + "/o'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("not a directory") != std::string::npos);
}

TEST_CASE("download script offline path: --from shared data, hashes verified", "[download]") {
    std::string data = data_dir_or_skip("download script offline path");
    if (data.empty()) return;
    std::string d = scratch_dir("dl_offline");
    std::string out = d + "/out";
    RunResult r = run_script("all fineweb-edu --from '" + data + "' --out '" + out + "'", d);
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    for (auto& [rel, sha] : kFiles) {
        INFO(rel);
        REQUIRE(ldm::file_exists(out + "/" + rel));
        REQUIRE(sha256_of(out + "/" + rel) == sha);
        REQUIRE(ldm::read_file(out + "/" + rel) == ldm::read_file(data + "/" + rel));
    }
    REQUIRE(std::system(("find '" + out + "' -name '*.part.*' | grep -q .").c_str()) != 0);  // no temp files
    // idempotent: a second run finds everything present
    r = run_script("all --from '" + data + "' --out '" + out + "'", d);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("lambada/lambada_test.jsonl: already present") != std::string::npos);
}

TEST_CASE("download script rejects a corrupted local copy and leaves nothing behind", "[download]") {
    std::string data = data_dir_or_skip("download script hash mismatch");
    if (data.empty()) return;
    std::string d = scratch_dir("dl_corrupt");
    std::string src = d + "/src", out = d + "/out";
    REQUIRE(std::system(("mkdir -p '" + src + "/lambada' '" + src + "/gpt2_tokenizer'").c_str()) == 0);
    std::string lam = ldm::read_file(data + "/lambada/lambada_test.jsonl");
    lam[1000] ^= 0x20;  // flip one bit
    ldm::write_file_atomic(src + "/lambada/lambada_test.jsonl", lam.data(), lam.size());
    RunResult r = run_script("lambada --from '" + src + "' --out '" + out + "'", d);
    INFO(r.out << r.err);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("sha256 mismatch") != std::string::npos);
    REQUIRE(r.err.find("lambada/lambada_test.jsonl") != std::string::npos);
    REQUIRE(!ldm::file_exists(out + "/lambada/lambada_test.jsonl"));
    REQUIRE(std::system(("find '" + out + "' -name '*.part.*' | grep -q .").c_str()) != 0);
    // a missing file in the source directory
    r = run_script("gpt2-tokenizer --from '" + src + "' --out '" + out + "'", d);
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("encoder.json not found") != std::string::npos);
    // a corrupted file already at the destination is replaced by a verified copy
    std::string bad = "junk";
    REQUIRE(std::system(("mkdir -p '" + out + "/lambada'").c_str()) == 0);
    ldm::write_file_atomic(out + "/lambada/lambada_test.jsonl", bad.data(), bad.size());
    r = run_script("lambada --from '" + data + "' --out '" + out + "'", d);
    REQUIRE(r.rc == 0);
    REQUIRE(sha256_of(out + "/lambada/lambada_test.jsonl") == kFiles[2].second);
}
