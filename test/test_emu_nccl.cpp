// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of the nccl workbench,
// dev/cuda/nccl.cu over cuda/nccl.cuh, with NCCL emulated by dev/emu/nccl_emu.h: its CHECKs
// (--check-only) on one rank, where every collective is the identity, and on two ranks under
// mpirun (this binary's hidden "[.two_ranks]" case on each rank), where the collectives are MPI's:
// all-reduce, reduce-scatter and all-gather sums at odd sizes in fp32 and bf16, the bucketed ZeRO-0
// and ZeRO-1 reductions of GpuDataParallel and its bf16 parameter gather. The inputs are multiples
// of 1/4, so the expected sums are exact and every CHECK line of every rank must PASS. Then the
// workbench command line (test/emu_workbench_cases.h; --nccl-id-file's value) and the hidden
// launch-only run at the BENCH shapes that test_ptxas checks.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "cuda_emu/dev_cuda/nccl.cu.h"
#include "test/emu_workbench_cases.h"
#include "test/test_train_shards.h"

namespace {

// The CHECK lines of `out` that name rank r of W ("(rank r of W)"), and how many of them PASS.
struct RankChecks {
    int lines = 0, passed = 0;
};
RankChecks rank_checks(const std::string& out, int r, int W) {
    RankChecks c;
    const std::string tag = " (rank " + std::to_string(r) + " of " + std::to_string(W) + ")";
    for (const std::string& line : split(out, '\n')) {
        if (line.rfind("CHECK nccl ", 0) != 0 || line.size() < tag.size() ||
            line.compare(line.size() - tag.size(), tag.size(), tag) != 0)
            continue;
        c.lines++;
        c.passed += line.find(" PASS (rank ") != std::string::npos;
    }
    return c;
}

size_t occurrences(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) n++;
    return n;
}

// The workbench's CHECK lines per rank: 5 sizes x 2 dtypes x 3 collectives, the bucketed
// reduction at ZeRO-0 and ZeRO-1, the ZeRO-1 parameter gather.
constexpr int kChecksPerRank = 5 * 2 * 3 + 2 + 1;

}  // namespace

TEST_CASE("emu: nccl workbench checks on one rank (--check-only)", "[emu][nccl]") {
    int rc = -1;
    const std::string out = emu::capture_stdout([&] { rc = EMU_WORKBENCH_RUN_("nccl", "--check-only"); });
    INFO(out);
    CHECK(rc == 0);
    const RankChecks c = rank_checks(out, 0, 1);
    CHECK(c.lines == kChecksPerRank);
    CHECK(c.passed == c.lines);
    CHECK_THAT(out, Catch::Contains("nccl: --check-only: no BENCH runs\n") &&
                        Catch::Contains("\nnccl: 0 failed checks over 1 ranks\n") &&
                        !Catch::Contains("\nBENCH "));
}

// One rank of the mpirun below: the workbench's checks in this MPI world.
TEST_CASE("nccl workbench checks on this rank of an mpirun world", "[.two_ranks]") {
    REQUIRE(std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr);
    const int rc = EMU_WORKBENCH_RUN_("nccl", "--check-only");
    std::printf("two_ranks: workbench_main returned %d\n", rc);
    std::fflush(stdout);
    CHECK(rc == 0);
}

TEST_CASE("emu: nccl workbench checks on two ranks under mpirun (MPI collectives)", "[emu][nccl][mpi]") {
    if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
        WARN("skipped: the two-rank run needs mpirun");
        return;
    }
    const std::string self = build_dir_of_test() + "/test/test_emu_nccl";
    const RunResult r = run_cmd("mpirun --allow-run-as-root --oversubscribe --bind-to none --mca "
                                "btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 -np 2 '" +
                                self + "' '[.two_ranks]' 2>&1");
    INFO(r.out);
    CHECK(r.status == 0);
    for (int rank = 0; rank < 2; rank++) {
        const RankChecks c = rank_checks(r.out, rank, 2);
        INFO("rank " << rank);
        CHECK(c.lines == kChecksPerRank);
        CHECK(c.passed == c.lines);
    }
    CHECK_THAT(r.out, Catch::Contains("\nnccl: 0 failed checks over 2 ranks\n"));
    CHECK(occurrences(r.out, "two_ranks: workbench_main returned 0\n") == 2);
}

TEST_CASE("emu: nccl workbench --nccl-id-file needs its value", "[emu][nccl][workbench_cli]") {
    int rc = -1;
    const std::string err = emu::capture_stderr([&] { rc = EMU_WORKBENCH_RUN_("nccl", "--nccl-id-file"); });
    CHECK(rc == 2);
    CHECK_THAT(err, Catch::StartsWith("nccl: error: --nccl-id-file needs a value\nusage: nccl [--quick] "
                                      "[--check-only | --bench-only] [--nccl-id-file PATH] [--help]\n"));
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("nccl")
