// cuda/common.cuh — shared CUDA infrastructure for the GPU trainers and the dev/cuda workbench:
// error checking, the bf16 type and fp32 conversions, RAII device buffers with 64-bit sizes,
// GPU detection and CUDA-event timing. Conventions: doc/cuda.md.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <type_traits>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/common.h"
#include "math/elementwise.h"

namespace ldm {
namespace gpu {

using bf16 = __nv_bfloat16;

// Throws ldm::Error("file:line: CUDA error <name>: <text> in <expr>") when a CUDA runtime call fails.
#define CUDA_CHECK(expr)                                                                         \
    do {                                                                                         \
        cudaError_t err_ = (expr);                                                               \
        if (err_ != cudaSuccess)                                                                 \
            throw ::ldm::Error(::ldm::strprintf("%s:%d: CUDA error %s: %s in %s", __FILE__,      \
                                                __LINE__, cudaGetErrorName(err_),                \
                                                cudaGetErrorString(err_), #expr));               \
    } while (0)

// Same for cuBLAS / cuBLASLt status codes.
#define CUBLAS_CHECK(expr)                                                                       \
    do {                                                                                         \
        cublasStatus_t st_ = (expr);                                                             \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                        \
            throw ::ldm::Error(::ldm::strprintf("%s:%d: cuBLAS error %d (%s) in %s", __FILE__,   \
                                                __LINE__, (int)st_, cublasGetStatusString(st_),  \
                                                #expr));                                         \
    } while (0)

// After every kernel launch: catches bad launch configurations immediately (asynchronous faults
// surface at the next synchronising call, which is checked too).
#define LDM_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

// fp32 <-> activation type. Arithmetic is always fp32; T is float or bf16 (round to nearest even).
LDM_HD inline float to_f(float x) { return x; }
LDM_HD inline float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T>
LDM_HD inline T from_f(float x);
template <>
LDM_HD inline float from_f<float>(float x) { return x; }
template <>
LDM_HD inline bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (sm_80+): c += A·B, A 16x16 and B 16x8 bf16
// in the PTX ISA fragment layout (gr = lane / 4, tg = lane % 4): a0 = A[gr][2tg, 2tg+1],
// a1 = A[gr+8][2tg..], a2 = A[gr][2tg+8..], a3 = A[gr+8][2tg+8..]; b0 = B[2tg, 2tg+1][gr],
// b1 = B[2tg+8, 2tg+9][gr]; c0, c1 = C[gr][2tg, 2tg+1], c2, c3 = C[gr+8][2tg, 2tg+1] (fp32). Two
// bf16 per register, the lower index in the low half. Emulated by dev/emu (EMU_HOST_mma).
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();  // host: mma
#endif
}

// Two consecutive bf16 of shared memory (even element index) as one register.
__device__ __forceinline__ uint32_t ld_pair(const bf16* p) {
    return *reinterpret_cast<const uint32_t*>(p);
}

// The strided loop i = first, first + stride, ... < end in batches of U steps: load(u, i) for
// every step of a batch, then use(u, i) for each, so all loads of a batch are issued before its
// first store (the compiler does not move loads across stores that may alias). After unrolling, u
// is a compile-time index, so per-batch arrays indexed by u stay in registers; use() sees the
// indices in the plain loop's order. Used by the memory-bound scheme kernels (cuda/ldm.cuh,
// cuda/hc.cuh).
template <int U, class Load, class Use>
__device__ __forceinline__ void batched_strided_loop(int first, int end, int stride, Load&& load, Use&& use) {
    for (int i0 = first; i0 < end; i0 += U * stride) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + u * stride;
            if (i >= end) break;
            load(u, i);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + u * stride;
            if (i >= end) break;
            use(u, i);
        }
    }
}

// Name of the activation type for logs and tables.
template <typename T>
inline const char* dtype_name();
template <>
inline const char* dtype_name<float>() { return "fp32"; }
template <>
inline const char* dtype_name<bf16>() { return "bf16"; }

// Ceil division for grid sizes (64-bit safe).
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid of a kernel whose blocks cover `channels` channels, per_block each (x), and stride over
// `tiles` token tiles (y: the token slices, at most one per tile, at least one), about `target`
// blocks in all. A function of the shape only, not of the device, so that sums a block forms over
// its slice have a fixed order (HC/mHC combine, LDM row pass).
inline dim3 slice_grid(int64_t channels, int64_t per_block, int64_t tiles, int64_t target) {
    const int64_t gx = ceil_div(channels, per_block);
    const int64_t gy = std::min(std::max<int64_t>(tiles, 1), std::max<int64_t>(ceil_div(target, gx), 1));
    return dim3((unsigned)gx, (unsigned)gy);
}

// True when at least one CUDA device is usable (driver present, device count > 0). Never throws;
// clears the sticky error state of a failed probe.
inline bool gpu_available() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

// Workbench / test entry: when no GPU is usable prints "skipped: no GPU" and exits 0.
inline void exit_if_no_gpu(const char* program) {
    if (!gpu_available()) {
        std::printf("%s: skipped: no GPU\n", program);
        std::exit(0);
    }
}

// Dynamic shared memory one block of the current device may opt into (cudaFuncSetAttribute with
// cudaFuncAttributeMaxDynamicSharedMemorySize): 227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on
// sm_86/sm_89. Without a device (a host-side query such as --dry-run) the sm_90 value. One
// attribute query (cudaDeviceGetAttribute), not cudaGetDeviceProperties, which fills every field.
inline size_t max_dynamic_smem_optin() {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || v <= 0) {
        (void)cudaGetLastError();
        return 227 * 1024;
    }
    return (size_t)v;
}

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device: raises its
// cudaFuncAttributeMaxDynamicSharedMemorySize where the value this function set before (for this
// device and kernel) is lower, and never lowers it. The attribute is per kernel and process-wide:
// setting a smaller value for one launch site would break another's launches. (Set even below
// 48 KiB: the default limit is 48 KiB of static + dynamic.) No CUDA call for 0 bytes, nor once
// the value suffices (so none inside a CUDA-graph capture after the first eager step). Throws
// ldm::Error (CUDA_CHECK) where the device refuses the value.
struct DynamicSmemSet {  // (device, kernel) -> the value ensure_dynamic_smem set
    std::mutex mu;
    std::map<std::pair<int, const void*>, size_t> value;
};
inline DynamicSmemSet& dynamic_smem_set() {
    static DynamicSmemSet s;
    return s;
}
template <typename K>
inline void ensure_dynamic_smem(K kernel, size_t bytes) {
    if (bytes == 0) return;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    DynamicSmemSet& set = dynamic_smem_set();
    std::lock_guard<std::mutex> lock(set.mu);
    size_t& cur = set.value[{dev, reinterpret_cast<const void*>(kernel)}];
    if (cur >= bytes) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    cur = bytes;
}

// Grid of a persistent kernel (its blocks loop over the work): the thread blocks the current
// device keeps resident at once with `threads` threads and `smem` bytes of dynamic shared memory,
// SMs × cudaOccupancyMaxActiveBlocksPerMultiprocessor (at least one block per SM), at most `cap`.
// One full wave: a larger fixed grid ends in a partly filled wave whose SMs hold fewer blocks, so
// fewer bytes in flight. First raises the kernel's dynamic shared-memory opt-in to `smem`
// (ensure_dynamic_smem), so that the occupancy query and the launch see the same limit; the result
// is cached per (device, kernel, threads, smem), so a repeated launch costs one lookup and no CUDA
// call. The result depends on the device (a reduction over such blocks is fixed per device, not
// across device models).
struct PersistentGridCache {
    std::mutex mu;
    std::map<std::tuple<int, const void*, int, size_t>, int> resident;  // -> SMs × blocks per SM
};
inline PersistentGridCache& persistent_grid_cache() {
    static PersistentGridCache c;
    return c;
}
template <typename K>
inline int persistent_grid(K kernel, int threads, size_t smem, int cap) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    PersistentGridCache& c = persistent_grid_cache();
    const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel), threads, smem);
    {
        std::lock_guard<std::mutex> lock(c.mu);
        const auto it = c.resident.find(key);
        if (it != c.resident.end()) return std::max(1, std::min(cap, it->second));
    }
    ensure_dynamic_smem(kernel, smem);
    int per_sm = 0, sms = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int resident = std::max(1, sms) * std::max(1, per_sm);
    {
        std::lock_guard<std::mutex> lock(c.mu);
        c.resident.emplace(key, resident);
    }
    return std::max(1, std::min(cap, resident));
}

