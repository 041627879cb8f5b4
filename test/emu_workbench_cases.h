// test/emu_workbench_cases.h — cases for a test that includes the emulation copy of a dev/cuda
// workbench (its main is workbench_main there, dev/emu/gen.py). EMU_WORKBENCH_CASES(NAME):
//   * its command line (dev/cuda/workbench.cuh Cli): --help exits 0 with the usage before any GPU
//     work; an unknown flag, and --check-only with --bench-only, exit 2 with the usage on stderr;
//   * "[.bench_launches]", hidden, only under launch-only emulation ($EMU_LAUNCH_ONLY=1): main with
//     --check-only, then with --bench-only after "bench_launches: --bench-only", which together
//     launch what scripts/gpu_check.sh's flagless run launches; no kernel runs, so the CHECKs fail
//     and the printed exit statuses mean nothing. test_ptxas counts the lines and checks the launches.
// EMU_WORKBENCH_QUICK_TIMES_NOTHING_CASE(NAME): where --quick times nothing, --quick --bench-only exits 2.
#pragma once
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "dev/emu/harness.h"

// workbench_main(argc, argv) with argv = {NAME, flags...}; the workbench's exit status.
#define EMU_WORKBENCH_RUN_(...)                                                                        \
    [](std::vector<std::string> args) {                                                                \
        std::vector<char*> argv;                                                                       \
        for (std::string& a : args) argv.push_back(&a[0]);                                             \
        argv.push_back(nullptr);                                                                       \
        return workbench_main(int(args.size()), argv.data());                                          \
    }(std::vector<std::string>{__VA_ARGS__})

#define EMU_WORKBENCH_CASES(NAME)                                                                      \
    TEST_CASE(NAME " workbench command line: --help, a bad flag, flags that exclude each other",      \
              "[emu][workbench_cli]") {                                                                \
        int rc = -1;                                                                                   \
        const std::string help = ::emu::capture_stdout([&] { rc = EMU_WORKBENCH_RUN_(NAME, "--help"); }); \
        CHECK(rc == 0);                                                                                \
        CHECK_THAT(help, Catch::StartsWith("usage: " NAME " [--quick] [--check-only | --bench-only] ") && \
                             Catch::Contains("\n  --bench-only  the BENCH lines only"));                \
        std::string err =                                                                              \
            ::emu::capture_stderr([&] { rc = EMU_WORKBENCH_RUN_(NAME, "--quick", "--no-such-flag"); }); \
        CHECK(rc == 2);                                                                                \
        CHECK_THAT(err, Catch::StartsWith(NAME ": error: unknown argument '--no-such-flag'\nusage: " NAME)); \
        err = ::emu::capture_stderr([&] { rc = EMU_WORKBENCH_RUN_(NAME, "--bench-only", "--check-only"); }); \
        CHECK(rc == 2);                                                                                \
        CHECK_THAT(err, Catch::StartsWith(NAME ": error: --check-only and --bench-only exclude each other")); \
    }                                                                                                  \
    TEST_CASE(NAME " workbench as gpu_check.sh runs it, launches only ($EMU_LAUNCH_ONLY=1)",           \
              "[.bench_launches]") {                                                                   \
        REQUIRE(::emu::launch_only()); /* (a whole workbench emulated would run for days) */          \
        int rc = EMU_WORKBENCH_RUN_(NAME, "--check-only");                                             \
        std::printf("bench_launches: workbench_main --check-only returned %d\n", rc);                  \
        std::printf("bench_launches: --bench-only\n");                                                 \
        std::fflush(stdout);                                                                           \
        rc = EMU_WORKBENCH_RUN_(NAME, "--bench-only");                                                 \
        std::printf("bench_launches: workbench_main --bench-only returned %d\n", rc);                  \
        std::fflush(stdout);                                                                           \
    }

#define EMU_WORKBENCH_QUICK_TIMES_NOTHING_CASE(NAME)                                                   \
    TEST_CASE(NAME " workbench refuses --quick --bench-only (its --quick times nothing)",             \
              "[emu][workbench_cli]") {                                                                \
        int rc = -1;                                                                                   \
        const std::string err =                                                                        \
            ::emu::capture_stderr([&] { rc = EMU_WORKBENCH_RUN_(NAME, "--bench-only", "--quick"); });  \
        CHECK(rc == 2);                                                                                \
        CHECK_THAT(err, Catch::StartsWith(NAME ": error: --quick times nothing here, so --quick --bench-only " \
                                               "would run nothing\nusage: " NAME));                     \
    }
