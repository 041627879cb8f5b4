// core/dist.h — the data-parallel layer shared by the CPU trainer and the GPU trainers (issue #10).
// See doc/distributed.md.
//
// Who am I: dist::init() reads the launcher's environment, in this order:
//   1. an MPI launcher (OpenMPI mpirun: OMPI_COMM_WORLD_SIZE; PMIx: PMIX_RANK; MPICH/hydra or
//      srun --mpi=pmi2: PMI_RANK) -> MPI_Init, rank/world from MPI_COMM_WORLD, local rank from
//      MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). launcher() == "mpi". Host collectives available.
//   2. Slurm without MPI (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID): launcher() == "slurm".
//   3. generic (RANK, WORLD_SIZE, LOCAL_RANK; torchrun style): launcher() == "env".
//      In 2 and 3 there is no host transport: host collectives with world > 1 throw ldm::Error
//      (the GPU trainers can still use NCCL with the unique id shared through a file,
//      cuda/nccl.cuh --nccl-id-file).
//   4. nothing set, or a world of 1: single process; MPI is NOT initialised and every collective
//      is a local no-op (a copy where it has an output), so plain runs behave exactly as before.
// The local rank picks the GPU of a node (device = local_rank % devices).
//
// Typed collectives: buffers are passed as Span<T> = (T* data, Elems count) where the count is
// an ELEMENT count of T held in a strong type (there is no implicit conversion from an integer, and
// a byte count must be divided by sizeof(T) by the caller on purpose). Bytes on the wire are always
// computed here as count * sizeof(T). T is mapped to the transport's datatype at compile time
// (dtype_of<T>(); unsupported types do not compile). Counts above INT_MAX are sent in chunks of at
// most max_chunk_elems() elements (MPI's counts are int).
//
// Determinism: reduce_scatter_ordered and sum_ordered add the ranks' contributions in rank order
// 0, 1, ..., W-1 (never MPI_SUM, whose order the library chooses), so results are reproducible
// run to run and the same on every rank.
#pragma once
#include <algorithm>
#include <climits>
#include <cstring>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/checkpoint.h"
#include "core/common.h"
#include "core/config.h"

