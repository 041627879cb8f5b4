// cuda/nccl.cuh — NCCL for the GPU trainers' data parallelism (issue #10; doc/distributed.md).
//
// Process layout comes from core/dist.h (mpirun / srun / RANK+WORLD_SIZE). Each process drives one
// GPU: device = local_rank % cudaGetDeviceCount(), so the 8 ranks of a node take GPUs 0..7.
// The NCCL unique id (128 bytes) is created by rank 0 and shared
//   * through MPI (dist::broadcast<uint8_t>) when the launcher is MPI, or
//   * through a file on a shared filesystem (--nccl-id-file PATH) for launchers without MPI
//     (srun without --mpi, torchrun-style env): rank 0 writes it atomically (temp + rename), the
//     other ranks poll for it (timeout 300 s). Use a fresh path per job (e.g. include the job id);
//     rank 0 removes a stale file before writing.
//
// Typed wrappers: element counts are dist::Elems (an element count of T, never bytes); T is float,
// bf16 (ncclBfloat16), double, int32, int64, uint64 or uint8, mapped at compile time. NCCL counts
// are size_t, so no chunking is needed. All calls are asynchronous on the given stream.
// Errors throw ldm::Error naming the NCCL call.
#pragma once
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>

#include "core/common.h"
#include "core/dist.h"
#include "cuda/common.cuh"

