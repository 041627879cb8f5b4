// Streams and events under the CPU emulation (dev/emu/emu.h "streams"): work on a stream made by
// cudaStreamCreate waits in a queue until something orders it, so that a program which forgets a
// cudaStreamWaitEvent or a synchronisation gets late results here as it may on a GPU. Checked: a
// queue runs at cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous cudaMemcpy (blocking
// streams only), cudaEventSynchronize (up to the record), a reached cudaStreamWaitEvent; a copy
// to pageable host memory is synchronous; a missing wait changes the result under one of the two
// stream orders or with the consumer's stream eager, a present one under none; a CUDA graph
// replayed onto a stream queues.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "dev/emu/emu.h"
#include "test/helpers.h"

namespace {

// a[i] = v for i < n
__global__ void fill_kernel(float* a, float v, int n) {
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) a[i] = v;
}
// dst[i] = 2 src[i] + 1
__global__ void twice_plus_one_kernel(float* dst, const float* src, int n) {
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) dst[i] = 2.f * src[i] + 1.f;
}

constexpr int kN = 100;
void fill(float* a, float v, cudaStream_t s) { emu::launch(dim3(1), dim3(128), 0, s, fill_kernel, a, v, kN); }
void twice_plus_one(float* dst, const float* src, cudaStream_t s) {
    emu::launch(dim3(1), dim3(128), 0, s, twice_plus_one_kernel, dst, src, kN);
}
bool all_equal(const float* a, float v) {
    for (int i = 0; i < kN; i++)
        if (!(a[i] == v)) return false;
    return true;
}

}  // namespace

TEST_CASE("emu streams: queued work runs when a synchronisation orders it", "[emu][streams]") {
    float *a = nullptr, *b = nullptr;
    REQUIRE(cudaMalloc(&a, kN * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, kN * sizeof(float)) == cudaSuccess);
    cudaStream_t s1 = nullptr, s2 = nullptr;
    REQUIRE(cudaStreamCreate(&s1) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);

    // a kernel on a created stream has not run when the launch returns; the stream's sync runs it
    fill(a, 3.f, s1);
    CHECK(emu::stream_work_pending() == 1);
    CHECK(std::isnan(a[0]));  // cudaMalloc's NaN fill: untouched
    REQUIRE(cudaStreamSynchronize(s1) == cudaSuccess);
    CHECK(all_equal(a, 3.f));
    CHECK(emu::stream_work_pending() == 0);

    // stream 0 work (a synchronous copy) orders the blocking stream s1, not the non-blocking s2
    float host[kN];
    fill(a, 4.f, s1);
    fill(b, 5.f, s2);
    REQUIRE(cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(all_equal(host, 4.f));
    REQUIRE(cudaMemcpy(host, b, sizeof host, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::isnan(host[0]));  // s2's fill is still queued: a GPU need not have run it either
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(all_equal(b, 5.f));

    // cudaEventSynchronize runs the stream up to the record, not past it
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreate(&e) == cudaSuccess);
    fill(a, 6.f, s1);
    REQUIRE(cudaEventRecord(e, s1) == cudaSuccess);
    fill(a, 7.f, s1);
    REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
    CHECK(all_equal(a, 6.f));
    CHECK(emu::stream_work_pending() == 1);

    // cudaMemcpyAsync into pageable host memory is synchronous for the host (after the stream's
    // earlier work); into pinned memory it is queued like a kernel
    REQUIRE(cudaMemcpyAsync(host, a, sizeof host, cudaMemcpyDeviceToHost, s1) == cudaSuccess);
    CHECK(all_equal(host, 7.f));
    float* pinned = nullptr;
    REQUIRE(cudaMallocHost(&pinned, kN * sizeof(float)) == cudaSuccess);
    std::memset(pinned, 0, kN * sizeof(float));
    fill(a, 8.f, s1);
    REQUIRE(cudaMemcpyAsync(pinned, a, kN * sizeof(float), cudaMemcpyDeviceToHost, s1) == cudaSuccess);
    CHECK(pinned[0] == 0.f);
    REQUIRE(cudaStreamSynchronize(s1) == cudaSuccess);
    CHECK(all_equal(pinned, 8.f));

    // a graph captured on s1 and replayed onto it queues behind the stream's earlier work
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    REQUIRE(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal) == cudaSuccess);
    twice_plus_one(b, a, s1);
    REQUIRE(cudaStreamEndCapture(s1, &g) == cudaSuccess);
    REQUIRE(cudaGraphInstantiate(&ge, g, nullptr, nullptr, 0) == cudaSuccess);
    fill(a, 1.f, s1);
    REQUIRE(cudaGraphLaunch(ge, s1) == cudaSuccess);
    CHECK(emu::stream_work_pending() == 2);
    REQUIRE(cudaStreamSynchronize(s1) == cudaSuccess);
    CHECK(all_equal(b, 3.f));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);

    cudaEventDestroy(e);
    cudaFreeHost(pinned);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    cudaFree(a);
    cudaFree(b);
}

