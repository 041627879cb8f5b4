// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of
// GpuAttnRes (train_gpt_baselines.cu, kernels cuda/attnres.cuh): the --quick workbench checks of
// dev/cuda/attnres.cu (Full AttnRes with the deferred backward: paired flushes, one source per
// flush, a pair at every other flush, the scores kernel's rows staged through registers, the
// flushes' direct loads (the five bit for bit the same), one source per barrier;
// the direct backward; Block AttnRes on the two-phase path, the per-sublayer path with the
// deferred backward and the direct one; fp32 and bf16, vs the CPU Scheme<double>), with the
// cuBLASLt GEMMs replaced by the host GEMM of dev/emu/matmul_host.h. Requires every CHECK to PASS.
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/attnres.cu.h"
#include "test/emu_workbench_cases.h"
#include "dev/emu/harness.h"

// The ThreadSanitizer build (build/tsan) runs the Race subset (dev/cuda/scheme_check.cuh Checks).
#if EMU_TSAN
constexpr ldm::gpu::wb::Checks kChecks = ldm::gpu::wb::Checks::Race;
#else
constexpr ldm::gpu::wb::Checks kChecks = ldm::gpu::wb::Checks::Quick;
#endif

TEST_CASE("emu: AttnRes scheme workbench checks (--quick shapes)", "[emu][attnres]") {
    bool ok = true;
    const std::string out = emu::capture_stdout([&] {
        ok &= run_checks<float>(kChecks, 1e-4, 1e-4);
        ok &= run_checks<bf16>(kChecks, 3e-2, 5e-2);
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total > 10);
    CHECK(c.failed.empty());
    CHECK(ok);
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("attnres")
EMU_WORKBENCH_QUICK_TIMES_NOTHING_CASE("attnres")
