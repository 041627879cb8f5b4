// dev/emu/emu.h — host (CPU) emulation of the CUDA execution model, so that kernels of cuda/*.cuh
// can run under g++ on machines without a GPU (dev tool + CI tests test/test_emu_*.cpp). See
// doc/cuda.md "Emulating kernels on the CPU" for what is and is not emulated; dev/emu/gen.py
// makes the emulation copies of the headers (kernel<<<g, b, smem, s>>>(args) ->
// emu::launch(g, b, smem, s, kernel, args), __shared__ arrays registered for poisoning,
// extern __shared__ -> the dynamic shared buffer). Include this header first (gen.py does).
//
// Model: one block at a time (in x, y, z order, or the order set_order gives); one fiber (own stack) per
// thread; warp = 32 consecutive linear thread ids (x fastest). A fiber runs without interruption
// until it reaches a yield point: __syncthreads (block barrier) or a warp collective (__syncwarp,
// __shfl*_sync, __ballot/__any/__all_sync). A warp collective completes when every live lane of
// the warp has arrived at a collective (they must be the same kind of collective, with a mask
// that covers every live lane: else the emulator aborts with a message); a block barrier
// completes when every live thread of the block is at __syncthreads. The scheduler runs one warp
// until all its lanes wait at __syncthreads (or exited), then the next warp; the order of warps
// and of lanes within a warp (and of the blocks) is set by emu::set_order (forward, reverse,
// seeded random), so running a kernel under several orders and requiring bit-identical outputs
// exposes code whose result depends on the interleaving between yield points (missing
// __syncthreads/__syncwarp) or on the order of blocks.
// Memory: kernels get host pointers; cudaMalloc is malloc filled with 0xff bytes (NaN: CUDA leaves
// new memory uninitialised), writes past a launch's dynamic shared memory fail; cudaMemcpy*/cudaMemset* are
// memcpy/memset; work on a stream made by cudaStreamCreate waits in a queue until something
// orders it (see "streams" below: a missing cudaStreamWaitEvent or synchronisation shows);
// events hold the host time their record ran at; stream capture records work into a graph that
// cudaGraphLaunch replays, and refuses what CUDA refuses inside a capture (see "stream capture"). cp.async copies complete only at the issuing thread's
// cp.async.wait_group / wait_all (see cp_async below). Built with -fsanitize=thread (EMU_TSAN),
// every emulated thread is a ThreadSanitizer fiber and the only happens-before edges are CUDA's
// (__syncthreads, __syncwarp, launch boundaries): data races are reported (doc/cuda.md "Race
// detection").
#pragma once

// Code that must behave differently under the emulation (e.g. not time an 8192³ GEMM) tests this.
#define LDM_EMULATED 1

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cuda_bf16.h>
#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#include <cublas_v2.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <random>
#include <type_traits>
#include <vector>

// Race detection (g++/clang -fsanitize=thread): every emulated thread is a ThreadSanitizer
// fiber, switched without implied synchronisation, and the only happens-before edges between
// threads of a launch are the ones CUDA guarantees (see "ThreadSanitizer" below).
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#include <sanitizer/tsan_interface.h>
#include <sys/mman.h>
// Exported by the ThreadSanitizer runtime (libtsan) but not declared in its public header.
extern "C" {
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
void __tsan_read_range(void* addr, unsigned long size);
void __tsan_write_range(void* addr, unsigned long size);
// Defaults for every emulation binary built with ThreadSanitizer (TSAN_OPTIONS overrides): stop
// at the first report with exit status 66, so a race fails the test that ran into it.
__attribute__((weak)) const char* __tsan_default_options() { return "halt_on_error=1:exitcode=66"; }
}
#if defined(_OPENMP)
#include <omp.h>
namespace emu {
// The CPU references' OpenMP threads synchronise inside libgomp, which ThreadSanitizer does not
// see: one OpenMP thread in race-detection builds, also where the program sets its own count
// (the trainers' --threads).
inline const bool tsan_single_omp_thread = (omp_set_num_threads(1), true);
}  // namespace emu
#define omp_set_num_threads(n) ((void)(n), omp_set_num_threads(1))
#endif
#else
#define EMU_TSAN 0
#endif

#if defined(__x86_64__) && !defined(EMU_USE_UCONTEXT) && !defined(__SANITIZE_ADDRESS__)
#define EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#define EMU_ASM_SWITCH 0
#endif

#if EMU_ASM_SWITCH
// Minimal x86-64 SysV context switch: saves the callee-saved registers on the current stack,
// stores the stack pointer in *save, loads `to` and pops the other context's registers. Weak, so
// that several translation units may include this header.
extern "C" void emu_switch_ctx(void** save, void* to);
__asm__(
    ".text\n"
    ".weak emu_switch_ctx\n"
    ".type emu_switch_ctx,@function\n"
    "emu_switch_ctx:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch_ctx, .-emu_switch_ctx\n");
#endif

namespace emu {

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "emu: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

// reinterpret_cast<P>(q) for a pointer type P = E* (gen.py rewrites every reinterpret_cast to a
// pointer type into this), aborting when q is not aligned to alignof(E). A GPU faults
// ("misaligned address") on a vector access below its natural alignment (float4, int4: 16 bytes;
// uint2, float2: 8; a uint32_t or __nv_bfloat162 over bf16 data: 4), where x86 would silently
// load it; the kernels cast right before the access (or cast an array base they then index
// from), so the cast is where the emulation checks. nullptr and integer sources are not checked.
template <typename P, typename Q>
inline P aligned_cast(Q q) {
    static_assert(std::is_pointer<P>::value, "aligned_cast: the target type must be a pointer");
    using E = typename std::remove_cv<typename std::remove_pointer<P>::type>::type;
    if constexpr (std::is_pointer<Q>::value && !std::is_void<E>::value && !std::is_function<E>::value) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(q);
        if (a % alignof(E) != 0) {
            char msg[160];
            std::snprintf(msg, sizeof msg, "misaligned address: %p cast to a %zu-byte aligned type of %zu bytes",
                          (const void*)q, alignof(E), sizeof(E));
            fail(msg);
        }
    }
    return reinterpret_cast<P>(q);
}

// $EMU_LAUNCH_ONLY=1 (not in the ThreadSanitizer build): every launch is checked and logged as
// usual (block and grid limits, dynamic shared memory and opt-in, __launch_bounds__,
// $EMU_LAUNCH_LOG) but no kernel body, no host GEMM (dev/emu/matmul_host.h) and no
// cudaMemcpy[Async] between two cudaMalloc blocks runs, and cudaMalloc memory starts zeroed: a
// program's launch configurations at shapes far too large to emulate (test_ptxas runs the
// trainers at the benchmark shapes and the workbenches at their BENCH shapes so), with every
// device result zero. Thread 0 of block (0,0,0) alone starts, and ends at kernel_entry, the
// first statement gen.py puts in every kernel (after check_launch_bounds); a kernel that gen.py
// did not convert runs its whole body in that one thread.
namespace detail {
inline int& launch_only_state() {  // 1 on, 0 off, -1 not yet read from the environment
    static int s = -1;
    return s;
}
}  // namespace detail
inline bool launch_only() {
#if EMU_TSAN
    return false;
#else
    int& s = detail::launch_only_state();
    if (s < 0) {
        const char* e = std::getenv("EMU_LAUNCH_ONLY");
        s = e && std::strcmp(e, "1") == 0;
        if (s) std::fprintf(stderr, "emu: EMU_LAUNCH_ONLY=1: launches are checked, kernels and GEMMs not run\n");
    }
    return s == 1;
#endif
}
// Launch-only mode on or off for the rest of the process, whatever $EMU_LAUNCH_ONLY says (tests).
// Memory keeps the kind its mode allocated (cudaFree knows which).
inline void set_launch_only(bool on) { detail::launch_only_state() = on ? 1 : 0; }

enum class Order { kForward, kReverse, kRandom };

