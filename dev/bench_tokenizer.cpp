// dev/bench_tokenizer.cpp — encoding throughput of ldm::Tokenizer (issue #2, Performance).
//
//   build/bench_tokenizer [--tokenizer PATH] [--threads N] [--reps R] [--js-input DIR] [--tsv] NAME=FILE...
//
// FILE is .jsonl (one document per line, field "text") or plain text (one document per line
// group: split at blank lines, like WikiText-2's paragraphs; tiny files are one document).
// For each file prints cold (fresh per-thread caches) and warm MB/s on 1 thread and on N threads
// (OpenMP over documents, default: all cores). --js-input DIR also writes DIR/NAME.bin in the
// input format of test/js/encode.mjs so scripts/bench_tokenizer.sh can time js-tiktoken on the
// very same documents; --tsv prints one tab-separated line per file instead of the table
// (name, MB, docs, tokens, threads, MB/s 1-thread cold, warm, N-thread cold, warm, and the
// 1-thread warm rate per CPU-second of the encoding thread, which a loaded machine distorts less).
// Exit status 1 with "error: ..." on failure.
#include <omp.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/tokenizer.h"

namespace {

std::vector<std::string> load_docs(const std::string& path) {
    std::string s = ldm::read_file(path);
    std::vector<std::string> docs;
    bool jsonl = path.size() > 6 && path.substr(path.size() - 6) == ".jsonl";
    size_t pos = 0, line = 0;
    if (jsonl) {
        while (pos < s.size()) {
            size_t e = s.find('\n', pos);
            if (e == std::string::npos) e = s.size();
            line++;
            if (e > pos) {
                try {
                    docs.push_back(nlohmann::json::parse(s.begin() + pos, s.begin() + e).at("text").get<std::string>());
                } catch (const nlohmann::json::exception& ex) {
                    throw ldm::Error(ldm::strprintf("%s:%zu: %s", path.c_str(), line, ex.what()));
                }
            }
            pos = e + 1;
        }
    } else {
        // documents = chunks ending at a blank line (keeps every byte: chunks concatenate to s)
        while (pos < s.size()) {
            size_t e = s.find("\n \n", pos);  // WikiText-2 blank lines are " \n"
            size_t e2 = s.find("\n\n", pos);
            e = std::min(e == std::string::npos ? s.size() : e + 3, e2 == std::string::npos ? s.size() : e2 + 2);
            docs.push_back(s.substr(pos, e - pos));
            pos = e;
        }
    }
    return docs;
}

double thread_cpu() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Encodes all docs with `threads` threads; returns seconds and fills the token count.
double run(const ldm::Tokenizer& tok, const std::vector<std::string>& docs, int threads, size_t* ntok) {
    size_t total = 0;
    double t0 = now();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) reduction(+ : total)
    for (size_t i = 0; i < docs.size(); i++) total += tok.encode(docs[i]).size();
    double t = now() - t0;
    *ntok = total;
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string tokpath, jsdir;
        bool tsv = false;
        int threads = omp_get_num_procs(), reps = 3;
        std::vector<std::pair<std::string, std::string>> files;
        for (int i = 1; i < argc; i++) {
            std::string a = argv[i];
            auto need = [&]() -> std::string {
                if (i + 1 >= argc) throw ldm::Error(a + " needs a value");
                return argv[++i];
            };
            if (a == "--tokenizer") tokpath = need();
            else if (a == "--threads") threads = std::atoi(need().c_str());
            else if (a == "--reps") reps = std::atoi(need().c_str());
            else if (a == "--js-input") jsdir = need();
            else if (a == "--tsv") tsv = true;
            else if (a == "-h" || a == "--help") {
                std::printf("usage: bench_tokenizer [--tokenizer PATH] [--threads N] [--reps R] [--js-input DIR] [--tsv] NAME=FILE...\n");
                return 0;
            } else if (a.find('=') != std::string::npos && a[0] != '-') {
                files.push_back({a.substr(0, a.find('=')), a.substr(a.find('=') + 1)});
            } else {
                throw ldm::Error("unknown argument " + a);
            }
        }
        if (threads < 1 || reps < 1) throw ldm::Error("--threads and --reps must be >= 1");
        ldm::check_threads_flag(threads);
        if (tokpath.empty()) {
            std::string d = ldm::find_data_dir();
            if (d.empty()) throw ldm::Error("no --tokenizer and no data directory");
            tokpath = d + "/gpt2_tokenizer";
        }
        if (files.empty()) throw ldm::Error("no NAME=FILE given");
        if (!tsv) std::printf("%-10s %8s %7s %9s | %-22s | %-22s\n", "file", "MB", "docs", "tokens",
                    "1 thread MB/s cold/warm", ("" + std::to_string(threads) + " threads MB/s cold/warm").c_str());
        for (const auto& nf : files) {
            auto docs = load_docs(nf.second);
            size_t bytes = 0;
            for (const auto& d : docs) bytes += d.size();
            if (!jsdir.empty()) {
                std::string buf;
                auto put = [&](uint32_t v) { buf.append(reinterpret_cast<const char*>(&v), 4); };
                put(uint32_t(docs.size()));
                for (const auto& d : docs) { put(uint32_t(d.size())); buf += d; }
                ldm::write_file_atomic(jsdir + "/" + nf.first + ".bin", buf.data(), buf.size());
            }
            double mb = bytes / 1e6;
            double res[2][2], cpu_best = 1e30;
            size_t ntok = 0;
            int tcount[2] = {1, threads};
            for (int k = 0; k < 2; k++) {
                // a fresh load gets fresh per-thread caches: the first pass is "cold"
                ldm::Tokenizer tok = ldm::Tokenizer::load(tokpath);
                res[k][0] = mb / run(tok, docs, tcount[k], &ntok);
                double best = 1e30;
                for (int r = 0; r < reps; r++) {
                    double c0 = thread_cpu();
                    best = std::min(best, run(tok, docs, tcount[k], &ntok));
                    // one thread runs on this (the calling) thread: its CPU time is the work
                    if (k == 0) cpu_best = std::min(cpu_best, thread_cpu() - c0);
                }
                res[k][1] = mb / best;
            }
            if (tsv)  // name MB docs tokens threads 1t-cold 1t-warm Nt-cold Nt-warm (MB/s)
                std::printf("%s\t%.6f\t%zu\t%zu\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\n", nf.first.c_str(), mb,
                            docs.size(), ntok, threads, res[0][0], res[0][1], res[1][0], res[1][1], mb / cpu_best);
            else
            std::printf("%-10s %8.3f %7zu %9zu | %9.2f / %9.2f  | %9.2f / %9.2f | %9.2f MB per CPU-s\n", nf.first.c_str(), mb,
                        docs.size(), ntok, res[0][0], res[0][1], res[1][0], res[1][1], mb / cpu_best);
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
