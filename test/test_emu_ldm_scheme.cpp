// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of the whole
// LdmGpuScheme of train_ldm.cu: every check case of the dev/cuda/ldm.cu workbench (check_cases():
// every rule and mode — store, unwind with drift, checkpoint-every, window with and without
// window-start states, --no-residual, --ldm-no-forget, odd shapes, the warp kernels at d_k <= 16
// and the thread kernels at d_k = 24, the warp and thread window paths) through begin / input /
// output / readout and their backward, fp32 and bf16, vs the CPU LDMScheme<double>; the cuBLASLt
// GEMMs are the host GEMM of dev/emu/matmul_host.h. Requires every CHECK to PASS. Also the
// workbench's checks of the windowed rls backward (wbwd::check_window_bwd).
#include <catch2/catch.hpp>

#include "cuda_emu/dev_cuda/ldm.cu.h"
#include "test/emu_bench_launches.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: LDM scheme, every workbench check case (fp32, bf16)", "[emu][ldm]") {
    const std::vector<Case> cases = check_cases();
    g_fail = 0;
    const std::string out = emu::capture_stdout([&] {
        for (const Case& c : cases) {
            run_case<float>(c);
            run_case<bf16>(c);
        }
    });
    const emu::CheckLines c = emu::check_lines(out);
    INFO(c.total << " CHECK lines over " << cases.size() << " cases");
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total >= 2 * 5 * (int)cases.size());
    CHECK(c.failed.empty());
    CHECK(g_fail == 0);
    // both kernel families and both window paths ran
    CHECK(out.find("-warp") != std::string::npos);
    CHECK(out.find("-thread") != std::string::npos);
    CHECK(out.find("-wwarp") != std::string::npos);
    CHECK(out.find("-wthread") != std::string::npos);
}

TEST_CASE("emu: the workbench's windowed-backward checks (dev/cuda/ldm_window_bwd.cuh; fp32, bf16)", "[emu][ldm]") {
    g_fail = 0;
    const std::string out = emu::capture_stdout([&] {
        wbwd::check_window_bwd<float>();
        wbwd::check_window_bwd<bf16>();
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total == 2 * 6 * 6);  // two dtypes, six window shapes, six outputs
    CHECK(c.failed.empty());
    CHECK(g_fail == 0);
}

// The windowed-backward bench's inputs: N tokens holding the rows of `distinct` tokens, in turn,
// each row bit for bit those wbwd_inputs makes for the `distinct` tokens alone.
TEST_CASE("ldm workbench: the windowed-backward bench's inputs repeat those of a few tokens", "[ldm]") {
    const int N = 11, distinct = 4, Hm = 2, dk = 3, dv = 5, w = 3, m = 2;
    const wbwd::WbwdHost few = wbwd::wbwd_inputs<bf16>(distinct, Hm, dk, dv, w, m, 77);
    const wbwd::WbwdHost all = wbwd::wbwd_inputs<bf16>(N, Hm, dk, dv, w, m, 77, distinct);
    REQUIRE(all.D.N == N);
    CHECK(all.m == m);
    CHECK(all.w == w);
    CHECK(all.lam == few.lam);
    // (rows of `row` floats, `blocks` blocks of N (all) or `distinct` (few) rows each)
    auto same = [&](const std::vector<float>& a, const std::vector<float>& f, int64_t row, int blocks) {
        REQUIRE(a.size() == (size_t)(blocks * N * row));
        REQUIRE(f.size() == (size_t)(blocks * distinct * row));
        int bad = 0;
        for (int64_t b = 0; b < blocks; b++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t i = 0; i < row; i++)
                    bad += a[(size_t)((b * N + n) * row + i)] != f[(size_t)((b * distinct + n % distinct) * row + i)];
        return bad;
    };
    CHECK(same(all.Kn, few.Kn, few.D.HK, m) == 0);
    CHECK(same(all.Qn, few.Qn, few.D.HK, m) == 0);
    CHECK(same(all.V, few.V, few.D.d, m) == 0);
    CHECK(same(all.dR, few.dR, few.D.d, m) == 0);
    CHECK(same(all.state, few.state, few.D.ST, 1) == 0);
    CHECK(same(all.dstate, few.dstate, few.D.ST, 1) == 0);
    CHECK(few.state[0] != 0.f);  // (a state reached by writes, not the zeros it starts from)
}

// scripts/gpu_check.sh's run of the workbench, launches only (test_ptxas checks them)
EMU_BENCH_LAUNCHES_CASE("ldm")