namespace detail {

// ---- ThreadSanitizer mode (EMU_TSAN) ----------------------------------------------------------
// The emulator's own bookkeeping (thread slots, collective arguments, cp.async lists) is touched
// by fibers and by the scheduler without CUDA-level synchronisation, so it must stay invisible to
// the race detector: fiber-side entry points are EMU_NOTSAN (not instrumented) and run their
// bookkeeping inside a Quiet scope (the runtime ignores every access, libc's included). What a
// kernel itself reads and writes stays instrumented; the emulator reports the memory accesses of
// its instruction emulations (cp.async, ldmatrix) explicitly with emu_read / emu_write.
#if EMU_TSAN
#define EMU_NOTSAN __attribute__((no_sanitize_thread, noinline))
struct Quiet {
    Quiet() { __tsan_ignore_thread_begin(); }
    ~Quiet() { __tsan_ignore_thread_end(); }
    Quiet(const Quiet&) = delete;
    Quiet& operator=(const Quiet&) = delete;
};
inline void emu_read(const void* p, size_t n) {
    if (n) __tsan_read_range(const_cast<void*>(p), n);
}
inline void emu_write(void* p, size_t n) {
    if (n) __tsan_write_range(p, n);
}
#else
#define EMU_NOTSAN
struct Quiet {
    Quiet() {}
};
inline void emu_read(const void*, size_t) {}
inline void emu_write(void*, size_t) {}
#endif

enum State { kReady, kAtWarp, kAtBlock, kDone };
constexpr int kWarp = 32;
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kSmemCanary = 64;          // guard bytes after a launch's dynamic shared memory
constexpr unsigned char kCanaryByte = 0x5a;

struct Thread;
// A warp collective: called once with the arrived lanes (lane index -> thread, nullptr if the
// lane does not exist or has exited) when every live lane of the warp has arrived.
using CollectiveFn = void (*)(Thread* const* lanes);

struct Thread {
    int state = kReady;
    uint3 tid{};
    int lin = 0;  // linear thread id in the block
    // collective slot
    CollectiveFn op = nullptr;
    const char* op_name = "";
    unsigned mask = 0;
    int arg = 0, width = 32;
    uint64_t in = 0, out = 0;
    const void* ptr = nullptr;
    uint32_t win[16] = {}, wout[16] = {};
    // cp.async: copies issued and not yet completed (group -1 = not yet committed), and the
    // number of groups this thread has committed.
    struct PendingCopy {
        void* dst;
        const void* src;
        int size, src_size, group;
    };
    std::vector<PendingCopy> cp_pending;
    int cp_groups = 0;
    // ThreadSanitizer mode: this thread's fiber, and how many block barriers / __syncwarps it has
    // passed (selects the synchronisation object of the current barrier generation).
    void* fiber = nullptr;
    unsigned bar_gen = 0, warp_gen = 0;
#if EMU_ASM_SWITCH
    void* sp = nullptr;
#else
    ucontext_t ctx;
#endif
    char* stack = nullptr;
};

// One warp's part of a wgmma.mma_async (m64nNk16, bf16 inputs, fp32 accumulators) between its
// issue and its completion by wgmma.wait_group: the operands as the instruction saw them at issue
// (A fragments when A comes from registers, the accumulator input when scale-d is 1, the shared
// memory descriptors) and where each lane's N/2 accumulators go.
struct WgmmaOp {
    int n = 0, scale_d = 0, tnsp_a = 0, tnsp_b = 0, group = -1;
    bool a_regs = false, chained = false;  // chained: accumulates onto a pending wgmma's result
    uint64_t desc_a = 0, desc_b = 0;
    uint32_t a[32][4] = {};
    float* d[32] = {};
    std::vector<float> d_in;  // [32][n/2]
};

struct Emu {
    dim3 grid{1, 1, 1}, block{1, 1, 1};
    uint3 bidx{0, 0, 0};
    std::vector<Thread> th;
    std::vector<std::unique_ptr<char[]>> stacks;
    Thread* cur = nullptr;
#if EMU_ASM_SWITCH
    void* sched_sp = nullptr;
#else
    ucontext_t sched_ctx;
#endif
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    std::vector<unsigned char> dyn_smem;
    size_t dyn_bytes = 0;
    std::vector<std::pair<const char*, size_t>> shared_seen;  // static __shared__ objects poisoned in this block
    // wgmma: per warp of the running block, the issued and not yet completed wgmma.mma_async
    // operations (in issue order) and the number of wgmma groups the warp has committed.
    std::vector<std::vector<WgmmaOp>> wg_ops;
    std::vector<int> wg_groups;
    // Shared-memory limits of the running launch (launch(), note_static_shared): the bytes of
    // static __shared__ objects this block has declared so far, and the kernel's
    // cudaFuncAttributeMaxDynamicSharedMemorySize (-1: never set, i.e. the 48 KiB default).
    size_t static_bytes = 0;
    long dyn_optin = -1;
    Order order = Order::kForward;
    int cp_wait_slack = 0;  // fault injection: cp.async.wait_group N waits as if N + slack
    std::mt19937_64 rng{1};
    bool in_kernel = false;
    uint64_t launches = 0, blocks = 0, yields = 0;
    // ThreadSanitizer mode: the scheduler's fiber; the launch's synchronisation objects (the
    // host releases into launch_sync before the first block, every emulated thread acquires it
    // when it starts and releases into exit_sync when it exits, the host acquires exit_sync after
    // the last block); the running block's private region, mapped afresh for each block (so no
    // shadow state, i.e. no access history, carries over from one block to the next): its
    // barrier objects, dynamic shared memory and static __shared__ arena. Fibers (and their
    // stacks) come from two pools used by alternate blocks: creating a ThreadSanitizer fiber
    // costs about 0.3 ms, and a reused fiber orders its new thread after its previous one, so
    // with two pools block b is ordered after block b - 2 but never after block b - 1.
    void* host_fiber = nullptr;
    std::vector<void*> fiber_pool[2];
    std::vector<std::unique_ptr<char[]>> fiber_stack_pool[2];
    char launch_sync = 0, exit_sync = 0;
    char* region = nullptr;
    size_t region_bytes = 0;
    char* dyn_ptr = nullptr;
    char* arena = nullptr;
    size_t arena_used = 0;
    std::vector<std::pair<const void*, void*>> arena_map;  // static __shared__ object -> its copy
};
inline Emu g;
// Layout of a block's region in ThreadSanitizer mode: barrier objects (block: 2 generations;
// warp w: 2 generations each) in the first page, then dynamic shared memory and the static arena.
constexpr size_t kSyncBytes = 4096, kArenaBytes = 64 * 1024;
inline void* block_sync_obj(unsigned gen) { return g.region + 8 * (gen & 1); }
inline void* warp_sync_obj(int warp, unsigned gen) { return g.region + 64 + 16 * warp + 8 * (gen & 1); }

EMU_NOTSAN inline void to_scheduler() {
    g.yields++;
#if EMU_TSAN
    __tsan_switch_to_fiber(g.host_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if EMU_ASM_SWITCH
    emu_switch_ctx(&g.cur->sp, g.sched_sp);
#else
    swapcontext(&g.cur->ctx, &g.sched_ctx);
#endif
}
EMU_NOTSAN inline void run_thread(Thread* t) {
    g.cur = t;
#if EMU_TSAN
    __tsan_switch_to_fiber(t->fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if EMU_ASM_SWITCH
    emu_switch_ctx(&g.sched_sp, t->sp);
#else
    swapcontext(&g.sched_ctx, &t->ctx);
#endif
    g.cur = nullptr;
}
EMU_NOTSAN inline void thread_main() {
#if EMU_TSAN
    __tsan_acquire(&g.launch_sync);  // what the host wrote before the launch
#endif
    try {
        g.body(g.body_arg);
    } catch (...) {
        fail("exception thrown inside an emulated kernel");
    }
#if EMU_TSAN
    __tsan_release(&g.exit_sync);  // what this thread wrote, for the host after the launch
#endif
    g.cur->state = kDone;
    to_scheduler();
    fail("finished fiber resumed");
}
#if EMU_ASM_SWITCH
inline void init_thread_stack(Thread* t) {
    uintptr_t top = ((uintptr_t)(t->stack + kStackBytes)) & ~(uintptr_t)15;
    uintptr_t* p = (uintptr_t*)top;
    *--p = 0;                        // fake return address of thread_main (never returns)
    *--p = (uintptr_t)&thread_main;  // `ret` target of the first switch
    for (int i = 0; i < 6; i++) *--p = 0;  // rbp rbx r12 r13 r14 r15
    t->sp = p;
}
#else
inline void init_thread_stack(Thread* t) {
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = t->stack;
    t->ctx.uc_stack.ss_size = kStackBytes;
    t->ctx.uc_link = nullptr;
    makecontext(&t->ctx, (void (*)())thread_main, 0);
}
#endif

inline void perm(std::vector<int>& idx, int n) {
    idx.resize(n);
    for (int i = 0; i < n; i++) idx[i] = g.order == Order::kReverse ? n - 1 - i : i;
    if (g.order == Order::kRandom) std::shuffle(idx.begin(), idx.end(), g.rng);
}

// Runs one block to completion.
inline void run_block() {
    const int nt = (int)g.th.size();
    const int nw = (nt + kWarp - 1) / kWarp;
#if EMU_TSAN
    // A fresh mapping per block: its shadow starts empty, so what this block's threads do to
    // shared memory, barrier objects and stacks is never compared with another block's.
    const size_t dyn_round = (g.dyn_bytes + 4095) & ~(size_t)4095;
    g.region_bytes = kSyncBytes + dyn_round + kArenaBytes;
    const int pool = (int)(g.blocks & 1);
    while (g.fiber_pool[pool].size() < (size_t)nt) {
        g.fiber_pool[pool].push_back(__tsan_create_fiber(0));
        Quiet q;
        g.fiber_stack_pool[pool].emplace_back(new char[kStackBytes]);
    }
    {
        Quiet q;
        void* r = mmap(nullptr, g.region_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (r == MAP_FAILED) fail("mmap of a block's region failed");
        g.region = static_cast<char*>(r);
        g.dyn_ptr = g.region + kSyncBytes;
        g.arena = g.dyn_ptr + dyn_round;
        g.arena_used = 0;
        g.arena_map.clear();
        if (g.dyn_bytes) std::memset(g.dyn_ptr, 0xff, g.dyn_bytes);
    }
    g.host_fiber = __tsan_get_current_fiber();
#endif
    for (int i = 0; i < nt; i++) {
        Thread& t = g.th[i];
        t.state = kReady;
        t.op = nullptr;
        t.cp_pending.clear();  // copies a thread never waited for die with its block
        t.cp_groups = 0;
#if EMU_TSAN
        t.stack = g.fiber_stack_pool[pool][(size_t)i].get();
        t.fiber = g.fiber_pool[pool][(size_t)i];
        t.bar_gen = t.warp_gen = 0;
#endif
        init_thread_stack(&t);
    }
    g.shared_seen.clear();
    g.wg_ops.assign((size_t)nw, {});  // wgmma operations never waited for die with their block
    g.wg_groups.assign((size_t)nw, 0);
    g.static_bytes = 0;
    if (!EMU_TSAN && g.dyn_bytes) std::memset(g.dyn_smem.data(), 0xff, g.dyn_bytes);
    std::vector<int> worder, lorder;
    Thread* lanes[kWarp];
    char msg[256];
    for (;;) {
        perm(worder, nw);
        for (int w : worder) {
            const int l0 = w * kWarp, nl = std::min(kWarp, nt - l0);
            for (;;) {
                perm(lorder, nl);
                for (int l : lorder)
                    if (g.th[l0 + l].state == kReady) run_thread(&g.th[l0 + l]);
                int live = 0, atw = 0, atb = 0;
                for (int l = 0; l < kWarp; l++) {
                    Thread* t = l < nl ? &g.th[l0 + l] : nullptr;
                    if (t && t->state == kDone) t = nullptr;
                    lanes[l] = t;
                    if (!t) continue;
                    live++;
                    atw += t->state == kAtWarp;
                    atb += t->state == kAtBlock;
                }
                if (atw == 0) break;  // all at __syncthreads or exited
                if (atb > 0) {
                    std::snprintf(msg, sizeof msg,
                                  "block (%u,%u,%u) warp %d: %d lanes at __syncthreads while %d lanes "
                                  "wait in a warp collective",
                                  g.bidx.x, g.bidx.y, g.bidx.z, w, atb, atw);
                    fail(msg);
                }
                (void)live;
                CollectiveFn fn = nullptr;
                const char* name = "";
                unsigned need = 0;
                for (int l = 0; l < kWarp; l++)
                    if (lanes[l]) need |= 1u << l;
                for (int l = 0; l < kWarp; l++) {
                    if (!lanes[l]) continue;
                    if (!fn) {
                        fn = lanes[l]->op;
                        name = lanes[l]->op_name;
                    } else if (lanes[l]->op != fn) {
                        std::snprintf(msg, sizeof msg,
                                      "block (%u,%u,%u) warp %d: lanes in different warp collectives (%s, %s)",
                                      g.bidx.x, g.bidx.y, g.bidx.z, w, name, lanes[l]->op_name);
                        fail(msg);
                    }
                    if ((lanes[l]->mask & need) != need) {
                        std::snprintf(msg, sizeof msg,
                                      "block (%u,%u,%u) warp %d lane %d: %s with mask 0x%08x but live lanes "
                                      "0x%08x (partial-mask collectives are not emulated)",
                                      g.bidx.x, g.bidx.y, g.bidx.z, w, l, name, lanes[l]->mask, need);
                        fail(msg);
                    }
                }
                {
                    Quiet q;  // an instruction's memory accesses are reported by its lanes (ldmatrix_x4)
                    fn(lanes);
                }
                for (int l = 0; l < kWarp; l++)
                    if (lanes[l]) lanes[l]->state = kReady;
            }
        }
        bool any = false;
        for (int i = 0; i < nt; i++)
            if (g.th[i].state == kAtBlock) {
                g.th[i].state = kReady;
                any = true;
            }
        if (!any) break;
    }
#if EMU_TSAN
    {
        Quiet q;
        munmap(g.region, g.region_bytes);
        g.region = g.dyn_ptr = g.arena = nullptr;
    }
#endif
}

EMU_NOTSAN inline void yield_warp(CollectiveFn fn, const char* name, unsigned mask) {
    Quiet q;
    if (!g.cur) fail("warp collective outside an emulated kernel");
    g.cur->op = fn;
    g.cur->op_name = name;
    g.cur->mask = mask;
    g.cur->state = kAtWarp;
    to_scheduler();
}

inline int lane_of(const Thread* t) { return t->lin & (kWarp - 1); }

// ---- collectives ----------------------------------------------------------------------------
inline void op_sync(Thread* const*) {}
enum ShflKind { kIdx, kXor, kUp, kDown };
template <int K>
inline void op_shfl(Thread* const* lanes) {
    for (int l = 0; l < kWarp; l++) {
        Thread* t = lanes[l];
        if (!t) continue;
        const int w = t->width, base = l & ~(w - 1);
        int src;
        if (K == kIdx) src = base + (t->arg & (w - 1));
        else if (K == kXor) {  // PTX shfl.bfly: a lane beyond the caller's segment gives back its own value
            src = l ^ (t->arg & (kWarp - 1));
            if (src > base + w - 1) src = l;
        } else if (K == kUp) src = l - (t->arg & (kWarp - 1)) >= base ? l - (t->arg & (kWarp - 1)) : l;
        else src = l + (t->arg & (kWarp - 1)) < base + w ? l + (t->arg & (kWarp - 1)) : l;
        if (src < 0 || src >= kWarp || !lanes[src]) {
            char msg[160];
            std::snprintf(msg, sizeof msg, "shuffle of lane %d reads lane %d, which does not exist or has exited",
                          l, src);
            fail(msg);
        }
        t->out = lanes[src]->in;
    }
}
inline void op_ballot(Thread* const* lanes) {
    uint64_t b = 0;
    for (int l = 0; l < kWarp; l++)
        if (lanes[l] && lanes[l]->in) b |= 1ull << l;
    for (int l = 0; l < kWarp; l++)
        if (lanes[l]) lanes[l]->out = b & lanes[l]->mask;
}

template <int K, typename T>
EMU_NOTSAN inline T shfl(unsigned mask, T v, int arg, int width, const char* name) {
    Quiet q;
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a value > 8 bytes");
    if (width <= 0 || width > 32 || (width & (width - 1))) fail("shuffle width must be a power of 2 <= 32");
    Thread* t = g.cur;
    t->in = 0;
    std::memcpy(&t->in, &v, sizeof(T));
    t->arg = arg;
    t->width = width;
    yield_warp(&op_shfl<K>, name, mask);
    T r;
    std::memcpy(&r, &g.cur->out, sizeof(T));
    return r;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, PTX ISA fragment layout (gr = lane / 4,
// tg = lane % 4): A 16x16 a0 = A[gr][2tg..2tg+1], a1 = A[gr+8][2tg..], a2 = A[gr][2tg+8..],
// a3 = A[gr+8][2tg+8..]; B 16x8 b0 = B[2tg..2tg+1][gr], b1 = B[2tg+8..2tg+9][gr]; C/D 16x8
// c0, c1 = C[gr][2tg, 2tg+1], c2, c3 = C[gr+8][2tg, 2tg+1]. Products of bf16 are exact in fp32;
// the sums are accumulated in float in k order (the hardware's internal order is not specified).
inline float bf16_bits_to_f(uint32_t h) {
    const uint32_t x = h << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
inline void op_mma16816(Thread* const* lanes) {
    float A[16][16], B[16][8];
    for (int l = 0; l < kWarp; l++) {
        if (!lanes[l]) fail("mma.sync with exited lanes");
        const uint32_t* f = lanes[l]->win;
        const int gr = l >> 2, tg = l & 3;
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++)
                A[gr + ((r & 1) ? 8 : 0)][2 * tg + h + ((r & 2) ? 8 : 0)] =
                    bf16_bits_to_f(h ? f[r] >> 16 : f[r] & 0xffffu);
        for (int r = 0; r < 2; r++)
            for (int h = 0; h < 2; h++) B[2 * tg + h + (r ? 8 : 0)][gr] = bf16_bits_to_f(h ? f[4 + r] >> 16 : f[4 + r] & 0xffffu);
    }
    for (int l = 0; l < kWarp; l++) {
        Thread* t = lanes[l];
        const int gr = l >> 2, tg = l & 3;
        for (int e = 0; e < 4; e++) {
            const int row = gr + ((e >> 1) ? 8 : 0), col = 2 * tg + (e & 1);
            float acc;
            std::memcpy(&acc, &t->win[6 + e], 4);
            for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
            std::memcpy(&t->wout[e], &acc, 4);
        }
    }
}
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l supplies the address of row l % 8 of
// matrix l / 8 (16-byte aligned); register i of lane l receives row l / 4, columns 2(l%4),
// 2(l%4)+1 of matrix i (.trans: rows 2(l%4), 2(l%4)+1 of column l / 4).
template <bool TRANS>
inline void op_ldmatrix_x4(Thread* const* lanes) {
    for (int l = 0; l < kWarp; l++)
        if (!lanes[l]) fail("ldmatrix with exited lanes");
    auto h16 = [](const void* row, int col) {
        uint16_t v;
        std::memcpy(&v, (const char*)row + 2 * col, 2);
        return (uint32_t)v;
    };
    for (int l = 0; l < kWarp; l++) {
        for (int i = 0; i < 4; i++) {
            if (!TRANS) {
                const void* row = lanes[8 * i + l / 4]->ptr;
                lanes[l]->wout[i] = h16(row, 2 * (l % 4)) | h16(row, 2 * (l % 4) + 1) << 16;
            } else {
                const void* r0 = lanes[8 * i + 2 * (l % 4)]->ptr;
                const void* r1 = lanes[8 * i + 2 * (l % 4) + 1]->ptr;
                lanes[l]->wout[i] = h16(r0, l / 4) | h16(r1, l / 4) << 16;
            }
        }
    }
}

template <typename K, typename Tup, size_t... I>
void call_with(K kernel, Tup& a, std::index_sequence<I...>) {
    kernel(std::get<I>(a)...);
}

}  // namespace detail

// Warp-level tensor-core and ldmatrix emulations (all 32 lanes must take part). A header's
// `__trap();  // host: KEY` fallback becomes EMU_HOST_KEY (gen.py); a harness maps those to these,
// e.g. #define EMU_HOST_mma ::emu::mma_m16n8k16_bf16(c, a, b).
EMU_NOTSAN inline void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    using namespace detail;
    Quiet q;
    Thread* t = g.cur;
    for (int i = 0; i < 4; i++) t->win[i] = a[i];
    t->win[4] = b[0];
    t->win[5] = b[1];
    for (int i = 0; i < 4; i++) std::memcpy(&t->win[6 + i], &c[i], 4);
    yield_warp(&op_mma16816, "mma.m16n8k16", 0xffffffffu);
    for (int i = 0; i < 4; i++) std::memcpy(&c[i], &g.cur->wout[i], 4);
}
namespace detail {
// Whether [p, p + n) lies in the running block's shared memory: its dynamic shared memory or a
// static __shared__ object it has declared (the operands PTX addresses in the .shared window; a
// global pointer there reads other bytes or faults on a GPU).
EMU_NOTSAN inline bool in_block_shared(const void* p, size_t n) {
    const char* c = (const char*)p;
#if EMU_TSAN
    const char* dyn = g.dyn_ptr;
    if (g.arena && c >= g.arena && c + n <= g.arena + g.arena_used) return true;
#else
    const char* dyn = (const char*)g.dyn_smem.data();
    for (const auto& e : g.shared_seen)
        if (c >= e.first && c + n <= e.first + e.second) return true;
#endif
    return dyn && c >= dyn && c + n <= dyn + g.dyn_bytes;
}
}  // namespace detail

EMU_NOTSAN inline void ldmatrix_x4(uint32_t r[4], const void* p, bool trans) {
    using namespace detail;
    if ((uintptr_t)p & 15) fail("ldmatrix: row address not 16-byte aligned");
    if (!in_block_shared(p, 16)) fail("ldmatrix: row address outside the block's shared memory");
    emu_read(p, 16);  // the row this lane addresses (the scheduler's copy of it is not reported)
    Quiet q;
    g.cur->ptr = p;
    yield_warp(trans ? &op_ldmatrix_x4<true> : &op_ldmatrix_x4<false>, trans ? "ldmatrix.trans" : "ldmatrix",
               0xffffffffu);
    for (int i = 0; i < 4; i++) r[i] = g.cur->wout[i];
}

// cp.async[.ca|.cg].shared.global [dst], [src], size, src_size (size 4, 8 or 16 bytes; the first
// src_size bytes come from src, the rest are zero). The copy is NOT done here: the destination
// becomes undefined at once (filled with 0xff: NaN for floats and bf16) and the bytes land when
// the issuing thread waits for the copy's group (cp_async_wait), so a kernel that reads a stage
// before waiting for it, reads another thread's copies without a barrier after that thread's
// wait, or overwrites a stage other warps are still reading, sees poison. The source is read at
// completion (a legal point of the copy's lifetime; the kernels here never write their sources).
// Race detection: the copy counts as a write of the destination and a read of the source both
// when it is issued and when it completes, i.e. over its whole lifetime.
EMU_NOTSAN inline void cp_async(void* dst, const void* src, int size, int src_size) {
    using namespace detail;
    if (size != 4 && size != 8 && size != 16) fail("cp.async: size must be 4, 8 or 16 bytes");
    if (src_size < 0 || src_size > size) fail("cp.async: src-size must be in [0, size]");
    if ((uintptr_t)dst % (uintptr_t)size) fail("cp.async: shared address not aligned to the copy size");
    if (src_size > 0 && (uintptr_t)src % (uintptr_t)size) fail("cp.async: global address not aligned to the copy size");
    if (!in_block_shared(dst, (size_t)size)) fail("cp.async: destination outside the block's shared memory");
    emu_write(dst, (size_t)size);
    emu_read(src, (size_t)src_size);
    Quiet q;
    if (!g.cur) fail("cp.async outside an emulated kernel");
    std::memset(dst, 0xff, (size_t)size);
    g.cur->cp_pending.push_back({dst, src, size, src_size, -1});
}
// cp.async.commit_group: the copies issued since the last commit form this thread's next group.
EMU_NOTSAN inline void cp_async_commit() {
    using namespace detail;
    Quiet q;
    if (!g.cur) fail("cp.async.commit_group outside an emulated kernel");
    Thread* t = g.cur;
    for (auto& c : t->cp_pending)
        if (c.group < 0) c.group = t->cp_groups;
    t->cp_groups++;
}
// cp.async.wait_group n: completes (performs) every copy of this thread's committed groups except
// the n most recent; copies not yet committed stay pending. Not a yield point (it orders nothing
// between threads: that takes a barrier).
EMU_NOTSAN inline void cp_async_wait(int n) {
    using namespace detail;
    if (n < 0) fail("cp.async.wait_group with a negative count");
    for (bool more = true; more;) {
        // Completes the copies in batches: performed quietly, then reported as this thread's
        // accesses (outside the Quiet scope).
        constexpr int kBatch = 64;
        Thread::PendingCopy done[kBatch];
        int nd = 0;
        {
            Quiet q;
            if (!g.cur) fail("cp.async.wait_group outside an emulated kernel");
            Thread* t = g.cur;
            const int done_below = t->cp_groups - (n + g.cp_wait_slack);  // groups [0, done_below) complete
            size_t keep = 0;
            more = false;
            for (size_t i = 0; i < t->cp_pending.size(); i++) {
                Thread::PendingCopy c = t->cp_pending[i];
                if (c.group >= 0 && c.group < done_below && nd < kBatch) {
                    if (c.src_size) std::memcpy(c.dst, c.src, (size_t)c.src_size);
                    if (c.size > c.src_size) std::memset((char*)c.dst + c.src_size, 0, (size_t)(c.size - c.src_size));
                    done[nd++] = c;
                } else {
                    more |= c.group >= 0 && c.group < done_below;
                    t->cp_pending[keep++] = c;
                }
            }
            t->cp_pending.resize(keep);
        }
        for (int i = 0; i < nd; i++) {
            emu_read(done[i].src, (size_t)done[i].src_size);
            emu_write(done[i].dst, (size_t)done[i].size);
        }
    }
}
// cp.async.wait_all = commit_group; wait_group 0.
inline void cp_async_wait_all() {
    cp_async_commit();
    cp_async_wait(0);
}
// Fault injection for tests of the tests: with slack s > 0, every cp.async.wait_group N (and
// wait_all) leaves N + s groups pending, as a kernel with a pipeline one stage too shallow in its
// waits would; such a kernel must then fail its checks. 0 (the default) is the PTX semantics.
inline void set_cp_async_wait_slack(int s) { detail::g.cp_wait_slack = s; }
// Copies issued by the running thread and not yet completed (for the emulator's self-test).
EMU_NOTSAN inline int cp_async_pending() {
    detail::Quiet q;
    return detail::g.cur ? (int)detail::g.cur->cp_pending.size() : 0;
}

// Scheduling order of warps and lanes for the following launches (see the header comment).
inline void set_order(Order o, uint64_t seed = 1) {
    detail::g.order = o;
    detail::g.rng.seed(seed);
}
inline const char* order_name(Order o) {
    return o == Order::kForward ? "forward" : o == Order::kReverse ? "reverse" : "random";
}

// Pointer to the dynamic shared memory of the running block (extern __shared__).
EMU_NOTSAN inline void* dyn_smem() {
    return EMU_TSAN ? (void*)detail::g.dyn_ptr : (void*)detail::g.dyn_smem.data();
}

// ---- wgmma (sm_90a warpgroup MMA), PTX ISA "Asynchronous Warpgroup Level Matrix Multiply" ------
// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16: a warpgroup (4 consecutive warps, the
// block a multiple of 128 threads) computes D[64][N] (+)= A[64][16] B[16][N]; warp w of the group
// owns rows 16(w%4) .. 16(w%4)+15, so each warp's part depends only on its own rows of A and on
// B, and the emulation runs it as a warp collective. Accumulators: lane l holds d[4i + e] =
// D[16(w%4) + l/4 + 8(e/2)][8i + 2(l%4) + (e%2)], i < N/8 (the m16n8 C layout repeated over N).
// A from registers: the mma.sync m16n8k16 A fragment of the warp's 16 rows. A and B from shared
// memory: a 64-bit matrix descriptor (start address, leading / stride byte offsets LBO / SBO, all
// >> 4 in 14-bit fields at bits 0, 16, 32; base offset at bits 49-51; swizzle at bits 62-63: 0
// none, 1 128B, 2 64B, 3 32B) over the canonical layouts of the PTX ISA, T = 8 bf16 per 16 bytes:
//   K-major  none: ((8,m),(T,2k)):((1T,SBO),(1,LBO))     MN-major none: ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
//   K-major  XB:   ((8,m),(T,2k)):((xT,SBO),(1,T))       MN-major XB:   ((T,x,m),(8,k)):((1,T,LBO),(xT,SBO))
// (x = 2, 4, 8 for 32B, 64B, 128B), then Swizzle<log2 x, 4, 3> on the byte address (address bits
// 4.. XOR bits 7..). A's K-major is row-major A[m][k]; B's K-major is B[k][n] stored n-major
// rows of k (imm-trans-b = 1 selects MN-major B, imm-trans-a = 1 MN-major A).
// Asynchrony: at issue the accumulators become NaN (reading them before wgmma.wait_group covers
// the operation is undefined on a GPU) and the A registers and accumulator inputs are captured;
// shared memory is read when the operation completes (wgmma.wait_group), the latest point the
// hardware may read it, so overwriting an operand before the wait shows. Not emulated (abort): a
// descriptor base offset other than 0, a swizzled operand whose start is not in the first 128
// bytes of its swizzle pattern (1024 / 512 / 256 bytes for 128B / 64B / 32B; i.e. the address
// bits the XOR takes are 0 at the start: where the ISA's base offset would matter, and the
// emulation's plain address-bit swizzle might differ from the hardware), operands outside dynamic shared
// memory, scale-a / scale-b of -1. The async proxy is not modelled: fence.proxy.async is a no-op,
// and the shared-memory reads of a completing wgmma are not reported to ThreadSanitizer.

// Shared-window address of a dynamic shared memory location (__cvta_generic_to_shared): its
// offset from the block's dynamic shared memory, which the emulation places at shared address 0.
EMU_NOTSAN inline uint32_t cvta_shared(const void* p) {
    using namespace detail;
    Quiet q;
    const char* base = (const char*)dyn_smem();
    if (!g.cur || !base || (const char*)p < base || (const char*)p > base + g.dyn_bytes)
        fail("shared address of a pointer outside the block's dynamic shared memory (the emulation's "
             "__cvta_generic_to_shared covers dynamic shared memory only)");
    return (uint32_t)((const char*)p - base);
}

namespace detail {
// Byte address in shared memory of element (mn, k) of a wgmma operand (mn < 64 for A, < N for B;
// k < 16) given its descriptor and major-ness.
inline uint32_t wgmma_elem_addr(uint64_t desc, int mn, int k, bool mn_major) {
    const uint32_t start = (uint32_t)(desc & 0x3fff) << 4;
    const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4;
    const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
    const int swz = (int)((desc >> 62) & 3);
    const int x = swz == 0 ? 1 : swz == 1 ? 8 : swz == 2 ? 4 : 2;  // 16-byte chunks per swizzle row
    const int row_bytes = 16 * x;
    uint32_t off;
    if (!mn_major) {
        if (swz == 0) off = (uint32_t)((mn % 8) * 16 + (k % 8) * 2) + (uint32_t)(mn / 8) * sbo + (uint32_t)(k / 8) * lbo;
        else off = (uint32_t)((mn % 8) * row_bytes + k * 2) + (uint32_t)(mn / 8) * sbo;
    } else {
        if (swz == 0) off = (uint32_t)((mn % 8) * 2 + (k % 8) * 16) + (uint32_t)(mn / 8) * sbo + (uint32_t)(k / 8) * lbo;
        else {
            const int per_row = row_bytes / 2;  // MN elements per swizzle row
            off = (uint32_t)((mn % per_row) * 2 + (k % 8) * row_bytes) + (uint32_t)(mn / per_row) * lbo +
                  (uint32_t)(k / 8) * sbo;
        }
    }
    uint32_t a = start + off;
    if (swz) a ^= ((a >> 7) & (uint32_t)(x - 1)) << 4;
    return a;
}
inline void wgmma_check_desc(uint64_t desc, const char* which) {
    char msg[200];
    const uint32_t start = (uint32_t)(desc & 0x3fff) << 4;
    const int swz = (int)((desc >> 62) & 3);
    if ((desc >> 49) & 7) {
        std::snprintf(msg, sizeof msg, "wgmma: %s descriptor has a base offset (not emulated)", which);
        fail(msg);
    }
    const uint32_t pattern = swz == 1 ? 1024 : swz == 2 ? 512 : swz == 3 ? 256 : 16;
    if (swz && (start % pattern) >= 128) {
        std::snprintf(msg, sizeof msg,
                      "wgmma: %s descriptor start 0x%x is not in the first 128 bytes of its %u-byte swizzle pattern "
                      "(not emulated)",
                      which, start, pattern);
        fail(msg);
    }
}
inline float wgmma_load_bf16(uint32_t addr) {
    if ((size_t)addr + 2 > g.dyn_bytes) {
        char msg[160];
        std::snprintf(msg, sizeof msg, "wgmma: operand address 0x%x outside the block's %zu bytes of dynamic shared memory",
                      addr, g.dyn_bytes);
        fail(msg);
    }
    uint16_t v;
    std::memcpy(&v, (const char*)dyn_smem() + addr, 2);
    return bf16_bits_to_f(v);
}
inline int warp_of(Thread* const* lanes) {
    for (int l = 0; l < kWarp; l++)
        if (!lanes[l]) fail("wgmma with exited lanes (all 128 threads of the warpgroup must take part)");
    if (g.th.size() % 128) fail("wgmma in a block whose size is not a multiple of 128 threads (a warpgroup)");
    return lanes[0]->lin / kWarp;
}
// Performs one warp's part of a wgmma (at its completion).
inline void wgmma_complete(WgmmaOp& op, int warp) {
    const int r0 = 16 * (warp % 4), n = op.n;
    float A[16][16];
    std::vector<float> B((size_t)16 * n);
    if (op.a_regs) {
        for (int l = 0; l < kWarp; l++) {
            const int gr = l >> 2, tg = l & 3;
            for (int r = 0; r < 4; r++)
                for (int h = 0; h < 2; h++)
                    A[gr + ((r & 1) ? 8 : 0)][2 * tg + h + ((r & 2) ? 8 : 0)] =
                        bf16_bits_to_f(h ? op.a[l][r] >> 16 : op.a[l][r] & 0xffffu);
        }
    } else {
        for (int r = 0; r < 16; r++)
            for (int k = 0; k < 16; k++) A[r][k] = wgmma_load_bf16(wgmma_elem_addr(op.desc_a, r0 + r, k, op.tnsp_a));
    }
    for (int k = 0; k < 16; k++)
        for (int c = 0; c < n; c++) B[(size_t)k * n + c] = wgmma_load_bf16(wgmma_elem_addr(op.desc_b, c, k, op.tnsp_b));
    for (int l = 0; l < kWarp; l++)
        for (int j = 0; j < n / 2; j++) {
            const int i = j / 4, e = j % 4;
            const int row = (l >> 2) + ((e >> 1) ? 8 : 0), col = 8 * i + 2 * (l & 3) + (e & 1);
            float acc = op.chained ? op.d[l][j] : op.scale_d ? op.d_in[(size_t)l * (n / 2) + j] : 0.f;
            for (int k = 0; k < 16; k++) acc += A[row][k] * B[(size_t)k * n + col];
            op.d[l][j] = acc;
        }
}
// Collective arguments of wgmma.mma_async (one per lane, on the lane's stack).
struct WgmmaArgs {
    int n, scale_d, tnsp_a, tnsp_b;
    bool a_regs;
    uint64_t desc_a, desc_b;
    const uint32_t* a;
    float* d;
};
inline void op_wgmma_issue(Thread* const* lanes) {
    const int warp = warp_of(lanes);
    const WgmmaArgs& a0 = *(const WgmmaArgs*)lanes[0]->ptr;
    WgmmaOp op;
    op.n = a0.n;
    op.scale_d = a0.scale_d;
    op.tnsp_a = a0.tnsp_a;
    op.tnsp_b = a0.tnsp_b;
    op.a_regs = a0.a_regs;
    op.desc_a = a0.desc_a;
    op.desc_b = a0.desc_b;
    if (!op.a_regs) wgmma_check_desc(op.desc_a, "A");
    wgmma_check_desc(op.desc_b, "B");
    op.d_in.assign((size_t)kWarp * (op.n / 2), 0.f);
    // A wgmma accumulating into the registers of a pending one (the usual chain over K) takes
    // that one's result as its input: the hardware orders them; completion runs in issue order.
    for (const auto& prev : g.wg_ops[(size_t)warp])
        for (int l = 0; l < kWarp; l++) {
            const float* pd = prev.d[l];
            const float* nd = ((const WgmmaArgs*)lanes[l]->ptr)->d;
            const bool overlap = pd < nd + op.n / 2 && nd < pd + prev.n / 2;
            if (!overlap) continue;
            if (pd != nd || prev.n != op.n) fail("wgmma: accumulators partly overlap those of a pending wgmma");
            op.chained = true;
        }
    if (op.chained && !op.scale_d) fail("wgmma: scale-d 0 into the accumulators of a pending wgmma");
    for (int l = 0; l < kWarp; l++) {
        const WgmmaArgs& al = *(const WgmmaArgs*)lanes[l]->ptr;
        if (al.n != a0.n || al.scale_d != a0.scale_d || al.tnsp_a != a0.tnsp_a || al.tnsp_b != a0.tnsp_b ||
            al.a_regs != a0.a_regs || al.desc_b != a0.desc_b || (!al.a_regs && al.desc_a != a0.desc_a))
            fail("wgmma: lanes of a warp issue different shapes, flags or descriptors");
        if (op.a_regs)
            for (int r = 0; r < 4; r++) op.a[l][r] = al.a[r];
        op.d[l] = al.d;
        for (int j = 0; j < op.n / 2; j++) {
            if (op.chained) continue;  // already poisoned; the input comes at completion
            if (op.scale_d) op.d_in[(size_t)l * (op.n / 2) + j] = al.d[j];
            al.d[j] = std::numeric_limits<float>::quiet_NaN();  // undefined until the wait
        }
    }
    g.wg_ops[(size_t)warp].push_back(std::move(op));
}
inline void op_wgmma_commit(Thread* const* lanes) {
    const int warp = warp_of(lanes);
    for (auto& op : g.wg_ops[(size_t)warp])
        if (op.group < 0) op.group = g.wg_groups[(size_t)warp];
    g.wg_groups[(size_t)warp]++;
}
inline void op_wgmma_wait(Thread* const* lanes) {
    const int warp = warp_of(lanes);
    const int n = lanes[0]->arg;
    for (int l = 1; l < kWarp; l++)
        if (lanes[l]->arg != n) fail("wgmma.wait_group: lanes of a warp wait for different counts");
    const int done_below = g.wg_groups[(size_t)warp] - n;
    auto& ops = g.wg_ops[(size_t)warp];
    size_t keep = 0;
    for (size_t i = 0; i < ops.size(); i++) {
        if (ops[i].group >= 0 && ops[i].group < done_below) wgmma_complete(ops[i], warp);
        else ops[keep++] = std::move(ops[i]);
    }
    ops.resize(keep);
}
inline void wgmma_issue(WgmmaArgs& a) {
    Quiet q;
    if (!g.cur) fail("wgmma outside an emulated kernel");
    if (a.n < 8 || a.n > 256 || a.n % 8) fail("wgmma: N must be a multiple of 8 in [8, 256]");
    g.cur->ptr = &a;
    yield_warp(&op_wgmma_issue, "wgmma.mma_async", 0xffffffffu);
}
}  // namespace detail

// wgmma.mma_async m64nNk16 f32.bf16.bf16 with A and B in shared memory (descriptors) and with A
// in registers (a[4]); d[N/2] the lane's accumulators, scale_d 0: D = A·B, 1: D += A·B.
EMU_NOTSAN inline void wgmma_ss(float* d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d, int tnsp_a,
                                int tnsp_b) {
    detail::WgmmaArgs a{n, scale_d, tnsp_a, tnsp_b, false, desc_a, desc_b, nullptr, d};
    detail::wgmma_issue(a);
}
EMU_NOTSAN inline void wgmma_rs(float* d, int n, const uint32_t a_frag[4], uint64_t desc_b, int scale_d, int tnsp_b) {
    detail::WgmmaArgs a{n, scale_d, 0, tnsp_b, true, 0, desc_b, a_frag, d};
    detail::wgmma_issue(a);
}
// wgmma.fence.sync.aligned (orders this warp's register accesses before later wgmma; here a warp
// collective that checks every lane takes part), wgmma.commit_group.sync.aligned (the warp's
// uncommitted wgmma form its next group), wgmma.wait_group.sync.aligned n (completes all but the
// n most recent groups, in issue order).
EMU_NOTSAN inline void wgmma_fence() {
    using namespace detail;
    Quiet q;
    if (!g.cur) fail("wgmma.fence outside an emulated kernel");
    yield_warp(&op_sync, "wgmma.fence", 0xffffffffu);
}
EMU_NOTSAN inline void wgmma_commit() {
    using namespace detail;
    Quiet q;
    if (!g.cur) fail("wgmma.commit_group outside an emulated kernel");
    yield_warp(&op_wgmma_commit, "wgmma.commit_group", 0xffffffffu);
}
EMU_NOTSAN inline void wgmma_wait(int n) {
    using namespace detail;
    Quiet q;
    if (!g.cur) fail("wgmma.wait_group outside an emulated kernel");
    if (n < 0) fail("wgmma.wait_group with a negative count");
    g.cur->arg = n;
    yield_warp(&op_wgmma_wait, "wgmma.wait_group", 0xffffffffu);
}
// wgmma operations a warp has issued and not yet completed (for the emulator's self-test).
inline int wgmma_pending(int warp) {
    return warp < (int)detail::g.wg_ops.size() ? (int)detail::g.wg_ops[(size_t)warp].size() : 0;
}

// Shared memory per block on sm_90: static __shared__ objects at most 48 KiB (ptxas refuses
// more); static + dynamic at most 48 KiB unless the kernel opted in with cudaFuncSetAttribute(f,
// cudaFuncAttributeMaxDynamicSharedMemorySize, n), which allows dynamic <= n and n + static <=
// 227 KiB. A launch beyond these fails on a GPU; the emulation aborts instead.
constexpr size_t kSmemDefault = 48 * 1024, kSmemOptin = 227 * 1024;

namespace detail {
// A static __shared__ object of `bytes` first declared in the running block: adds it to the
// block's static total and aborts when the total breaks a limit above. The emulation only sees
// the declarations a thread reaches, so it can undercount a kernel whose declarations sit in
// branches not taken (ptxas counts them all).
EMU_NOTSAN inline void note_static_shared(size_t bytes) {
    g.static_bytes += bytes;
    const size_t st = g.static_bytes;
    const char* why = nullptr;
    if (st > kSmemDefault)
        why = "static __shared__ memory of a kernel above 48 KiB (ptxas refuses it)";
    else if (g.dyn_optin < 0 && st + g.dyn_bytes > kSmemDefault)
        why = "static + dynamic shared memory above 48 KiB without cudaFuncSetAttribute("
              "cudaFuncAttributeMaxDynamicSharedMemorySize)";
    else if (g.dyn_optin >= 0 && st + (size_t)g.dyn_optin > kSmemOptin)
        why = "static shared memory + cudaFuncAttributeMaxDynamicSharedMemorySize above 227 KiB";
    if (!why) return;
    std::fprintf(stderr, "emu: %zu bytes static __shared__, %zu bytes dynamic, opt-in %ld\n", st, g.dyn_bytes,
                 g.dyn_optin);
    fail(why);
}
}  // namespace detail

// First execution of a static __shared__ declaration in a block poisons it with 0xff bytes
// (NaN floats, -1 integers): a kernel that reads shared memory it did not write sees garbage.
EMU_NOTSAN inline void shared_init(void* p, size_t bytes) {
    detail::Quiet q;
    auto& s = detail::g.shared_seen;
    for (const auto& e : s)
        if (e.first == (const char*)p) return;
    s.push_back({(const char*)p, bytes});
    std::memset(p, 0xff, bytes);
    detail::note_static_shared(bytes);
}

// First statement of a kernel declared `__launch_bounds__(max_threads, ...)` (gen.py inserts
// it): aborts when the block has more threads than max_threads, a launch a GPU refuses.
EMU_NOTSAN inline void check_launch_bounds(long max_threads) {
    const dim3 b = detail::g.block;
    const long nt = (long)b.x * b.y * b.z;
    if (nt <= max_threads) return;
    std::fprintf(stderr, "emu: block of %ld threads, kernel declared __launch_bounds__(%ld)\n", nt, max_threads);
    fail("block size above the kernel's __launch_bounds__ (the launch fails on a GPU)");
}
// First statement of every kernel gen.py converts (after check_launch_bounds): under
// $EMU_LAUNCH_ONLY the thread ends here, as at the end of its kernel (launch_only).
EMU_NOTSAN inline void kernel_entry() {
    if (!launch_only()) return;
    detail::g.cur->state = detail::kDone;
    detail::to_scheduler();
    fail("finished fiber resumed");
}
// A static __shared__ object as the running block sees it (gen.py: `__shared__ T a[N];` ->
// `static T a__emu[N]; auto& a = ::emu::block_shared(a__emu);`): the object itself, poisoned
// once per block (shared_init); in ThreadSanitizer mode a poisoned copy in the block's own
// region instead, so that no block's accesses are compared with another block's.
template <typename T>
EMU_NOTSAN T& block_shared(T& proto) {
#if EMU_TSAN
    using namespace detail;
    Quiet q;
    for (const auto& e : g.arena_map)
        if (e.first == (const void*)&proto) return *static_cast<T*>(e.second);
    const size_t at = (g.arena_used + 255) & ~(size_t)255;
    if (at + sizeof(T) > kArenaBytes) fail("static __shared__ objects of a block above the emulator's 64 KiB arena");
    g.arena_used = at + sizeof(T);
    void* p = g.arena + at;
    std::memset(p, 0xff, sizeof(T));
    g.arena_map.push_back({(const void*)&proto, p});
    note_static_shared(sizeof(T));
    return *static_cast<T*>(p);
#else
    shared_init(&proto, sizeof(T));
    return proto;
#endif
}

// Statistics for tests and logs.
inline uint64_t launch_count() { return detail::g.launches; }
inline uint64_t yield_count() { return detail::g.yields; }

// ---- stream capture and CUDA graphs ---------------------------------------------------------
// cudaStreamBeginCapture(s) .. cudaStreamEndCapture(s, &graph) records, instead of running, every
// kernel launch, host-GEMM call, cudaMemcpyAsync and cudaMemsetAsync in order (kernel arguments
// copied at capture time, as in CUDA); cudaGraphLaunch replays them. During a capture the
// emulator aborts, with a message, on what CUDA refuses or what would make the graph differ from
// the eager run: a synchronous copy / memset, a stream or device synchronisation, cudaMalloc /
// cudaFree, work on a stream other than the capturing one, a copy from or to host memory that is
// not pinned (cudaMallocHost), NCCL calls, and a second capture. Streams made by cudaStreamCreate
// are distinct handles (stream 0 stays the legacy stream, which cannot be captured).
struct Graph {
    std::vector<std::function<void()>> ops;
};
namespace detail {
struct Capture {
    Graph* graph = nullptr;  // the graph being recorded (nullptr: not capturing)
    cudaStream_t stream = nullptr;
    uint64_t streams_made = 0;
    uint64_t replays = 0;
};
inline Capture& capture() {
    static Capture c;
    return c;
}
inline std::vector<std::pair<void*, size_t>>& pinned() {
    static std::vector<std::pair<void*, size_t>> a;
    return a;
}
}  // namespace detail
inline bool capturing() { return detail::capture().graph != nullptr; }

// ---- streams ---------------------------------------------------------------------------------
// Work on the legacy default stream (0) runs at once, after the queued work of every blocking
// stream (as CUDA orders it). Work on a stream made by cudaStreamCreate[WithFlags] (kernels,
// GEMMs, async copies and memsets, event records, waits, NCCL calls) is queued and runs only when
// something orders it: cudaStreamSynchronize of the stream, cudaDeviceSynchronize, cudaFree,
// cudaEventSynchronize or a reached cudaStreamWaitEvent (up to the event's record), work on stream
// 0 or a synchronous cudaMemcpy / cudaMemset (the blocking streams; a cudaStreamNonBlocking stream
// is not ordered with stream 0), a copy from or to pageable host memory on the stream (which CUDA
// makes synchronous for the host). So work a program forgets to order runs late, where a GPU may
// run it, and changes the results. At a synchronisation of several streams the queues run one after
// the other, in the order set_stream_order gives (forward: the order the streams were made in;
// reverse; seeded random; $EMU_STREAM_ORDER sets the start value). set_eager_stream (or
// $EMU_EAGER_STREAM: none, first, last) makes the first or the last stream made run its work at
// once (as far as its waits let it), ahead of the other streams' queued work: that is how a
// consumer stream without its cudaStreamWaitEvent reads what its producer has not written yet. A
// test runs the variants to catch a missing wait in either direction. A cycle of waits aborts
// (a GPU would hang).
namespace detail {
struct StreamQueue {
    uint64_t id = 0;            // creation order
    bool non_blocking = false;  // cudaStreamNonBlocking
    bool running = false;       // its queue is being run (a wait back on it is a cycle)
    std::deque<std::function<void()>> ops;
};
struct Streams {
    std::map<cudaStream_t, StreamQueue> queues;
    bool in_queued_op = false;  // running a queued op: the work it issues (itself) runs at once
    Order order = Order::kForward;
    std::mt19937_64 rng{1};
    bool order_read = false;
    int eager = 0;  // 0: every created stream queues; 1: the first made runs at once; 2: the last
};
inline Streams& streams() {
    static Streams s;
    if (!s.order_read) {
        s.order_read = true;
        if (const char* e = std::getenv("EMU_STREAM_ORDER")) {
            const std::string v(e);
            if (v == "reverse") s.order = Order::kReverse;
            else if (v == "random") s.order = Order::kRandom;
            else if (v != "forward" && !v.empty()) fail("EMU_STREAM_ORDER must be forward, reverse or random");
        }
        if (const char* e = std::getenv("EMU_EAGER_STREAM")) {
            const std::string v(e);
            if (v == "first") s.eager = 1;
            else if (v == "last") s.eager = 2;
            else if (v != "none" && !v.empty()) fail("EMU_EAGER_STREAM must be none, first or last");
        }
    }
    return s;
}
// Runs op as queued work: what it issues (a launch, a GEMM, a copy) runs at once, not queued again.
inline void run_as_queued(const std::function<void()>& op) {
    const bool outer = streams().in_queued_op;
    streams().in_queued_op = true;
    op();
    streams().in_queued_op = outer;
}
// Runs the queue of stream s until done() (or it is empty).
inline void run_queue(cudaStream_t s, const std::function<bool()>& done) {
    auto it = streams().queues.find(s);
    if (it == streams().queues.end()) return;
    StreamQueue& q = it->second;
    if (done()) return;
    if (q.running) fail("emu: a cycle of cudaStreamWaitEvent waits between streams (a GPU would hang)");
    q.running = true;
    while (!q.ops.empty() && !done()) {
        std::function<void()> op = std::move(q.ops.front());
        q.ops.pop_front();
        run_as_queued(op);
    }
    q.running = false;
}
inline void run_whole_queue(cudaStream_t s) {
    run_queue(s, [] { return false; });
}
// Runs the queues of all streams (blocking ones only: blocking_only), in set_stream_order's order.
inline void run_queues(bool blocking_only) {
    Streams& st = streams();
    std::vector<std::pair<uint64_t, cudaStream_t>> v;
    for (auto& kv : st.queues)
        if (!kv.second.ops.empty() && !(blocking_only && kv.second.non_blocking)) v.push_back({kv.second.id, kv.first});
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    if (st.order == Order::kReverse) std::reverse(v.begin(), v.end());
    if (st.order == Order::kRandom) std::shuffle(v.begin(), v.end(), st.rng);
    for (const auto& e : v) run_whole_queue(e.second);
}
// Queues op on stream s and returns true, or returns false: the caller runs it now (stream 0,
// after the blocking streams' queues; a stream cudaStreamCreate did not make; the op itself being
// run from its queue).
inline bool enqueue(cudaStream_t s, std::function<void()>& op) {
    Streams& st = streams();
    if (st.in_queued_op) return false;
    auto it = st.queues.find(s);
    if (it == st.queues.end()) {
        run_queues(true);
        return false;
    }
    it->second.ops.push_back(std::move(op));
    if (st.eager) {  // the eager stream runs what it was given at once (its waits pull the others)
        uint64_t lo = UINT64_MAX, hi = 0;
        for (const auto& kv : st.queues) {
            lo = std::min(lo, kv.second.id);
            hi = std::max(hi, kv.second.id);
        }
        if (it->second.id == (st.eager == 1 ? lo : hi)) run_whole_queue(s);
    }
    return true;
}
}  // namespace detail
// Which stream's queue runs first when several are synchronised (see "streams" above).
inline void set_stream_order(Order o, uint64_t seed = 1) {
    detail::streams().order = o;
    detail::streams().rng.seed(seed);
}
// 0: every created stream queues its work; 1 / 2: the first / last stream made runs its at once.
inline void set_eager_stream(int which) { detail::streams().eager = which; }
// Work queued on streams and not yet run (for the emulator's self-test).
inline size_t stream_work_pending() {
    size_t n = 0;
    for (const auto& kv : detail::streams().queues) n += kv.second.ops.size();
    return n;
}
inline uint64_t graph_replays() { return detail::capture().replays; }
// Aborts when a capture is active: `what` is not allowed while a stream is capturing.
inline void forbid_in_capture(const char* what) {
    if (!capturing()) return;
    std::fprintf(stderr, "emu: %s while a stream is capturing (not allowed in a CUDA graph)\n", what);
    fail("illegal operation during stream capture");
}
// True when the op is taken: recorded while a capture is active (aborts on a stream other than the
// capturing one), else queued on its stream (see "streams"). False: the caller runs it now.
inline bool record(cudaStream_t s, const char* what, std::function<void()> op) {
    detail::Capture& c = detail::capture();
    if (detail::streams().in_queued_op) return false;  // queued work running: it runs now
    if (!c.graph) return detail::enqueue(s, op);
    if (s != c.stream) {
        std::fprintf(stderr, "emu: %s on another stream than the capturing one\n", what);
        fail("work outside the capturing stream during stream capture");
    }
    c.graph->ops.push_back(std::move(op));
    return true;
}

// cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, n) per kernel: the
// kernel's address -> n (the other attributes are accepted and ignored).
namespace detail {
inline std::vector<std::pair<const void*, int>>& dyn_smem_optin() {
    static std::vector<std::pair<const void*, int>> a;
    return a;
}
template <typename K>
inline const void* kernel_key(K k) {
    if constexpr (std::is_pointer<K>::value && std::is_function<std::remove_pointer_t<K>>::value)
        return reinterpret_cast<const void*>(k);
    else if constexpr (std::is_convertible<K, const void*>::value)
        return k;  // cudaFuncSetAttribute((const void*)f, ...)
    else
        return nullptr;  // a functor: no attributes
}
// The recorded opt-in of kernel key, or -1.
inline long optin_of(const void* key) {
    if (!key) return -1;
    for (const auto& e : dyn_smem_optin())
        if (e.first == key) return e.second;
    return -1;
}
}  // namespace detail
// cudaFuncSetAttribute: cudaErrorInvalidValue for a MaxDynamicSharedMemorySize outside
// [0, 227 KiB] (as CUDA; the static part is checked at launch, note_static_shared).
template <typename F>
inline cudaError_t func_set_attribute_(F* f, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (value < 0 || (size_t)value > kSmemOptin) return cudaErrorInvalidValue;
    const void* key = detail::kernel_key(f);
    for (auto& e : detail::dyn_smem_optin())
        if (e.first == key) {
            e.second = value;
            return cudaSuccess;
        }
    detail::dyn_smem_optin().push_back({key, value});
    return cudaSuccess;
}

// cudaOccupancyMaxActiveBlocksPerMultiprocessor: thread blocks of `threads` threads and `smem`
// bytes of dynamic shared memory one SM holds at once, from what the emulation knows: 2048
// threads and 32 blocks per SM, 228 KiB of shared memory with 1 KiB reserved per block (not the
// kernel's registers or static __shared__, which only ptxas knows: scripts/launch_check.py). 0
// where one block does not fit; cudaErrorInvalidValue for a block size outside 1..1024.
template <typename F>
inline cudaError_t occupancy_(int* n, F f, int threads, size_t smem) {
    (void)f;
    if (threads <= 0 || threads > 1024) return cudaErrorInvalidValue;
    const int warps = (threads + 31) / 32;
    int b = std::min(32, 64 / warps);
    if (smem > kSmemOptin) b = 0;
    else b = std::min<long>(b, (long)(228 * 1024) / (long)(smem + 1024));
    *n = b;
    return cudaSuccess;
}

// $EMU_LAUNCH_LOG naming a file: every distinct launch configuration (kernel, threads per block,
// dynamic shared memory, opt-in) of the process is appended to it as one line
// "symbol<TAB>threads<TAB>dynamic smem B<TAB>opt-in B or -1<TAB>static smem B seen", the symbol
// the kernel's mangled name (dladdr: the program must export it, i.e. link with -rdynamic; "?"
// when it cannot be resolved, e.g. internal linkage). scripts/launch_check.py joins the log with
// ptxas's registers and static shared memory per kernel (the limits the emulation cannot see).
namespace detail {
inline void log_launch(const void* key, int64_t threads, size_t smem, long optin) {
    static const char* path = std::getenv("EMU_LAUNCH_LOG");
    if (!path || !*path || !key) return;
    struct Seen {
        const void* key;
        int64_t threads;
        size_t smem;
        long optin;
    };
    static std::vector<Seen> seen;
    for (const Seen& e : seen)
        if (e.key == key && e.threads == threads && e.smem == smem && e.optin == optin) return;
    seen.push_back({key, threads, smem, optin});
    Dl_info info{};
    const char* name = dladdr(const_cast<void*>(key), &info) && info.dli_sname && info.dli_saddr == key
                           ? info.dli_sname : "?";
    char line[4096];
    const int n = std::snprintf(line, sizeof line, "%s\t%lld\t%zu\t%ld\t%zu\n", name, (long long)threads, smem,
                                optin, g.static_bytes);
    if (n <= 0 || (size_t)n >= sizeof line) return;  // (a symbol longer than the line: left out)
    const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);  // one write per line: processes may share it
    if (fd < 0) fail("cannot open $EMU_LAUNCH_LOG");
    const bool ok = write(fd, line, (size_t)n) == n;
    close(fd);
    if (!ok) fail("cannot write $EMU_LAUNCH_LOG");
}
}  // namespace detail

// kernel<<<grid, block, smem, stream>>>(args...): runs every block, one after the other, to
// completion before returning on stream 0; on a created stream the launch is queued (see
// "streams"). Arguments are copied as in CUDA.
// During a stream capture the launch is recorded (arguments copied now) and runs at replay.
template <typename K, typename... Args>
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, K kernel, Args... args) {
    using namespace detail;
    if (g.in_kernel) fail("kernel launch from inside a kernel (dynamic parallelism) is not emulated");
    if (record(stream, "kernel launch", [=] { launch(grid, block, smem, stream, kernel, args...); })) return;
    const int64_t nt = (int64_t)block.x * block.y * block.z;
    if (nt <= 0 || nt > 1024) fail("block size must be 1..1024 threads");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) fail("empty grid");
    if (block.x > 1024 || block.y > 1024 || block.z > 64) fail("block dimensions above 1024 x 1024 x 64");
    if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        fail("grid dimensions above (2^31 - 1) x 65535 x 65535");
    const long optin = optin_of(kernel_key(kernel));
    if (smem > kSmemOptin) fail("dynamic shared memory above 227 KiB");
    if (optin < 0 && smem > kSmemDefault) {
        std::fprintf(stderr, "emu: launch with %zu bytes of dynamic shared memory\n", smem);
        fail("dynamic shared memory above 48 KiB without cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)");
    }
    if (optin >= 0 && smem > (size_t)optin) {
        std::fprintf(stderr, "emu: launch with %zu bytes of dynamic shared memory, opt-in %ld\n", smem, optin);
        fail("dynamic shared memory above the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize");
    }
    g.launches++;
    g.grid = grid;
    g.block = block;
    // launch-only: thread 0 of block (0,0,0) alone (every thread of a converted kernel would end at
    // kernel_entry after the same launch-bounds check; blockDim is the launch's)
    const int64_t started = launch_only() ? 1 : nt;
    g.th.assign((size_t)started, Thread());
    while (!EMU_TSAN && g.stacks.size() < (size_t)started) g.stacks.emplace_back(new char[kStackBytes]);  // (TSan: per-pool stacks)
    for (int64_t i = 0; i < started; i++) {
        Thread& t = g.th[(size_t)i];
        t.lin = (int)i;
        t.tid = make_uint3((unsigned)(i % block.x), (unsigned)(i / block.x % block.y),
                           (unsigned)(i / ((int64_t)block.x * block.y)));
        if (!EMU_TSAN) t.stack = g.stacks[(size_t)i].get();
    }
    // kSmemCanary bytes of a fixed pattern after the launch's dynamic shared memory: a block that
    // writes past what the launch asked for fails the launch (a GPU may not fault there).
    g.dyn_smem.assign(std::max<size_t>(smem, 16) + kSmemCanary, 0xff);
    std::memset(g.dyn_smem.data() + smem, kCanaryByte, kSmemCanary);
    g.dyn_bytes = smem;
    g.dyn_optin = optin;
    auto tup = std::make_tuple(args...);
    struct Call {
        K kernel;
        decltype(tup)* a;
        static void run(void* p) {
            Call* c = (Call*)p;
            auto copy = *c->a;  // each thread its own parameter copy (kernels may modify them)
            call_with(c->kernel, copy, std::index_sequence_for<Args...>{});
        }
    } call{kernel, &tup};
    g.body = &Call::run;
    g.body_arg = &call;
    g.in_kernel = true;
#if EMU_TSAN
    __tsan_release(&g.launch_sync);  // the host's work so far happens before every emulated thread
#endif
    const bool all = !launch_only();  // (else block (0,0,0) only: its thread ends at kernel_entry)
    // Blocks in the order of emu::set_order too (x fastest when forward): a GPU gives no order
    // between blocks, so a kernel whose result depends on it differs between the orders.
    const int64_t nb = all ? (int64_t)grid.x * grid.y * grid.z : 1;
    std::vector<int> border;
    if (nb > 1 && nb <= (1 << 24) && g.order != Order::kForward) perm(border, (int)nb);  // (bigger grids: forward)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i = border.empty() ? b : border[(size_t)b];
        g.bidx = make_uint3((unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y),
                            (unsigned)(i / ((int64_t)grid.x * grid.y)));
        g.blocks++;
        run_block();
        if (!EMU_TSAN)
            for (size_t c = 0; c < kSmemCanary; c++)
                if (g.dyn_smem[smem + c] != kCanaryByte) {
                    char msg[200];
                    std::snprintf(msg, sizeof msg,
                                  "block (%u,%u,%u) wrote past its %zu bytes of dynamic shared memory (byte %zu)",
                                  g.bidx.x, g.bidx.y, g.bidx.z, smem, smem + c);
                    fail(msg);
                }
    }
#if EMU_TSAN
    __tsan_acquire(&g.exit_sync);  // every emulated thread's work happens before what follows
#endif
    g.in_kernel = false;
    log_launch(kernel_key(kernel), nt, smem, optin);
}

