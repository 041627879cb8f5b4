// dev/bench_shard_check.cpp — throughput of the data loader's construction-time token check
// (check_shard_ids, core/shard.h; issue #19 item 3).
//   build/bench_shard_check [--dir D] [--shards N] [--tokens M] [--width 2|4] [--vocab V]
//                           [--threads T] [--reps R] [--keep]
// Writes N shards of M random ids < V (default 4 x 64M uint16 ids, V = 50257) into D (default
// build/bench_shard_check.tmp), then times DataLoader construction (headers + every id) R times
// and prints GB/s of shard bytes. The shards were just written, so the reads come from the page
// cache (a cold disk is slower: its read speed bounds the check). Results: doc/formats.md
// "Data loader".
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/dataloader.h"
#include "core/shard.h"

int main(int argc, char** argv) {
    try {
        std::string dir = "build/bench_shard_check.tmp";
        uint64_t shards = 4, tokens = uint64_t(64) << 20;
        int width = 2, threads = 0, reps = 3;
        uint32_t vocab = 50257;
        bool keep = false;
        for (int i = 1; i < argc; i++) {
            std::string a = argv[i];
            auto need = [&]() -> std::string {
                if (i + 1 >= argc) throw ldm::Error(a + " needs a value");
                return argv[++i];
            };
            if (a == "--dir") dir = need();
            else if (a == "--shards") shards = std::stoull(need());
            else if (a == "--tokens") tokens = std::stoull(need());
            else if (a == "--width") width = std::stoi(need());
            else if (a == "--vocab") vocab = uint32_t(std::stoul(need()));
            else if (a == "--threads") threads = std::stoi(need());
            else if (a == "--reps") reps = std::stoi(need());
            else if (a == "--keep") keep = true;
            else if (a == "--help" || a == "-h") {
                std::printf("usage: bench_shard_check [--dir D] [--shards N] [--tokens M] [--width 2|4] [--vocab V] "
                            "[--threads T] [--reps R] [--keep]\n");
                return 0;
            } else {
                throw ldm::Error("unknown flag " + a);
            }
        }
        if (width != 2 && width != 4) throw ldm::Error("--width must be 2 or 4");
        if (shards < 1 || tokens < 2 || reps < 1 || vocab < 1) throw ldm::Error("bad sizes");
        if (width == 2 && vocab > 65536) throw ldm::Error("--vocab > 65536 needs --width 4");
        ldm::check_threads_flag(threads);
        if (threads > 0) omp_set_num_threads(threads);
        ldm::mkdir_p(dir);
        std::vector<uint32_t> buf(static_cast<size_t>(tokens));
        std::mt19937_64 rng(1);
        for (uint64_t s = 0; s < shards; s++) {
            for (auto& x : buf) x = uint32_t(rng() % vocab);
            ldm::write_shard(dir + ldm::strprintf("/bench_%06llu.bin", (unsigned long long)s), buf.data(), buf.size(),
                             width == 4);
        }
        std::vector<uint32_t>().swap(buf);
        const double gb = double(shards) * (1024.0 + double(tokens) * width) / 1e9;
        for (int r = 0; r < reps; r++) {
            const auto t0 = std::chrono::steady_clock::now();
            ldm::DataLoader dl(dir + "/bench_*.bin", 1, 1024, 0, 1, false, 0, vocab);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::printf("rep %d: %llu shards, %.3f GB (uint%d), %d threads: %.3f s = %.2f GB/s\n", r,
                        (unsigned long long)shards, gb, width * 8, omp_get_max_threads(), s, gb / s);
        }
        if (!keep) {
            for (uint64_t s = 0; s < shards; s++)
                std::remove((dir + ldm::strprintf("/bench_%06llu.bin", (unsigned long long)s)).c_str());
            std::remove(dir.c_str());  // only if empty
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
