// Launch limits under the CPU emulation (dev/emu/emu.h): the launches a GPU refuses but a host
// loop would run must abort in the emulator too. Dynamic shared memory above 48 KiB needs the
// kernel's cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) opt-in and stays
// within it; static __shared__ at most 48 KiB, static + dynamic at most 48 KiB without the
// opt-in and opt-in + static at most 227 KiB; a block no larger than the kernel's
// __launch_bounds__ (gen.py inserts the check into every such kernel: checked on the generated
// classifier kernel); grid and block dimensions within CUDA's limits. Each refused launch runs in a
// forked child (run_child, test/helpers.h). Also the helpers built on these limits:
// ensure_dynamic_smem and persistent_grid (cuda/common.cuh), and the emulated device attributes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_emu/classifier.cuh"
#include "dev/emu/emu.h"
#include "test/helpers.h"

namespace {

// out[i] = sum of the first `n` floats of dynamic shared memory after each thread fills its
// strided share with (k + 1) * 0.5: out[blockIdx.x] = 0.25 n (n + 1). Each kernel below is a
// distinct function (the opt-in is per kernel) with the same body.
__device__ void fill_and_sum(float* out, int n) {
    float* sm = (float*)::emu::dyn_smem();
    for (int k = threadIdx.x; k < n; k += blockDim.x) sm[k] = 0.5f * (float)(k + 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int k = 0; k < n; k++) s += sm[k];
        out[blockIdx.x] = (float)s;
    }
}
__global__ void dyn_kernel_a(float* out, int n) { fill_and_sum(out, n); }
__global__ void dyn_kernel_b(float* out, int n) { fill_and_sum(out, n); }
__global__ void dyn_kernel_c(float* out, int n) { fill_and_sum(out, n); }
__global__ void dyn_kernel_d(float* out, int n) { fill_and_sum(out, n); }
__global__ void dyn_kernel_e(float* out, int n) { fill_and_sum(out, n); }

// A kernel with a static __shared__ array of NB bytes, declared as gen.py writes it, plus the
// dynamic part: out[blockIdx.x] = sum of both after every thread wrote its share.
template <int NB>
__global__ void static_kernel(float* out, int ndyn) {
    static float st__emu[NB / 4];
    auto& st = ::emu::block_shared(st__emu);
    for (int k = threadIdx.x; k < NB / 4; k += blockDim.x) st[k] = 1.0f;
    __syncthreads();
    fill_and_sum(out, ndyn);
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int k = 0; k < NB / 4; k++) s += st[k];
        out[blockIdx.x] += (float)s;
    }
}

// ids[linear block id · threads per block + linear thread id] = that index (x fastest).
__global__ void linear_id_kernel(int* ids) {
    const int nt = (int)(blockDim.x * blockDim.y * blockDim.z);
    const int b = (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    const int t = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    ids[b * nt + t] = b * nt + t;
}

float expect_sum(int n) { return (float)(0.25 * (double)n * (double)(n + 1)); }

}  // namespace

