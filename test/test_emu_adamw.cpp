// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/adamw.cuh: the
// workbench checks of dev/cuda/adamw.cu — the AdamW update by both production kernels (v2 =
// adamw_update: vec4 after 0..3 scalar leading elements; v1 = its scalar fallback kernel) on three
// ranges with odd boundaries, fp32 and bf16 working copy, bit-exact against core/optim.h
// AdamW<float>, a skipped step leaving everything unchanged, the on-device clip factor and skip
// flag; and global_norm_squared against a double sum, run to run identical — at small
// sizes (the workbench's 1e6-element cases are left to the GPU). Requires every CHECK to PASS.
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/adamw.cu.h"
#include "test/emu_workbench_cases.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: adamw workbench checks (v1, v2, global norm)", "[emu][adamw]") {
    const std::string out = emu::capture_stdout([&] {
        uint64_t seed = 1;
        for (int variant : {1, 2})
            for (int64_t n : {1, 2, 7, 1000, 4099}) {
                check_adamw<float>(variant, n, seed++);
                check_adamw<bf16>(variant, n, seed++);
            }
        for (int64_t n : {0, 1, 1000}) check_norm(n, seed++);
        check_step_guard();
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total == 2 * 5 * (3 + 4) + 3 + 1);  // fp32: update, bitexact, skip; bf16: + p_copy; 3 norms; guard
    CHECK(c.failed.empty());
    CHECK(g_failures == 0);
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("adamw")
