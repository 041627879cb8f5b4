// core/dataloader.cpp — see core/dataloader.h and doc/formats.md "Data loader".
#include "core/dataloader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <glob.h>
#include <unistd.h>

#include "core/checkpoint.h"
#include "core/common.h"

namespace ldm {

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): state += golden gamma; output = mix(state).
inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
struct SplitMix64 {
    uint64_t s;
    uint64_t next() { return mix64(s += 0x9E3779B97F4A7C15ull); }
    // Uniform in [0, bound) by rejection (no modulo bias).
    uint64_t below(uint64_t bound) {
        uint64_t threshold = (0 - bound) % bound;  // = 2^64 mod bound
        for (;;) {
            uint64_t r = next();
            if (r >= threshold) return r % bound;
        }
    }
};

// FNV-1a 64-bit (fnv1a64 of core/checkpoint.h, chained), for the shard fingerprint.
struct Fnv {
    uint64_t h = 0xcbf29ce484222325ull;
    void add(const void* p, size_t n) { h = fnv1a64(p, n, h); }
    void add_u64(uint64_t v) { add(&v, 8); }
    void add_str(const std::string& s) {
        add_u64(s.size());
        add(s.data(), s.size());
    }
};

// LDMDLST2: the fingerprint covers the shards' contents (the first and last token ids); LDMDLST1
// (older checkpoints): names and sizes only. Same layout.
const char kStateMagic[8] = {'L', 'D', 'M', 'D', 'L', 'S', 'T', '2'};
const char kStateMagicV1[8] = {'L', 'D', 'M', 'D', 'L', 'S', 'T', '1'};

// Adds the first and the last (up to) 16384 token ids of the shard to the fingerprint: a shard
// rewritten at the same size (another tokenizer, other documents, another order) changes them.
void add_shard_samples(Fnv& fp, const ShardInfo& info) {
    constexpr uint64_t kSample = 16384;
    const uint64_t head = std::min(kSample, info.num_tokens), tail = std::min(kSample, info.num_tokens - head);
    std::vector<uint32_t> ids(size_t(head + tail));
    read_shard_tokens(info, 0, head, ids.data());
    read_shard_tokens(info, info.num_tokens - tail, tail, ids.data() + head);
    fp.add(ids.data(), ids.size() * sizeof(uint32_t));
}
constexpr size_t kStateBytes = 8 + 4 * 4 + 1 + 8 * 4;

template <typename V>
void put(std::vector<uint8_t>& out, V v) {
    uint8_t b[sizeof(V)];
    std::memcpy(b, &v, sizeof(V));
    out.insert(out.end(), b, b + sizeof(V));
}
template <typename V>
V get(const std::vector<uint8_t>& in, size_t& at) {
    V v;
    std::memcpy(&v, in.data() + at, sizeof(V));
    at += sizeof(V);
    return v;
}

}  // namespace

std::vector<uint64_t> loader_permutation(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t stream) {
    std::vector<uint64_t> p(n);
    for (uint64_t i = 0; i < n; i++) p[i] = i;
    SplitMix64 rng{mix64(seed ^ mix64(epoch ^ mix64(stream + 0x632BE59BD9B4E019ull)))};
    for (uint64_t i = n; i > 1; i--) std::swap(p[i - 1], p[rng.below(i)]);
    return p;
}

DataLoader::DataLoader(const std::string& pattern, int B, int T, int rank, int world, bool shuffle,
                       uint64_t seed, uint32_t vocab_size)
    : pattern_(pattern), B_(B), T_(T), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed),
      vocab_(vocab_size) {
    if (B <= 0 || T <= 0) throw Error(strprintf("data loader: B=%d and T=%d must be positive", B, T));
    if (world <= 0 || rank < 0 || rank >= world)
        throw Error(strprintf("data loader: rank %d is not in [0, world=%d)", rank, world));
    if (vocab_size == 0) throw Error("data loader: vocab_size must be positive");

    glob_t g;
    std::memset(&g, 0, sizeof(g));
    int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> files;
    if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) files.push_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (rc == GLOB_NOMATCH || files.empty()) throw Error("data loader: no shard files match '" + pattern + "'");
    if (rc != 0) throw Error("data loader: cannot expand pattern '" + pattern + "'");
    std::sort(files.begin(), files.end());

    const uint64_t bt = uint64_t(B) * uint64_t(T);
    uint64_t largest = 0;
    Fnv fp;
    // Every shard given, used or not: headers, then every token id < vocab_size, before any step.
    std::vector<ShardInfo> infos;
    for (const std::string& f : files) infos.push_back(read_shard_info(f));
    if (check_shard_ids(infos, vocab_, "data loader")) {
        uint64_t tokens = 0;
        for (const ShardInfo& info : infos) tokens += info.num_tokens;
        if (tokens >= 4096)  // a handful of ids below 257 proves nothing
            std::fprintf(stderr,
                         "warning: data loader: every token id in '%s' (%llu tokens) is below 257, but the model's "
                         "vocabulary has %u ids: byte-level shards (ldm_data --tokenizer bytes)? Then train and "
                         "evaluate with --tokenizer bytes\n",
                         pattern.c_str(), (unsigned long long)tokens, vocab_);
    }
    Fnv contents;  // LDMDLST2 adds the shards' sampled token ids to fp (names and sizes)
    for (const ShardInfo& info : infos) {
        const std::string& f = info.path;
        fp.add_str(basename_of(f));
        fp.add_u64(info.file_size);
        add_shard_samples(contents, info);
        largest = std::max(largest, info.num_tokens);
        uint64_t w = info.num_tokens >= 1 ? (info.num_tokens - 1) / bt : 0;
        if (w == 0) {
            std::fprintf(stderr,
                         "warning: data loader: shard %s has %llu tokens, fewer than B*T+1 = %llu; skipped\n",
                         f.c_str(), (unsigned long long)info.num_tokens, (unsigned long long)(bt + 1));
            continue;
        }
        shards_.push_back({info, w});
        total_windows_ += w;
    }
    if (shards_.empty())
        throw Error(strprintf("data loader: too few tokens for B*T: no shard matching '%s' has B*T+1 = %llu "
                              "tokens (largest has %llu)",
                              pattern.c_str(), (unsigned long long)(bt + 1), (unsigned long long)largest));
    per_rank_ = total_windows_ / uint64_t(world);
    if (per_rank_ == 0)
        throw Error(strprintf("data loader: too few tokens for B*T with world size %d: '%s' holds only %llu "
                              "windows of B*T+1 = %llu tokens",
                              world, pattern.c_str(), (unsigned long long)total_windows_,
                              (unsigned long long)(bt + 1)));
    fingerprint_v1_ = fp.h;
    fp.add_u64(contents.h);
    fingerprint_ = fp.h;
    setup_epoch();
}