TEST_CASE("emu limits: dynamic shared memory above 48 KiB needs the kernel's opt-in and stays within it",
          "[emu][limits]") {
    float* out = nullptr;
    REQUIRE(cudaMalloc(&out, 2 * sizeof(float)) == cudaSuccess);
    const size_t k48 = 48 * 1024, k64 = 64 * 1024;

    // at the default limit: runs without an opt-in
    emu::launch(dim3(2), dim3(96), k48, nullptr, dyn_kernel_a, out, (int)(k48 / 4));
    CHECK(out[0] == expect_sum((int)(k48 / 4)));
    CHECK(out[1] == expect_sum((int)(k48 / 4)));

    // 64 KiB without the opt-in: refused
    ChildResult r = run_child([&] { emu::launch(dim3(1), dim3(64), k64, nullptr, dyn_kernel_a, out, 16); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("above 48 KiB without cudaFuncSetAttribute"));

    // opted in to 64 KiB: runs, and reads back all of it
    REQUIRE(cudaFuncSetAttribute(dyn_kernel_a, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k64) == cudaSuccess);
    emu::launch(dim3(2), dim3(128), k64, nullptr, dyn_kernel_a, out, (int)(k64 / 4));
    CHECK(out[0] == expect_sum((int)(k64 / 4)));
    CHECK(out[1] == expect_sum((int)(k64 / 4)));

    // beyond its own opt-in: refused
    r = run_child([&] { emu::launch(dim3(1), dim3(64), k64 + 16, nullptr, dyn_kernel_a, out, 16); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("above the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize"));

    // the opt-in belongs to one kernel: another with the same body is still refused
    r = run_child([&] { emu::launch(dim3(1), dim3(64), k64, nullptr, dyn_kernel_b, out, 16); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("above 48 KiB without cudaFuncSetAttribute"));

    // a later, smaller setting replaces the earlier one; through a void pointer too
    REQUIRE(cudaFuncSetAttribute(dyn_kernel_c, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024) ==
            cudaSuccess);
    REQUIRE(cudaFuncSetAttribute((const void*)dyn_kernel_c, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)k64) == cudaSuccess);
    r = run_child([&] { emu::launch(dim3(1), dim3(64), 100 * 1024, nullptr, dyn_kernel_c, out, 16); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("above the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize"));

    // the sm_90 maximum: 227 KiB (the launch itself refuses more, opt-in or not)
    CHECK(cudaFuncSetAttribute(dyn_kernel_b, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 + 4) ==
          cudaErrorInvalidValue);
    CHECK(cudaFuncSetAttribute(dyn_kernel_b, cudaFuncAttributeMaxDynamicSharedMemorySize, -1) ==
          cudaErrorInvalidValue);
    REQUIRE(cudaFuncSetAttribute(dyn_kernel_b, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024) ==
            cudaSuccess);
    emu::launch(dim3(1), dim3(256), 227 * 1024, nullptr, dyn_kernel_b, out, 227 * 256);
    CHECK(out[0] == expect_sum(227 * 256));
    // other attributes are accepted and change nothing
    CHECK(cudaFuncSetAttribute(dyn_kernel_b, cudaFuncAttributePreferredSharedMemoryCarveout, 100) == cudaSuccess);
    cudaFree(out);
}

TEST_CASE("emu limits: static __shared__ counts toward the shared-memory limits", "[emu][limits]") {
    float* out = nullptr;
    REQUIRE(cudaMalloc(&out, sizeof(float)) == cudaSuccess);
    constexpr int k32 = 32 * 1024;

    // 32 KiB static + 16 KiB dynamic = 48 KiB: runs without an opt-in (both parts read back)
    emu::launch(dim3(1), dim3(128), 16 * 1024, nullptr, static_kernel<k32>, out, 4096);
    CHECK(out[0] == expect_sum(4096) + (float)(k32 / 4));

    // 32 KiB static + 20 KiB dynamic without an opt-in: refused (the dynamic part alone is fine)
    ChildResult r = run_child([&] { emu::launch(dim3(1), dim3(64), 20 * 1024, nullptr, static_kernel<k32>, out, 16); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("static + dynamic shared memory above 48 KiB"));

    // more than 48 KiB of static __shared__: refused (ptxas would not build it)
    r = run_child([&] { emu::launch(dim3(1), dim3(64), 0, nullptr, static_kernel<52 * 1024>, out, 0); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("static __shared__ memory of a kernel above 48 KiB"));

    // opted in: 32 KiB static + 100 KiB dynamic runs; an opt-in of 200 KiB + 32 KiB static is
    // above 227 KiB and refused even when the launch itself asks for less
    REQUIRE(cudaFuncSetAttribute(static_kernel<k32>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024) ==
            cudaSuccess);
    emu::launch(dim3(1), dim3(128), 100 * 1024, nullptr, static_kernel<k32>, out, 25600);
    CHECK(out[0] == expect_sum(25600) + (float)(k32 / 4));
    REQUIRE(cudaFuncSetAttribute(static_kernel<k32>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024) ==
            cudaSuccess);
    r = run_child([&] { emu::launch(dim3(1), dim3(64), 1024, nullptr, static_kernel<k32>, out, 16); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("static shared memory + cudaFuncAttributeMaxDynamicSharedMemorySize above 227 KiB"));
    cudaFree(out);
}

TEST_CASE("ensure_dynamic_smem (cuda/common.cuh) raises a kernel's opt-in and never lowers it", "[emu][limits]") {
    using ldm::gpu::ensure_dynamic_smem;
    float* out = nullptr;
    REQUIRE(cudaMalloc(&out, sizeof(float)) == cudaSuccess);
    const void* key = reinterpret_cast<const void*>(dyn_kernel_d);
    ensure_dynamic_smem(dyn_kernel_d, 0);  // nothing to allow: no opt-in recorded
    CHECK(emu::detail::optin_of(key) == -1);
    ensure_dynamic_smem(dyn_kernel_d, 100 * 1024);
    CHECK(emu::detail::optin_of(key) == 100 * 1024);
    emu::launch(dim3(1), dim3(128), 100 * 1024, nullptr, dyn_kernel_d, out, 25600);
    CHECK(out[0] == expect_sum(25600));
    // a launch site asking for less leaves the larger opt-in (cudaFuncSetAttribute would lower it:
    // dyn_kernel_c above), so the 100 KiB launch still runs
    ensure_dynamic_smem(dyn_kernel_d, 60 * 1024);
    ensure_dynamic_smem(dyn_kernel_d, 1024);
    CHECK(emu::detail::optin_of(key) == 100 * 1024);
    emu::launch(dim3(1), dim3(128), 100 * 1024, nullptr, dyn_kernel_d, out, 25600);
    CHECK(out[0] == expect_sum(25600));
    ensure_dynamic_smem(dyn_kernel_d, 150 * 1024);  // more: raised
    CHECK(emu::detail::optin_of(key) == 150 * 1024);
    // below 48 KiB of dynamic memory it still opts in, for the static part: 40 KiB static + 12 KiB
    // dynamic is refused without (static_kernel<40 KiB> has no opt-in yet) and runs with it
    constexpr int k40 = 40 * 1024;
    ChildResult r = run_child([&] { emu::launch(dim3(1), dim3(64), 12 * 1024, nullptr, static_kernel<k40>, out, 16); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    ensure_dynamic_smem(static_kernel<k40>, 12 * 1024);
    emu::launch(dim3(1), dim3(128), 12 * 1024, nullptr, static_kernel<k40>, out, 3072);
    CHECK(out[0] == expect_sum(3072) + (float)(k40 / 4));
    // a value the device refuses: ldm::Error, and nothing recorded
    CHECK_THROWS_AS(ensure_dynamic_smem(dyn_kernel_d, 228 * 1024), ldm::Error);
    CHECK(emu::detail::optin_of(key) == 150 * 1024);
    cudaFree(out);
}

TEST_CASE("persistent_grid (cuda/common.cuh): one wave of the emulated device's resident blocks, capped",
          "[emu][limits]") {
    using ldm::gpu::persistent_grid;
    // the emulated device: 1 SM of 2048 threads, 32 blocks, 228 KiB of shared memory (1 KiB reserved per block)
    int n = -1;
    REQUIRE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dyn_kernel_a, 256, 0) == cudaSuccess);
    CHECK(n == 8);
    REQUIRE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dyn_kernel_a, 32, 0) == cudaSuccess);
    CHECK(n == 32);
    REQUIRE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dyn_kernel_a, 96, 100 * 1024) == cudaSuccess);
    CHECK(n == 2);  // 228 KiB / 101 KiB
    REQUIRE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dyn_kernel_a, 96, 228 * 1024) == cudaSuccess);
    CHECK(n == 0);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dyn_kernel_a, 1025, 0) == cudaErrorInvalidValue);
    CHECK(persistent_grid(dyn_kernel_e, 256, 0, 1024) == 8);
    CHECK(persistent_grid(dyn_kernel_e, 256, 0, 3) == 3);                  // capped (the cached count)
    CHECK(persistent_grid(dyn_kernel_e, 128, 60 * 1024, 1024) == 3);       // 228 / 61
    CHECK(persistent_grid(dyn_kernel_e, 128, 60 * 1024, 2) == 2);
    CHECK(persistent_grid(dyn_kernel_e, 128, 227 * 1024, 1024) == 1);      // 228 / 228
    // it raised the kernel's opt-in first, so its grid launches with that shared memory
    float* out = nullptr;
    REQUIRE(cudaMalloc(&out, 3 * sizeof(float)) == cudaSuccess);
    const int nb = persistent_grid(dyn_kernel_e, 128, 60 * 1024, 1024);
    emu::launch(dim3(nb), dim3(128), 60 * 1024, nullptr, dyn_kernel_e, out, 60 * 256);
    for (int b = 0; b < nb; b++) CHECK(out[b] == expect_sum(60 * 256));
    cudaFree(out);
    // a size the device refuses: the opt-in's error (ldm::Error), not a grid
    CHECK_THROWS_AS(persistent_grid(dyn_kernel_e, 128, 228 * 1024, 1024), ldm::Error);
}

