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
#include <functional>
#include <utility>
#include <vector>

#include "cuda_emu/dev_cuda/nccl.cu.h"
#include "test/emu_workbench_cases.h"
#include "test/test_train_shards.h"

namespace {

// The workbench's CHECK lines per rank: 5 sizes x 2 dtypes x 3 collectives, the bucketed
// reduction at ZeRO-0 and ZeRO-1, the ZeRO-1 parameter gather.
constexpr int kChecksPerRank = 5 * 2 * 3 + 2 + 1;

// Rank r of W's output `out` holds kChecksPerRank CHECK lines, each naming that rank, all ending
// in PASS (emu::check_lines: what scripts/gpu_check.sh counts as passed).
void require_rank_checks(const std::string& out, int r, int W) {
    const emu::CheckLines c = emu::check_lines(out, "CHECK nccl ");
    CHECK(c.total == kChecksPerRank);
    CHECK(count_of(out, " rank=" + std::to_string(r) + "/" + std::to_string(W) + " ") == size_t(kChecksPerRank));
    CHECK(c.failed.empty());
}

}  // namespace

TEST_CASE("emu: nccl workbench checks on one rank (--check-only)", "[emu][nccl]") {
    int rc = -1;
    const std::string out = emu::capture_stdout([&] { rc = EMU_WORKBENCH_RUN_("nccl", "--check-only"); });
    INFO(out);
    CHECK(rc == 0);
    require_rank_checks(out, 0, 1);
    CHECK_THAT(out, Catch::Contains("nccl: --check-only: no BENCH runs\n") &&
                        Catch::Contains("\nnccl: 0 failed checks over 1 ranks\n") &&
                        !Catch::Contains("\nBENCH "));
}

// One rank of the mpirun below: the workbench's checks in this MPI world, its output and exit
// status into $LDM_NCCL_RANKS_DIR/rank<r>.out (a file per rank: the ranks' stdout, merged by
// mpirun, could interleave within a line).
TEST_CASE("nccl workbench checks on this rank of an mpirun world", "[.two_ranks]") {
    const char* dir = std::getenv("LDM_NCCL_RANKS_DIR");
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    REQUIRE(dir != nullptr);
    REQUIRE(rank != nullptr);
    int rc = -1;
    std::string out = emu::capture_stdout([&] { rc = EMU_WORKBENCH_RUN_("nccl", "--check-only"); });
    out += "two_ranks: workbench_main returned " + std::to_string(rc) + "\n";
    ldm::write_file_atomic(std::string(dir) + "/rank" + rank + ".out", out.data(), out.size());
    CHECK(rc == 0);
}

TEST_CASE("emu: nccl workbench checks on two ranks under mpirun (MPI collectives)", "[emu][nccl][mpi]") {
    if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
        WARN("skipped: the two-rank run needs mpirun");
        return;
    }
    const std::string self = build_dir_of_test() + "/test/test_emu_nccl";
    const std::string dir = scratch_dir("emu_nccl_two_ranks");
    const RunResult r = run_cmd("LDM_NCCL_RANKS_DIR='" + dir + "' mpirun --allow-run-as-root --oversubscribe "
                                "--bind-to none --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 "
                                "-np 2 '" + self + "' '[.two_ranks]' 2>&1");
    INFO(r.out);
    CHECK(r.status == 0);
    for (int rank = 0; rank < 2; rank++) {
        const std::string out = slurp(dir + "/rank" + std::to_string(rank) + ".out");
        INFO("rank " << rank << ":\n" << out);
        require_rank_checks(out, rank, 2);
        CHECK_THAT(out, Catch::EndsWith("\ntwo_ranks: workbench_main returned 0\n"));
        // the failure count summed over both ranks, printed by rank 0
        CHECK(count_of(out, "\nnccl: 0 failed checks over 2 ranks\n") == (rank == 0 ? 1u : 0u));
    }
}

// In launch-only mode (emu.h launch_only: device work is not done) every emulated collective
// leaves its output as it was; otherwise, on one rank, each copies its input.
TEST_CASE("emu: emulated NCCL moves nothing in launch-only mode", "[emu][nccl]") {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    ncclComm_t comm = nullptr;
    REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
    const std::vector<float> in = {1.5f, -2.f, 0.25f, 3.f, -7.5f};
    const size_t n = in.size();
    using Collective = std::function<ncclResult_t(const float*, float*)>;
    const std::vector<std::pair<const char*, Collective>> collectives = {
        {"all_reduce", [&](const float* s, float* d) { return ncclAllReduce(s, d, n, ncclFloat32, ncclSum, comm, 0); }},
        {"reduce_scatter",
         [&](const float* s, float* d) { return ncclReduceScatter(s, d, n, ncclFloat32, ncclSum, comm, 0); }},
        {"all_gather", [&](const float* s, float* d) { return ncclAllGather(s, d, n, ncclFloat32, comm, 0); }},
        {"reduce", [&](const float* s, float* d) { return ncclReduce(s, d, n, ncclFloat32, ncclSum, 0, comm, 0); }},
        {"broadcast", [&](const float* s, float* d) { return ncclBroadcast(s, d, n, ncclFloat32, 0, comm, 0); }},
    };
    for (const auto& c : collectives) {
        INFO(c.first);
        std::vector<float> out(n, 9.f);
        emu::set_launch_only(true);
        const ncclResult_t skipped = c.second(in.data(), out.data());
        emu::set_launch_only(false);
        CHECK(skipped == ncclSuccess);
        CHECK(out == std::vector<float>(n, 9.f));
        CHECK(c.second(in.data(), out.data()) == ncclSuccess);
        CHECK(out == in);
    }
    REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
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

// The rule every emulation test and scripts/gpu_check.sh count CHECK lines by: a line passes only
// when its last word is PASS (the old nccl format, with the rank after the verdict, failed it).
TEST_CASE("emu::check_lines: a CHECK line passes only when it ends in PASS", "[emu][nccl]") {
    const emu::CheckLines c = emu::check_lines(
        "CHECK a fp32 n=1 rel=0 max_abs=0 PASS\n"
        "CHECK b bf16 n=1 rel=1 max_abs=1 FAIL  worst: 3\n"
        "CHECK nccl c fp32 n=1 rel=0 max_abs=0 PASS (rank 0 of 1)\n"
        "BENCH d fp32 n=1 ms=1 GB/s=- TFLOP/s=-\n"
        "summary: CHECK lines PASS\n"
        "CHECK e fp32 PASSED\n");
    CHECK(c.total == 4);
    CHECK(c.failed == std::vector<std::string>{"CHECK b bf16 n=1 rel=1 max_abs=1 FAIL  worst: 3",
                                               "CHECK nccl c fp32 n=1 rel=0 max_abs=0 PASS (rank 0 of 1)",
                                               "CHECK e fp32 PASSED"});
    CHECK(emu::check_lines("CHECK nccl all_reduce fp32 n=1 rank=0/1 rel=0 max_abs=0 PASS\n", "CHECK nccl ").failed.empty());
}
