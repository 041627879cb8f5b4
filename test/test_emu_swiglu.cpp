// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/swiglu.cuh: the
// workbench checks of dev/cuda/swiglu.cu (forward and backward on the packed h13 layout, both
// production kernels: v1 one thread per element at every F, v2 16-byte packs where F allows it,
// fp32 and bf16, vs cpu::swiglu_*) at its two small shapes (F = 37: v1 only). Requires every
// CHECK to PASS.
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/swiglu.cu.h"
#include "test/emu_workbench_cases.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: swiglu workbench checks (v1, v2)", "[emu][swiglu]") {
    Report R;
    Rng rng(3);
    const std::string out = emu::capture_stdout([&] {
        check<float>(R, rng, 77, 37);
        check<bf16>(R, rng, 77, 37);
        check<float>(R, rng, 130, 64);
        check<bf16>(R, rng, 130, 64);
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total == 12);  // (F = 37: v1; F = 64: v1, v2) x (forward, backward) x 2 dtypes
    CHECK(c.failed.empty());
    CHECK(R.fails == 0);
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("swiglu")