TEST_CASE("emu limits: a block above the kernel's __launch_bounds__ is refused (generated classifier kernel)",
          "[emu][limits]") {
    using namespace ldm::gpu;
    using classifier_detail::classifier_kernel;
    // one row of V = 7 logits (random, non-zero) and its target; the kernel turns the row into
    // dlogits = (softmax - onehot) * dscale and writes the row's loss
    const int V = 7;
    float *logits = nullptr, *losses = nullptr;
    int32_t* targets = nullptr;
    REQUIRE(cudaMalloc(&logits, V * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&losses, sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&targets, sizeof(int32_t)) == cudaSuccess);
    const float x[V] = {0.31f, -1.2f, 2.05f, 0.77f, -0.4f, 1.1f, -2.3f};
    for (int i = 0; i < V; i++) logits[i] = x[i];
    targets[0] = 3;
    const int kThreads = classifier_detail::kThreads;

    // at the bound: runs, with the closed-form loss log(sum exp x) - x_t
    emu::launch(dim3(1), dim3(kThreads), 0, nullptr, classifier_kernel<float, false>, logits, losses, targets, V, V,
                1.0f, true);
    double z = 0.0;
    for (int i = 0; i < V; i++) z += std::exp((double)x[i]);
    CHECK(std::fabs((double)losses[0] - (std::log(z) - (double)x[3])) <= 1e-5);

    // twice the bound: refused
    const ChildResult r = run_child([&] {
        emu::launch(dim3(1), dim3(2 * kThreads), 0, nullptr, classifier_kernel<float, false>, logits, losses, targets,
                    V, V, 1.0f, true);
    });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("above the kernel's __launch_bounds__") &&
                          Catch::Contains("block of " + std::to_string(2 * kThreads) + " threads"));
    cudaFree(logits);
    cudaFree(losses);
    cudaFree(targets);
}

