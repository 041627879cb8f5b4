// core/dist.cpp — see core/dist.h and doc/distributed.md.
#include "core/dist.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define OMPI_SKIP_MPICXX 1  // C API only (no deprecated C++ bindings)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#define LDM_HAVE_MPI 1
#endif
#endif
#ifndef LDM_HAVE_MPI
#define LDM_HAVE_MPI 0
#endif

namespace ldm {
namespace dist {

namespace {

Context g_ctx;
bool g_inited = false, g_finalized = false;
int64_t g_max_chunk = INT_MAX;

bool env_int(const char* name, int* out) {
    const char* v = std::getenv(name);
    if (!v || !*v) return false;
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    if (*end != '\0') throw Error(strprintf("environment variable %s=%s is not an integer", name, v));
    *out = int(x);
    return true;
}

void require_transport(const char* what) {
    if (g_ctx.world > 1 && !g_ctx.mpi)
        throw Error(strprintf("dist::%s: %d processes were launched by '%s' but there is no MPI; host collectives "
                              "need an MPI launcher (mpirun, or srun --mpi=pmix)",
                              what, g_ctx.world, g_ctx.launcher.c_str()));
}

#if LDM_HAVE_MPI
MPI_Datatype mpi_type(DType t) {
    switch (t) {
        case DType::f32: return MPI_FLOAT;
        case DType::f64: return MPI_DOUBLE;
        case DType::i32: return MPI_INT32_T;
        case DType::i64: return MPI_INT64_T;
        case DType::u64: return MPI_UINT64_T;
        case DType::u8: return MPI_UINT8_T;
    }
    throw Error("dist: unknown datatype");
}

void mpi_check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(strprintf("MPI error in %s: %.*s", what, len, msg));
}
constexpr int kTag = 4242;  // one tag: MPI's non-overtaking rule keeps chunks in order
#endif

}  // namespace

int64_t dtype_size(DType t) {
    switch (t) {
        case DType::f32: return 4;
        case DType::f64: return 8;
        case DType::i32: return 4;
        case DType::i64: return 8;
        case DType::u64: return 8;
        case DType::u8: return 1;
    }
    return 0;
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "f32";
        case DType::f64: return "f64";
        case DType::i32: return "i32";
        case DType::i64: return "i64";
        case DType::u64: return "u64";
        case DType::u8: return "u8";
    }
    return "?";
}

Shard shard_range(int64_t n, int world, int rank) {
    if (n < 0 || world < 1 || rank < 0 || rank >= world)
        throw Error(strprintf("dist::shard_range: n=%lld world=%d rank=%d", (long long)n, world, rank));
    const int64_t base = n / world, extra = n % world;
    Shard s;
    s.count = base + (rank < extra ? 1 : 0);
    s.offset = int64_t(rank) * base + std::min<int64_t>(rank, extra);
    return s;
}

std::vector<Shard> split_chunks(int64_t count, int64_t max_chunk) {
    if (count < 0 || max_chunk < 1)
        throw Error(strprintf("dist::split_chunks: count=%lld max_chunk=%lld", (long long)count, (long long)max_chunk));
    std::vector<Shard> out;
    for (int64_t off = 0; off < count; off += max_chunk) out.push_back({off, std::min(max_chunk, count - off)});
    return out;
}

int grad_stage_of(const std::string& name, int n_layer) {
    if (name == "final_norm.w" || name == "lm_head") return grad_stage_head();
    if (name == "wte" || name.rfind("scheme.", 0) == 0) return grad_stage_end(n_layer);
    if (name.rfind("blocks.", 0) == 0) {
        const size_t dot = name.find('.', 7);
        if (dot != std::string::npos && dot > 7) {
            int l = 0;
            for (size_t i = 7; i < dot; i++) {
                if (name[i] < '0' || name[i] > '9') throw Error("dist::grad_stage_of: bad block name '" + name + "'");
                l = l * 10 + (name[i] - '0');
                if (l > n_layer) break;
            }
            if (l < n_layer) return grad_stage_block(l, n_layer);
        }
    }
    throw Error(strprintf("dist::grad_stage_of: '%s' is not a parameter of a %d-block model", name.c_str(), n_layer));
}