TEST_CASE("emu streams: a missing cudaStreamWaitEvent shows under one stream order, a present one under none",
          "[emu][streams]") {
    // producer (stream p): a = 5; consumer (stream c): b = 2a + 1 = 11, ordered by an event or not.
    // `producer_first`: the producer's stream is made first (forward order runs it first); `eager`:
    // which stream runs its work at once (set_eager_stream: 0 none, 1 the first made, 2 the last).
    auto run = [](bool with_wait, emu::Order order, bool producer_first, int eager = 0) {
        emu::set_stream_order(order);
        emu::set_eager_stream(eager);
        float *a = nullptr, *b = nullptr;
        REQUIRE(cudaMalloc(&a, kN * sizeof(float)) == cudaSuccess);
        REQUIRE(cudaMalloc(&b, kN * sizeof(float)) == cudaSuccess);
        cudaStream_t p = nullptr, c = nullptr;
        if (producer_first) {
            REQUIRE(cudaStreamCreate(&p) == cudaSuccess);
            REQUIRE(cudaStreamCreate(&c) == cudaSuccess);
        } else {
            REQUIRE(cudaStreamCreate(&c) == cudaSuccess);
            REQUIRE(cudaStreamCreate(&p) == cudaSuccess);
        }
        cudaEvent_t done = nullptr;
        REQUIRE(cudaEventCreate(&done) == cudaSuccess);
        REQUIRE(cudaMemset(a, 0, kN * sizeof(float)) == cudaSuccess);
        fill(a, 5.f, p);
        REQUIRE(cudaEventRecord(done, p) == cudaSuccess);
        if (with_wait) REQUIRE(cudaStreamWaitEvent(c, done, 0) == cudaSuccess);
        twice_plus_one(b, a, c);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        const bool right = all_equal(b, 11.f);
        cudaEventDestroy(done);
        cudaStreamDestroy(p);
        cudaStreamDestroy(c);
        cudaFree(a);
        cudaFree(b);
        emu::set_stream_order(emu::Order::kForward);
        emu::set_eager_stream(0);
        return right;
    };
    for (bool producer_first : {true, false}) {
        INFO("producer stream made first: " << producer_first);
        for (emu::Order o : {emu::Order::kForward, emu::Order::kReverse, emu::Order::kRandom}) {
            INFO("stream order " << emu::order_name(o));
            CHECK(run(true, o, producer_first));
        }
        // without the wait: right when the producer's queue happens to run first, wrong otherwise
        CHECK(run(false, emu::Order::kForward, producer_first) == producer_first);
        CHECK(run(false, emu::Order::kReverse, producer_first) == !producer_first);
        // an eager consumer runs at its launch, before the queued producer, unless it waits
        const int consumer_eager = producer_first ? 2 : 1, producer_eager = 3 - consumer_eager;
        CHECK(!run(false, emu::Order::kForward, producer_first, consumer_eager));
        CHECK(run(true, emu::Order::kForward, producer_first, consumer_eager));
        CHECK(run(false, emu::Order::kForward, producer_first, producer_eager));
        CHECK(run(true, emu::Order::kReverse, producer_first, producer_eager));
    }

    // the wait is on the record made before it: a later record of the same event does not count
    float* a = nullptr;
    REQUIRE(cudaMalloc(&a, kN * sizeof(float)) == cudaSuccess);
    cudaStream_t p = nullptr, c = nullptr;
    REQUIRE(cudaStreamCreate(&p) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&c) == cudaSuccess);
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreate(&e) == cudaSuccess);
    fill(a, 1.f, p);
    REQUIRE(cudaEventRecord(e, p) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(c, e, 0) == cudaSuccess);
    fill(a, 2.f, p);
    REQUIRE(cudaEventRecord(e, p) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(c) == cudaSuccess);  // c's wait runs p up to the first record
    CHECK(all_equal(a, 1.f));
    CHECK(emu::stream_work_pending() == 2);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(all_equal(a, 2.f));
    cudaEventDestroy(e);
    cudaStreamDestroy(p);
    cudaStreamDestroy(c);
    cudaFree(a);
}