// ---- runtime API on host memory -------------------------------------------------------------
// 256-byte aligned like cudaMalloc, exactly n bytes (so ASan sees any access past the end).
// Live emulated device allocations (pointer -> bytes), for cudaMemGetInfo.
inline std::vector<std::pair<void*, size_t>>& allocations() {
    static std::vector<std::pair<void*, size_t>> a;
    return a;
}
// Live launch-only allocations (launch_only: zeroed pages from mmap, pointer -> bytes).
inline std::vector<std::pair<void*, size_t>>& mapped_allocations() {
    static std::vector<std::pair<void*, size_t>> a;
    return a;
}
inline size_t& allocated_bytes() {
    static size_t n = 0;
    return n;
}
// The emulated device's "memory": 16 GiB; 80 GiB (an H100's) in launch-only mode, where
// allocations are backed only where the host writes.
inline size_t device_bytes() { return launch_only() ? size_t(80) << 30 : size_t(1) << 34; }
// 256-byte aligned host block of n bytes (at least 1) registered in `list`; nullptr when out of memory.
inline void* tracked_alloc(std::vector<std::pair<void*, size_t>>& list, size_t n) {
    void* p = nullptr;
    if (posix_memalign(&p, 256, n ? n : 1) != 0) return nullptr;
    list.push_back({p, n});
    return p;
}
// Frees p (from tracked_alloc on `list`, or nullptr) and returns its size (0 when untracked).
inline size_t tracked_free(std::vector<std::pair<void*, size_t>>& list, void* p) {
    size_t n = 0;
    for (size_t i = list.size(); p && i-- > 0;)
        if (list[i].first == p) {
            n = list[i].second;
            list[i] = list.back();
            list.pop_back();
            break;
        }
    std::free(p);
    return n;
}
inline cudaError_t malloc_(void** p, size_t n) {
    forbid_in_capture("cudaMalloc");
    if (launch_only()) {  // zeroed pages, backed only where the host writes (no kernel runs)
        void* m = mmap(nullptr, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        *p = m == MAP_FAILED ? nullptr : m;
        if (*p) mapped_allocations().push_back({*p, n});
    } else {  // CUDA leaves new memory uninitialised: all-ones bytes (fp32 and bf16 NaN) expose reads before writes
        *p = tracked_alloc(allocations(), n);
        if (*p) std::memset(*p, 0xff, n);
    }
    if (!*p) return cudaErrorMemoryAllocation;
    allocated_bytes() += n;
    return cudaSuccess;
}
template <typename P>
inline cudaError_t malloc_(P** p, size_t n) {
    return malloc_((void**)p, n);
}
inline cudaError_t free_(void* p) {
    forbid_in_capture("cudaFree");
    detail::run_queues(false);  // cudaFree synchronises the device
    auto& mapped = mapped_allocations();  // (launch-only blocks, whatever the mode is now)
    for (size_t i = mapped.size(); p && i-- > 0;)
        if (mapped[i].first == p) {
            const size_t n = mapped[i].second;
            munmap(p, n ? n : 1);
            allocated_bytes() -= n;
            mapped[i] = mapped.back();
            mapped.pop_back();
            return cudaSuccess;
        }
    allocated_bytes() -= tracked_free(allocations(), p);
    return cudaSuccess;
}
// cudaMemGetInfo: free = device_bytes() minus the live emulated allocations.
inline cudaError_t mem_get_info_(size_t* free_b, size_t* total_b) {
    *total_b = device_bytes();
    *free_b = *total_b > allocated_bytes() ? *total_b - allocated_bytes() : 0;
    return cudaSuccess;
}
// cudaMallocHost / cudaFreeHost: page-locked host memory (the only host memory a captured copy
// may touch).
inline cudaError_t malloc_host_(void** p, size_t n) {
    forbid_in_capture("cudaMallocHost");
    *p = tracked_alloc(detail::pinned(), n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename P>
inline cudaError_t malloc_host_(P** p, size_t n) {
    return malloc_host_((void**)p, n);
}
inline cudaError_t free_host_(void* p) {
    forbid_in_capture("cudaFreeHost");
    detail::run_queues(false);
    tracked_free(detail::pinned(), p);
    return cudaSuccess;
}
// Whether [p, p + n) lies in one emulated device allocation or one pinned host allocation.
// Whether [p, p + n) lies in one block of `list` (pointer -> bytes).
inline bool in_one_of(const std::vector<std::pair<void*, size_t>>& list, const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    for (const auto& a : list) {
        const char* b = static_cast<const char*>(a.first);
        if (c >= b && c + n <= b + a.second) return true;
    }
    return false;
}
inline bool in_captureable_memory(const void* p, size_t n) {
    return in_one_of(allocations(), p, n) || in_one_of(mapped_allocations(), p, n) || in_one_of(detail::pinned(), p, n);
}
inline void check_captured_copy(const void* d, const void* s, size_t n) {
    if (!in_captureable_memory(d, n) || !in_captureable_memory(s, n))
        fail("cudaMemcpyAsync from or to pageable host memory during stream capture (use cudaMallocHost)");
}
// memset(d, v, n) of cudaMemset[Async]. In launch-only mode a zero fill hands the whole pages in
// the range back (madvise MADV_DONTNEED: private anonymous pages read back as zero) and writes only
// the partial pages at its ends, so that zeroing the trainers' large buffers costs no memory.
inline void device_fill(void* d, int v, size_t n) {
    if (!n) return;
    if (launch_only() && v == 0) {
        const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), b = (uintptr_t)d, e = b + n;
        const uintptr_t pb = (b + pg - 1) / pg * pg, pe = e / pg * pg;
        if (pb < pe && madvise((void*)pb, pe - pb, MADV_DONTNEED) == 0) {
            std::memset(d, 0, pb - b);
            std::memset((void*)pe, 0, e - pe);
            return;
        }
    }
    std::memset(d, v, n);
}
// The copy of cudaMemcpy[Async]: memmove, except in launch-only mode between two launch-only
// allocations: a device-to-device copy is device work, like a kernel, and is not done (it would
// back the destination's pages: the LDM workbench's stored states at its BENCH shape, 26 GB).
inline void device_copy(void* d, const void* s, size_t n) {
    const auto& mapped = mapped_allocations();
    if (!n || (launch_only() && in_one_of(mapped, d, n) && in_one_of(mapped, s, n))) return;
    std::memmove(d, s, n);
}
// Synchronous cudaMemcpy / cudaMemset on stream 0 (not allowed during a capture): after the
// blocking streams' queued work.
inline cudaError_t memcpy_(void* d, const void* s, size_t n, ...) {
    forbid_in_capture("cudaMemcpy (synchronous)");
    detail::run_queues(true);
    device_copy(d, s, n);
    return cudaSuccess;
}
inline cudaError_t memset_(void* d, int v, size_t n, ...) {
    forbid_in_capture("cudaMemset (synchronous)");
    detail::run_queues(true);
    device_fill(d, v, n);
    return cudaSuccess;
}
// Before an async copy from or to pageable host memory, which CUDA makes synchronous for the host:
// the earlier work of its stream (stream 0: of the blocking streams) runs.
inline void run_before_pageable_copy(cudaStream_t st) {
    if (detail::streams().queues.count(st)) detail::run_whole_queue(st);
    else detail::run_queues(true);
}
// cudaMemcpyAsync / cudaMemsetAsync: recorded during a capture, else queued on their stream (see
// "streams"). A copy from or to pageable host memory is synchronous for the host, as in CUDA: the
// stream's earlier work runs first, then the copy.
inline cudaError_t memcpy_async_(void* d, const void* s, size_t n, cudaMemcpyKind = cudaMemcpyDefault,
                                 cudaStream_t st = nullptr) {
    if (capturing()) {
        check_captured_copy(d, s, n);
        record(st, "cudaMemcpyAsync", [=] { device_copy(d, s, n); });
        return cudaSuccess;
    }
    if (!in_captureable_memory(d, n) || !in_captureable_memory(s, n)) {
        run_before_pageable_copy(st);
    } else if (record(st, "cudaMemcpyAsync", [=] { device_copy(d, s, n); })) {
        return cudaSuccess;
    }
    device_copy(d, s, n);
    return cudaSuccess;
}
inline cudaError_t memset_async_(void* d, int v, size_t n, cudaStream_t st = nullptr) {
    if (capturing() && !in_captureable_memory(d, n)) fail("cudaMemsetAsync on host memory during stream capture");
    if (record(st, "cudaMemsetAsync", [=] { device_fill(d, v, n); })) return cudaSuccess;
    device_fill(d, v, n);
    return cudaSuccess;
}
// cudaMemcpy2D[Async]: `height` rows of `width` bytes, row pitches dpitch / spitch (bytes).
inline void copy2d(void* d, size_t dpitch, const void* s, size_t spitch, size_t width, size_t height) {
    for (size_t r = 0; r < height; r++)
        if (width) std::memmove(static_cast<char*>(d) + r * dpitch, static_cast<const char*>(s) + r * spitch, width);
}
inline cudaError_t memcpy2d_(void* d, size_t dpitch, const void* s, size_t spitch, size_t width, size_t height, ...) {
    forbid_in_capture("cudaMemcpy2D (synchronous)");
    detail::run_queues(true);
    copy2d(d, dpitch, s, spitch, width, height);
    return cudaSuccess;
}
inline cudaError_t memcpy2d_async_(void* d, size_t dpitch, const void* s, size_t spitch, size_t width, size_t height,
                                   cudaMemcpyKind = cudaMemcpyDefault, cudaStream_t st = nullptr) {
    if (capturing()) {
        if (height && (!in_captureable_memory(d, dpitch * (height - 1) + width) ||
                       !in_captureable_memory(s, spitch * (height - 1) + width)))
            fail("cudaMemcpy2DAsync from or to pageable host memory during stream capture");
        record(st, "cudaMemcpy2DAsync", [=] { copy2d(d, dpitch, s, spitch, width, height); });
        return cudaSuccess;
    }
    if (height && (!in_captureable_memory(d, dpitch * (height - 1) + width) ||
                   !in_captureable_memory(s, spitch * (height - 1) + width))) {
        run_before_pageable_copy(st);
    } else if (record(st, "cudaMemcpy2DAsync", [=] { copy2d(d, dpitch, s, spitch, width, height); })) {
        return cudaSuccess;
    }
    copy2d(d, dpitch, s, spitch, width, height);
    return cudaSuccess;
}
// Synchronisation points (not allowed during a capture): cudaDeviceSynchronize runs every queue;
// cudaStreamSynchronize the stream's (stream 0: the blocking streams').
inline cudaError_t device_sync_() {
    forbid_in_capture("cudaDeviceSynchronize");
    detail::run_queues(false);
    return cudaSuccess;
}
inline cudaError_t stream_sync_(cudaStream_t s) {
    forbid_in_capture("cudaStreamSynchronize");
    if (detail::streams().queues.count(s)) detail::run_whole_queue(s);
    else detail::run_queues(true);
    return cudaSuccess;
}
// cudaStreamCreate[WithFlags]: a distinct non-null handle (never dereferenced) with a queue.
inline cudaError_t stream_create_(cudaStream_t* s, unsigned flags = 0) {
    *s = reinterpret_cast<cudaStream_t>(uintptr_t(0x5eed0000) + 16 * ++detail::capture().streams_made);
    detail::StreamQueue& q = detail::streams().queues[*s];
    q.id = detail::capture().streams_made;
    q.non_blocking = (flags & cudaStreamNonBlocking) != 0;
    return cudaSuccess;
}
// cudaStreamDestroy: the queued work still runs (as on a GPU), now.
inline cudaError_t stream_destroy_(cudaStream_t s) {
    forbid_in_capture("cudaStreamDestroy");
    detail::run_whole_queue(s);
    detail::streams().queues.erase(s);
    return cudaSuccess;
}
// Events: each cudaEventRecord makes a record, an op of its stream that marks it done and stores
// the host time when it runs, so cudaEventElapsedTime gives the emulation's own time between two
// records (what --profile-stages shows under the emulation: host time, not GPU time). The event
// holds its latest record; a wait or synchronisation is on the record made before it (as in CUDA).
// Queued ops hold the record, not the event, so destroying an event orders nothing (as in CUDA).
struct EventRecord {
    bool done = false;
    std::chrono::steady_clock::time_point t{};
};
struct Event {
    std::shared_ptr<EventRecord> latest;  // nullptr: never recorded
    cudaStream_t stream = nullptr;        // where the latest record was made
};
inline cudaError_t event_create_(cudaEvent_t* e) {
    *e = reinterpret_cast<cudaEvent_t>(new Event());
    return cudaSuccess;
}
inline cudaError_t event_destroy_(cudaEvent_t e) {
    delete reinterpret_cast<Event*>(e);
    return cudaSuccess;
}
inline cudaError_t event_record_(cudaEvent_t e, cudaStream_t s = nullptr) {
    forbid_in_capture("cudaEventRecord (not emulated inside a capture)");
    Event* ev = reinterpret_cast<Event*>(e);
    if (!ev) fail("cudaEventRecord on a null event");
    auto rec = std::make_shared<EventRecord>();
    ev->latest = rec;
    ev->stream = s;
    std::function<void()> op = [rec] {
        rec->t = std::chrono::steady_clock::now();
        rec->done = true;
    };
    if (!detail::enqueue(s, op)) op();
    return cudaSuccess;
}
// Runs stream s (where rec was made) until rec has run.
inline void run_to_record(const std::shared_ptr<EventRecord>& rec, cudaStream_t s) {
    if (!rec->done) detail::run_queue(s, [rec] { return rec->done; });
}
inline cudaError_t event_sync_(cudaEvent_t e) {
    forbid_in_capture("cudaEventSynchronize");
    Event* ev = reinterpret_cast<Event*>(e);
    if (!ev) fail("cudaEventSynchronize on a null event");
    if (ev->latest) run_to_record(ev->latest, ev->stream);
    return cudaSuccess;
}
// cudaStreamWaitEvent(s, e): s's later work runs after e's latest record (queued on s: the wait
// runs e's stream up to that record when s reaches it).
inline cudaError_t stream_wait_event_(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
    forbid_in_capture("cudaStreamWaitEvent (not emulated inside a capture)");
    Event* ev = reinterpret_cast<Event*>(e);
    if (!ev) fail("cudaStreamWaitEvent on a null event");
    if (!ev->latest) return cudaSuccess;  // never recorded: waits for nothing
    std::function<void()> op = [rec = ev->latest, es = ev->stream] { run_to_record(rec, es); };
    if (!detail::enqueue(s, op)) op();
    return cudaSuccess;
}
inline cudaError_t event_elapsed_(float* ms, cudaEvent_t a, cudaEvent_t b) {
    const Event *ea = reinterpret_cast<const Event*>(a), *eb = reinterpret_cast<const Event*>(b);
    if (!ea || !eb || !ea->latest || !eb->latest) return cudaErrorInvalidResourceHandle;
    if (!ea->latest->done || !eb->latest->done) return cudaErrorNotReady;
    *ms = std::chrono::duration<float, std::milli>(eb->latest->t - ea->latest->t).count();
    return cudaSuccess;
}
inline cudaError_t begin_capture_(cudaStream_t s) {
    detail::Capture& c = detail::capture();
    if (c.graph) fail("cudaStreamBeginCapture: a capture is already active");
    if (s == nullptr) fail("cudaStreamBeginCapture on the legacy default stream (0) is not allowed");
    c.graph = new Graph();
    c.stream = s;
    return cudaSuccess;
}
inline cudaError_t end_capture_(cudaStream_t s, Graph** out) {
    detail::Capture& c = detail::capture();
    if (!c.graph || s != c.stream) fail("cudaStreamEndCapture without a capture on this stream");
    *out = c.graph;
    c.graph = nullptr;
    c.stream = nullptr;
    return cudaSuccess;
}
inline cudaError_t is_capturing_(cudaStream_t s, cudaStreamCaptureStatus* st) {
    *st = capturing() && s == detail::capture().stream ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
inline cudaError_t graph_instantiate_(Graph** exec, Graph* g) {
    forbid_in_capture("cudaGraphInstantiate");
    *exec = new Graph(*g);
    return cudaSuccess;
}
// cudaGraphLaunch: the graph's ops, in order, as one piece of work of stream s (queued on a created
// stream, see "streams"); each op runs as recorded, not queued again on its own.
inline cudaError_t graph_launch_(Graph* exec, cudaStream_t s) {
    forbid_in_capture("cudaGraphLaunch");
    detail::capture().replays++;
    std::function<void()> replay = [ops = exec->ops] {
        detail::run_as_queued([&] {
            for (const auto& op : ops) op();
        });
    };
    if (!detail::enqueue(s, replay)) replay();
    return cudaSuccess;
}
inline cudaError_t graph_destroy_(Graph* g) {
    delete g;
    return cudaSuccess;
}
inline const void* sym_(const void* p) { return p; }

}  // namespace emu

// ---- CUDA built-ins --------------------------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __shared__
#undef __constant__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// (libstdc++ spells the attribute __noinline__ in a few headers, e.g. shared_ptr_base.h: they
// must be included before this point, as <memory> is above.)
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static

#if EMU_TSAN
namespace emu::detail {
EMU_NOTSAN inline uint3 q_tid() { return g.cur->tid; }
EMU_NOTSAN inline uint3 q_bidx() { return g.bidx; }
EMU_NOTSAN inline dim3 q_block() { return g.block; }
EMU_NOTSAN inline dim3 q_grid() { return g.grid; }
}  // namespace emu::detail
#define threadIdx (::emu::detail::q_tid())
#define blockIdx (::emu::detail::q_bidx())
#define blockDim (::emu::detail::q_block())
#define gridDim (::emu::detail::q_grid())
#else
#define threadIdx (::emu::detail::g.cur->tid)
#define blockIdx (::emu::detail::g.bidx)
#define blockDim (::emu::detail::g.block)
#define gridDim (::emu::detail::g.grid)
#endif
constexpr int warpSize = 32;

// In ThreadSanitizer mode the two barriers are the happens-before edges CUDA defines between the
// threads of a block: __syncthreads among all of them, __syncwarp among the lanes of a warp
// (release by every arriving thread, acquire by every leaving one, on an object of the barrier's
// generation). Shuffles, votes, mma and ldmatrix exchange values but order no memory accesses.
EMU_NOTSAN inline void __syncthreads() {
    using namespace emu::detail;
    Thread* t;
    {
        Quiet q;
        t = g.cur;
        if (!t) emu::fail("__syncthreads outside an emulated kernel");
    }
#if EMU_TSAN
    void* obj = block_sync_obj(t->bar_gen);
    __tsan_release(obj);
#endif
    {
        Quiet q;
        t->state = kAtBlock;
        to_scheduler();
    }
#if EMU_TSAN
    __tsan_acquire(obj);
    t->bar_gen++;
#endif
}
EMU_NOTSAN inline void __syncwarp(unsigned mask = 0xffffffffu) {
    using namespace emu::detail;
#if EMU_TSAN
    Thread* t = g.cur;
    if (!t) emu::fail("__syncwarp outside an emulated kernel");
    void* obj = warp_sync_obj(t->lin / kWarp, t->warp_gen);
    __tsan_release(obj);
#endif
    yield_warp(&op_sync, "__syncwarp", mask);
#if EMU_TSAN
    __tsan_acquire(obj);
    t->warp_gen++;
#endif
}
[[noreturn]] inline void __trap() { emu::fail("__trap() in an emulated kernel"); }

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return emu::detail::shfl<emu::detail::kIdx>(mask, v, src, width, "__shfl_sync");
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return emu::detail::shfl<emu::detail::kXor>(mask, v, lane_mask, width, "__shfl_xor_sync");
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return emu::detail::shfl<emu::detail::kUp>(mask, v, (int)delta, width, "__shfl_up_sync");
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return emu::detail::shfl<emu::detail::kDown>(mask, v, (int)delta, width, "__shfl_down_sync");
}
EMU_NOTSAN inline unsigned __ballot_sync(unsigned mask, int pred) {
    using namespace emu::detail;
    Quiet q;
    g.cur->in = pred != 0;
    yield_warp(&op_ballot, "__ballot_sync", mask);
    return (unsigned)g.cur->out;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == (mask & __ballot_sync(mask, 1)); }

// Atomics: one relaxed compare-and-swap on the 4- or 8-byte word (only one fiber runs at a time,
// so it succeeds at once); return the old value. Being real atomics, they never race with each
// other under ThreadSanitizer, and order nothing else (CUDA's atomic* are relaxed).
namespace emu::detail {
template <typename T, typename F>
inline T atomic_rmw(T* p, F f) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics on 4- or 8-byte values");
    using U = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
    U* w = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(w, __ATOMIC_RELAXED);
    for (;;) {
        T o, n;
        std::memcpy(&o, &old, sizeof o);
        n = f(o);
        U nw;
        std::memcpy(&nw, &n, sizeof nw);
        if (__atomic_compare_exchange_n(w, &old, nw, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return o;
    }
}
}  // namespace emu::detail
template <typename T>
inline T atomicAdd(T* p, T v) { return emu::detail::atomic_rmw(p, [v](T o) { return o + v; }); }
template <typename T>
inline T atomicSub(T* p, T v) { return emu::detail::atomic_rmw(p, [v](T o) { return o - v; }); }
template <typename T>
inline T atomicMax(T* p, T v) { return emu::detail::atomic_rmw(p, [v](T o) { return o > v ? o : v; }); }
template <typename T>
inline T atomicMin(T* p, T v) { return emu::detail::atomic_rmw(p, [v](T o) { return o < v ? o : v; }); }
template <typename T>
inline T atomicExch(T* p, T v) { return emu::detail::atomic_rmw(p, [v](T) { return v; }); }
template <typename T>
inline T atomicCAS(T* p, T cmp, T v) { return emu::detail::atomic_rmw(p, [cmp, v](T o) { return o == cmp ? v : o; }); }

template <typename T>
inline T __ldg(const T* p) { return *p; }
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; std::memcpy(&x, &u, 4); return x; }
inline int __float_as_int(float x) { int u; std::memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int u) { float x; std::memcpy(&x, &u, 4); return x; }
// The fast intrinsics computed the way the GPU does (CUDA Programming Guide, "Intrinsic
// Functions"): __expf is ex2.approx of x * log2(e) rounded to fp32 and __logf is lg2.approx times
// ln 2, so their error grows with |x| as on the hardware (the approx instructions' own ~2 ulp are
// not modelled); __fdividef is a times the reciprocal of b, 0 for 2^126 < |b| < 2^128.
inline float __expf(float x) { return exp2f(x * 1.44269504088896341f); }
inline float __logf(float x) { return log2f(x) * 0.693147180559945309f; }
inline float __fdividef(float a, float b) {
    const float ab = fabsf(b);
    if (ab > 8.50705917e37f && ab < INFINITY) return a * copysignf(0.f, b);  // rcp(b) = ±0: NaN for a NaN or inf a
    return a * (1.f / b);
}
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }

