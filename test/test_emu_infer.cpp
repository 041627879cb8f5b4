// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of the GPU inference
// kernels of cuda/infer.cuh: kv_cache_append and cached_attention_forward (decode attention
// against the KV cache: one block of 4 warps per query row, GQA, fp32 online softmax merged over
// the warps), through the workbench checks of dev/cuda/infer.cu at all its shapes (first position,
// decode, chunks of new tokens, GQA 2:1 and 4:1, hd 6 / 16 / 64 / 128 / 256, full cache), fp32 and
// bf16, vs the host row reference (itself checked against a plain double softmax attention in
// test_infer_math), plus the run-to-run repeat. Requires every CHECK to PASS.
#include <catch2/catch.hpp>

// inline-asm paths of attention.cuh (included through infer.cuh; dev/emu/gen.py)
#define EMU_HOST_mma ::emu::mma_m16n8k16_bf16(c, a, b)
#define EMU_HOST_ldsm ::emu::ldmatrix_x4(r, p, false)
#define EMU_HOST_ldsm_trans ::emu::ldmatrix_x4(r, p, true)
#include "cuda_emu/dev_cuda/infer.cu.h"
#include "test/emu_workbench_cases.h"
#include "dev/emu/harness.h"

TEST_CASE("emu: decode attention and KV-cache append (workbench checks)", "[emu][infer]") {
    Report R;
    Rng rng(11);
    const std::string out = emu::capture_stdout([&] {
        for (const Shape& s : kCheckShapes) {  // the workbench's cases
            check<float>(R, rng, s);
            check<bf16>(R, rng, s);
        }
    });
    const emu::CheckLines c = emu::check_lines(out);
    std::string failed;
    for (const auto& l : c.failed) failed += l + "\n";
    INFO("failed CHECK lines:\n" << failed);
    CHECK(c.total >= 4 * 2 * 6);
    CHECK(c.failed.empty());
    CHECK(R.fails == 0);
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("infer")