// $EMU_LAUNCH_ONLY (emu::set_launch_only in a child process): a launch within the limits starts
// thread 0 of block (0,0,0) only, which ends at gen.py's kernel_entry before the body (the rows the
// kernel would overwrite, logits and losses, keep their values; losses as cudaMalloc left them,
// zeroed, from zero pages of an 80 GiB device); cudaMemset fills them (a zero fill by giving pages
// back); a copy between two of them is not done, one to or from the host is; cudaFree unmaps them
// even with the mode switched off; the limits are still checked.
TEST_CASE("emu limits: launch-only mode checks a launch without running the kernel", "[emu][limits]") {
#if EMU_TSAN
    WARN("SKIP: launch-only mode is off in the ThreadSanitizer build");
    return;
#endif
    using namespace ldm::gpu;
    using classifier_detail::classifier_kernel;
    const int kThreads = classifier_detail::kThreads;
    const ChildResult r = run_child([&] {
        emu::set_launch_only(true);
        const int V = 7, R = 15;  // rows: a grid of 5 x 3 blocks
        float *logits = nullptr, *losses = nullptr;
        int32_t* targets = nullptr;
        if (cudaMalloc(&logits, R * V * sizeof(float)) != cudaSuccess ||
            cudaMalloc(&losses, R * sizeof(float)) != cudaSuccess || cudaMalloc(&targets, R * sizeof(int32_t)) != cudaSuccess)
            std::exit(3);
        size_t free_b = 0, total_b = 0;
        const bool mapped = emu::mapped_allocations().size() == 3 && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess &&
                            total_b == (size_t(80) << 30);
        bool zeroed = true;
        for (int i = 0; i < R; i++) zeroed = zeroed && losses[i] == 0.f;
        for (int i = 0; i < R * V; i++) logits[i] = 0.25f * (float)(i % V + 1) - 0.6f;  // row loss != 0
        for (int i = 0; i < R; i++) targets[i] = i % V;
        const uint64_t blocks = emu::detail::g.blocks;
        emu::launch(dim3(5, 3), dim3(kThreads), 0, nullptr, classifier_kernel<float, false>, logits, losses, targets,
                    V, V, 1.0f, true);
        bool kept = true;
        for (int i = 0; i < R; i++) kept = kept && losses[i] == 0.f;
        for (int i = 0; i < R * V; i++) kept = kept && logits[i] == 0.25f * (float)(i % V + 1) - 0.6f;
        std::fprintf(stderr, "mapped %d, zeroed %d, blocks run %llu, threads %zu of %d, rows kept %d\n", mapped ? 1 : 0,
                     zeroed ? 1 : 0, (unsigned long long)(emu::detail::g.blocks - blocks), emu::detail::g.th.size(),
                     kThreads, kept ? 1 : 0);
        // cudaMemset: a zero fill over whole pages (given back) and its partial ends, then a non-zero one
        const size_t nbig = 3001;  // 12004 B from a page start: 2 whole pages and a partial one
        float* big = nullptr;
        bool fills = cudaMalloc(&big, nbig * sizeof(float)) == cudaSuccess;
        for (size_t i = 0; fills && i < nbig; i++) big[i] = 1.5f + (float)i;
        fills = fills && cudaMemset(big + 1, 0, (nbig - 2) * sizeof(float)) == cudaSuccess;
        for (size_t i = 1; fills && i + 1 < nbig; i++) fills = big[i] == 0.f;
        fills = fills && big[0] == 1.5f && big[nbig - 1] == 1.5f + (float)(nbig - 1);
        fills = fills && cudaMemset(big, 0x3f, nbig * sizeof(float)) == cudaSuccess;
        const uint32_t pattern = 0x3f3f3f3fu;
        float want = 0.f;
        std::memcpy(&want, &pattern, sizeof want);
        for (size_t i = 0; fills && i < nbig; i++) fills = big[i] == want;
        // copies: between two cudaMalloc blocks not done (device work), to and from the host done
        float host[R];
        bool copies = cudaMemcpy(losses, logits, R * sizeof(float), cudaMemcpyDeviceToDevice) == cudaSuccess &&
                      cudaMemcpyAsync(losses, logits, R * sizeof(float), cudaMemcpyDefault, nullptr) == cudaSuccess;
        for (int i = 0; i < R; i++) copies = copies && losses[i] == 0.f;
        copies = copies && cudaMemcpy(host, logits, R * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess;
        for (int i = 0; i < R; i++) copies = copies && host[i] == logits[i] && host[i] != 0.f;
        for (int i = 0; i < R; i++) host[i] = 2.f + (float)i;
        copies = copies && cudaMemcpy(losses, host, R * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
        for (int i = 0; i < R; i++) copies = copies && losses[i] == 2.f + (float)i;
        // freed by the kind they were allocated as, whatever the mode is now
        emu::set_launch_only(false);
        const bool freed = cudaFree(logits) == cudaSuccess && cudaFree(losses) == cudaSuccess &&
                           cudaFree(targets) == cudaSuccess && cudaFree(big) == cudaSuccess &&
                           emu::mapped_allocations().empty();
        emu::set_launch_only(true);
        std::fprintf(stderr, "fills %d, copies %d, freed %d\n", fills ? 1 : 0, copies ? 1 : 0, freed ? 1 : 0);
        emu::launch(dim3(1), dim3(2 * kThreads), 0, nullptr, classifier_kernel<float, false>, logits, losses, targets,
                    V, V, 1.0f, true);  // twice the bound: refused (before any thread reads the freed rows)
    });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("mapped 1, zeroed 1, blocks run 1, threads 1 of " + std::to_string(kThreads) +
                                    ", rows kept 1\nfills 1, copies 1, freed 1\n"));
    CHECK_THAT(r.err, Catch::Contains("above the kernel's __launch_bounds__"));
}

// dev/emu/gen.py's kernel rewrite on a made-up header: every kernel body starts with
// ::emu::kernel_entry() (where launch-only mode ends a thread), after ::emu::check_launch_bounds(N)
// where the kernel declares __launch_bounds__; a declaration and a // comment are left alone; a
// kernel spelled any other way is an error (it would run its whole body in launch-only mode).
TEST_CASE("emu gen.py: kernel_entry first in every kernel body, a kernel it cannot parse refused", "[emu][limits]") {
    namespace fs = std::filesystem;
    const std::string dir = scratch_dir("gen_kernels");
    fs::create_directories(dir + "/src/cuda");
    auto gen = [&](const std::string& text, std::string& out) {
        std::FILE* f = std::fopen((dir + "/src/cuda/k.cuh").c_str(), "w");
        REQUIRE(f);
        REQUIRE(std::fwrite(text.data(), 1, text.size(), f) == text.size());
        REQUIRE(std::fclose(f) == 0);
        const std::string cmd = "python3 '" LDM_SOURCE_DIR "/dev/emu/gen.py' -q --root '" + dir + "/src' --out '" + dir +
                                "/out' cuda/k.cuh 2>&1";
        std::FILE* p = popen(cmd.c_str(), "r");
        REQUIRE(p);
        char buf[512];
        std::string msg;
        while (std::fgets(buf, sizeof buf, p)) msg += buf;
        const int st = pclose(p);
        out = msg;
        if (st != 0) return false;
        out = slurp(dir + "/out/cuda_emu/k.cuh");
        return true;
    };
    std::string out;
    REQUIRE(gen("#pragma once\n// __global__ void not_a_kernel(int) {\n"
                "template <int N>\n__global__ void __launch_bounds__(N, 2)\n    k1(int* a, int (*f)(int)) { a[0] = f(N); }\n"
                "__global__ void k2(float* x);\n__global__ void k2(float* x) {\n    x[0] = 2.f;\n}\n",
                out));
    INFO(out);
    CHECK_THAT(out, Catch::Contains("// __global__ void not_a_kernel(int) {\n"));
    CHECK_THAT(out, Catch::Contains("k1(int* a, int (*f)(int)) { ::emu::check_launch_bounds((long)(N)); "
                                    "::emu::kernel_entry(); a[0] = f(N); }"));
    CHECK_THAT(out, Catch::Contains("__global__ void k2(float* x);\n__global__ void k2(float* x) { "
                                    "::emu::kernel_entry();\n    x[0] = 2.f;"));
    size_t entries = 0;
    for (size_t at = out.find("::emu::kernel_entry()"); at != std::string::npos; at = out.find("::emu::kernel_entry()", at + 1))
        entries++;
    CHECK(entries == 2);
    CHECK_FALSE(gen("__global__ __launch_bounds__(64) void k3(int* a) { a[0] = 3; }\n", out));
    CHECK_THAT(out, Catch::Contains("a kernel not spelled"));
}

TEST_CASE("emu limits: grid and block dimensions a GPU refuses abort; the largest accepted shapes run",
          "[emu][limits]") {
    float* out = nullptr;
    REQUIRE(cudaMalloc(&out, 2 * sizeof(float)) == cudaSuccess);
    // accepted: blocks of 1 x 1 x 64 and 1024 x 1 x 1 threads, a grid of 2 in z and in y; every
    // thread writes its linear id (blocks and threads x fastest) into its own slot
    int* ids = nullptr;
    REQUIRE(cudaMalloc(&ids, 2048 * sizeof(int)) == cudaSuccess);
    const struct {
        dim3 grid, block;
    } accepted[] = {{dim3(1, 1, 2), dim3(1, 1, 64)}, {dim3(1, 2), dim3(1024)}};
    for (const auto& c : accepted) {
        const int total = (int)(c.grid.x * c.grid.y * c.grid.z * c.block.x * c.block.y * c.block.z);
        for (int i = 0; i < total; i++) ids[i] = -1;
        emu::launch(c.grid, c.block, 0, nullptr, linear_id_kernel, ids);
        int wrong = 0;
        for (int i = 0; i < total; i++) wrong += ids[i] != i;
        CHECK(wrong == 0);
    }
    cudaFree(ids);
    const struct {
        dim3 grid, block;
        const char* msg;
    } refused[] = {
        {dim3(1, 65536), dim3(32), "grid dimensions above"},
        {dim3(1, 1, 65536), dim3(32), "grid dimensions above"},
        {dim3(2147483648u), dim3(32), "grid dimensions above"},
        {dim3(1), dim3(1, 1, 65), "block dimensions above"},
        {dim3(1), dim3(1, 1025), "block size must be"},
        {dim3(1), dim3(64, 32), "block size must be"},
    };
    for (const auto& c : refused) {
        const ChildResult r = run_child([&] { emu::launch(c.grid, c.block, 0, nullptr, dyn_kernel_a, out, 5); });
        INFO("grid " << c.grid.x << "x" << c.grid.y << "x" << c.grid.z << ", block " << c.block.x << "x"
                     << c.block.y << "x" << c.block.z << "; child stderr: " << r.err);
        CHECK(r.aborted);
        CHECK_THAT(r.err, Catch::Contains(c.msg));
    }
    cudaFree(out);
}

TEST_CASE("emu: cudaDeviceGetAttribute answers as cudaGetDeviceProperties; max_dynamic_smem_optin reads it",
          "[emu][limits]") {
    cudaDeviceProp p;
    REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
    int v = -1;
    REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
    CHECK(v == p.multiProcessorCount);
    REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
    CHECK(v == (int)p.sharedMemPerBlockOptin);
    REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
    CHECK(v == p.major);
    CHECK(ldm::gpu::max_dynamic_smem_optin() == 227 * 1024);
    const ChildResult r = run_child([&] { (void)cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, 0); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("not emulated"));
}

namespace {
// seq[linear block id] = how many blocks ran before it (one counter, thread 0 of each block).
__global__ void block_sequence_kernel(int* seq, int* counter) {
    if (threadIdx.x == 0) seq[blockIdx.x + gridDim.x * blockIdx.y] = atomicAdd(counter, 1);
}
// Writes the float after the launch's `n` floats of dynamic shared memory when `past` is set.
__global__ void smem_write_kernel(float* out, int n, int past) {
    float* sm = (float*)::emu::dyn_smem();
    if (threadIdx.x == 0) sm[n - 1 + past] = 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = sm[n - 1];
}
// out[lane] = __shfl_xor_sync(full, lane, mask, width) for one warp.
__global__ void shfl_xor_kernel(int* out, int mask, int width) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, mask, width);
}
}  // namespace

