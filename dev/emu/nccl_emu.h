// dev/emu/nccl_emu.h — NCCL for the host-emulated GPU programs (dev/emu; doc/cuda.md "Emulating
// kernels on the CPU"). The real <nccl.h> supplies the types; this header DEFINES the NCCL
// functions cuda/nccl.cuh calls, on host memory (emulated device buffers are host buffers):
//   * one rank (no MPI, or an MPI world of 1): every collective is the identity (a copy when send
//     and recv differ);
//   * several ranks under mpirun: the matching MPI collective on MPI_COMM_WORLD (allreduce,
//     reduce_scatter_block, allgather, reduce, bcast), bf16 sums with a user-defined MPI op that
//     adds in fp32 and rounds to nearest even (as NCCL's bf16 sum does per step).
// A collective is work of its stream: queued on a stream made by cudaStreamCreate until something
// orders it (emu.h "streams"), run at once on stream 0; in launch-only mode it moves nothing
// (device work). Grouped calls (ncclGroupStart/End) run in issue order, which is correct because
// every rank issues the same sequence (and runs its queues in the same order). The unique id is a constant: the communicator is
// MPI_COMM_WORLD. Included once per program (gen.py substitutes it for `#include <nccl.h>` in the
// emulation copy of cuda/nccl.cuh).
#pragma once
#include <nccl.h>
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only (no C++ bindings to link)
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>

struct ncclComm {
    int rank = 0, world = 1;
};

namespace emu {
namespace nccl {

inline size_t type_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: case ncclUint8: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

inline float bf16_to_f(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint16_t f_to_bf16(float f) {  // round to nearest even (finite inputs)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}
inline void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
    const uint16_t* a = static_cast<const uint16_t*>(in);
    uint16_t* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; i++) b[i] = f_to_bf16(bf16_to_f(a[i]) + bf16_to_f(b[i]));
}

inline bool multi(const ncclComm* c) { return c && c->world > 1; }

// MPI datatype and sum op of an NCCL datatype (bf16: 16-bit elements with the bf16 sum).
inline MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: return MPI_INT8_T;
        case ncclUint8: return MPI_UINT8_T;
        case ncclInt32: return MPI_INT32_T;
        case ncclUint32: return MPI_UINT32_T;
        case ncclInt64: return MPI_INT64_T;
        case ncclUint64: return MPI_UINT64_T;
        case ncclFloat32: return MPI_FLOAT;
        case ncclFloat64: return MPI_DOUBLE;
        case ncclBfloat16: case ncclFloat16: return MPI_UINT16_T;
        default: return MPI_DATATYPE_NULL;
    }
}
inline MPI_Op sum_op(ncclDataType_t t) {
    static MPI_Op bf16op = MPI_OP_NULL;
    if (t == ncclBfloat16) {
        if (bf16op == MPI_OP_NULL) MPI_Op_create(&bf16_sum, 1, &bf16op);
        return bf16op;
    }
    return MPI_SUM;
}
inline ncclResult_t check(int mpi_rc) { return mpi_rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }
inline void copy(void* dst, const void* src, size_t n) {
    if (dst != src && n) std::memmove(dst, src, n);
}
// Under launch-only emulation ($EMU_LAUNCH_ONLY, emu.h launch_only) a collective is device work
// and moves nothing (every rank skips it alike): the buffers of a workbench's or trainer's
// benchmark shape stay unbacked, and no MPI traffic runs.
inline bool device_work_skipped() { return ::emu::launch_only(); }
// Runs the collective `act` now, or queues it on stream s (emu.h "streams"); a queued one that
// fails aborts, since its error can no longer be returned.
inline ncclResult_t on_stream(cudaStream_t s, const char* what, std::function<ncclResult_t()> act) {
    if (::emu::record(s, what, [act, what] {
            if (act() != ncclSuccess) {
                std::fprintf(stderr, "emu: %s failed (emulated NCCL over MPI)\n", what);
                ::emu::fail("a queued NCCL collective failed");
            }
        }))
        return ncclSuccess;
    return act();
}

}  // namespace nccl
}  // namespace emu

