// test/emu_bench_launches.h — EMU_BENCH_LAUNCHES_CASE(NAME): a hidden Catch2 case,
// "[.bench_launches]", for a test that includes the emulation copy of the dev/cuda/NAME.cu
// workbench (its main is workbench_main there, dev/emu/gen.py). It runs workbench_main with no
// flags, as scripts/gpu_check.sh runs the workbench on a GPU: every CHECK, then every BENCH at its
// full shape (llama-400m and qwen3-1.7b sizes). Only under launch-only emulation
// ($EMU_LAUNCH_ONLY=1, dev/emu/emu.h launch_only): each launch is checked against the device limits
// and logged ($EMU_LAUNCH_LOG), no kernel runs, so the CHECK lines fail (the outputs stay zero) and
// the workbench's exit status means nothing; the case prints it. test_ptxas runs the case of each
// workbench and checks the logged launches against ptxas's registers and shared memory.
#pragma once
#include <catch2/catch.hpp>

#include <cstdio>

#define EMU_BENCH_LAUNCHES_CASE(NAME)                                                                  \
    TEST_CASE(NAME " workbench at its BENCH shapes, launches only ($EMU_LAUNCH_ONLY=1)",               \
              "[.bench_launches]") {                                                                   \
        REQUIRE(::emu::launch_only()); /* (a whole workbench emulated would run for days) */          \
        char arg0[] = NAME;                                                                            \
        char* argv[] = {arg0, nullptr};                                                                \
        const int rc = workbench_main(1, argv);                                                        \
        std::printf("bench_launches: workbench_main returned %d\n", rc);                               \
        std::fflush(stdout);                                                                           \
    }