std::vector<GradBucket> plan_grad_buckets(const std::vector<ParamSpec>& specs, int n_layer, int64_t min_elems) {
    if (n_layer < 1 || min_elems < 0)
        throw Error(strprintf("dist::plan_grad_buckets: n_layer=%d min_elems=%lld", n_layer, (long long)min_elems));
    // 1. runs of adjacent tensors with the same stage
    std::vector<GradBucket> runs;
    int64_t end = 0;
    for (const ParamSpec& s : specs) {
        if (s.offset != end || s.numel < 0)
            throw Error("dist::plan_grad_buckets: parameter '" + s.name + "' does not follow its predecessor");
        const int st = grad_stage_of(s.name, n_layer);
        if (!runs.empty() && runs.back().stage == st) runs.back().count.n += s.numel;
        else {
            GradBucket b;
            b.offset = s.offset;
            b.count = Elems(s.numel);
            b.stage = st;
            runs.push_back(b);
        }
        end += s.numel;
    }
    runs.erase(std::remove_if(runs.begin(), runs.end(), [](const GradBucket& b) { return b.count.n == 0; }), runs.end());
    // 2. backward order
    std::stable_sort(runs.begin(), runs.end(), [](const GradBucket& a, const GradBucket& b) {
        return a.stage != b.stage ? a.stage < b.stage : a.offset > b.offset;
    });
    // 3. small buckets absorb the next range when adjacent in memory
    std::vector<GradBucket> out;
    for (const GradBucket& r : runs) {
        if (!out.empty()) {
            GradBucket& c = out.back();
            const bool adjacent = r.offset + r.count.n == c.offset || c.offset + c.count.n == r.offset;
            if (c.count.n < min_elems && adjacent) {
                c.offset = std::min(c.offset, r.offset);
                c.count.n += r.count.n;
                c.stage = std::max(c.stage, r.stage);
                continue;
            }
        }
        out.push_back(r);
    }
    return out;
}

int64_t padded_shard_size(int64_t n, int world) {
    if (n < 0 || world < 1) throw Error(strprintf("dist::padded_shard_size: n=%lld world=%d", (long long)n, world));
    return ((n + world - 1) / world + 63) / 64 * 64;
}

Shard padded_shard_range(int64_t n, int world, int rank) {
    if (rank < 0 || rank >= world) throw Error(strprintf("dist::padded_shard_range: rank %d of %d", rank, world));
    const int64_t S = padded_shard_size(n, world);
    Shard s;
    s.offset = std::min(n, int64_t(rank) * S);
    s.count = std::max<int64_t>(0, std::min(n, s.offset + S) - s.offset);
    return s;
}

std::vector<ReducePiece> split_by_owner(int64_t offset, Elems count, int64_t n, int world) {
    if (offset < 0 || count.n < 0 || offset + count.n > n)
        throw Error(strprintf("dist::split_by_owner: [%lld, %lld) outside [0, %lld)", (long long)offset,
                              (long long)(offset + count.n), (long long)n));
    const int64_t S = padded_shard_size(n, world);
    std::vector<ReducePiece> out;
    int64_t a = offset;
    const int64_t b = offset + count.n;
    while (a < b) {
        const int r = int(a / S);  // S >= 1 whenever a < n
        const int64_t e = std::min(b, int64_t(r + 1) * S);
        ReducePiece p;
        p.offset = a;
        p.count = Elems(e - a);
        p.root = r;
        out.push_back(p);
        a = e;
    }
    return out;
}

int64_t max_chunk_elems() { return g_max_chunk; }
void set_max_chunk_elems(int64_t n) {
    if (n < 1 || n > INT_MAX) throw Error(strprintf("dist::set_max_chunk_elems: %lld not in [1, INT_MAX]", (long long)n));
    g_max_chunk = n;
}

