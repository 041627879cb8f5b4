// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of cuda/rope.cuh: the
// workbench checks of dev/cuda/rope.cu (QK-norm + RoPE forward/backward, with and without the
// norm, v1 = the workbench's thread-per-head kernels and v2 = production, fp32 and bf16) at its
// two small shapes (GQA, odd T), on host memory through the emulated
// launches, including production's in-place backward without QK-norm (bit for bit the out-of-place
// one). Requires every CHECK to PASS.
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/rope.cu.h"
#include "test/emu_workbench_cases.h"
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
    // the in-place backward ran at both shapes and dtypes (without QK-norm only)
    size_t inplace = 0;
    for (size_t p = out.find("backward_v2_inplace_din"); p != std::string::npos;
         p = out.find("backward_v2_inplace_din", p + 1))
        inplace++;
    CHECK(inplace == 4);
}

TEST_CASE("emu: qknorm_rope_backward in place only without QK-norm", "[emu][rope]") {
    // with QK-norm the weight gradients read dout after din is written: aliasing is refused
    const int64_t N = 3;
    const int nh = 2, nkv = 1, hd = 4, W = (nh + 2 * nkv) * hd;
    DeviceBuffer<float> g(N * W), x(N * W), rstd(N * (nh + nkv)), w(hd), dw(hd), cs(N * hd / 2), sn(N * hd / 2),
        scratch(qknorm_rope_backward_scratch(N, nh, nkv, hd));
    CHECK_THROWS_WITH(qknorm_rope_backward<float>(g.get(), dw.get(), dw.get(), scratch.get(), g.get(), x.get(),
                                                  rstd.get(), w.get(), w.get(), cs.get(), sn.get(), N, (int)N, nh,
                                                  nkv, hd, 0),
                      Catch::Contains("din may alias dout only without QK-norm"));
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("rope")