// ---- the NCCL API (definitions of the functions <nccl.h> declares) -------------------------------
inline const char* ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error (emulated NCCL)" : "error (emulated NCCL over MPI)";
}
inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    std::memset(id, 0, sizeof *id);
    std::strcpy(id->internal, "dev/emu NCCL over MPI_COMM_WORLD");
    return ncclSuccess;
}
inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
    int world = 1, r = 0, init = 0;
    MPI_Initialized(&init);
    if (init) {
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
    }
    if (world != nranks || r != rank) return ncclInvalidArgument;  // only MPI_COMM_WORLD is emulated
    *comm = new ncclComm{rank, nranks};
    return ncclSuccess;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    ::emu::detail::run_queues(false);  // queued collectives hold the communicator
    delete comm;
    return ncclSuccess;
}
inline ncclResult_t ncclGroupStart() { return ncclSuccess; }
inline ncclResult_t ncclGroupEnd() { return ncclSuccess; }

inline ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream) {
    ::emu::forbid_in_capture("ncclAllReduce");
    using namespace emu::nccl;
    if (op != ncclSum || !type_size(t)) return ncclInvalidArgument;
    if (device_work_skipped()) return ncclSuccess;
    return on_stream(stream, "ncclAllReduce", [=]() -> ncclResult_t {
        if (!multi(comm)) return copy(recv, send, count * type_size(t)), ncclSuccess;
        return check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, int(count), mpi_type(t), sum_op(t),
                                   MPI_COMM_WORLD));
    });
}
inline ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t t,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    ::emu::forbid_in_capture("ncclReduceScatter");
    using namespace emu::nccl;
    if (op != ncclSum || !type_size(t)) return ncclInvalidArgument;
    if (device_work_skipped()) return ncclSuccess;
    return on_stream(stream, "ncclReduceScatter", [=]() -> ncclResult_t {
        const size_t es = type_size(t);
        if (!multi(comm)) return copy(recv, send, recv_count * es), ncclSuccess;
        const bool inplace = static_cast<const char*>(send) + size_t(comm->rank) * recv_count * es == recv;
        if (inplace) {  // MPI has no in-place form with an offset output: reduce a copy of the input
            char* tmp = new char[size_t(comm->world) * recv_count * es];
            std::memcpy(tmp, send, size_t(comm->world) * recv_count * es);
            const int rc = MPI_Reduce_scatter_block(tmp, recv, int(recv_count), mpi_type(t), sum_op(t), MPI_COMM_WORLD);
            delete[] tmp;
            return check(rc);
        }
        return check(MPI_Reduce_scatter_block(send, recv, int(recv_count), mpi_type(t), sum_op(t), MPI_COMM_WORLD));
    });
}
inline ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t t, ncclComm_t comm,
                                  cudaStream_t stream) {
    ::emu::forbid_in_capture("ncclAllGather");
    using namespace emu::nccl;
    if (!type_size(t)) return ncclInvalidArgument;
    if (device_work_skipped()) return ncclSuccess;
    return on_stream(stream, "ncclAllGather", [=]() -> ncclResult_t {
        const size_t es = type_size(t);
        if (!multi(comm)) return copy(recv, send, send_count * es), ncclSuccess;
        const bool inplace = static_cast<const char*>(recv) + size_t(comm->rank) * send_count * es == send;
        return check(MPI_Allgather(inplace ? MPI_IN_PLACE : send, int(send_count), mpi_type(t), recv, int(send_count),
                                   mpi_type(t), MPI_COMM_WORLD));
    });
}
inline ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                               ncclComm_t comm, cudaStream_t stream) {
    ::emu::forbid_in_capture("ncclReduce");
    using namespace emu::nccl;
    if (op != ncclSum || !type_size(t)) return ncclInvalidArgument;
    if (device_work_skipped()) return ncclSuccess;
    return on_stream(stream, "ncclReduce", [=]() -> ncclResult_t {
        if (!multi(comm)) return copy(recv, send, count * type_size(t)), ncclSuccess;
        const bool me = comm->rank == root;
        return check(MPI_Reduce(me && send == recv ? MPI_IN_PLACE : send, recv, int(count), mpi_type(t), sum_op(t),
                                root, MPI_COMM_WORLD));
    });
}
inline ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
    ::emu::forbid_in_capture("ncclBroadcast");
    using namespace emu::nccl;
    if (!type_size(t)) return ncclInvalidArgument;
    if (device_work_skipped()) return ncclSuccess;
    return on_stream(stream, "ncclBroadcast", [=]() -> ncclResult_t {
        const size_t es = type_size(t);
        if (comm && comm->rank == root) copy(recv, send, count * es);
        if (!multi(comm)) return ncclSuccess;
        return check(MPI_Bcast(recv, int(count), mpi_type(t), root, MPI_COMM_WORLD));
    });
}
