// ptxas resources of the GPU trainers' kernels (scripts/ptxas_report.py: nvcc -Xptxas -v on sm_90,
// no GPU needed): no kernel spills registers to local memory beyond a few bytes. The bound (64
// bytes of spill stores or loads per thread) leaves room for the few bytes that ptxas versions
// move around in two rarely-hot kernels (the scalar bf16 attention forward and the hd-64 dQ
// kernel: 4-8 bytes with nvcc 13.0) and catches what matters: the rls warp kernels at d_k 16 once
// kept P and dP in registers and spilled 1.5-17 KB per thread. Skips visibly without nvcc.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "test/helpers.h"
#include "test/test_train_shards.h"

TEST_CASE("ptxas: no trainer kernel spills more than 64 bytes per thread (sm_90)", "[ptxas][cuda]") {
    const std::string nvcc = std::getenv("NVCC") ? std::getenv("NVCC") : "/usr/local/cuda/bin/nvcc";
    if (std::system(("test -x '" + nvcc + "' || command -v nvcc >/dev/null 2>&1").c_str()) != 0) {
        WARN("SKIP ptxas report: no nvcc");
        return;
    }
    const std::string dir = scratch_dir("ptxas");
    const std::string out = dir + "/ptxas.md";
    const std::string cmd = "cd '" LDM_SOURCE_DIR "' && python3 scripts/ptxas_report.py --out '" + out + "'" +
                            (std::getenv("NVCC") ? " --nvcc '" + nvcc + "'" : std::string()) + " 2>&1";
    RunResult r = run_cmd(cmd);
    INFO(cmd << "\n" << r.out);
    REQUIRE(r.status == 0);
    const std::string md = slurp(out);
    int kernels = 0, ldm_kernels = 0;
    for (const std::string& line : split(md, '\n')) {
        if (line.rfind("| train_", 0) != 0) continue;
        const std::vector<std::string> c = split(line, '|');  // "", source, kernel, regs, smem, stack, st, ld, ""
        REQUIRE(c.size() == 9);
        kernels++;
        if (c[2].find("ldmk") != std::string::npos) ldm_kernels++;  // (demangled or not)
        const long regs = std::atol(c[3].c_str()), st = std::atol(c[6].c_str()), ld = std::atol(c[7].c_str());
        INFO(line);
        CHECK(regs > 0);
        CHECK(regs <= 255);
        CHECK(st <= 64);
        CHECK(ld <= 64);
    }
    CHECK(kernels > 100);  // every production kernel of both trainers (368 with nvcc 13.0)
    CHECK(ldm_kernels > 20);
}
