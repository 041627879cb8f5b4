// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/matmul.cuh: the
// --quick workbench checks of dev/cuda/matmul.cu — Matmul::gemm (here the host GEMM of
// dev/emu/matmul_host.h in place of cuBLASLt) and the workbench-only naive GEMM kernel in all four
// transpose pairs with bias / beta, linear_forward / linear_backward (dinp set and accumulated,
// dW, dbias, bit-identical repeat) and both bias-gradient kernels (production colsum, the
// workbench's thread per column), fp32 / bf16 / bf16->fp32, vs cpu::gemm / matmul_*. Requires
// every CHECK to PASS.
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/matmul.cu.h"
#include "test/emu_workbench_cases.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: matmul workbench checks (naive GEMM, linear layer, bias gradients)", "[emu][matmul]") {
    Report R;
    Matmul mm;
    Rng rng(1234);
    const std::string out = emu::capture_stdout([&] {
        for (int ta = 0; ta <= 1; ta++)
            for (int tb = 0; tb <= 1; tb++) {
                check_gemm<float, float>(R, mm, rng, ta, tb, 37, 53, 29, true, 0.f, 0);
                check_gemm<bf16, bf16>(R, mm, rng, ta, tb, 37, 53, 29, true, 0.f, 0);
                check_gemm<bf16, float>(R, mm, rng, ta, tb, 37, 53, 29, false, 1.f, 0);
                check_gemm<float, float>(R, mm, rng, ta, tb, 30, 16, 20, false, 1.f, 3);
            }
        check_linear<float>(R, mm, rng, 77, 48, 40, 0, true);
        check_linear<bf16>(R, mm, rng, 77, 48, 40, 0, true);
        check_linear<float>(R, mm, rng, 131, 64, 50, 14, false);
        check_linear<bf16>(R, mm, rng, 131, 64, 50, 14, false);
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total == 74);  // 4 x 4 gemm configs x 2 kernels; linear: 12 with bias, 9 without, x 2
    CHECK(c.failed.empty());
    CHECK(R.fails == 0);
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("matmul")
