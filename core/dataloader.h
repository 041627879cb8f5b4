// core/dataloader.h — token-shard data loader shared by the CPU and GPU trainers (issue #2 item 7).
// Semantics (documented in doc/formats.md "Data loader"):
//
// * Shards: the files matching a glob pattern (sorted by name). At construction, before any
//   batch, every one of them is checked: header and size (read_shard_info) and every token id
//   < vocab_size (check_shard_ids: streamed, parallel over shards and blocks). Only one shard is
//   held in memory at a time.
// * Windows: a batch is ONE contiguous window of B*T+1 tokens (as in llm.c): inputs = w[0:B*T],
//   targets = w[1:B*T+1], both reshaped row-major to [B, T]. A shard of n tokens has
//   floor((n-1)/(B*T)) windows, window k starting at token k*B*T (consecutive windows share one
//   token). Windows never cross shard boundaries. Shards with no window (n < B*T+1) are skipped
//   with a warning on stderr; if no shard has a window -> ldm::Error ("too few tokens for B*T").
// * Epoch order: shard order, then window order inside each shard; with shuffle=true both are
//   permuted per epoch by Fisher-Yates driven by SplitMix64 streams keyed by (seed, epoch,
//   stream), so the order is the same on every platform (std::shuffle is not used).
// * Ranks: of the N windows of an epoch (global order g = 0..N-1), rank r of world W takes
//   g = r, r+W, r+2W, ... for g < floor(N/W)*W. The last N mod W windows of the epoch's order are
//   dropped, so every rank has exactly floor(N/W) batches per epoch and ranks never overlap.
// * After the last batch of an epoch the next call starts the next epoch (new permutation).
// * Token ids >= vocab_size -> ldm::Error at construction naming the shard, the token index, its
//   byte offset and the id (checked again when a shard is loaded, in case it was rewritten).
// * save_state/load_state: (epoch, batch index) plus B, T, rank, world, shuffle, seed and a
//   fingerprint of the shard files (names, sizes and the first and last 16384 token ids of each,
//   so that shards rewritten at the same size count as different); a mismatch on load -> ldm::Error saying
//   which. States saved before the contents counted (LDMDLST1) are checked on names and sizes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/shard.h"

namespace ldm {

class DataLoader {
 public:
    // pattern: a glob of shard files (sorted); B sequences of T tokens per batch; windows of
    // B*T+1 tokens; rank/world: disjoint windows per rank; shuffle: deterministic per-epoch
    // shuffle of shard order and window order from seed (false = sequential, for validation).
    // vocab_size: any token id >= vocab_size -> ldm::Error naming the shard and position.
    DataLoader(const std::string& pattern, int B, int T, int rank, int world, bool shuffle, uint64_t seed,
               uint32_t vocab_size);
    void next_batch(int32_t* inputs, int32_t* targets);  // each [B*T], row-major (b, t)
    void reset();                                         // back to the start of epoch 0
    std::vector<uint8_t> save_state() const;              // opaque bytes for checkpoints
    void load_state(const std::vector<uint8_t>& s);       // ldm::Error if it does not match
    // For a resume with another world size: ldm::Error when the saved state is of other data
    // (shard files, seed, shuffle, B, T); rank, world and position are not compared.
    void check_same_data(const std::vector<uint8_t>& s) const;
    uint64_t batches_per_epoch() const { return per_rank_; }  // for this rank

    // Introspection (logging, tests).
    uint64_t epoch() const { return epoch_; }
    uint64_t batch_in_epoch() const { return idx_; }        // batches already taken this epoch
    uint64_t windows_per_epoch() const { return total_windows_; }  // all ranks, before dropping
    size_t num_shards() const { return shards_.size(); }    // shards with >= 1 window
    const std::string& shard_path(size_t i) const { return shards_[i].info.path; }
    // (shard index in the sorted usable list, window index in that shard) of the last batch.
    uint64_t last_shard() const { return last_shard_; }
    uint64_t last_window() const { return last_window_; }

 private:
    // " what differs;" for each mismatch of s against this loader ("" = same); with_rank: also
    // rank and world. ldm::Error when s is not a loader state.
    std::string state_mismatch(const std::vector<uint8_t>& s, bool with_rank) const;
    struct Shard {
        ShardInfo info;
        uint64_t windows;
    };
    void setup_epoch();
    void load_shard(size_t s);

    std::string pattern_;
    int B_, T_, rank_, world_;
    bool shuffle_;
    uint64_t seed_;
    uint32_t vocab_;
    std::vector<Shard> shards_;
    uint64_t fingerprint_ = 0, total_windows_ = 0, per_rank_ = 0;
    uint64_t fingerprint_v1_ = 0;  // names and sizes only: what an LDMDLST1 state holds

    uint64_t epoch_ = 0, idx_ = 0;
    std::vector<uint32_t> order_;     // shard order of this epoch (indices into shards_)
    std::vector<uint64_t> prefix_;    // prefix_[p] = windows in order_[0..p)
    size_t pos_ = 0;                  // position in order_ of the loaded shard (valid if loaded_)
    bool loaded_ = false;
    int64_t loaded_shard_ = -1;       // which shard's tokens are in tokens16_/tokens32_
    uint64_t perm_epoch_ = ~0ull;     // epoch for which perm_ was built
    std::vector<uint64_t> perm_;      // window order inside the loaded shard
    std::vector<uint16_t> tokens16_;
    std::vector<uint32_t> tokens32_;
    uint64_t last_shard_ = 0, last_window_ = 0;
};

// The deterministic permutation used for shuffling: Fisher-Yates over [0, n) driven by
// SplitMix64 keyed by (seed, epoch, stream). Exposed for tests and documentation.
std::vector<uint64_t> loader_permutation(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t stream);

}  // namespace ldm
