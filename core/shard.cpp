// core/shard.cpp — llm.c-compatible token shards. See core/shard.h and doc/formats.md.
#include "core/shard.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shard I/O assumes a little-endian host (the on-disk format is little-endian)"
#endif

namespace ldm {

namespace {

void put_token(uint8_t* dst, uint32_t v, bool u32) {
    if (u32) {
        std::memcpy(dst, &v, 4);
    } else {
        uint16_t s = uint16_t(v);
        std::memcpy(dst, &s, 2);
    }
}

// Reads exactly n bytes at offset `off`; throws naming the file on short read / error.
void pread_exact(int fd, void* dst, size_t n, uint64_t off, const std::string& path) {
    uint8_t* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
        ssize_t r = ::pread(fd, p, n, off_t(off));
        if (r < 0) {
            if (errno == EINTR) continue;
            throw Error("read error on shard " + path + ": " + std::strerror(errno));
        }
        if (r == 0) throw Error(strprintf("shard %s: unexpected end of file at byte %llu", path.c_str(),
                                          (unsigned long long)off));
        p += r;
        n -= size_t(r);
        off += uint64_t(r);
    }
}

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
ShardWriter::ShardWriter(const std::string& path, bool uint32_tokens)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())), u32_(uint32_tokens) {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) throw Error("cannot create " + tmp_ + ": " + std::strerror(errno));
    std::vector<uint8_t> zero(kShardHeaderBytes, 0);  // placeholder header, rewritten in finish()
    if (std::fwrite(zero.data(), 1, zero.size(), f_) != zero.size()) {
        int e = errno;
        std::fclose(f_);
        f_ = nullptr;
        ::unlink(tmp_.c_str());
        throw Error("write failed on " + tmp_ + ": " + std::strerror(e));
    }
    buf_.reserve(1 << 20);
}

ShardWriter::~ShardWriter() {
    if (f_) {
        std::fclose(f_);
        ::unlink(tmp_.c_str());
    }
}

void ShardWriter::flush_buffer() {
    if (buf_.empty()) return;
    if (std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size())
        throw Error("write failed on " + tmp_ + ": " + std::strerror(errno));
    buf_.clear();
}

void ShardWriter::append(const uint32_t* tokens, size_t n) {
    if (!f_) throw Error("shard writer for " + path_ + " is already closed");
    if (count_ + n > uint64_t(INT32_MAX))
        throw Error(strprintf("shard %s: more than %d tokens (the header's count is an int32)",
                              path_.c_str(), INT32_MAX));
    const size_t w = u32_ ? 4 : 2;
    for (size_t i = 0; i < n; i++) {
        if (!u32_ && tokens[i] > 0xFFFF)
            throw Error(strprintf("shard %s: token id %u at index %llu does not fit the uint16 format "
                                  "(vocabularies over 65536 ids need the uint32 variant)",
                                  path_.c_str(), tokens[i], (unsigned long long)(count_ + i)));
        size_t at = buf_.size();
        buf_.resize(at + w);
        put_token(buf_.data() + at, tokens[i], u32_);
        if (buf_.size() >= (1u << 20)) flush_buffer();
    }
    count_ += n;
}

void ShardWriter::finish() {
    if (!f_) throw Error("shard writer for " + path_ + " is already closed");
    flush_buffer();
    int32_t header[kShardHeaderInts] = {0};
    header[0] = u32_ ? kShardMagicU32 : kShardMagicU16;
    header[1] = u32_ ? kShardVersionU32 : kShardVersionU16;
    header[2] = int32_t(count_);
    if (std::fseek(f_, 0, SEEK_SET) != 0 || std::fwrite(header, 4, kShardHeaderInts, f_) != kShardHeaderInts ||
        std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0)
        throw Error("write failed on " + tmp_ + ": " + std::strerror(errno));
    int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) {
        ::unlink(tmp_.c_str());
        throw Error("cannot close " + tmp_ + ": " + std::strerror(errno));
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
        int e = errno;
        ::unlink(tmp_.c_str());
        throw Error("cannot rename " + tmp_ + " to " + path_ + ": " + std::strerror(e));
    }
}

void write_shard(const std::string& path, const uint32_t* tokens, size_t n, bool uint32_tokens) {
    ShardWriter w(path, uint32_tokens);
    w.append(tokens, n);
    w.finish();
}