// One-line description of device 0: "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB".
inline std::string device_description(int dev = 0) {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    return strprintf("%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
                     p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024));
}

// Owning allocation of n elements of E: device memory (cudaMalloc; no managed memory) or, with
// kPinned, page-locked host memory (cudaMallocHost). Move-only; contents undefined after alloc.
template <typename E, bool kPinned>
struct OwnedBuffer {
    E* ptr = nullptr;
    int64_t n = 0;
    OwnedBuffer() = default;
    explicit OwnedBuffer(int64_t count) { alloc(count); }
    ~OwnedBuffer() { release(); }
    OwnedBuffer(const OwnedBuffer&) = delete;
    OwnedBuffer& operator=(const OwnedBuffer&) = delete;
    OwnedBuffer(OwnedBuffer&& o) noexcept : ptr(o.ptr), n(o.n) { o.ptr = nullptr; o.n = 0; }
    OwnedBuffer& operator=(OwnedBuffer&& o) noexcept {
        if (this != &o) {
            release();
            ptr = o.ptr; n = o.n;
            o.ptr = nullptr; o.n = 0;
        }
        return *this;
    }
    // (Re)allocates when count differs; contents are undefined afterwards.
    void alloc(int64_t count) {
        if (count == n && ptr) return;
        release();
        if (count > 0) {
            if constexpr (kPinned) CUDA_CHECK(cudaMallocHost((void**)&ptr, (size_t)count * sizeof(E)));
            else CUDA_CHECK(cudaMalloc((void**)&ptr, (size_t)count * sizeof(E)));
        }
        n = count;
    }
    void release() {
        if (ptr) {
            if constexpr (kPinned) cudaFreeHost(ptr);
            else cudaFree(ptr);
        }
        ptr = nullptr;
        n = 0;
    }
    int64_t bytes() const { return n * (int64_t)sizeof(E); }
    E* get() const { return ptr; }
};
// Device memory.
template <typename E>
using DeviceBuffer = OwnedBuffer<E, false>;
// Page-locked host memory: the only host memory an asynchronous copy inside a CUDA graph may read
// or write (the copy node reads it when the graph runs, not when it is captured).
template <typename E>
using PinnedBuffer = OwnedBuffer<E, true>;