namespace ldm {
namespace gpu {

// Throws ldm::Error("file:line: NCCL error <text> in <expr>") when an NCCL call fails.
#define NCCL_CHECK(expr)                                                                          \
    do {                                                                                          \
        ncclResult_t r_ = (expr);                                                                 \
        if (r_ != ncclSuccess)                                                                    \
            throw ::ldm::Error(::ldm::strprintf("%s:%d: NCCL error %d (%s) in %s", __FILE__,      \
                                                __LINE__, (int)r_, ncclGetErrorString(r_), #expr)); \
    } while (0)

// Compile-time datatype map (an unsupported T has no specialisation and fails to compile).
template <typename T>
struct NcclType;
template <> struct NcclType<float> { static constexpr ncclDataType_t value = ncclFloat32; };
template <> struct NcclType<bf16> { static constexpr ncclDataType_t value = ncclBfloat16; };
template <> struct NcclType<double> { static constexpr ncclDataType_t value = ncclFloat64; };
template <> struct NcclType<int32_t> { static constexpr ncclDataType_t value = ncclInt32; };
template <> struct NcclType<int64_t> { static constexpr ncclDataType_t value = ncclInt64; };
template <> struct NcclType<uint64_t> { static constexpr ncclDataType_t value = ncclUint64; };
template <> struct NcclType<uint8_t> { static constexpr ncclDataType_t value = ncclUint8; };

// The GPU of this process on its node: local_rank % visible devices. ldm::Error without a GPU.
inline int local_device(const dist::Context& c) {
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n < 1) throw Error("no GPU visible to this process");
    return c.local_rank % n;
}

// Shares the 128-byte unique id of rank 0 through a file (see the header comment).
inline void share_id_via_file(ncclUniqueId& id, const dist::Context& c, const std::string& path, double timeout_s = 300) {
    if (c.rank == 0) {
        write_file_atomic(path, &id, sizeof(id));
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
        if (file_exists(path)) {
            std::string b = read_file(path);
            if (b.size() == sizeof(id)) {
                std::memcpy(&id, b.data(), sizeof(id));
                return;
            }
        }
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
            throw Error(strprintf("--nccl-id-file %s: rank 0 did not write the NCCL id within %.0f s", path.c_str(), timeout_s));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

// One NCCL communicator over all ranks of the job, on this process's GPU.
struct NcclComm {
    ncclComm_t comm = nullptr;
    int rank = 0, world = 1, device = 0;

    NcclComm() = default;
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;
    ~NcclComm() {
        if (comm) ncclCommDestroy(comm);
    }

    // Selects the device (cudaSetDevice(local_device(c))) and creates the communicator. With a
    // world of 1 it still creates a one-rank communicator (used to measure the cost of the NCCL
    // path on one GPU). id_file: "" = share the id through MPI (ldm::Error if the launcher has
    // none and world > 1).
    void init(const dist::Context& c, const std::string& id_file = "") {
        device = local_device(c);
        CUDA_CHECK(cudaSetDevice(device));
        rank = c.rank;
        world = c.world;
        ncclUniqueId id;
        std::memset(&id, 0, sizeof(id));
        if (rank == 0) {
            if (!id_file.empty()) std::remove(id_file.c_str());
            NCCL_CHECK(ncclGetUniqueId(&id));
        }
        if (world > 1) {
            if (!id_file.empty()) {
                share_id_via_file(id, c, id_file);
            } else {
                if (!c.mpi)
                    throw Error("NCCL: " + std::to_string(world) + " processes from launcher '" + c.launcher +
                                "' without MPI: pass --nccl-id-file PATH on a filesystem shared by all ranks");
                dist::Span<uint8_t> bytes(reinterpret_cast<uint8_t*>(&id), dist::Elems(sizeof(id)));
                dist::broadcast<uint8_t>(bytes, 0);
            }
        }
        NCCL_CHECK(ncclCommInitRank(&comm, world, id, rank));
    }
};

// recv[i] = sum over ranks of send[i], count elements (send == recv allowed: in place).
template <typename T>
inline void nccl_all_reduce_sum(NcclComm& c, const T* send, T* recv, dist::Elems count, cudaStream_t s) {
    NCCL_CHECK(ncclAllReduce(send, recv, size_t(count.n), NcclType<T>::value, ncclSum, c.comm, s));
}

// send: [world * recv_count] on every rank; recv: [recv_count] = sum over ranks of
// send[rank * recv_count + i]. Equal shards: callers pad the buffer to a multiple of world
// (padded_shard below). In place when recv == send + rank * recv_count.
template <typename T>
inline void nccl_reduce_scatter_sum(NcclComm& c, const T* send, T* recv, dist::Elems recv_count, cudaStream_t s) {
    NCCL_CHECK(ncclReduceScatter(send, recv, size_t(recv_count.n), NcclType<T>::value, ncclSum, c.comm, s));
}

// send: [send_count] of this rank; recv: [world * send_count], rank p's part at p * send_count.
// In place when send == recv + rank * send_count.
template <typename T>
inline void nccl_all_gather(NcclComm& c, const T* send, T* recv, dist::Elems send_count, cudaStream_t s) {
    NCCL_CHECK(ncclAllGather(send, recv, size_t(send_count.n), NcclType<T>::value, c.comm, s));
}

// Equal NCCL shards over n elements: shard = ceil(n / world) rounded up to a multiple of 64
// elements (so every rank's slice starts 256-byte aligned, like the full arrays); the padded
// buffer holds world * shard >= n elements (the tail past n is padding, kept at zero).
inline int64_t padded_shard(int64_t n, int world) { return ((n + world - 1) / world + 63) / 64 * 64; }

// ---- Data parallelism of the GPU trainers (cuda/trainer.cuh; doc/distributed.md) -------------
// One process per GPU. Gradients (fp32 [n], already scaled by 1/global micro-batches) are summed
// over the ranks after the backward pass of the step's last micro-batch, on the compute stream
// (not overlapped per layer: the backward lives in cuda/gpt.cuh and has no per-layer hook yet).
//   ZeRO-0: in-place all-reduce of the gradients; every rank runs the full AdamW.
//   ZeRO-1: the gradients are copied into a buffer padded to W * S (S >= ceil(n / W)) and
//   reduce-scattered; rank r owns [r S, min(n, (r+1) S)) of the AdamW state (S: padded_shard) and updates that slice
//   of the fp32 master weights, which are then all-gathered (fp32: the schemes read some
//   parameters from the master copy, and every rank's master stays complete for checkpoints);
//   the bf16 working copy is refreshed locally.
// With W = 1 and force_nccl the same path runs on a one-rank communicator (to measure its cost).
struct GpuDataParallel {
    int world = 1, rank = 0;
    bool nccl = false, zero1 = false, mpi = false;
    int64_t n = 0, S = 0, own_off = 0, own_count = 0;
    NcclComm comm;
    DeviceBuffer<float> pad;       // [W * S] ZeRO-1 staging (tail past n stays zero)
    DeviceBuffer<double> scalar;   // [1] NCCL scalar sums without MPI

    // Sets the device (local rank) and, when W > 1 or force_nccl, the communicator.
    void init(const dist::Context& c, int64_t n_params, int zero, bool force_nccl, const std::string& id_file) {
        world = c.world;
        rank = c.rank;
        mpi = c.mpi;
        n = n_params;
        nccl = world > 1 || force_nccl;
        if (nccl) comm.init(c, id_file);
        else CUDA_CHECK(cudaSetDevice(local_device(c)));
        zero1 = nccl && zero == 1;
        S = padded_shard(n, world);
        own_off = zero1 ? int64_t(rank) * S : 0;
        own_count = zero1 ? std::max<int64_t>(0, std::min(n, own_off + S) - own_off) : n;
        if (zero1) {
            pad.alloc(int64_t(world) * S);
            CUDA_CHECK(cudaMemset(pad.ptr, 0, size_t(pad.bytes())));
        }
        if (nccl) scalar.alloc(1);
    }
    // Length of this rank's AdamW state: S (ZeRO-1) or n.
    int64_t state_len() const { return zero1 ? S : n; }

    // Sums the gradients over the ranks. Returns the reduced gradients this rank updates with:
    // grads itself (ZeRO-0 / no NCCL), or its own slice [own_off, own_off + own_count) (ZeRO-1).
    float* reduce_grads(float* grads, cudaStream_t s) {
        if (!nccl) return grads;
        if (!zero1) {
            nccl_all_reduce_sum<float>(comm, grads, grads, dist::Elems(n), s);
            return grads;
        }
        CUDA_CHECK(cudaMemcpyAsync(pad.ptr, grads, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, s));
        float* mine = pad.ptr + int64_t(rank) * S;
        nccl_reduce_scatter_sum<float>(comm, pad.ptr, mine, dist::Elems(S), s);
        return mine;
    }
    // ZeRO-1, after this rank updated master[own_off, +own_count): every rank gets all of master.
    void allgather_master(float* master, cudaStream_t s) { allgather_full(master, s); }
    // ZeRO-1: all-gathers a vector of which this rank holds [own_off, +own_count) into full [n]
    // (in place in `full`); also used for the AdamW moments at checkpoint time (own = state[0:S]).
    void allgather_full(float* full, cudaStream_t s, const float* own = nullptr) {
        if (!zero1) return;
        float* mine = pad.ptr + int64_t(rank) * S;
        if (own_count > 0)
            CUDA_CHECK(cudaMemcpyAsync(mine, own ? own : full + own_off, size_t(own_count) * sizeof(float),
                                       cudaMemcpyDeviceToDevice, s));
        nccl_all_gather<float>(comm, mine, pad.ptr, dist::Elems(S), s);
        CUDA_CHECK(cudaMemcpyAsync(full, pad.ptr, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        // the staging tail must stay zero for the next reduce-scatter
        if (int64_t(world) * S > n)
            CUDA_CHECK(cudaMemsetAsync(pad.ptr + n, 0, size_t(int64_t(world) * S - n) * sizeof(float), s));
    }
    // Sum of a host scalar over the ranks (identical on every rank): rank-ordered over MPI when
    // there is MPI, else an NCCL fp64 all-reduce; x itself when W = 1.
    double sum(double x, cudaStream_t s) {
        if (world == 1) return x;
        if (mpi) return dist::sum_ordered(x);
        CUDA_CHECK(cudaMemcpyAsync(scalar.ptr, &x, sizeof(double), cudaMemcpyHostToDevice, s));
        nccl_all_reduce_sum<double>(comm, scalar.ptr, scalar.ptr, dist::Elems(1), s);
        CUDA_CHECK(cudaMemcpyAsync(&x, scalar.ptr, sizeof(double), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        return x;
    }
    // Every rank waits for every other (MPI barrier, else an NCCL sum).
    void barrier(cudaStream_t s) {
        if (world == 1) return;
        if (mpi) dist::barrier();
        else (void)sum(0.0, s);
    }
};

}  // namespace gpu
}  // namespace ldm
