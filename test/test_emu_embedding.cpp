// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/embedding.cuh:
// the workbench checks of dev/cuda/embedding.cu (forward, exact; deterministic bucketed backward
// and its bit-identical repeat, also with the bucket count read on the device; both production
// kernels: v1 at every C, v2 16-byte packs where C allows it; fp32 and bf16; vs
// cpu::embedding_*) at its two small shapes (C = 37: v1 only), requiring every CHECK to PASS;
// and the host bucket build against a comparison sort.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "cuda_emu/dev_cuda/embedding.cu.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: embedding workbench checks (v1, v2)", "[emu][embedding]") {
    Report R;
    Rng rng(99);
    const std::string out = emu::capture_stdout([&] {
        check<float>(R, rng, 77, 37, 53);
        check<bf16>(R, rng, 77, 37, 53);
        check<float>(R, rng, 300, 64, 100);
        check<bf16>(R, rng, 300, 64, 100);
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total == 24);  // (C = 37: v1; C = 64: v1, v2) x (forward; backward, repeat, count on the device) x 2 dtypes
    CHECK(c.failed.empty());
    CHECK(R.fails == 0);
}

// EmbeddingBuckets::build (the counting sort the trainer runs on the host for every micro-batch)
// against a comparison-sort construction written here: distinct ids increasing, CSR offsets,
// positions of each id in increasing n; repeated, sparse and single ids; N = 0; a negative id.
TEST_CASE("emu: EmbeddingBuckets::build == a stable comparison sort", "[emu][embedding]") {
    std::mt19937 gen(7);
    for (int64_t N : {0, 1, 2, 7, 1000, 16384}) {
        for (int max_id : {0, 3, 300, 50303}) {
            std::vector<int32_t> tok((size_t)N);
            std::uniform_int_distribution<int32_t> pick(0, max_id);
            for (auto& t : tok) t = pick(gen);
            if (N > 3) tok[(size_t)N / 2] = max_id;  // the largest id present
            // reference: sort positions by id, stable in n
            std::vector<int32_t> pos((size_t)N);
            for (int64_t i = 0; i < N; i++) pos[(size_t)i] = (int32_t)i;
            std::stable_sort(pos.begin(), pos.end(), [&](int32_t a, int32_t b) { return tok[(size_t)a] < tok[(size_t)b]; });
            std::vector<int32_t> uniq, start{0};
            for (int64_t i = 0; i < N; i++) {
                const int32_t id = tok[(size_t)pos[(size_t)i]];
                if (i > 0 && id != uniq.back()) start.push_back((int32_t)i);
                if (i == 0 || id != uniq.back()) uniq.push_back(id);
            }
            if (N > 0) start.push_back((int32_t)N);
            const EmbeddingBuckets b = EmbeddingBuckets::build(tok.data(), N);
            INFO("N=" << N << " max_id=" << max_id);
            CHECK(b.uniq == uniq);
            CHECK(b.start == start);
            CHECK(b.pos == pos);
            CHECK(b.U() == (int)uniq.size());
        }
    }
    const int32_t bad[3] = {4, -1, 2};
    CHECK_THROWS_WITH(EmbeddingBuckets::build(bad, 3), Catch::Contains("token id -1 < 0"));
}
