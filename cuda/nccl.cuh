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

// Equal NCCL shards over n elements: shard = ceil(n / world); the padded buffer holds
// world * shard >= n elements (the tail past n is padding, kept at zero).
inline int64_t padded_shard(int64_t n, int world) { return (n + world - 1) / world; }

}  // namespace gpu
}  // namespace ldm
