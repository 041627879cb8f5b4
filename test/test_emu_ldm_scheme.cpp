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
#include "test/emu_workbench_cases.h"
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
// each row bit for bit those wbwd_inputs makes for the `distinct` tokens alone, found through the
// kernels' own row offsets.
TEST_CASE("ldm workbench: the windowed-backward bench's inputs repeat those of a few tokens", "[ldm]") {
    const int N = 11, distinct = 4, Hm = 2, dk = 3, dv = 5, w = 3, m = 2;
    const wbwd::WbwdHost few = wbwd::wbwd_inputs<bf16>(distinct, Hm, dk, dv, w, m, 77);
    const wbwd::WbwdHost all = wbwd::wbwd_inputs<bf16>(N, Hm, dk, dv, w, m, 77, distinct);
    REQUIRE(all.D.N == N);
    CHECK(all.m == m);
    CHECK(all.w == w);
    CHECK(all.lam == few.lam);
    // token n's rows of head h through the kernels' offsets (Dims::key_off, val_off, state_off; write
    // t's block of a per-write array at t times its token count): those of token n % distinct
    const auto& Da = all.D;
    const auto& Df = few.D;
    int bad = 0, rows = 0;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < Hm; h++) {
            const int f = n % distinct;
            for (int t = 0; t < m; t++) {
                const int64_t ka = t * (int64_t)N * Da.HK + Da.key_off(n, h), kf = t * (int64_t)distinct * Df.HK + Df.key_off(f, h);
                const int64_t va = t * (int64_t)N * Da.d + Da.val_off(n, h), vf = t * (int64_t)distinct * Df.d + Df.val_off(f, h);
                for (int i = 0; i < dk; i++) bad += all.Kn[(size_t)(ka + i)] != few.Kn[(size_t)(kf + i)];
                for (int i = 0; i < dk; i++) bad += all.Qn[(size_t)(ka + i)] != few.Qn[(size_t)(kf + i)];
                for (int i = 0; i < dv; i++) bad += all.V[(size_t)(va + i)] != few.V[(size_t)(vf + i)];
                for (int i = 0; i < dv; i++) bad += all.dR[(size_t)(va + i)] != few.dR[(size_t)(vf + i)];
                rows += 4;
            }
            const int64_t sa = Da.state_off(n, h), sf = Df.state_off(f, h);
            for (int i = 0; i < Da.SS + Da.PP; i++) bad += all.state[(size_t)(sa + i)] != few.state[(size_t)(sf + i)];
            for (int i = 0; i < Da.SS + Da.PP; i++) bad += all.dstate[(size_t)(sa + i)] != few.dstate[(size_t)(sf + i)];
            rows += 2;
        }
    CHECK(rows == N * Hm * (4 * m + 2));
    CHECK(bad == 0);
    // the sizes of N tokens, and the layout the offsets above cover (every element once)
    CHECK(all.Kn.size() == (size_t)(m * (int64_t)N * Da.HK));
    CHECK(all.V.size() == (size_t)(m * (int64_t)N * Da.d));
    CHECK(all.state.size() == (size_t)(N * (int64_t)Da.ST));
    CHECK(all.dstate.size() == all.state.size());
    CHECK(Da.ST == Hm * (Da.SS + Da.PP));
    CHECK(Da.HK == Hm * dk);
    CHECK(Da.d == Hm * dv);
    CHECK(few.state[0] != 0.f);  // (a state reached by writes, not the zeros it starts from)
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("ldm")