// Captures everything enqueue() puts on stream s (a created stream; stream 0 cannot be captured)
// into a CUDA graph and instantiates it; *nodes = its node count. Any error inside (an operation
// CUDA refuses during a capture, a failed launch) ends the capture first and throws ldm::Error
// naming `what` and the --cuda-graph 0 alternative. The caller owns the result
// (cudaGraphExecDestroy).
template <class F>
cudaGraphExec_t capture_graph(cudaStream_t s, F&& enqueue, int64_t* nodes, const char* what) {
    cudaGraphExec_t exec = nullptr;
    try {
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        cudaGraph_t g = nullptr;
        try {
            enqueue();
        } catch (...) {
            (void)cudaStreamEndCapture(s, &g);  // end the capture before reporting the error
            if (g) (void)cudaGraphDestroy(g);
            throw;
        }
        CUDA_CHECK(cudaStreamEndCapture(s, &g));
        size_t n = 0;
        const cudaError_t en = cudaGraphGetNodes(g, nullptr, &n);
        const cudaError_t e = en != cudaSuccess ? en : cudaGraphInstantiate(&exec, g, 0);
        (void)cudaGraphDestroy(g);
        if (e != cudaSuccess) {
            exec = nullptr;
            CUDA_CHECK(e);
        }
        if (nodes) *nodes = (int64_t)n;
    } catch (const std::exception& e) {
        throw Error(std::string("--cuda-graph 1: capturing ") + what + " as a CUDA graph failed (" + e.what() +
                    "); --cuda-graph 0 launches every kernel instead");
    }
    return exec;
}