Context context_from_env() {
    Context c;
    int v = 0;
    if (env_int("OMPI_COMM_WORLD_SIZE", &c.world)) {  // OpenMPI mpirun
        c.launcher = "mpi";
        c.mpi = true;
        env_int("OMPI_COMM_WORLD_RANK", &c.rank);
        if (env_int("OMPI_COMM_WORLD_LOCAL_RANK", &v)) c.local_rank = v;
        if (env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &v)) c.local_world = v;
    } else if (env_int("PMIX_RANK", &c.rank) || env_int("PMI_RANK", &c.rank)) {  // PMIx / PMI (srun --mpi=...)
        c.launcher = "mpi";
        c.mpi = true;
        c.world = -1;  // unknown until MPI_Init, unless the launcher says
        if (env_int("PMI_SIZE", &v) || env_int("SLURM_NTASKS", &v)) c.world = v;
        if (env_int("SLURM_LOCALID", &v) || env_int("MPI_LOCALRANKID", &v)) c.local_rank = v;
    } else if (env_int("SLURM_PROCID", &c.rank) && env_int("SLURM_NTASKS", &c.world)) {  // srun, no MPI
        c.launcher = "slurm";
        if (env_int("SLURM_LOCALID", &v)) c.local_rank = v;
        c.local_world = std::max(1, c.local_rank + 1);
        if (env_int("SLURM_NTASKS_PER_NODE", &v)) c.local_world = v;
    } else if (env_int("RANK", &c.rank) && env_int("WORLD_SIZE", &c.world)) {  // generic (torchrun style)
        c.launcher = "env";
        if (env_int("LOCAL_RANK", &v)) c.local_rank = v;
        c.local_world = std::max(1, c.local_rank + 1);
        if (env_int("LOCAL_WORLD_SIZE", &v)) c.local_world = v;
    } else {
        c = Context();
    }
    if (c.world != -1 && (c.world < 1 || c.rank < 0 || c.rank >= c.world))
        throw Error(strprintf("dist: launcher '%s' gives rank %d outside [0, world=%d)", c.launcher.c_str(), c.rank,
                              c.world));
    if (c.local_rank < 0) throw Error(strprintf("dist: negative local rank %d", c.local_rank));
    if (c.world == 1) c.mpi = false;  // a world of one needs no transport
    return c;
}

const Context& init(int* argc, char*** argv) {
    if (g_inited) return g_ctx;
    Context c = context_from_env();
    if (c.mpi) {
#if LDM_HAVE_MPI
        int provided = 0;
        mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        int r = 0, w = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        MPI_Comm_size(MPI_COMM_WORLD, &w);
        if (c.world != -1 && (w != c.world || r != c.rank))
            throw Error(strprintf("dist: the launcher says rank %d of %d but MPI says rank %d of %d", c.rank, c.world,
                                  r, w));
        c.rank = r;
        c.world = w;
        MPI_Comm node;
        mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, &node), "split_type");
        MPI_Comm_rank(node, &c.local_rank);
        MPI_Comm_size(node, &c.local_world);
        MPI_Comm_free(&node);
        if (w == 1) {  // PMI launch of a single task
            MPI_Finalize();
            g_finalized = true;
            c.mpi = false;
        }
#else
        throw Error("dist: launched by an MPI launcher but this build has no MPI (rebuild with mpicxx available)");
#endif
    }
    g_ctx = c;
    g_inited = true;
    return g_ctx;
}

const Context& context() {
    if (!g_inited) init(nullptr, nullptr);
    return g_ctx;
}

void finalize() {
#if LDM_HAVE_MPI
    if (g_inited && g_ctx.mpi && !g_finalized) {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        g_finalized = true;
    }
#endif
}

void abort_all(int code) {
#if LDM_HAVE_MPI
    if (g_inited && g_ctx.mpi && !g_finalized && g_ctx.world > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    (void)code;
}

void barrier() {
    context();
    if (g_ctx.world == 1) return;
    require_transport("barrier");
#if LDM_HAVE_MPI
    mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

template <typename T>
void allreduce_sum(Span<T> d) {
    context();
    if (g_ctx.world == 1) return;
    require_transport("allreduce_sum");
#if LDM_HAVE_MPI
    for (const Shard& c : split_chunks(d.count, g_max_chunk))
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, d.data + c.offset, int(c.count), mpi_type(dtype_of<T>()), MPI_SUM,
                                MPI_COMM_WORLD),
                  "MPI_Allreduce");
#endif
}

template <typename T>
void broadcast(Span<T> d, int root) {
    context();
    if (g_ctx.world == 1) return;
    require_transport("broadcast");
    if (root < 0 || root >= g_ctx.world) throw Error(strprintf("dist::broadcast: root %d", root));
#if LDM_HAVE_MPI
    for (const Shard& c : split_chunks(d.count, g_max_chunk))
        mpi_check(MPI_Bcast(d.data + c.offset, int(c.count), mpi_type(dtype_of<T>()), root, MPI_COMM_WORLD),
                  "MPI_Bcast");
#endif
}

