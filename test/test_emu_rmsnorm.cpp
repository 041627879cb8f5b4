// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/rmsnorm.cuh:
// the workbench checks of dev/cuda/rmsnorm.cu (forward, residual forward also aliased, backward
// overwrite/accumulate; v1 = the workbench's thread-per-row kernels, v2 = production, both its
// 16-byte and its lane-strided path; PreLN's fused rmsnorm_backward_residual vs the CPU and bit for
// bit vs the three unfused kernels; fp32 and bf16, vs cpu::rmsnorm_*) at its two small shapes,
// run on host memory through the emulated launches. Requires every CHECK to PASS.
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/rmsnorm.cu.h"
#include "test/emu_workbench_cases.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: rmsnorm workbench checks (variants 1 and 2)", "[emu][rmsnorm]") {
    Report R;
    Rng rng(7);
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
    CHECK(c.total > 40);
    CHECK(c.failed.empty());
    CHECK(R.fails == 0);
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("rmsnorm")
