// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/embedding.cuh:
// the workbench checks of dev/cuda/embedding.cu (forward, exact; deterministic bucketed backward
// and its bit-identical repeat, also with the bucket count read on the device; both production kernels: v1 at every C, v2 16-byte packs where
// C allows it; fp32 and bf16; vs cpu::embedding_*) at its two small shapes (C = 37: v1 only).
// Requires every CHECK to PASS.
#include <catch2/catch.hpp>

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