TEST_CASE("emu: new device memory is NaN, writes past dynamic shared memory fail, blocks follow set_order, "
          "butterfly shuffles within width", "[emu][limits]") {
    // cudaMalloc: uninitialised in CUDA; all-ones bytes (NaN) here, small and large
    for (size_t n : {(size_t)16, (size_t)(4 << 20)}) {
        float* f = nullptr;
        REQUIRE(cudaMalloc(&f, n) == cudaSuccess);
        size_t finite = 0;
        for (size_t i = 0; i < n / 4; i++) finite += std::isfinite(f[i]);
        CHECK(finite == 0);
        cudaFree(f);
    }
    float* out = nullptr;
    REQUIRE(cudaMalloc(&out, sizeof(float)) == cudaSuccess);
    // the last float of the launch's dynamic shared memory is fine, the one after it is not
    emu::launch(dim3(3), dim3(64), 40 * sizeof(float), nullptr, smem_write_kernel, out, 40, 0);
    CHECK(out[0] == 1.0f);
    ChildResult r = run_child(
        [&] { emu::launch(dim3(3), dim3(64), 40 * sizeof(float), nullptr, smem_write_kernel, out, 40, 1); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("block (0,0,0) wrote past its 160 bytes of dynamic shared memory"));
    cudaFree(out);

    // block order: x fastest forward, reversed, and a seeded permutation (every block once)
    const int gx = 7, gy = 3, nb = gx * gy;
    int *seq = nullptr, *counter = nullptr;
    REQUIRE(cudaMalloc(&seq, nb * sizeof(int)) == cudaSuccess);
    REQUIRE(cudaMalloc(&counter, sizeof(int)) == cudaSuccess);
    for (emu::Order o : {emu::Order::kForward, emu::Order::kReverse, emu::Order::kRandom}) {
        emu::set_order(o, 5);
        *counter = 0;
        emu::launch(dim3(gx, gy), dim3(64), 0, nullptr, block_sequence_kernel, seq, counter);
        std::vector<int> got(seq, seq + nb), sorted = got;
        std::sort(sorted.begin(), sorted.end());
        int in_place = 0;
        for (int b = 0; b < nb; b++) {
            CHECK(sorted[b] == b);
            in_place += got[b] == b;
        }
        INFO("order " << emu::order_name(o));
        if (o == emu::Order::kForward) CHECK(in_place == nb);
        if (o == emu::Order::kReverse)
            for (int b = 0; b < nb; b++) CHECK(got[b] == nb - 1 - b);
        if (o == emu::Order::kRandom) CHECK(in_place < nb / 2);  // 21 blocks: identity-like by chance ~never
    }
    emu::set_order(emu::Order::kForward);
    cudaFree(seq);
    cudaFree(counter);

    // __shfl_xor_sync with width: a partner in a later segment gives the caller's own value
    int* lanes = nullptr;
    REQUIRE(cudaMalloc(&lanes, 32 * sizeof(int)) == cudaSuccess);
    emu::launch(dim3(1), dim3(32), 0, nullptr, shfl_xor_kernel, lanes, 16, 16);
    for (int l = 0; l < 32; l++) CHECK(lanes[l] == (l < 16 ? l : l - 16));
    emu::launch(dim3(1), dim3(32), 0, nullptr, shfl_xor_kernel, lanes, 3, 8);
    for (int l = 0; l < 32; l++) CHECK(lanes[l] == (l ^ 3));
    emu::launch(dim3(1), dim3(32), 0, nullptr, shfl_xor_kernel, lanes, 5, 32);
    for (int l = 0; l < 32; l++) CHECK(lanes[l] == (l ^ 5));
    cudaFree(lanes);
}

namespace {
// cp.async of 16 bytes from src into `dst` (nullptr: the block's dynamic shared memory), waited
// for; then ldmatrix.x4 of 8x8 bf16 tiles at `rows` (nullptr: dynamic shared memory).
__global__ void shared_operand_kernel(float* out, const float* src, float* dst, const uint16_t* rows) {
    float* sm = (float*)::emu::dyn_smem();
    float* d = dst ? dst : sm;
    emu::cp_async(d + 4 * threadIdx.x, src + 4 * threadIdx.x, 16, 16);
    emu::cp_async_commit();
    emu::cp_async_wait(0);
    __syncthreads();
    uint32_t r[4];
    const uint16_t* base = rows ? rows : (const uint16_t*)sm;
    emu::ldmatrix_x4(r, base + 8 * (threadIdx.x % 32), false);
    out[threadIdx.x] = d[4 * threadIdx.x] + (float)(r[0] & 1);
}
}  // namespace

TEST_CASE("emu: cp.async and ldmatrix take shared-memory operands only", "[emu][limits]") {
    float *src = nullptr, *out = nullptr, *glob = nullptr;
    REQUIRE(cudaMalloc(&src, 128 * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&out, 32 * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&glob, 128 * sizeof(float)) == cudaSuccess);
    for (int i = 0; i < 128; i++) src[i] = (float)(2 * i);  // even bit patterns of the low bf16 halves: r & 1 == 0
    const size_t smem = 128 * sizeof(float);
    emu::launch(dim3(1), dim3(32), smem, nullptr, shared_operand_kernel, out, (const float*)src, (float*)nullptr,
                (const uint16_t*)nullptr);
    for (int t = 0; t < 32; t++) CHECK(out[t] == (float)(8 * t));
    ChildResult r = run_child([&] {
        emu::launch(dim3(1), dim3(32), smem, nullptr, shared_operand_kernel, out, (const float*)src, glob,
                    (const uint16_t*)nullptr);
    });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("cp.async: destination outside the block's shared memory"));
    r = run_child([&] {
        emu::launch(dim3(1), dim3(32), smem, nullptr, shared_operand_kernel, out, (const float*)src, (float*)nullptr,
                    (const uint16_t*)glob);
    });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("ldmatrix: row address outside the block's shared memory"));
    cudaFree(src);
    cudaFree(out);
    cudaFree(glob);
}