// ---------------------------------------------------------------------------------------------
ShardInfo read_shard_info(const std::string& path) {
    Fd fd;
    fd.fd = ::open(path.c_str(), O_RDONLY);
    if (fd.fd < 0) throw Error("cannot open shard " + path + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd.fd, &st) != 0) throw Error("cannot stat shard " + path + ": " + std::strerror(errno));
    ShardInfo info;
    info.path = path;
    info.file_size = uint64_t(st.st_size);
    if (info.file_size < kShardHeaderBytes)
        throw Error(strprintf("shard %s: truncated header (file has %llu bytes, the header alone is %zu)",
                              path.c_str(), (unsigned long long)info.file_size, kShardHeaderBytes));
    int32_t header[kShardHeaderInts];
    pread_exact(fd.fd, header, kShardHeaderBytes, 0, path);
    info.magic = header[0];
    info.version = header[1];
    if (info.magic == kShardMagicU16) {
        info.token_bytes = 2;
        if (info.version != kShardVersionU16)
            throw Error(strprintf("shard %s: wrong version %d for magic %d (expected %d)", path.c_str(),
                                  info.version, info.magic, kShardVersionU16));
    } else if (info.magic == kShardMagicU32) {
        info.token_bytes = 4;
        if (info.version != kShardVersionU32)
            throw Error(strprintf("shard %s: wrong version %d for magic %d (expected %d)", path.c_str(),
                                  info.version, info.magic, kShardVersionU32));
    } else {
        throw Error(strprintf("shard %s: wrong magic %d (expected %d for uint16 tokens or %d for uint32 "
                              "tokens); not a token shard",
                              path.c_str(), info.magic, kShardMagicU16, kShardMagicU32));
    }
    if (header[2] < 0)
        throw Error(strprintf("shard %s: negative token count %d in header", path.c_str(), header[2]));
    info.num_tokens = uint64_t(header[2]);
    uint64_t expect = kShardHeaderBytes + info.num_tokens * uint64_t(info.token_bytes);
    if (info.file_size < expect)
        throw Error(strprintf("shard %s: truncated: header says %llu tokens (%llu bytes) but the file has "
                              "%llu bytes",
                              path.c_str(), (unsigned long long)info.num_tokens, (unsigned long long)expect,
                              (unsigned long long)info.file_size));
    if (info.file_size > expect)
        throw Error(strprintf("shard %s: %llu trailing bytes: header says %llu tokens (%llu bytes) but the "
                              "file has %llu bytes",
                              path.c_str(), (unsigned long long)(info.file_size - expect),
                              (unsigned long long)info.num_tokens, (unsigned long long)expect,
                              (unsigned long long)info.file_size));
    return info;
}

void read_shard_tokens(const ShardInfo& info, uint64_t start, uint64_t count, uint32_t* out) {
    if (start > info.num_tokens || count > info.num_tokens - start)
        throw Error(strprintf("shard %s: token range [%llu, %llu) outside its %llu tokens", info.path.c_str(),
                              (unsigned long long)start, (unsigned long long)(start + count),
                              (unsigned long long)info.num_tokens));
    if (count == 0) return;
    Fd fd;
    fd.fd = ::open(info.path.c_str(), O_RDONLY);
    if (fd.fd < 0) throw Error("cannot open shard " + info.path + ": " + std::strerror(errno));
    const uint64_t w = uint64_t(info.token_bytes);
    const uint64_t off = kShardHeaderBytes + start * w;
    if (w == 4) {
        pread_exact(fd.fd, out, size_t(count * 4), off, info.path);
        return;
    }
    // uint16: read in blocks and widen.
    std::vector<uint16_t> buf(size_t(std::min<uint64_t>(count, 1 << 20)));
    uint64_t done = 0;
    while (done < count) {
        size_t m = size_t(std::min<uint64_t>(count - done, buf.size()));
        pread_exact(fd.fd, buf.data(), m * 2, off + done * 2, info.path);
        for (size_t i = 0; i < m; i++) out[done + i] = buf[i];
        done += m;
    }
}

namespace {
template <typename W>
uint64_t first_id_at_least_t(const W* t, uint64_t n, uint32_t vocab_size) {
    if (vocab_size == 0) return 0;                         // every id is bad
    if (sizeof(W) == 2 && vocab_size > 0xFFFF) return n;   // every uint16 id fits
    const W lim = W(vocab_size - 1);                       // every id must be <= lim
    constexpr uint64_t kBlock = 1 << 14;
    for (uint64_t b = 0; b < n; b += kBlock) {
        const uint64_t e = std::min(n, b + kBlock);
        W mx = 0;
#pragma omp simd reduction(max : mx)
        for (uint64_t i = b; i < e; i++) mx = t[i] > mx ? t[i] : mx;
        if (mx > lim)
            for (uint64_t i = b; i < e; i++)
                if (t[i] > lim) return i;
    }
    return n;
}
}  // namespace

