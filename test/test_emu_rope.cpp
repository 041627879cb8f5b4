// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/rope.cuh: the
// workbench checks of dev/cuda/rope.cu (QK-norm + RoPE forward/backward, with and without the
// norm, v1 = the workbench's thread-per-head kernels and v2 = production, fp32 and bf16) at its
// two small shapes (GQA, odd T), on host memory through the emulated
// launches. Requires every CHECK to PASS.
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/rope.cu.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: rope workbench checks", "[emu][rope]") {
    Report R;
    Rng rng(5);
    const Shape small[] = {{2, 13, 4, 2, 8}, {3, 37, 3, 1, 6}};
    const std::string out = emu::capture_stdout([&] {
        for (const Shape& s : small)
            for (int norm = 0; norm <= 1; norm++) {
                check<float>(R, rng, s, norm != 0);
                check<bf16>(R, rng, s, norm != 0);
            }
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total > 10);
    CHECK(c.failed.empty());
    CHECK(R.fails == 0);
}
