// cuda/nccl.cuh — NCCL for the GPU trainers' data parallelism (issue #10; doc/distributed.md).
//
// Process layout comes from core/dist.h (mpirun / srun / RANK+WORLD_SIZE). Each process drives one
// GPU: device = local_rank % cudaGetDeviceCount(), so the 8 ranks of a node take GPUs 0..7.
// The NCCL unique id (128 bytes) is created by rank 0 and shared
//   * through MPI (dist::broadcast<uint8_t>) when the launcher is MPI, or
//   * through a file on a shared filesystem (--nccl-id-file PATH) for launchers without MPI
//     (srun without --mpi, torchrun-style env): rank 0 writes it atomically (temp + rename), the
//     other ranks poll for it (timeout 300 s). The file names the launch (core/rendezvous.h), so
//     a file left by an earlier Slurm or torchrun job is not read; rank 0 also removes it first.
//     Other launchers: use a fresh path per job.
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
#include <vector>
#include <algorithm>

#include "core/common.h"
#include "core/dist.h"
#include "core/rendezvous.h"
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

// Shares the 128-byte unique id of rank 0 through a file (see the header comment and
// core/rendezvous.h): rank 0 writes it with this launch's world and tag; the other ranks wait until
// a file of this launch is there (a stale file of an earlier job is waited past, not read), and
// throw ldm::Error naming the path and what they last found after timeout_s.
inline void share_id_via_file(ncclUniqueId& id, const dist::Context& c, const std::string& path, double timeout_s = 300) {
    const std::string tag = rendezvous_launch_tag();
    if (c.rank == 0) {
        const std::string b = rendezvous_encode(&id, sizeof(id), c.world, tag);
        write_file_atomic(path, b.data(), b.size());
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::string last = "no file";
    for (;;) {
        if (file_exists(path)) {
            std::string b;
            try {
                b = read_file(path);
            } catch (const Error&) {  // replaced between the check and the read
                b.clear();
            }
            if (rendezvous_decode(b, sizeof(id), c.world, tag, &id, &last)) return;
        }
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
            throw Error(strprintf("--nccl-id-file %s: rank 0 of this launch did not write the NCCL id within %.0f s "
                                  "(last seen: %s)",
                                  path.c_str(), timeout_s, last.c_str()));
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

// ncclReduce: recv[i] on rank `root` = sum over ranks of send[i], count elements (send == recv:
// in place; recv is not written on the other ranks).
template <typename T>
inline void nccl_reduce_sum(NcclComm& c, const T* send, T* recv, dist::Elems count, int root, cudaStream_t s) {
    NCCL_CHECK(ncclReduce(send, recv, size_t(count.n), NcclType<T>::value, ncclSum, root, c.comm, s));
}

// ncclBroadcast: recv[i] = send[i] of rank `root` on every rank (send == recv: in place).
template <typename T>
inline void nccl_broadcast(NcclComm& c, const T* send, T* recv, dist::Elems count, int root, cudaStream_t s) {
    NCCL_CHECK(ncclBroadcast(send, recv, size_t(count.n), NcclType<T>::value, root, c.comm, s));
}

// Equal NCCL shards over n elements: shard = ceil(n / world) rounded up to a multiple of 64
// elements (so every rank's slice starts 256-byte aligned, like the full arrays); the padded
// buffer holds world * shard >= n elements (the tail past n is padding, kept at zero).
// Same formula as dist::padded_shard_size (the host-side layout the tests check).
inline int64_t padded_shard(int64_t n, int world) { return dist::padded_shard_size(n, world); }

// Smallest gradient bucket of the overlap path, in fp32 elements (16 MiB): smaller adjacent
// ranges (norm weights, tiny blocks) are merged so each NCCL launch moves enough bytes.
constexpr int64_t kNcclMinBucketElems = int64_t(1) << 22;

// ---- Data parallelism of the GPU trainers (cuda/trainer.cuh; doc/distributed.md) -------------
// One process per GPU. Gradients (fp32 [n], already scaled by 1/global micro-batches) are summed
// over the ranks. Rank r's ZeRO-1 slice is [own_off, own_off + own_count) = [r S, min(n, (r+1) S))
// (S: padded_shard) in both paths below, so checkpoints, resume and resharding do not depend on
// the path. Two paths (--nccl-overlap):
//
// Overlapped (overlap = true; --nccl-overlap 1, off by default until run on GPUs): the gradient is cut into buckets
// (dist::plan_grad_buckets: contiguous ranges whose gradients become final together, about one
// transformer block each). On the step's last micro-batch Transformer::backward calls on_grads_final(stage)
// at each backward stage; an event recorded on the compute stream makes the communication stream
// wait for exactly those gradients, and the stage's buckets are reduced there while backward
// continues on the compute stream. finish_reduction() makes the compute stream wait before the
// optimizer.
//   ZeRO-0: in-place ncclAllReduce per bucket.
//   ZeRO-1: per bucket, one in-place ncclReduce per owner's piece of it (dist::split_by_owner) to
//   that owner, in one NCCL group: rank r ends with the summed gradients of its own slice, in place
//   in the gradient array (no padded staging buffer). After the update of its slice (fp32 master
//   and bf16 working copy), gather_params() broadcasts each owner's slice of the bf16 WORKING COPY
//   (half the bytes of fp32) plus the fp32 master of the scheme parameters (the schemes read those
//   from the master) from its owner, grouped in-place ncclBroadcasts. The rest of the fp32 master
//   is then stale outside the own slice (it is only read there, by AdamW); allgather_master()
//   completes it before a checkpoint.
// Flat (overlap = false, the default): after the backward of the last micro-batch, on the
// compute stream: ZeRO-0 all-reduces the whole gradient in place; ZeRO-1 copies it into a buffer
// padded to W * S, reduce-scatters, updates its slice, all-gathers the fp32 master and refreshes the
// bf16 working copy locally.
// With W = 1 and force_nccl the same paths run on a one-rank communicator (to measure their cost).
struct GpuDataParallel {
    int world = 1, rank = 0;
    bool nccl = false, zero1 = false, mpi = false, overlap = false;
    int64_t n = 0, S = 0, own_off = 0, own_count = 0;
    NcclComm comm;
    DeviceBuffer<float> pad;       // [W * S] ZeRO-1 staging of the flat path (tail past n stays zero)
    DeviceBuffer<double> scalar;   // [1] NCCL scalar sums without MPI
    // overlap path
    std::vector<dist::GradBucket> buckets;               // backward order
    std::vector<std::vector<dist::ReducePiece>> pieces;  // ZeRO-1: buckets[i] cut at the owners' shards
    cudaStream_t comm_stream = nullptr;
    std::vector<cudaEvent_t> stage_ready;  // one per backward stage
    cudaEvent_t comm_done = nullptr;
    float* grads_ = nullptr;
    size_t launched_ = 0;   // buckets whose reduction was enqueued this step
    bool pending_ = false;  // reductions enqueued and not yet waited for
    bool ready_ = false;    // every bucket of this step reduced and waited for (reset by reduce_grads)

    GpuDataParallel() = default;
    GpuDataParallel(const GpuDataParallel&) = delete;
    GpuDataParallel& operator=(const GpuDataParallel&) = delete;
    ~GpuDataParallel() {
        for (cudaEvent_t e : stage_ready) cudaEventDestroy(e);
        if (comm_done) cudaEventDestroy(comm_done);
        if (comm_stream) cudaStreamDestroy(comm_stream);
    }

    // Sets the device (local rank) and, when W > 1 or force_nccl, the communicator. overlap_:
    // the overlapped path (then call plan_overlap before training); ignored without NCCL.
    void init(const dist::Context& c, int64_t n_params, int zero, bool force_nccl, const std::string& id_file,
              bool overlap_ = false) {
        world = c.world;
        rank = c.rank;
        mpi = c.mpi;
        n = n_params;
        nccl = world > 1 || force_nccl;
        if (nccl) comm.init(c, id_file);
        else CUDA_CHECK(cudaSetDevice(local_device(c)));
        zero1 = nccl && zero == 1;
        overlap = nccl && overlap_;
        S = padded_shard(n, world);
        const dist::Shard own = dist::padded_shard_range(n, world, rank);
        own_off = zero1 ? own.offset : 0;
        own_count = zero1 ? own.count : n;
        if (zero1 && !overlap) {
            pad.alloc(int64_t(world) * S);
            CUDA_CHECK(cudaMemset(pad.ptr, 0, size_t(pad.bytes())));
        }
        if (nccl) scalar.alloc(1);
    }
    // Length of this rank's AdamW state: S (ZeRO-1) or n.
    int64_t state_len() const { return zero1 ? S : n; }

    // Overlap path: the bucket plan over the model's layout (specs: param_specs order, n_layer
    // blocks; buckets of at least min_bucket elements where adjacent ranges allow), the
    // communication stream and the events. grads: the model's fp32 gradient array [n]. No-op
    // unless overlap.
    void plan_overlap(const std::vector<ParamSpec>& specs, int n_layer, float* grads, int64_t min_bucket) {
        if (!overlap) return;
        grads_ = grads;
        buckets = dist::plan_grad_buckets(specs, n_layer, min_bucket);
        int64_t total = 0;
        for (const auto& b : buckets) total += b.count.n;
        if (total != n) throw Error(strprintf("GpuDataParallel: bucket plan covers %lld of %lld gradients", (long long)total, (long long)n));
        pieces.assign(buckets.size(), {});
        if (zero1)
            for (size_t i = 0; i < buckets.size(); i++)
                pieces[i] = dist::split_by_owner(buckets[i].offset, buckets[i].count, n, world);
        stage_ready.assign(size_t(dist::grad_stage_end(n_layer)) + 1, nullptr);
        for (cudaEvent_t& e : stage_ready) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&comm_done, cudaEventDisableTiming));
        CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    }

    // The Transformer::grad_hook of the step's last micro-batch: the gradients of every bucket of `stage`
    // are final once the work enqueued so far on the compute stream s has run. Enqueues their
    // reduction on the communication stream behind an event (s itself gets no work).
    void on_grads_final(int stage, cudaStream_t s) {
        if (!overlap || stage < 0 || size_t(stage) >= stage_ready.size()) return;
        bool any = false;
        for (const auto& b : buckets) any = any || b.stage == stage;
        if (!any) return;
        CUDA_CHECK(cudaEventRecord(stage_ready[size_t(stage)], s));
        CUDA_CHECK(cudaStreamWaitEvent(comm_stream, stage_ready[size_t(stage)], 0));
        NCCL_CHECK(ncclGroupStart());
        for (size_t i = 0; i < buckets.size(); i++) {
            const dist::GradBucket& b = buckets[i];
            if (b.stage != stage) continue;
            if (!zero1) {
                nccl_all_reduce_sum<float>(comm, grads_ + b.offset, grads_ + b.offset, b.count, comm_stream);
            } else {
                for (const dist::ReducePiece& p : pieces[i])
                    nccl_reduce_sum<float>(comm, grads_ + p.offset, grads_ + p.offset, p.count, p.root, comm_stream);
            }
            launched_++;
        }
        NCCL_CHECK(ncclGroupEnd());
        pending_ = true;
    }

    // Overlap path: the compute stream s waits for every enqueued reduction. Call after the
    // step's last backward, before anything else touches the gradients or the communicator.
    // ldm::Error if backward did not reach every stage (a bucket was never reduced).
    void finish_reduction(cudaStream_t s) {
        if (!overlap || !pending_) return;
        CUDA_CHECK(cudaEventRecord(comm_done, comm_stream));
        CUDA_CHECK(cudaStreamWaitEvent(s, comm_done, 0));
        pending_ = false;
        ready_ = true;
        const size_t got = launched_;
        launched_ = 0;
        if (got != buckets.size())
            throw Error(strprintf("GpuDataParallel: %zu of %zu gradient buckets were reduced (backward hook missed a stage)",
                                  got, buckets.size()));
    }

    // Sums the gradients over the ranks. Returns the reduced gradients this rank updates with:
    // grads itself (ZeRO-0 / no NCCL), or its own slice [own_off, own_off + own_count) (ZeRO-1).
    // Overlap path: the reductions were enqueued during backward; this only waits for them.
    float* reduce_grads(float* grads, cudaStream_t s) {
        if (!nccl) return grads;
        if (overlap) {
            finish_reduction(s);
            if (!ready_) throw Error("GpuDataParallel: overlap path without the backward hook on the last micro-batch");
            ready_ = false;
            return zero1 ? grads + own_off : grads;
        }
        if (!zero1) {
            nccl_all_reduce_sum<float>(comm, grads, grads, dist::Elems(n), s);
            return grads;
        }
        CUDA_CHECK(cudaMemcpyAsync(pad.ptr, grads, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, s));
        float* mine = pad.ptr + int64_t(rank) * S;
        nccl_reduce_scatter_sum<float>(comm, pad.ptr, mine, dist::Elems(S), s);
        return mine;
    }

    // In-place all-gather of the owners' slices of full[lo, hi) by grouped broadcasts: rank q's
    // slice [q S, min(n, (q+1) S)) ∩ [lo, hi) is sent from q to every rank. Any n, no padding.
    template <typename E>
    void broadcast_slices(E* full, int64_t lo, int64_t hi, cudaStream_t s) {
        if (hi <= lo) return;
        NCCL_CHECK(ncclGroupStart());
        for (int q = 0; q < world; q++) {
            const dist::Shard sh = dist::padded_shard_range(n, world, q);
            const int64_t a = std::max(lo, sh.offset), b = std::min(hi, sh.offset + sh.count);
            if (b > a) nccl_broadcast<E>(comm, full + a, full + a, dist::Elems(b - a), q, s);
        }
        NCCL_CHECK(ncclGroupEnd());
    }

    // ZeRO-1 overlap path, after this rank updated master[own slice] and work[own slice]: every
    // rank receives the other ranks' slices of the working copy (bf16; work == nullptr for fp32
    // runs, whose working copy is the master: then the master is gathered) and of the fp32 master
    // over [master_lo, n) (the scheme parameters; n = none). Synchronises s.
    template <typename T>
    void gather_params(T* work, float* master, int64_t master_lo, cudaStream_t s) {
        if (!zero1) return;
        if (work) {
            broadcast_slices<T>(work, 0, n, s);
            broadcast_slices<float>(master, master_lo, n, s);
        } else {
            broadcast_slices<float>(master, 0, n, s);
        }
        CUDA_CHECK(cudaStreamSynchronize(s));
    }

    // ZeRO-1, after this rank updated master[own_off, +own_count): every rank gets all of master.
    void allgather_master(float* master, cudaStream_t s) { allgather_full(master, s); }
    // ZeRO-1: all-gathers a vector of which this rank holds [own_off, +own_count) into full [n]
    // (in place in `full`); also used for the AdamW moments at checkpoint time (own = state[0:S]).
    void allgather_full(float* full, cudaStream_t s, const float* own = nullptr) {
        if (!zero1) return;
        if (overlap) {
            if (own && own_count > 0)
                CUDA_CHECK(cudaMemcpyAsync(full + own_off, own, size_t(own_count) * sizeof(float),
                                           cudaMemcpyDeviceToDevice, s));
            broadcast_slices<float>(full, 0, n, s);
            CUDA_CHECK(cudaStreamSynchronize(s));
            return;
        }
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