// Host fp32/fp64/any -> device T, converting through fp32 (blocking); straight from src when H is T.
template <typename T, typename H>
inline void upload(T* dst, const H* src, int64_t n) {
    if constexpr (std::is_same<T, H>::value) {
        CUDA_CHECK(cudaMemcpy(dst, src, (size_t)n * sizeof(T), cudaMemcpyHostToDevice));
    } else {
        std::vector<T> tmp((size_t)n);
        for (int64_t i = 0; i < n; i++) tmp[(size_t)i] = from_f<T>((float)src[i]);
        CUDA_CHECK(cudaMemcpy(dst, tmp.data(), (size_t)n * sizeof(T), cudaMemcpyHostToDevice));
    }
}
// Device T -> host float (blocking).
template <typename T>
inline std::vector<float> download(const T* src, int64_t n) {
    std::vector<float> out((size_t)n);
    if constexpr (std::is_same<T, float>::value) {
        CUDA_CHECK(cudaMemcpy(out.data(), src, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    } else {
        std::vector<T> tmp((size_t)n);
        CUDA_CHECK(cudaMemcpy(tmp.data(), src, (size_t)n * sizeof(T), cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < n; i++) out[(size_t)i] = to_f(tmp[(size_t)i]);
    }
    return out;
}

// Fills n device values with a constant (e.g. NaN poison before a kernel writes them).
template <typename T>
void fill(T* dst, int64_t n, float value, cudaStream_t s);

template <typename T>
__global__ void fill_kernel(T* dst, int64_t n, T v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = v;
}
template <typename T>
void fill(T* dst, int64_t n, float value, cudaStream_t s) {
    if (n <= 0) return;
    int64_t blocks = ceil_div(n, 256);
    if (blocks > 65535 * 8) blocks = 65535 * 8;
    fill_kernel<T><<<(unsigned)blocks, 256, 0, s>>>(dst, n, from_f<T>(value));
    LDM_LAUNCH_CHECK();
}

// Elapsed-time measurement with CUDA events on one stream (milliseconds).
struct Timer {
    cudaEvent_t a = nullptr, b = nullptr;
    Timer() {
        CUDA_CHECK(cudaEventCreate(&a));
        CUDA_CHECK(cudaEventCreate(&b));
    }
    ~Timer() {
        if (a) cudaEventDestroy(a);
        if (b) cudaEventDestroy(b);
    }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;
    void start(cudaStream_t s = 0) { CUDA_CHECK(cudaEventRecord(a, s)); }
    float stop_ms(cudaStream_t s = 0) {
        CUDA_CHECK(cudaEventRecord(b, s));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        return ms;
    }
};

// Median (core/common.h median(): for an even `reps` the mean of the two middle times) of the
// per-call times (ms) of fn() over `reps` >= 1 calls after `warmup` calls, timed with events on
// stream s. fn must enqueue its work on s.
template <typename F>
inline float time_median_ms(F&& fn, int warmup, int reps, cudaStream_t s = 0) {
    for (int i = 0; i < warmup; i++) fn();
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<double> t;
    Timer tm;
    for (int i = 0; i < reps; i++) {
        tm.start(s);
        fn();
        t.push_back(tm.stop_ms(s));
    }
    return float(median(t));
}

// Relative error ||a - b|| / max(||b||, tiny) in double, and whether any value is non-finite.
struct Compare {
    double rel = 0, max_abs = 0;
    bool finite = true;
};
inline Compare compare(const float* a, const float* b, int64_t n) {
    Compare c;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (!std::isfinite(x) || !std::isfinite(y)) c.finite = false;
        num += (x - y) * (x - y);
        den += y * y;
        c.max_abs = std::max(c.max_abs, std::fabs(x - y));
    }
    c.rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
    return c;
}

}  // namespace gpu
}  // namespace ldm
