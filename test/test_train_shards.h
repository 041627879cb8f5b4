// Helpers shared by the trainer tests (test_train*.cpp, test_torch_ref.cpp): real token shards
// made from the FineWeb-Edu sample with the GPT-2 tokenizer, and running build/train_cpu.
#pragma once
#include <nlohmann/json.hpp>

#include <array>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "core/common.h"
#include "core/shard.h"
#include "core/tokenizer.h"
#include "test/helpers.h"

inline std::string trainer_path() { return build_dir_of_test() + "/train_cpu"; }

// A scratch directory of the running test case (scratch_dir in test/helpers.h).
inline std::string train_scratch(const std::string& name) { return scratch_dir(name); }

// Writes train.bin (first ~90% of the documents) and val.bin (the rest) into dir: the FineWeb-Edu
// sample (documents joined by <|endoftext|>), GPT-2 tokens. Returns false (with a SKIP) when the
// data directory is absent. max_docs limits the documents used (0 = all 150).
inline bool make_fineweb_shards(const std::string& dir, const std::string& data_dir, int max_docs = 0) {
    if (ldm::file_exists(dir + "/train.bin") && ldm::file_exists(dir + "/val.bin")) return true;
    ldm::Tokenizer tok = ldm::Tokenizer::load(data_dir + "/gpt2_tokenizer");
    std::ifstream in(data_dir + "/fineweb_edu_sample/fineweb_edu_sample.jsonl");
    std::vector<std::vector<uint32_t>> docs;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        std::string text = nlohmann::json::parse(line).at("text").get<std::string>();
        docs.push_back(tok.encode(text));
        if (max_docs && int(docs.size()) >= max_docs) break;
    }
    size_t ntrain = docs.size() * 9 / 10;
    std::vector<uint32_t> tr, va;
    for (size_t i = 0; i < docs.size(); i++) {
        auto& dst = i < ntrain ? tr : va;
        dst.push_back(tok.eot_id());
        dst.insert(dst.end(), docs[i].begin(), docs[i].end());
    }
    ldm::write_shard(dir + "/train.bin", tr.data(), tr.size(), false);
    ldm::write_shard(dir + "/val.bin", va.data(), va.size(), false);
    return true;
}

struct RunResult {
    int status = -1;
    std::string out;  // stdout + stderr
};

// Runs a shell command line, capturing stdout and stderr together.
inline RunResult run_cmd(const std::string& cmd) {
    RunResult r;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return r;
}

// Parses a JSONL log into its objects.
inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::vector<nlohmann::json> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line))
        if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    return out;
}

// Byte-level shards of tiny Shakespeare (--tokenizer bytes: sh_train_*.bin, a 20k-token
// sh_val_*.bin) in a scratch directory of this test binary, made once per binary; "" (with a
// SKIP naming `what`) when the data directory is absent.
inline std::string tiny_shakespeare_byte_shards(const char* what) {
    static std::string dir;
    if (!dir.empty()) return dir;
    const std::string dd = data_dir_or_skip(what);
    if (dd.empty()) return "";
    const std::string d = binary_scratch_dir("byte_shards");
    const std::string cmd = build_dir_of_test() + "/ldm_data shards --tokenizer bytes --input '" + dd +
                            "/tinyshakespeare/input.txt' --format text --text-split blank --out-dir '" + d +
                            "' --name sh --val-tokens 20000 --quiet 2>&1";
    RunResult r = run_cmd(cmd);
    INFO(cmd << "\n" << r.out);
    REQUIRE(r.status == 0);
    dir = d;
    return dir;
}

// True when both emulated trainers (build/emu/train_*) are built; else false with a SKIP naming
// `what` (no CUDA headers at build time).
inline bool emu_trainers_built(const char* what) {
    const std::string e = build_dir_of_test() + "/emu/";
    if (ldm::file_exists(e + "train_gpt_baselines") && ldm::file_exists(e + "train_ldm")) return true;
    WARN("SKIP " << what << ": the emulated trainers are not built (no CUDA headers at build time?)");
    return false;
}