template <typename T>
std::vector<T> allgather_value(T x) {
    context();
    std::vector<T> out(size_t(g_ctx.world), x);
    if (g_ctx.world == 1) return out;
    require_transport("allgather_value");
#if LDM_HAVE_MPI
    const MPI_Datatype t = mpi_type(dtype_of<T>());
    mpi_check(MPI_Allgather(&x, 1, t, out.data(), 1, t, MPI_COMM_WORLD), "MPI_Allgather");
#endif
    return out;
}

double sum_ordered(double x) {
    std::vector<double> v = allgather_value<double>(x);
    double s = v[0];
    for (size_t i = 1; i < v.size(); i++) s += v[i];
    return s;
}

template <typename T>
void reduce_scatter_ordered(Span<const T> in, Span<T> out) {
    context();
    const int W = g_ctx.world, me = g_ctx.rank;
    const int64_t n = in.count;
    const Shard mine = shard_range(n, W, me);
    if (out.count != mine.count)
        throw Error(strprintf("dist::reduce_scatter_ordered: output has %lld elements, this rank's shard of %lld is %lld",
                              (long long)out.count, (long long)n, (long long)mine.count));
    if (W == 1) {
        if (n > 0 && out.data != in.data) std::memcpy(out.data, in.data, size_t(in.bytes()));
        return;
    }
    require_transport("reduce_scatter_ordered");
#if LDM_HAVE_MPI
    const MPI_Datatype t = mpi_type(dtype_of<T>());
    std::vector<T> recv(size_t(W) * size_t(mine.count));  // piece of rank p at p * mine.count
    std::vector<MPI_Request> reqs;
    for (int p = 0; p < W; p++) {
        if (p == me) continue;
        for (const Shard& c : split_chunks(mine.count, g_max_chunk)) {
            reqs.emplace_back();
            mpi_check(MPI_Irecv(recv.data() + size_t(p) * size_t(mine.count) + c.offset, int(c.count), t, p, kTag,
                                MPI_COMM_WORLD, &reqs.back()),
                      "MPI_Irecv");
        }
        const Shard theirs = shard_range(n, W, p);
        for (const Shard& c : split_chunks(theirs.count, g_max_chunk)) {
            reqs.emplace_back();
            mpi_check(MPI_Isend(in.data + theirs.offset + c.offset, int(c.count), t, p, kTag, MPI_COMM_WORLD,
                                &reqs.back()),
                      "MPI_Isend");
        }
    }
    mpi_check(MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    const T* own = in.data + mine.offset;
    T* o = out.data;
    const int64_t m = mine.count;
    const T* r = recv.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        T s = me == 0 ? own[i] : r[i];
        for (int p = 1; p < W; p++) s += (p == me ? own[i] : r[size_t(p) * size_t(m) + size_t(i)]);
        o[i] = s;
    }
#endif
}