// Runtime API on host memory (streams, events, device attributes: no-ops).
#define cudaMalloc(p, n) ::emu::malloc_(p, n)
#define cudaFree(p) ::emu::free_(p)
#define cudaMallocHost(p, n) ::emu::malloc_host_(p, n)
#define cudaFreeHost(p) ::emu::free_host_(p)
#define cudaMemcpy(...) ::emu::memcpy_(__VA_ARGS__)
#define cudaMemcpyAsync(...) ::emu::memcpy_async_(__VA_ARGS__)
#define cudaMemcpy2D(...) ::emu::memcpy2d_(__VA_ARGS__)
#define cudaMemcpy2DAsync(...) ::emu::memcpy2d_async_(__VA_ARGS__)
#define cudaMemset(...) ::emu::memset_(__VA_ARGS__)
#define cudaMemsetAsync(...) ::emu::memset_async_(__VA_ARGS__)
#define cudaGetLastError() cudaSuccess
#define cudaPeekAtLastError() cudaSuccess
#define cudaDeviceSynchronize() ::emu::device_sync_()
#define cudaStreamSynchronize(s) ::emu::stream_sync_(s)
#define cudaStreamBeginCapture(s, mode) ((void)(mode), ::emu::begin_capture_(s))
#define cudaStreamEndCapture(s, g) ::emu::end_capture_(s, g)
#define cudaStreamIsCapturing(s, st) ::emu::is_capturing_(s, st)
#define cudaGraphInstantiate(e, g, ...) ::emu::graph_instantiate_(e, g)
#define cudaGraphLaunch(e, s) ::emu::graph_launch_(e, s)
#define cudaGraphGetNodes(g, nodes, count) ((void)(nodes), *(count) = (g)->ops.size(), cudaSuccess)
#define cudaGraphExecDestroy(e) ::emu::graph_destroy_(e)
#define cudaGraphDestroy(g) ::emu::graph_destroy_(g)
#define cudaGraph_t ::emu::Graph*
#define cudaGraphExec_t ::emu::Graph*
#define cudaFuncSetAttribute(...) ::emu::func_set_attribute_(__VA_ARGS__)
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, f, threads, smem) ::emu::occupancy_(n, f, threads, smem)
#define cudaGetDeviceCount(n) (*(n) = 1, cudaSuccess)
#define cudaMemGetInfo(f, t) ::emu::mem_get_info_(f, t)
#define cudaSetDevice(d) ((void)(d), cudaSuccess)
#define cudaGetDevice(d) (*(d) = 0, cudaSuccess)
#define cudaGetDeviceProperties(p, d) ::emu::device_props_(p, d)
#define cudaDeviceGetAttribute(v, a, d) ::emu::device_attribute_(v, a, d)
#define cudaGetErrorName(e) ((void)(e), "cudaError(emulated)")
#define cudaGetErrorString(e) ((void)(e), "(emulated)")
#define cublasGetStatusString(e) ((void)(e), "(emulated)")
#define cudaEventCreate(e) ::emu::event_create_(e)
#define cudaEventCreateWithFlags(e, f) ((void)(f), ::emu::event_create_(e))
#define cudaEventDestroy(e) ::emu::event_destroy_(e)
#define cudaEventRecord(...) ::emu::event_record_(__VA_ARGS__)
#define cudaEventSynchronize(e) ::emu::event_sync_(e)
#define cudaEventElapsedTime(ms, a, b) ::emu::event_elapsed_(ms, a, b)
#define cudaStreamCreate(s) ::emu::stream_create_(s)
#define cudaStreamCreateWithFlags(s, f) ::emu::stream_create_(s, f)
#define cudaStreamDestroy(s) ::emu::stream_destroy_(s)
#define cudaStreamWaitEvent(...) ::emu::stream_wait_event_(__VA_ARGS__)
namespace emu {
inline cudaError_t device_props_(cudaDeviceProp* p, int) {
    std::memset(p, 0, sizeof *p);
    std::snprintf(p->name, sizeof p->name, launch_only() ? "host emulation (dev/emu, launch only)" : "host emulation (dev/emu)");
    p->major = 9;
    p->multiProcessorCount = launch_only() ? 132 : 1;  // (launch only: the H100 / H200 SXM's, for persistent grids)
    p->totalGlobalMem = device_bytes();
    p->sharedMemPerBlockOptin = 227 * 1024;
    return cudaSuccess;
}
// cudaDeviceGetAttribute for the attributes the project queries, with device_props_'s values;
// any other attribute aborts (add it here with its emulated value).
inline cudaError_t device_attribute_(int* v, cudaDeviceAttr a, int) {
    cudaDeviceProp p;
    device_props_(&p, 0);
    switch (a) {
        case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; return cudaSuccess;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMajor: *v = p.major; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor: *v = p.minor; return cudaSuccess;
        default: fail("cudaDeviceGetAttribute: this attribute is not emulated");
    }
    return cudaErrorInvalidValue;
}
}  // namespace emu