namespace ldm {
namespace dist {

// ---- Strong element count and typed span ------------------------------------------------------
struct Elems {
    constexpr explicit Elems(int64_t n_) : n(n_) {}
    int64_t n;
};

// A typed view of `count` elements of T. bytes() = count * sizeof(T) is the only place a byte size
// is formed.
template <typename T>
struct Span {
    T* data = nullptr;
    int64_t count = 0;
    Span() = default;
    Span(T* p, Elems n) : data(p), count(n.n) {}
    // Any contiguous container of T (std::vector, std::string for char, ...).
    template <typename V, typename = typename std::enable_if<
                              std::is_convertible<decltype(std::declval<V&>().data()), T*>::value>::type>
    Span(V& vec) : data(vec.data()), count(int64_t(vec.size())) {}
    // Span<T> -> Span<const T>.
    template <typename U, typename = typename std::enable_if<std::is_same<const U, T>::value>::type>
    Span(const Span<U>& s) : data(s.data), count(s.count) {}
    int64_t bytes() const { return count * int64_t(sizeof(T)); }
    // [offset, offset+n), checked (ldm::Error).
    Span<T> sub(int64_t offset, int64_t n) const {
        if (offset < 0 || n < 0 || offset + n > count)
            throw Error(strprintf("dist::Span::sub: [%lld, %lld) outside [0, %lld)", (long long)offset,
                                  (long long)(offset + n), (long long)count));
        return Span<T>(data + offset, Elems(n));
    }
};

// Datatypes known to the transports (MPI here, NCCL in cuda/nccl.cuh).
enum class DType { f32, f64, i32, i64, u64, u8 };
template <typename T>
struct DTypeOf;  // no definition: an unsupported T fails to compile
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<uint64_t> { static constexpr DType value = DType::u64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::u8; };
template <typename T>
constexpr DType dtype_of() { return DTypeOf<typename std::remove_const<T>::type>::value; }
int64_t dtype_size(DType t);  // bytes per element: 4, 8, 4, 8, 8, 1
const char* dtype_name(DType t);

// ---- Shards (ZeRO-1 and the reduce-scatter) ---------------------------------------------------
// Contiguous shard of rank r among W over n elements: the first n mod W ranks get floor(n/W)+1
// elements, the others floor(n/W); shards are in rank order and cover [0, n) exactly.
struct Shard {
    int64_t offset = 0, count = 0;
};
Shard shard_range(int64_t n, int world, int rank);

// Splits `count` elements into pieces of at most max_chunk (> 0): (offset, n) pairs in order.
std::vector<Shard> split_chunks(int64_t count, int64_t max_chunk);
// The chunk size used for every transfer (default INT_MAX elements; tests lower it to exercise
// the chunking). ldm::Error if n < 1 or n > INT_MAX.
int64_t max_chunk_elems();
void set_max_chunk_elems(int64_t n);

// ---- Gradient buckets of the GPU trainers (reduction overlapped with backward) ----------------
// Pure host code (tested on the CPU: test/test_grad_buckets.cpp); used by cuda/nccl.cuh
// GpuDataParallel and cuda/transformer.cuh Transformer::backward. doc/distributed.md "Overlap".
//
// Backward stages: the points of Transformer::backward at which it calls its gradient hook, in time order.
//   stage 0          after the head (LM head and final RMSNorm backward);
//   stage L - l      after the backward of block l (l = L-1 .. 0, so stages 1 .. L);
//   stage L + 1      at the end (embedding backward; the scheme's begin_backward has run).
// On the step's last micro-batch a parameter's gradient is final at (grad_stage_of):
//   final_norm.w, lm_head -> 0;  blocks.<l>.* -> L - l;  wte (also the tied LM head) and every
//   scheme.* parameter (a scheme accumulates into its parameters over all sublayers) -> L + 1.
inline int grad_stage_head() { return 0; }
inline int grad_stage_block(int layer, int n_layer) { return n_layer - layer; }
inline int grad_stage_end(int n_layer) { return n_layer + 1; }
// ldm::Error for a name outside the layout of core/config.h param_specs.
int grad_stage_of(const std::string& param_name, int n_layer);

// A contiguous range of the flat gradient, reduced as one unit once backward reaches `stage`.
struct GradBucket {
    int64_t offset = 0;
    Elems count{0};  // fp32 gradient elements
    int stage = 0;
};
// Buckets over the flat layout `specs` (param_specs order: contiguous from 0, ldm::Error
// otherwise), in backward order (stage ascending; within a stage, offset descending). Runs of
// adjacent tensors with the same stage form one range; then, in that order, a bucket smaller than
// min_elems absorbs the next range when the two are adjacent in memory (the merged bucket takes the
// later stage, so its gradients are still final when it is reduced). Every element is in exactly
// one bucket. min_elems = 0: no merging.
std::vector<GradBucket> plan_grad_buckets(const std::vector<ParamSpec>& specs, int n_layer, int64_t min_elems);

// The GPU trainers' ZeRO-1 shard layout (cuda/nccl.cuh): S = ceil(n / W) rounded up to a multiple
// of 64 elements; rank r owns [r S, min(n, (r+1) S)) (empty for trailing ranks when n is small).
int64_t padded_shard_size(int64_t n, int world);
Shard padded_shard_range(int64_t n, int world, int rank);
// ZeRO-1 reduction of one bucket: the bucket cut at the owners' shard boundaries; piece k is
// reduced to rank `root` (its owner). Pieces in offset order, non-empty, inside their root's shard.
struct ReducePiece {
    int64_t offset = 0;
    Elems count{0};
    int root = 0;
};
std::vector<ReducePiece> split_by_owner(int64_t offset, Elems count, int64_t n, int world);

// ---- Process context -------------------------------------------------------------------------
struct Context {
    int rank = 0, world = 1;
    int local_rank = 0, local_world = 1;  // within the node
    std::string launcher = "none";         // none | mpi | slurm | env
    bool mpi = false;                      // MPI initialised (host collectives available)
};

// Reads the environment (above) and initialises MPI when launched by an MPI launcher. Idempotent.
// ldm::Error on inconsistent variables (rank outside [0, world), MPI's size differing from the
// launcher's).
const Context& init(int* argc, char*** argv);
const Context& context();  // init(nullptr, nullptr) if not done yet
inline int rank() { return context().rank; }
inline int world() { return context().world; }
inline bool is_root() { return context().rank == 0; }
// MPI_Finalize when MPI was initialised (after a barrier). Safe to call more than once.
void finalize();
// After an error on one rank: MPI_Abort(code) when MPI runs with world > 1 (so the other ranks
// do not hang in a collective), else returns.
void abort_all(int code);
// Pure function of the environment (for tests): what init() would decide without touching MPI.
// `mpi` is set when an MPI launcher is detected; rank/world come from its variables.
Context context_from_env();

// ---- Host collectives (world 1: no-ops / copies) ---------------------------------------------
void barrier();
// Sum over ranks in place with MPI_SUM (order chosen by MPI: use it for integer counts and flags;
// floating-point sums that must be reproducible use sum_ordered / reduce_scatter_ordered).
template <typename T>
void allreduce_sum(Span<T> data);
template <typename T>
void broadcast(Span<T> data, int root);
// Every rank's x, in rank order.
template <typename T>
std::vector<T> allgather_value(T x);
// sum over ranks of x, added in rank order: ((x_0 + x_1) + x_2) + ... — identical on every rank.
double sum_ordered(double x);
// Reduce-scatter with a fixed order. in: [n] on every rank (n equal on all ranks). out: this rank's
// shard [shard_range(n, W, rank).count]: out[i] = ((in_0[o+i] + in_1[o+i]) + in_2[o+i]) + ... in T
// arithmetic. in and out must not overlap. Point-to-point, chunked, every rank sends
// n - shard elements and receives (W-1)*shard.
template <typename T>
void reduce_scatter_ordered(Span<const T> in, Span<T> out);
// All-gather of contiguous shards in place. data: [n]; on entry this rank's shard_range(n, W, rank)
// part is valid; on exit every part is (bit-identical to its owner's values).
template <typename T>
void allgather_shards(Span<T> data);

// ---- Sharded checkpoints (doc/distributed.md "Checkpoints") -----------------------------------
// A checkpoint ckpt_<s> is <base>.model plus either <base>.state (one process) or the rank files
// <base>.state.rank<r>of<W> (rank r's slice shard_range(n, W, r) of the AdamW moments and, for fp64,
// of the exact parameters; header extra: world, rank, zero, param_count, shard_offset,
// shard_count), completed by the marker <base>.done written last by rank 0.

// "--resume" argument -> base (strips .model, .state or .done).
std::string checkpoint_base(const std::string& arg);
std::string shard_state_path(const std::string& base, int rank, int world);
// Rank 0, after a barrier that follows every rank's write: <base>.done, atomically. `states`:
// the file names (without directory) of the training states.
void write_checkpoint_marker(const std::string& base, int64_t step, int world, int zero, int64_t n,
                             const std::string& dtype, const std::vector<std::string>& states);

// The saved training state of a checkpoint, in its own shard layout.
struct SavedState {
    int world = 1;                  // world size that wrote it (1 for a .state file)
    std::vector<TrainState> parts;  // rank order
    std::vector<Shard> shards;      // the flat-parameter range each part holds
};
// Loads the state files that the marker <base>.done names (exactly those: <base>.state for one
// rank, <base>.state.rank<r>of<W> for W ranks; the names are checked against the marker's own
// stem, so files renamed together still load), else a bare <base>.state (a checkpoint from
// before markers). Checks the marker against the model (step, param_count), each part's
// resume flags (check_resume_flags against `flags`), its step (== step) and shard layout;
// ldm::Error naming the file otherwise, and when neither file exists ("incomplete" checkpoint).
SavedState load_saved_state(const std::string& base, int64_t n, int64_t step, const nlohmann::json& flags);

// Copies the part of a saved slice (raw values of R for [ps.offset, ps.offset + ps.count) of the
// flat index) that falls inside dst, which holds [lo, lo + dst_count). ldm::Error if `bytes` does
// not hold ps.count values of R.
template <typename R>
void copy_saved_part(R* dst, int64_t lo, int64_t dst_count, const std::string& bytes, Shard ps, const char* what) {
    if (bytes.size() != size_t(ps.count) * sizeof(R))
        throw Error(std::string("resume: ") + what + " has the wrong size");
    const int64_t a = std::max(lo, ps.offset), b = std::min(lo + dst_count, ps.offset + ps.count);
    if (b > a) std::memcpy(dst + (a - lo), bytes.data() + size_t(a - ps.offset) * sizeof(R), size_t(b - a) * sizeof(R));
}

}  // namespace dist
}  // namespace ldm
