// Tests for core/shard.h: llm.c-compatible token shards (issue #2 item 4).
#include "test/helpers.h"

#include <cstring>
#include <random>
#include <unistd.h>

#include "core/shard.h"

using ldm::Error;

namespace {

// Independent decoding of the on-disk bytes (little-endian), not using the library reader.
int32_t le_i32(const std::string& b, size_t off) {
    return int32_t(uint32_t(uint8_t(b[off])) | uint32_t(uint8_t(b[off + 1])) << 8 |
                   uint32_t(uint8_t(b[off + 2])) << 16 | uint32_t(uint8_t(b[off + 3])) << 24);
}
uint32_t le_u16(const std::string& b, size_t off) {
    return uint32_t(uint8_t(b[off])) | uint32_t(uint8_t(b[off + 1])) << 8;
}

std::string raw_header(int32_t magic, int32_t version, int32_t n) {
    std::string h(1024, '\0');
    int32_t v[3] = {magic, version, n};
    std::memcpy(&h[0], v, 12);
    return h;
}

void write_raw(const std::string& path, const std::string& bytes) {
    ldm::write_file_atomic(path, bytes.data(), bytes.size());
}

// Expects read_shard_info(path) to throw with a message containing every string in `parts`.
void expect_error(const std::string& path, std::initializer_list<const char*> parts) {
    try {
        ldm::read_shard_info(path);
        FAIL("no exception for " << path);
    } catch (const Error& e) {
        std::string msg = e.what();
        INFO(msg);
        REQUIRE(msg.find(path) != std::string::npos);
        for (const char* p : parts) REQUIRE(msg.find(p) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("uint16 shard roundtrip and exact llm.c byte layout", "[shard]") {
    std::string d = scratch_dir("shard_u16");
    std::mt19937 rng(123);
    std::vector<uint32_t> toks(100003);
    for (auto& t : toks) t = rng() % 50257;
    toks[0] = 0;
    toks[1] = 65535;  // the largest uint16 id
    std::string path = d + "/a.bin";
    ldm::write_shard(path, toks.data(), toks.size(), false);

    std::string b = ldm::read_file(path);
    REQUIRE(b.size() == 1024 + 2 * toks.size());
    REQUIRE(le_i32(b, 0) == 20240520);
    REQUIRE(le_i32(b, 4) == 1);
    REQUIRE(le_i32(b, 8) == int32_t(toks.size()));
    for (size_t i = 12; i < 1024; i++) REQUIRE(b[i] == 0);
    for (size_t i = 0; i < toks.size(); i++) REQUIRE(le_u16(b, 1024 + 2 * i) == toks[i]);

    ldm::ShardInfo info = ldm::read_shard_info(path);
    REQUIRE(info.token_bytes == 2);
    REQUIRE(info.num_tokens == toks.size());
    REQUIRE(info.magic == 20240520);
    REQUIRE(info.version == 1);
    REQUIRE(ldm::read_shard(path) == toks);

    std::vector<uint32_t> part(777);
    ldm::read_shard_tokens(info, 5000, part.size(), part.data());
    REQUIRE(std::equal(part.begin(), part.end(), toks.begin() + 5000));
    REQUIRE_THROWS_AS(ldm::read_shard_tokens(info, toks.size() - 10, 11, part.data()), Error);
    REQUIRE(!ldm::file_exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST_CASE("uint32 shard roundtrip with ids above 65535", "[shard]") {
    std::string d = scratch_dir("shard_u32");
    std::mt19937 rng(7);
    std::vector<uint32_t> toks(4099);
    for (auto& t : toks) t = rng() % 200000;
    toks[3] = 0xFFFFFFFFu;
    std::string path = d + "/b.bin";
    ldm::write_shard(path, toks.data(), toks.size(), true);
    std::string b = ldm::read_file(path);
    REQUIRE(b.size() == 1024 + 4 * toks.size());
    REQUIRE(le_i32(b, 0) == 20240801);
    REQUIRE(le_i32(b, 4) == 7);
    REQUIRE(le_i32(b, 8) == int32_t(toks.size()));
    for (size_t i = 0; i < toks.size(); i++) REQUIRE(uint32_t(le_i32(b, 1024 + 4 * i)) == toks[i]);
    REQUIRE(ldm::read_shard_info(path).token_bytes == 4);
    REQUIRE(ldm::read_shard(path) == toks);
    REQUIRE(ldm::shard_needs_uint32(65537));
    REQUIRE(!ldm::shard_needs_uint32(65536));
    REQUIRE(!ldm::shard_needs_uint32(50257));
}

TEST_CASE("empty shard and streaming writer equal write_shard", "[shard]") {
    std::string d = scratch_dir("shard_stream");
    ldm::write_shard(d + "/empty.bin", nullptr, 0, false);
    REQUIRE(ldm::read_shard_info(d + "/empty.bin").num_tokens == 0);
    REQUIRE(ldm::read_shard(d + "/empty.bin").empty());

    std::vector<uint32_t> toks(3000000);
    for (size_t i = 0; i < toks.size(); i++) toks[i] = uint32_t((i * 2654435761u) >> 16) % 50000;
    ldm::write_shard(d + "/whole.bin", toks.data(), toks.size(), false);
    {
        ldm::ShardWriter w(d + "/stream.bin", false);
        size_t at = 0, step = 1;
        while (at < toks.size()) {
            size_t m = std::min(step, toks.size() - at);
            w.append(toks.data() + at, m);
            at += m;
            step = step * 3 + 1;
        }
        REQUIRE(w.size() == toks.size());
        REQUIRE(!ldm::file_exists(d + "/stream.bin"));  // nothing at the final name before finish()
        w.finish();
    }
    REQUIRE(ldm::read_file(d + "/stream.bin") == ldm::read_file(d + "/whole.bin"));
}

TEST_CASE("an unfinished writer leaves no file; uint16 rejects ids >= 65536", "[shard]") {
    std::string d = scratch_dir("shard_abort");
    {
        ldm::ShardWriter w(d + "/x.bin", false);
        uint32_t t[3] = {1, 2, 3};
        w.append(t, 3);
    }
    REQUIRE(!ldm::file_exists(d + "/x.bin"));
    REQUIRE(!ldm::file_exists(d + "/x.bin.tmp." + std::to_string(::getpid())));

    std::vector<uint32_t> bad = {5, 65535, 65536};
    try {
        ldm::write_shard(d + "/y.bin", bad.data(), bad.size(), false);
        FAIL("no exception");
    } catch (const Error& e) {
        std::string m = e.what();
        REQUIRE(m.find("65536") != std::string::npos);
        REQUIRE(m.find("index 2") != std::string::npos);
        REQUIRE(m.find("y.bin") != std::string::npos);
    }
    REQUIRE(!ldm::file_exists(d + "/y.bin"));
    REQUIRE_THROWS_AS(ldm::write_shard(d + "/nodir/z.bin", bad.data(), 1, false), Error);
}

TEST_CASE("every bad header is rejected with a message naming the file", "[shard]") {
    std::string d = scratch_dir("shard_bad");
    std::string body16(2 * 10, '\x01'), body32(4 * 10, '\x01');

    write_raw(d + "/short.bin", std::string(1000, '\0'));
    expect_error(d + "/short.bin", {"truncated header"});
    write_raw(d + "/zero.bin", "");
    expect_error(d + "/zero.bin", {"truncated header"});

    write_raw(d + "/magic.bin", raw_header(20240521, 1, 10) + body16);
    expect_error(d + "/magic.bin", {"wrong magic", "20240521"});
    write_raw(d + "/text.bin", std::string(2000, 'a'));
    expect_error(d + "/text.bin", {"wrong magic"});

    write_raw(d + "/ver16.bin", raw_header(20240520, 7, 10) + body16);
    expect_error(d + "/ver16.bin", {"wrong version", "7"});
    write_raw(d + "/ver32.bin", raw_header(20240801, 1, 10) + body32);
    expect_error(d + "/ver32.bin", {"wrong version"});

    write_raw(d + "/neg.bin", raw_header(20240520, 1, -5) + body16);
    expect_error(d + "/neg.bin", {"negative token count"});

    write_raw(d + "/trunc16.bin", raw_header(20240520, 1, 11) + body16);
    expect_error(d + "/trunc16.bin", {"truncated", "11 tokens"});
    write_raw(d + "/trunc32.bin", raw_header(20240801, 7, 10) + body32.substr(1));
    expect_error(d + "/trunc32.bin", {"truncated"});
    // a uint16 body under a uint32 header: 10 tokens need 40 bytes, only 20 present
    write_raw(d + "/mixed.bin", raw_header(20240801, 7, 10) + body16);
    expect_error(d + "/mixed.bin", {"truncated"});

    write_raw(d + "/trail16.bin", raw_header(20240520, 1, 10) + body16 + "x");
    expect_error(d + "/trail16.bin", {"1 trailing bytes"});
    write_raw(d + "/trail32.bin", raw_header(20240801, 7, 9) + body32);
    expect_error(d + "/trail32.bin", {"4 trailing bytes"});

    try {
        ldm::read_shard(d + "/missing.bin");
        FAIL("no exception");
    } catch (const Error& e) {
        REQUIRE(std::string(e.what()).find("missing.bin") != std::string::npos);
    }
    // the good case of the same construction is accepted (so the checks above are not vacuous)
    write_raw(d + "/good.bin", raw_header(20240520, 1, 10) + body16);
    REQUIRE(ldm::read_shard(d + "/good.bin") == std::vector<uint32_t>(10, 0x0101));
}