uint64_t first_id_at_least(const uint16_t* tokens, uint64_t n, uint32_t vocab_size) {
    return first_id_at_least_t(tokens, n, vocab_size);
}
uint64_t first_id_at_least(const uint32_t* tokens, uint64_t n, uint32_t vocab_size) {
    return first_id_at_least_t(tokens, n, vocab_size);
}

bool check_shard_ids(const std::vector<ShardInfo>& shards, uint32_t vocab_size, const std::string& who) {
    constexpr uint32_t kByteVocab = 257;  // the byte tokenizer: ids 0..255 and EOT 256
    const bool want_bytes = vocab_size > kByteVocab;
    struct Block {
        size_t shard;
        uint64_t start, count;  // tokens
    };
    constexpr uint64_t kBlockBytes = uint64_t(8) << 20;
    std::vector<Block> blocks;
    for (size_t s = 0; s < shards.size(); s++) {
        const ShardInfo& sh = shards[s];
        const uint64_t per = kBlockBytes / uint64_t(sh.token_bytes);
        if (sh.token_bytes == 2 && vocab_size > 0xFFFF) {
            // every uint16 id fits: only the first block, for the byte-range check
            if (sh.num_tokens > 0) blocks.push_back({s, 0, std::min(per, sh.num_tokens)});
            continue;
        }
        for (uint64_t at = 0; at < sh.num_tokens; at += per)
            blocks.push_back({s, at, std::min(per, sh.num_tokens - at)});
    }
    const long nb = long(blocks.size());
    std::vector<uint64_t> bad(blocks.size(), UINT64_MAX);  // index in the shard of the first bad id
    std::vector<uint32_t> bad_id(blocks.size(), 0);
    std::vector<char> above_bytes(blocks.size(), 0);  // the block has an id >= 257
    std::vector<std::string> err(blocks.size());
#pragma omp parallel if (nb > 1)
    {
        std::vector<uint32_t> buf32;  // 8 MiB block buffer (uint16 blocks use it as uint16)
        Fd fd;
        size_t open_shard = SIZE_MAX;
#pragma omp for schedule(dynamic, 1)
        for (long b = 0; b < nb; b++) {
            const Block& k = blocks[size_t(b)];
            const ShardInfo& sh = shards[k.shard];
            try {
                if (open_shard != k.shard) {
                    if (fd.fd >= 0) ::close(fd.fd);
                    open_shard = SIZE_MAX;
                    fd.fd = ::open(sh.path.c_str(), O_RDONLY);
                    if (fd.fd < 0) throw Error("cannot open shard " + sh.path + ": " + std::strerror(errno));
                    ::posix_fadvise(fd.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
                    open_shard = k.shard;
                }
                const uint64_t w = uint64_t(sh.token_bytes);
                buf32.resize(size_t(kBlockBytes / 4));
                pread_exact(fd.fd, buf32.data(), size_t(k.count * w), kShardHeaderBytes + k.start * w, sh.path);
                uint64_t i;
                if (w == 2) {
                    const uint16_t* p = reinterpret_cast<const uint16_t*>(buf32.data());
                    i = first_id_at_least(p, k.count, vocab_size);
                    if (i < k.count) bad_id[size_t(b)] = p[i];
                    if (want_bytes) above_bytes[size_t(b)] = first_id_at_least(p, k.count, kByteVocab) < k.count;
                } else {
                    i = first_id_at_least(buf32.data(), k.count, vocab_size);
                    if (i < k.count) bad_id[size_t(b)] = buf32[size_t(i)];
                    if (want_bytes) above_bytes[size_t(b)] = first_id_at_least(buf32.data(), k.count, kByteVocab) < k.count;
                }
                if (i < k.count) bad[size_t(b)] = k.start + i;
            } catch (const std::exception& e) {
                err[size_t(b)] = e.what();
            }
        }
    }
    for (size_t b = 0; b < blocks.size(); b++) {
        if (!err[b].empty()) throw Error(who + ": " + err[b]);
        if (bad[b] != UINT64_MAX) {
            const ShardInfo& sh = shards[blocks[b].shard];
            throw Error(strprintf("%s: shard %s: token id %u at index %llu (byte offset %llu) is >= vocab_size %u",
                                  who.c_str(), sh.path.c_str(), bad_id[b], (unsigned long long)bad[b],
                                  (unsigned long long)(kShardHeaderBytes + bad[b] * uint64_t(sh.token_bytes)),
                                  vocab_size));
        }
    }
    if (!want_bytes || blocks.empty()) return false;
    for (char a : above_bytes)
        if (a) return false;
    return true;
}

std::vector<uint32_t> read_shard(const std::string& path) {
    ShardInfo info = read_shard_info(path);
    std::vector<uint32_t> out(size_t(info.num_tokens));
    read_shard_tokens(info, 0, info.num_tokens, out.data());
    return out;
}

}  // namespace ldm