template <typename T>
void allgather_shards(Span<T> d) {
    context();
    const int W = g_ctx.world, me = g_ctx.rank;
    if (W == 1) return;
    require_transport("allgather_shards");
#if LDM_HAVE_MPI
    const MPI_Datatype t = mpi_type(dtype_of<T>());
    const Shard mine = shard_range(d.count, W, me);
    std::vector<MPI_Request> reqs;
    for (int p = 0; p < W; p++) {
        if (p == me) continue;
        const Shard theirs = shard_range(d.count, W, p);
        for (const Shard& c : split_chunks(theirs.count, g_max_chunk)) {
            reqs.emplace_back();
            mpi_check(MPI_Irecv(d.data + theirs.offset + c.offset, int(c.count), t, p, kTag, MPI_COMM_WORLD,
                                &reqs.back()),
                      "MPI_Irecv");
        }
        for (const Shard& c : split_chunks(mine.count, g_max_chunk)) {
            reqs.emplace_back();
            mpi_check(MPI_Isend(d.data + mine.offset + c.offset, int(c.count), t, p, kTag, MPI_COMM_WORLD,
                                &reqs.back()),
                      "MPI_Isend");
        }
    }
    mpi_check(MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
#endif
}

std::string checkpoint_base(const std::string& arg) {
    std::string base = arg;
    for (const char* ext : {".model", ".state", ".done"}) {
        const size_t k = std::strlen(ext);
        if (base.size() > k && base.compare(base.size() - k, k, ext) == 0) return base.substr(0, base.size() - k);
    }
    return base;
}

std::string shard_state_path(const std::string& base, int rank, int world) {
    return base + strprintf(".state.rank%dof%d", rank, world);
}

void write_checkpoint_marker(const std::string& base, int64_t step, int world, int zero, int64_t n,
                             const std::string& dtype, const std::vector<std::string>& states) {
    const std::string name = basename_of(base);
    const std::string mk = nlohmann::json{{"kind", "checkpoint_marker"}, {"step", step}, {"world", world},
                                          {"zero", zero}, {"param_count", n}, {"dtype", dtype},
                                          {"model", name + ".model"}, {"states", states}}
                               .dump() + "\n";
    write_file_atomic(base + ".done", mk.data(), mk.size());
}

SavedState load_saved_state(const std::string& base, int64_t n, int64_t step, const nlohmann::json& flags) {
    SavedState s;
    const std::string spath = base + ".state", dpath = base + ".done";
    if (file_exists(dpath)) {
        // The marker names the state files of its checkpoint (one .state or W rank files); only
        // those are read (a stray .state or rank file of another save of this step is not).
        std::vector<std::string> states;
        try {
            nlohmann::json mk = nlohmann::json::parse(read_file(dpath));
            s.world = mk.at("world").get<int>();
            states = mk.at("states").get<std::vector<std::string>>();
            const std::string model = mk.at("model").get<std::string>();
            if (mk.at("param_count").get<int64_t>() != n || mk.at("step").get<int64_t>() != step || s.world < 1 ||
                int(states.size()) != s.world || model.size() < 7 || model.compare(model.size() - 6, 6, ".model") != 0)
                throw Error("marker does not match the model file");
            // The names are checked against the marker's own stem (a checkpoint whose files were
            // renamed together, ckpt_000100.* -> best.*, still resumes); the files read are this
            // base's.
            const std::string stem = model.substr(0, model.size() - 6);
            for (int p = 0; p < s.world; p++) {
                const std::string want = s.world == 1 ? stem + ".state" : basename_of(shard_state_path(stem, p, s.world));
                if (states[size_t(p)] != want)
                    throw Error("marker names state file '" + states[size_t(p)] + "', expected '" + want + "'");
            }
        } catch (const std::exception& e) {
            throw Error("--resume: checkpoint marker " + dpath + ": " + e.what());
        }
        for (int p = 0; p < s.world; p++) {
            const std::string sp = s.world == 1 ? spath : shard_state_path(base, p, s.world);
            s.parts.push_back(load_train_state(sp));
            s.shards.push_back(s.world == 1 ? Shard{0, n} : shard_range(n, s.world, p));
            check_resume_flags(s.parts.back().flags, flags, sp);
            if (s.world == 1) continue;
            const nlohmann::json& ex = s.parts.back().extra;
            if (ex.value("shard_offset", int64_t(-1)) != s.shards.back().offset ||
                ex.value("shard_count", int64_t(-1)) != s.shards.back().count)
                throw Error("--resume: " + sp + " does not hold shard " + std::to_string(p) + " of " +
                            std::to_string(s.world));
        }
    } else if (file_exists(spath)) {  // a single-process checkpoint written before markers existed
        s.parts.push_back(load_train_state(spath));
        s.shards.push_back({0, n});
        check_resume_flags(s.parts[0].flags, flags, spath);
    } else {
        throw Error("--resume: neither the checkpoint marker " + dpath + " nor " + spath +
                    " exists (a checkpoint without its marker is incomplete)");
    }
    for (const TrainState& st : s.parts)
        if (st.step != step)
            throw Error(strprintf("--resume: model file is at step %lld but training state at step %lld",
                                  (long long)step, (long long)st.step));
    if (s.parts[0].rng_state.size() != 1) throw Error("--resume: " + base + ": bad rng state");
    return s;
}

#define LDM_DIST_INST(T)                                                    \
    template void allreduce_sum<T>(Span<T>);                                \
    template void broadcast<T>(Span<T>, int);                               \
    template std::vector<T> allgather_value<T>(T);                          \
    template void reduce_scatter_ordered<T>(Span<const T>, Span<T>);        \
    template void allgather_shards<T>(Span<T>);
LDM_DIST_INST(float)
LDM_DIST_INST(double)
LDM_DIST_INST(int32_t)
LDM_DIST_INST(int64_t)
LDM_DIST_INST(uint64_t)
LDM_DIST_INST(uint8_t)
#undef LDM_DIST_INST

}  // namespace dist
}  // namespace ldm
