// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/classifier.cuh:
// the workbench checks of dev/cuda/classifier.cu (losses, dlogits, zero padding, sum_losses,
// loss-only leaves the logits untouched) for the production fused_classifier (16-byte path on
// aligned rows, scalar path on unaligned ones and forced on aligned ones) and the workbench-only
// three-pass v1, fp32 and bf16, vs cpu/ops.h cross_entropy_*, at the workbench's small shapes
// (V = 3 .. 50257, padded and unpadded, aligned and unaligned rows). Requires every CHECK to PASS.
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/classifier.cu.h"
#include "test/emu_workbench_cases.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: classifier workbench checks (v1, v2, v2_scalar)", "[emu][classifier]") {
    struct Shape {
        int64_t N;
        int V, Vp;
    };
    const Shape shapes[] = {{3, 50257, 50304}, {7, 1000, 1024}, {5, 1001, 1008}, {6, 999, 1001}, {2, 3, 8}};
    const std::string out = emu::capture_stdout([&] {
        uint64_t seed = 1;
        for (const Shape& sh : shapes) {
            check_shape<float>(sh.N, sh.V, sh.Vp, seed++, {1, 2, 3});
            check_shape<bf16>(sh.N, sh.V, sh.Vp, seed++, {1, 2, 3});
        }
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total == 5 * 2 * 3 * 5);  // shapes x dtypes x kernels x (loss, dlogits, pad, sum, loss-only)
    CHECK(c.failed.empty());
    CHECK(g_failures == 0);
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("classifier")
