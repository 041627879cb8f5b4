// core/shard.h — token shards, byte-compatible with llm.c's data files (issue #2 item 4).
//
// Layout (all little-endian; see doc/formats.md "Token shards"):
//   header: 256 x int32 (1024 bytes)
//     [0] magic   20240520 (uint16 tokens) | 20240801 (uint32 tokens)
//     [1] version 1                        | 7
//     [2] number of tokens n (0 <= n <= INT32_MAX)
//     [3..255] zero
//   body:   n tokens, uint16 or uint32 each
// A valid file is exactly 1024 + n * width bytes. uint16 shards hold ids < 65536, i.e.
// vocabularies of at most 65536 ids; larger vocabularies use the uint32 variant.
//
// Errors: every reader/writer throws ldm::Error naming the file and what is wrong (wrong magic,
// wrong version, truncated header/body, trailing bytes, id too large for uint16).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ldm {

constexpr int32_t kShardMagicU16 = 20240520, kShardVersionU16 = 1;
constexpr int32_t kShardMagicU32 = 20240801, kShardVersionU32 = 7;
constexpr size_t kShardHeaderInts = 256;
constexpr size_t kShardHeaderBytes = kShardHeaderInts * 4;

// True when ids of a vocabulary with `vocab_size` ids need the uint32 variant (> 65536 ids).
inline bool shard_needs_uint32(uint64_t vocab_size) { return vocab_size > 65536; }

struct ShardInfo {
    std::string path;
    int32_t magic = 0, version = 0;
    int token_bytes = 0;      // 2 (uint16 variant) or 4 (uint32 variant)
    uint64_t num_tokens = 0;  // header[2]
    uint64_t file_size = 0;   // bytes, == kShardHeaderBytes + num_tokens * token_bytes
};

// Writes `n` tokens to `path` atomically (temp file + fsync + rename). uint32_tokens selects the
// uint32 variant; otherwise every id must be < 65536 (ldm::Error naming the index otherwise).
void write_shard(const std::string& path, const uint32_t* tokens, size_t n, bool uint32_tokens);

// Reads and checks the header and the file size (magic, version, n >= 0, size == 1024 + n*width).
ShardInfo read_shard_info(const std::string& path);

// Reads the whole shard (checked as read_shard_info) and widens the ids to uint32.
std::vector<uint32_t> read_shard(const std::string& path);

// Reads tokens [start, start+count) of a shard whose header was checked by read_shard_info,
// widening to uint32. ldm::Error when the range is outside the shard or the read fails.
void read_shard_tokens(const ShardInfo& info, uint64_t start, uint64_t count, uint32_t* out);

// Index of the first token >= vocab_size among tokens[0, n) (uint16 or uint32 ids), or n if
// there is none. Vectorized max reduction per block, then a search inside the failing block.
uint64_t first_id_at_least(const uint16_t* tokens, uint64_t n, uint32_t vocab_size);
uint64_t first_id_at_least(const uint32_t* tokens, uint64_t n, uint32_t vocab_size);

// Checks every token of every shard (headers already checked by read_shard_info) against
// vocab_size, streaming the files in 8 MiB blocks on all OpenMP threads (parallel over the
// blocks of all shards, so one large shard is split too; uint16 shards need no scan when
// vocab_size >= 65536). Throws ldm::Error "<who>: shard F: token id X at index I (byte offset B)
// is >= vocab_size V" for the first bad token in list order, or the read error. Returns true when
// vocab_size > 257 and every id is < 257 (the byte tokenizer's range: shards made with
// `--tokenizer bytes` read under a larger vocabulary; for uint16 shards with vocab_size > 65535,
// whose ids need no check, only the first 8 MiB of each shard are looked at), false otherwise.
// Throughput:
// doc/formats.md "Data loader".
bool check_shard_ids(const std::vector<ShardInfo>& shards, uint32_t vocab_size, const std::string& who);

// Streaming writer for shards of unknown length: appends tokens to `path.tmp.<pid>`, and
// finish() writes the header (count), fsyncs and renames to `path`. If destroyed without
// finish() (e.g. an exception unwinding), the temp file is removed and `path` is untouched.
class ShardWriter {
 public:
    ShardWriter(const std::string& path, bool uint32_tokens);
    ~ShardWriter();
    ShardWriter(const ShardWriter&) = delete;
    ShardWriter& operator=(const ShardWriter&) = delete;
    void append(const uint32_t* tokens, size_t n);  // ldm::Error if an id does not fit the width
    uint64_t size() const { return count_; }          // tokens appended so far
    const std::string& path() const { return path_; }
    void finish();                                    // header + rename; the writer is then closed

 private:
    void flush_buffer();
    std::string path_, tmp_;
    bool u32_;
    FILE* f_ = nullptr;
    uint64_t count_ = 0;
    std::vector<uint8_t> buf_;
};

}  // namespace ldm
