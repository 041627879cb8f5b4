// test/emu_workbench_cases.h — EMU_WORKBENCH_CASES(NAME): two Catch2 cases for a test that includes
// the emulation copy of the dev/cuda/NAME.cu workbench (its main is workbench_main there,
// dev/emu/gen.py).
//   * "NAME workbench command line": the flags every workbench takes (dev/cuda/workbench.cuh Cli):
//     --help prints the usage and exits 0 before any GPU work; an unknown flag, and --check-only
//     with --bench-only, exit 2 with the error and the usage on stderr.
//   * "[.bench_launches]", hidden, only under launch-only emulation ($EMU_LAUNCH_ONLY=1, dev/emu/emu.h
//     launch_only: each launch checked against the device limits and logged in $EMU_LAUNCH_LOG, no
//     kernel runs): workbench_main with --check-only, then with --bench-only after the line
//     "bench_launches: --bench-only". Together they launch what scripts/gpu_check.sh's run with no
//     flags launches on a GPU (every CHECK, then every BENCH at its full shape), with no host work
//     done twice. The CHECKs fail by design (the outputs stay zero), so the exit statuses mean
//     nothing; the case prints them. test_ptxas runs it for every workbench, counts the CHECK and
//     BENCH lines of both runs and checks the launches against ptxas.
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
    TEST_CASE(NAME " workbench at its BENCH shapes, launches only ($EMU_LAUNCH_ONLY=1)",               \
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