// The inline-asm paths of cuda/*.cuh (`__trap();  // host: KEY`, rewritten to EMU_HOST_KEY by
// gen.py) map to these emulations unless a harness defines its own first.
#ifndef EMU_HOST_mma
#define EMU_HOST_mma ::emu::mma_m16n8k16_bf16(c, a, b)
#endif
#ifndef EMU_HOST_ldsm
#define EMU_HOST_ldsm ::emu::ldmatrix_x4(r, p, false)
#endif
#ifndef EMU_HOST_ldsm_trans
#define EMU_HOST_ldsm_trans ::emu::ldmatrix_x4(r, p, true)
#endif
// cuda/cp_async.cuh
#ifndef EMU_HOST_cp_async_16
#define EMU_HOST_cp_async_16 ::emu::cp_async(dst, src, 16, valid ? 16 : 0)
#endif
#ifndef EMU_HOST_cp_async_4
#define EMU_HOST_cp_async_4 ::emu::cp_async(dst, src, 4, valid ? 4 : 0)
#endif
#ifndef EMU_HOST_cp_async_commit
#define EMU_HOST_cp_async_commit ::emu::cp_async_commit()
#endif
#ifndef EMU_HOST_cp_async_wait
#define EMU_HOST_cp_async_wait ::emu::cp_async_wait(N)
#endif
#ifndef EMU_HOST_cp_async_wait_all
#define EMU_HOST_cp_async_wait_all ::emu::cp_async_wait_all()
#endif
// dev/cuda/wgmma.cuh
#ifndef EMU_HOST_smem_u32
#define EMU_HOST_smem_u32 return ::emu::cvta_shared(p)
#endif
#ifndef EMU_HOST_wgmma_fence
#define EMU_HOST_wgmma_fence ::emu::wgmma_fence()
#endif
#ifndef EMU_HOST_wgmma_commit
#define EMU_HOST_wgmma_commit ::emu::wgmma_commit()
#endif
#ifndef EMU_HOST_wgmma_wait
#define EMU_HOST_wgmma_wait ::emu::wgmma_wait(N)
#endif
#ifndef EMU_HOST_wgmma_ss
#define EMU_HOST_wgmma_ss ::emu::wgmma_ss(d, N, desc_a, desc_b, scale_d, TA, TB)
#endif
#ifndef EMU_HOST_wgmma_rs
#define EMU_HOST_wgmma_rs ::emu::wgmma_rs(d, N, a, desc_b, scale_d, TB)
#endif
