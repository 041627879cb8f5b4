// Race detection of the CPU emulation (dev/emu/emu.h built with -fsanitize=thread; doc/cuda.md
// "Emulating kernels on the CPU", "Race detection"): the synchronisation CUDA defines is all the
// detector sees. Each case runs one small kernel in a forked child whose stderr is captured; a
// kernel that communicates without the barrier it needs must be reported as a data race
// (ThreadSanitizer exits with 66), and the same kernel with the barrier must run clean. Built and
// run only in the ThreadSanitizer build ($(BUILD)/tsan, `make test`).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_emu/dev_cuda/attention.cu.h"
#include "cpu/rng.h"

#if !EMU_TSAN
#error "tsan_emu_race.cpp is built with -fsanitize=thread only"
#endif

using namespace ldm;
using namespace ldm::gpu;

namespace {

struct Outcome {
    int code = -1;     // the child's exit status (66: ThreadSanitizer reported; 0: clean)
    std::string err;   // its stderr
    bool race() const { return code == 66 && err.find("ThreadSanitizer: data race") != std::string::npos; }
    bool clean() const { return code == 0 && err.find("ThreadSanitizer") == std::string::npos; }
};

// Runs f in a forked child (stderr captured), which exits 0 when f returns.
template <typename F>
Outcome in_child(F f) {
    int fd[2];
    REQUIRE(pipe(fd) == 0);
    std::fflush(nullptr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        f();
        std::fflush(nullptr);
        _exit(0);
    }
    close(fd[1]);
    Outcome o;
    char buf[4096];
    for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) o.err.append(buf, (size_t)n);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    o.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return o;
}

// CHECK(o.what()) with the child's exit status and stderr as context (what: race or clean).
#define EXPECT_OUTCOME(o, what)                                                    \
    do {                                                                           \
        const Outcome oc_ = (o);                                                   \
        INFO("exit " << oc_.code << ", stderr:\n" << oc_.err.substr(0, 3000));     \
        CHECK(oc_.what());                                                         \
    } while (0)
#define EXPECT_RACE(o) EXPECT_OUTCOME(o, race)
#define EXPECT_CLEAN(o) EXPECT_OUTCOME(o, clean)

// Thread t writes sh[t] and reads its neighbour's slot, across the block (stride 33: another
// warp for t < 224 at 256 threads) or within its warp (lane + 1); `sync` says what separates
// the write from the read: 0 nothing, 1 a shuffle (orders nothing), 2 __syncwarp, 3 __syncthreads.
void neighbour_kernel(float* out, int across_warps, int sync) {
    static float sh__emu[256];
    auto& sh = ::emu::block_shared(sh__emu);
    const int t = threadIdx.x, n = blockDim.x;
    sh[t] = 1.f + (float)t;
    float v = 0.f;
    if (sync == 1) v = __shfl_xor_sync(0xffffffffu, 1.f, 1);
    if (sync == 2) __syncwarp();
    if (sync == 3) __syncthreads();
    const int src = across_warps ? (t + 33) % n : (t & ~31) + ((t + 1) & 31);
    out[blockIdx.x * n + t] = sh[src] + v;
}

// Every block writes out[blockIdx.x] (clean) or out[0] (a write-write race between blocks),
// then passes a barrier (blocks' barriers must not order one block after another).
void block_write_kernel(float* out, int same) {
    if (threadIdx.x == 0) out[same ? 0 : blockIdx.x] = (float)blockIdx.x;
    __syncthreads();
    __syncwarp();
}

// Every thread of every block adds to one counter: atomics never race with each other.
void atomic_kernel(unsigned* counter, float* sum) {
    atomicAdd(counter, 1u);
    atomicAdd(sum, 0.5f);
}

// Lane t copies 16 bytes with cp.async, waits for its own copy, then reads lane t+1's chunk,
// after a __syncthreads when `bar`.
void cp_async_kernel(float* out, const float* in, int bar) {
    float* sm = reinterpret_cast<float*>(::emu::dyn_smem());
    const int t = threadIdx.x;
    cp_async_16(sm + 4 * t, in + 4 * t, true);
    cp_async_commit();
    cp_async_wait<0>();
    if (bar) __syncthreads();
    for (int i = 0; i < 4; i++) out[4 * t + i] = sm[4 * ((t + 1) % 32) + i];
}

// Warp 0 reads a shared stage that warp 1 then refills with cp.async; with `bar` a barrier
// between the read and the refill (the pipelines' "one barrier per step" rule).
void stage_reuse_kernel(float* out, const float* in, int bar) {
    float* sm = reinterpret_cast<float*>(::emu::dyn_smem());
    const int t = threadIdx.x, lane = t & 31;
    sm[t] = (float)t;  // warp w fills floats [32 w, 32 w + 32)
    __syncthreads();
    if (t < 32) out[t] = sm[32 + lane];  // warp 0 reads warp 1's floats
    if (bar) __syncthreads();
    if (t >= 32 && lane < 8) {  // warp 1 refills them, 16 bytes per lane
        cp_async_16(sm + 32 + 4 * lane, in + 4 * lane, true);
        cp_async_wait_all();
    }
}

// ldmatrix rows written by other lanes of the warp: with __syncwarp (clean) or without.
void ldmatrix_kernel(uint32_t* out, int sync) {
    static uint16_t tile__emu[32 * 8];
    auto& tile = ::emu::block_shared(tile__emu);
    const int lane = threadIdx.x;
    for (int i = 0; i < 8; i++) tile[((lane + 1) & 31) * 8 + i] = (uint16_t)(lane * 8 + i);  // the next lane's row
    if (sync) __syncwarp();
    uint32_t r[4];
    ::emu::ldmatrix_x4(r, &tile[lane * 8], false);
    for (int i = 0; i < 4; i++) out[4 * lane + i] = r[i];
}

}  // namespace