TEST_CASE("emu: __expf, __logf and __fdividef as the GPU computes them", "[emu][limits]") {
    // __expf rounds x * log2(e) to fp32 before ex2: its error grows with |x| as the CUDA
    // Programming Guide states for the hardware, 2 + 1.16 |x| ulp at most (ex2's own error, which
    // is not modelled, is within the constant); expf has < 1 ulp at any x.
    std::srand(11);
    double worst_ulp_at_80 = 0.0;
    for (int i = 0; i < 20000; i++) {
        const float x = -87.f + 174.f * float(std::rand()) / float(RAND_MAX);
        const double exact = std::exp(double(x));
        const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
        const double err = std::fabs(double(__expf(x)) - exact) / ulp;
        INFO("x = " << x);
        REQUIRE(err <= 2.0 + 1.16 * std::fabs(x));
        if (std::fabs(x) > 80.f) worst_ulp_at_80 = std::max(worst_ulp_at_80, err);
    }
    CHECK(worst_ulp_at_80 > 4.0);  // not the accurate expf: the product's rounding shows at large |x|
    // __logf: lg2.approx times ln 2; on [0.5, 2] the Programming Guide bounds its absolute error
    // by 2^-21.41
    for (int i = 0; i < 20000; i++) {
        const float x = 0.5f + 1.5f * float(std::rand()) / float(RAND_MAX);
        REQUIRE(std::fabs(double(__logf(x)) - std::log(double(x))) <= std::ldexp(1.0, -21));
    }
    // __fdividef: 0 for 2^126 < |b| < 2^128 (NaN for an infinite a), else a * (1/b)
    CHECK(__fdividef(1.f, 1e38f) == 0.f);
    CHECK(__fdividef(-3.f, -2e38f) == 0.f);
    CHECK(std::isnan(__fdividef(INFINITY, 1e38f)));
    CHECK(std::fabs(double(__fdividef(1.f, 1e37f)) - 1e-37) <= 2e-44);  // 2 roundings: <= 2 ulp
    CHECK(__fdividef(6.f, 3.f) == 2.f);
}
