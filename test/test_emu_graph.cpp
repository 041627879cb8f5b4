// Stream capture and CUDA graphs under the CPU emulation (dev/emu/emu.h): what a capture records
// and what a replay does (kernel arguments copied at capture time, copies and memsets in order,
// nothing run during the capture), and the operations CUDA refuses inside a capture, which the
// emulator must refuse too (they abort the process: each runs in a forked child, run_child of
// test/helpers.h, whose exit signal and message are checked). The trainers' --cuda-graph path is
// checked end to end in test_emu_train.cpp.
#include <catch2/catch.hpp>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dev/emu/emu.h"
#include "test/helpers.h"

namespace {

// y[i] = y[i] * scale + add for i < n (one thread per element).
__global__ void affine_kernel(float* y, float scale, float add, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * scale + add;
}

}  // namespace

TEST_CASE("emu graph: a capture records in order without running; replays run it again each time", "[emu][graph]") {
    const int n = 37;
    float *a = nullptr, *b = nullptr, *pinned = nullptr;
    REQUIRE(cudaMalloc(&a, n * 4) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, n * 4) == cudaSuccess);
    REQUIRE(cudaMallocHost(&pinned, n * 4) == cudaSuccess);
    std::vector<float> init(n);
    for (int i = 0; i < n; i++) init[i] = 0.25f * (float)(i + 1) - 3.0f;
    REQUIRE(cudaMemcpy(a, init.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
    CHECK(s != nullptr);  // a created stream is not the legacy one

    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    cudaStreamCaptureStatus st;
    REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
    CHECK(st == cudaStreamCaptureStatusActive);
    float scale = 2.0f;
    emu::launch(dim3(2), dim3(32), 0, s, affine_kernel, a, scale, 1.0f, n);  // a = 2a + 1
    scale = 100.0f;  // the capture copied the argument: the replay must still use 2
    REQUIRE(cudaMemcpyAsync(b, a, n * 4, cudaMemcpyDeviceToDevice, s) == cudaSuccess);  // b = a
    emu::launch(dim3(1), dim3(64), 0, s, affine_kernel, b, -1.0f, 0.5f, n);           // b = 0.5 - b
    REQUIRE(cudaMemsetAsync(a, 0, 4, s) == cudaSuccess);                                 // a[0] = 0
    REQUIRE(cudaMemcpyAsync(pinned, b, n * 4, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    cudaGraph_t g = nullptr;
    REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
    size_t nodes = 0;
    REQUIRE(cudaGraphGetNodes(g, nullptr, &nodes) == cudaSuccess);
    CHECK(nodes == 5);
    // nothing ran during the capture
    for (int i = 0; i < n; i++) REQUIRE(a[i] == init[i]);
    cudaGraphExec_t e = nullptr;
    REQUIRE(cudaGraphInstantiate(&e, g, 0) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);  // the executable graph stays valid

    // two replays against the same steps done by hand (exact in fp32: small dyadic values)
    std::vector<double> ha(init.begin(), init.end()), hb(n);
    for (int rep = 0; rep < 2; rep++) {
        REQUIRE(cudaGraphLaunch(e, s) == cudaSuccess);
        CHECK(emu::stream_work_pending() == 1);  // the replay is work of s: queued until a sync
        REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
        for (int i = 0; i < n; i++) {
            ha[i] = 2.0 * ha[i] + 1.0;
            hb[i] = 0.5 - ha[i];
        }
        ha[0] = 0.0;
        for (int i = 0; i < n; i++) {
            INFO("replay " << rep << " element " << i);
            CHECK(a[i] == (float)ha[i]);
            CHECK(b[i] == (float)hb[i]);
            CHECK(pinned[i] == (float)hb[i]);
        }
    }
    CHECK(emu::graph_replays() >= 2);
    REQUIRE(cudaGraphExecDestroy(e) == cudaSuccess);
    REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
    CHECK(st == cudaStreamCaptureStatusNone);
    // after the capture, launches are work of the stream again (emu.h "streams")
    emu::launch(dim3(1), dim3(64), 0, s, affine_kernel, a, 1.0f, 1.0f, n);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(a[0] == 1.0f);
    cudaFreeHost(pinned);
    cudaFree(a);
    cudaFree(b);
}

TEST_CASE("emu graph: what CUDA refuses during a capture aborts with a message", "[emu][graph]") {
    struct Case {
        const char* name;
        const char* message;  // part of the emulator's message
        std::function<void(cudaStream_t, float*, float*)> op;
    };
    const Case cases[] = {
        {"stream synchronize", "cudaStreamSynchronize", [](cudaStream_t s, float*, float*) { (void)cudaStreamSynchronize(s); }},
        {"device synchronize", "cudaDeviceSynchronize", [](cudaStream_t, float*, float*) { (void)cudaDeviceSynchronize(); }},
        {"synchronous copy", "cudaMemcpy (synchronous)",
         [](cudaStream_t, float* d, float* d2) { (void)cudaMemcpy(d, d2, 16, cudaMemcpyDeviceToDevice); }},
        {"synchronous memset", "cudaMemset (synchronous)", [](cudaStream_t, float* d, float*) { (void)cudaMemset(d, 0, 16); }},
        {"pageable host copy", "pageable host memory",
         [](cudaStream_t s, float* d, float*) {
             std::vector<float> h(4, 1.0f);
             (void)cudaMemcpyAsync(d, h.data(), 16, cudaMemcpyHostToDevice, s);
         }},
        {"cudaMalloc", "cudaMalloc",
         [](cudaStream_t, float*, float*) {
             void* p = nullptr;
             (void)cudaMalloc(&p, 64);
         }},
        {"launch on stream 0", "another stream",
         [](cudaStream_t, float* d, float*) { emu::launch(dim3(1), dim3(32), 0, nullptr, affine_kernel, d, 1.0f, 1.0f, 4); }},
        {"second capture", "already active",
         [](cudaStream_t, float*, float*) {
             cudaStream_t t = nullptr;
             (void)cudaStreamCreate(&t);
             (void)cudaStreamBeginCapture(t, cudaStreamCaptureModeThreadLocal);
         }},
    };
    for (const Case& c : cases) {
        const ChildResult d = run_child([&] {
            float *x = nullptr, *y = nullptr;
            (void)cudaMalloc(&x, 64);
            (void)cudaMalloc(&y, 64);
            cudaStream_t s = nullptr;
            (void)cudaStreamCreate(&s);
            (void)cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
            c.op(s, x, y);
        });
        INFO(c.name << ": child stderr: " << d.err);
        CHECK(d.aborted);
        CHECK_THAT(d.err, Catch::Contains(c.message));
    }
    // the legacy stream cannot be captured
    const ChildResult d0 = run_child([] { (void)cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeThreadLocal); });
    CHECK(d0.aborted);
    CHECK_THAT(d0.err, Catch::Contains("legacy default stream"));
    // and the allowed operations do not abort: async device copies, pinned host copies, a kernel
    const ChildResult ok = run_child([] {
        float *x = nullptr, *y = nullptr, *h = nullptr;
        (void)cudaMalloc(&x, 64);
        (void)cudaMalloc(&y, 64);
        (void)cudaMallocHost(&h, 64);
        cudaStream_t s = nullptr;
        (void)cudaStreamCreate(&s);
        (void)cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        (void)cudaMemcpyAsync(x, h, 64, cudaMemcpyHostToDevice, s);
        (void)cudaMemcpyAsync(y, x, 64, cudaMemcpyDeviceToDevice, s);
        (void)cudaMemsetAsync(y, 0, 64, s);
        emu::launch(dim3(1), dim3(32), 0, s, affine_kernel, x, 1.0f, 1.0f, 16);
        cudaGraph_t g = nullptr;
        (void)cudaStreamEndCapture(s, &g);
        (void)cudaGraphDestroy(g);
    });
    INFO("allowed operations: " << ok.err);
    CHECK(!ok.aborted);
}