TEST_CASE("tsan: shared memory across warps needs __syncthreads", "[emu][tsan]") {
    std::vector<float> out(2 * 256);
    for (int sync : {0, 1, 2}) {
        INFO("sync " << sync);
        EXPECT_RACE(in_child([&] { ::emu::launch(dim3(1), dim3(256), 0, 0, neighbour_kernel, out.data(), 1, sync); }));
    }
    EXPECT_CLEAN(in_child([&] { ::emu::launch(dim3(2), dim3(256), 0, 0, neighbour_kernel, out.data(), 1, 3); }));
}

TEST_CASE("tsan: shared memory within a warp needs __syncwarp (a shuffle orders nothing)", "[emu][tsan]") {
    std::vector<float> out(3 * 64);
    EXPECT_RACE(in_child([&] { ::emu::launch(dim3(1), dim3(64), 0, 0, neighbour_kernel, out.data(), 0, 0); }));
    EXPECT_RACE(in_child([&] { ::emu::launch(dim3(1), dim3(64), 0, 0, neighbour_kernel, out.data(), 0, 1); }));
    EXPECT_CLEAN(in_child([&] { ::emu::launch(dim3(3), dim3(64), 0, 0, neighbour_kernel, out.data(), 0, 2); }));
    EXPECT_CLEAN(in_child([&] { ::emu::launch(dim3(1), dim3(64), 0, 0, neighbour_kernel, out.data(), 0, 3); }));
}

TEST_CASE("tsan: blocks of one launch are unordered; launches, the host and atomics are ordered", "[emu][tsan]") {
    std::vector<float> out(8, 0.f);
    EXPECT_RACE(in_child([&] { ::emu::launch(dim3(8), dim3(32), 0, 0, block_write_kernel, out.data(), 1); }));
    EXPECT_CLEAN(in_child([&] {
        ::emu::launch(dim3(8), dim3(32), 0, 0, block_write_kernel, out.data(), 0);
        out[3] += 1.f;  // the host after the launch
        ::emu::launch(dim3(8), dim3(32), 0, 0, block_write_kernel, out.data(), 0);  // a second launch
        if (out[3] != 3.f) _exit(3);
    }));
    unsigned counter = 0;
    float sum = 0.f;
    EXPECT_CLEAN(in_child([&] {
        ::emu::launch(dim3(4), dim3(64), 0, 0, atomic_kernel, &counter, &sum);
        if (counter != 256u || sum != 128.f) _exit(3);
    }));
}

TEST_CASE("tsan: cp.async copies are visible to other threads only after a barrier", "[emu][tsan]") {
    std::vector<float> in(128), out(128);
    for (int i = 0; i < 128; i++) in[(size_t)i] = 1.f + (float)i;
    EXPECT_RACE(in_child([&] { ::emu::launch(dim3(1), dim3(32), 512, 0, cp_async_kernel, out.data(), in.data(), 0); }));
    EXPECT_CLEAN(in_child([&] {
        ::emu::launch(dim3(1), dim3(32), 512, 0, cp_async_kernel, out.data(), in.data(), 1);
        for (int t = 0; t < 32; t++)
            if (out[(size_t)(4 * t)] != in[(size_t)(4 * ((t + 1) % 32))]) _exit(3);
    }));
    EXPECT_RACE(in_child([&] { ::emu::launch(dim3(1), dim3(64), 256, 0, stage_reuse_kernel, out.data(), in.data(), 0); }));
    EXPECT_CLEAN(in_child([&] { ::emu::launch(dim3(1), dim3(64), 256, 0, stage_reuse_kernel, out.data(), in.data(), 1); }));
}

TEST_CASE("tsan: ldmatrix reads rows other lanes wrote only after __syncwarp", "[emu][tsan]") {
    std::vector<uint32_t> out(128);
    EXPECT_RACE(in_child([&] { ::emu::launch(dim3(1), dim3(32), 0, 0, ldmatrix_kernel, out.data(), 0); }));
    EXPECT_CLEAN(in_child([&] { ::emu::launch(dim3(1), dim3(32), 0, 0, ldmatrix_kernel, out.data(), 1); }));
}

TEST_CASE("tsan: the pipelined attention with waits one group short is reported", "[emu][tsan][attention]") {
    // B=1, T=70, 4 query / 2 kv heads, hd 64: two key tiles, so a stage is read before its copy.
    const int B = 1, T = 70, nh = 4, nkv = 2, hd = 64, C3 = (nh + 2 * nkv) * hd;
    std::vector<bf16> qkv((size_t)B * T * C3), o((size_t)B * T * nh * hd);
    std::vector<float> lse((size_t)B * nh * T);
    const uint64_t s0 = init_stream(5, 0);
    for (size_t i = 0; i < qkv.size(); i++) qkv[i] = from_f<bf16>((float)stream_normal(s0, i));
    auto fwd = [&] { kernel_forward<bf16>(kMmaPipe, o.data(), lse.data(), qkv.data(), B, T, nh, nkv, hd, 0); };
    EXPECT_CLEAN(in_child(fwd));
    EXPECT_RACE(in_child([&] {
        emu::set_cp_async_wait_slack(1);
        fwd();
    }));
}