void DataLoader::setup_epoch() {
    const size_t S = shards_.size();
    order_.resize(S);
    if (shuffle_) {
        std::vector<uint64_t> p = loader_permutation(S, seed_, epoch_, 0);
        for (size_t i = 0; i < S; i++) order_[i] = uint32_t(p[i]);
    } else {
        for (size_t i = 0; i < S; i++) order_[i] = uint32_t(i);
    }
    prefix_.assign(S + 1, 0);
    for (size_t p = 0; p < S; p++) prefix_[p + 1] = prefix_[p] + shards_[order_[p]].windows;
    pos_ = 0;
    loaded_ = false;  // the window order must be rebuilt for the new epoch
}

void DataLoader::load_shard(size_t s) {
    const Shard& sh = shards_[s];
    if (loaded_shard_ != int64_t(s)) {
        loaded_shard_ = -1;
        ShardInfo now = read_shard_info(sh.info.path);
        if (now.num_tokens != sh.info.num_tokens || now.token_bytes != sh.info.token_bytes)
            throw Error("data loader: shard " + sh.info.path + " changed since the loader was opened");
        const uint64_t n = now.num_tokens;
        int fd = ::open(now.path.c_str(), O_RDONLY);
        if (fd < 0) throw Error("cannot open shard " + now.path + ": " + std::strerror(errno));
        uint8_t* dst;
        size_t bytes;
        if (now.token_bytes == 2) {
            tokens32_.clear();
            tokens32_.shrink_to_fit();
            tokens16_.resize(size_t(n));
            dst = reinterpret_cast<uint8_t*>(tokens16_.data());
            bytes = size_t(n) * 2;
        } else {
            tokens16_.clear();
            tokens16_.shrink_to_fit();
            tokens32_.resize(size_t(n));
            dst = reinterpret_cast<uint8_t*>(tokens32_.data());
            bytes = size_t(n) * 4;
        }
        size_t done = 0;
        while (done < bytes) {
            ssize_t r = ::pread(fd, dst + done, bytes - done, off_t(kShardHeaderBytes + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                ::close(fd);
                throw Error("read error on shard " + now.path);
            }
            done += size_t(r);
        }
        ::close(fd);
        // Checked at construction; again here in case the file was rewritten since (same size).
        const uint64_t i = now.token_bytes == 2 ? first_id_at_least(tokens16_.data(), n, vocab_)
                                                : first_id_at_least(tokens32_.data(), n, vocab_);
        if (i < n)
            throw Error(strprintf("data loader: shard %s: token id %u at index %llu is >= vocab_size %u (the file "
                                  "changed since the loader was opened)",
                                  now.path.c_str(), now.token_bytes == 2 ? uint32_t(tokens16_[i]) : tokens32_[i],
                                  (unsigned long long)i, vocab_));
        loaded_shard_ = int64_t(s);
        perm_epoch_ = ~0ull;
    }
    if (perm_epoch_ != epoch_) {
        if (shuffle_) {
            perm_ = loader_permutation(sh.windows, seed_, epoch_, uint64_t(s) + 1);
        } else {
            perm_.resize(sh.windows);
            for (uint64_t i = 0; i < sh.windows; i++) perm_[i] = i;
        }
        perm_epoch_ = epoch_;
    }
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
    if (idx_ >= per_rank_) {
        epoch_++;
        idx_ = 0;
        setup_epoch();
    }
    const uint64_t g = uint64_t(rank_) + uint64_t(world_) * idx_;
    if (!loaded_ || g < prefix_[pos_] || g >= prefix_[pos_ + 1]) {
        // upper_bound over prefix_ gives the first position whose start is > g.
        size_t p = size_t(std::upper_bound(prefix_.begin(), prefix_.end(), g) - prefix_.begin()) - 1;
        pos_ = p;
        load_shard(order_[p]);
        loaded_ = true;
    }
    const size_t s = order_[pos_];
    const uint64_t w = perm_[g - prefix_[pos_]];
    const size_t n = size_t(B_) * size_t(T_);
    const uint64_t off = w * uint64_t(n);
    if (shards_[s].info.token_bytes == 2) {
        const uint16_t* src = tokens16_.data() + off;
        for (size_t i = 0; i < n; i++) {
            inputs[i] = int32_t(src[i]);
            targets[i] = int32_t(src[i + 1]);
        }
    } else {
        const uint32_t* src = tokens32_.data() + off;
        for (size_t i = 0; i < n; i++) {
            inputs[i] = int32_t(src[i]);
            targets[i] = int32_t(src[i + 1]);
        }
    }
    last_shard_ = s;
    last_window_ = w;
    idx_++;
}

void DataLoader::reset() {
    epoch_ = 0;
    idx_ = 0;
    setup_epoch();
}

std::vector<uint8_t> DataLoader::save_state() const {
    std::vector<uint8_t> out(kStateMagic, kStateMagic + 8);
    put<int32_t>(out, B_);
    put<int32_t>(out, T_);
    put<int32_t>(out, rank_);
    put<int32_t>(out, world_);
    put<uint8_t>(out, shuffle_ ? 1 : 0);
    put<uint64_t>(out, seed_);
    put<uint64_t>(out, fingerprint_);
    put<uint64_t>(out, epoch_);
    put<uint64_t>(out, idx_);
    return out;
}

namespace {
struct SavedLoader {
    int32_t B, T, rank, world;
    bool shuffle;
    uint64_t seed, fingerprint, epoch, idx;
    bool v1;  // LDMDLST1: the fingerprint is of names and sizes only
};

SavedLoader parse_loader_state(const std::vector<uint8_t>& s) {
    const bool v1 = s.size() == kStateBytes && std::memcmp(s.data(), kStateMagicV1, 8) == 0;
    if (s.size() != kStateBytes || (!v1 && std::memcmp(s.data(), kStateMagic, 8) != 0))
        throw Error(strprintf("data loader state: not a data loader state (%zu bytes, expected %zu starting with "
                              "LDMDLST2 or LDMDLST1)",
                              s.size(), kStateBytes));
    size_t at = 8;
    SavedLoader v;
    v.v1 = v1;
    v.B = get<int32_t>(s, at);
    v.T = get<int32_t>(s, at);
    v.rank = get<int32_t>(s, at);
    v.world = get<int32_t>(s, at);
    v.shuffle = get<uint8_t>(s, at) != 0;
    v.seed = get<uint64_t>(s, at);
    v.fingerprint = get<uint64_t>(s, at);
    v.epoch = get<uint64_t>(s, at);
    v.idx = get<uint64_t>(s, at);
    return v;
}
}  // namespace

std::string DataLoader::state_mismatch(const std::vector<uint8_t>& s, bool with_rank) const {
    const SavedLoader v = parse_loader_state(s);
    std::string bad;
    if (v.B != B_ || v.T != T_) bad += strprintf(" B,T saved %d,%d now %d,%d;", v.B, v.T, B_, T_);
    if (with_rank && (v.rank != rank_ || v.world != world_))
        bad += strprintf(" rank/world saved %d/%d now %d/%d;", v.rank, v.world, rank_, world_);
    if (v.shuffle != shuffle_) bad += strprintf(" shuffle saved %d now %d;", int(v.shuffle), int(shuffle_));
    if (v.seed != seed_)
        bad += strprintf(" seed saved %llu now %llu;", (unsigned long long)v.seed, (unsigned long long)seed_);
    if (v.v1 ? v.fingerprint != fingerprint_v1_ : v.fingerprint != fingerprint_)
        bad += std::string(" shard files (names, sizes") + (v.v1 ? "" : " or contents") + ") differ from '" +
               pattern_ + "';";
    return bad;
}

void DataLoader::check_same_data(const std::vector<uint8_t>& s) const {
    const std::string bad = state_mismatch(s, false);
    if (!bad.empty()) throw Error("data loader state does not match this loader:" + bad);
}

void DataLoader::load_state(const std::vector<uint8_t>& s) {
    const std::string bad = state_mismatch(s, true);
    if (!bad.empty()) throw Error("data loader state does not match this loader:" + bad);
    const SavedLoader v = parse_loader_state(s);
    if (v.idx > per_rank_)
        throw Error(strprintf("data loader state: batch index %llu beyond the %llu batches per epoch",
                              (unsigned long long)v.idx, (unsigned long long)per_rank_));
    epoch_ = v.epoch;
    idx_ = v.idx;
    setup_epoch();
}

}  // namespace ldm
