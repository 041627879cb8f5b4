// Tests for core/checkpoint: FNV-1a against published vectors, container round trips, and clear
// errors on corrupt, truncated, wrong-kind and mismatching files.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "core/checkpoint.h"
#include "core/common.h"
#include "test/helpers.h"

using namespace ldm;

static ModelConfig tiny_cfg() {
    ModelConfig c = preset_config("tiny", 50257);
    c.seq_len = 64;
    return c;
}

TEST_CASE("fnv1a64 matches the published test vectors", "[checkpoint]") {
    // From the FNV reference test suite (Fowler/Noll/Vo), FNV-1a 64-bit.
    CHECK(fnv1a64("", 0) == 0xcbf29ce484222325ull);
    CHECK(fnv1a64("a", 1) == 0xaf63dc4c8601ec8cull);
    CHECK(fnv1a64("foobar", 6) == 0x85944171f73967e8ull);
    // incremental == one shot
    CHECK(fnv1a64("bar", 3, fnv1a64("foo", 3)) == 0x85944171f73967e8ull);
}

TEST_CASE("config JSON round trip and diff", "[checkpoint]") {
    ModelConfig c = preset_config("qwen3-1.7b", 50257);
    c.n_layer = 3;
    ModelConfig d = config_from_json(config_to_json(c));
    CHECK(config_to_json(d) == config_to_json(c));
    CHECK(config_diff(c, d) == "");
    d.d_model = 1024;
    d.n_head = 8;
    CHECK_THAT(config_diff(c, d), Catch::Contains("d_model: 2048 vs 1024") && Catch::Contains("n_head"));
    auto j = config_to_json(c);
    j.erase("ffn");
    CHECK_THROWS_WITH(config_from_json(j), Catch::Contains("missing field 'ffn'"));
    j = config_to_json(c);
    j["n_kv_head"] = 5;  // 16 % 5 != 0 -> validate() error
    CHECK_THROWS_AS(config_from_json(j), Error);
}

TEST_CASE("model checkpoint round trip; errors on corruption, truncation, wrong kind", "[checkpoint]") {
    const std::string dir = scratch_dir("checkpoint");
    ModelConfig c = tiny_cfg();
    const int64_t n = count_params(c);
    std::vector<double> p(static_cast<size_t>(n));
    std::mt19937_64 rng(1);
    std::normal_distribution<double> nd(0, 0.02);
    for (auto& x : p) x = nd(rng);
    const std::string path = dir + "/m.model";
    save_model(path, c, p.data(), 17);
    ModelCheckpoint m = load_model(path);
    CHECK(m.step == 17);
    CHECK(config_diff(m.cfg, c) == "");
    REQUIRE(int64_t(m.params.size()) == n);
    bool same = true;
    for (int64_t i = 0; i < n; i++) same = same && (m.params[size_t(i)] == float(p[size_t(i)]));
    CHECK(same);
    // payload starts 64-byte aligned and the header length is recorded at offset 12
    std::string raw = read_file(path);
    uint32_t hl;
    std::memcpy(&hl, raw.data() + 12, 4);
    CHECK((16 + hl) % 64 == 0);
    CHECK(raw.size() == 16 + hl + size_t(n) * 4 + 8);

    // one flipped byte inside the parameters -> checksum error
    std::string bad = raw;
    bad[16 + hl + 1000] ^= 0x5a;
    write_file_atomic(dir + "/corrupt.model", bad.data(), bad.size());
    CHECK_THROWS_WITH(load_model(dir + "/corrupt.model"), Catch::Contains("checksum mismatch") && Catch::Contains("corrupt.model"));
    // truncated
    write_file_atomic(dir + "/trunc.model", raw.data(), raw.size() / 2);
    CHECK_THROWS_WITH(load_model(dir + "/trunc.model"), Catch::Contains("truncated") && Catch::Contains("trunc.model"));
    write_file_atomic(dir + "/tiny.model", raw.data(), 10);
    CHECK_THROWS_WITH(load_model(dir + "/tiny.model"), Catch::Contains("too small"));
    // wrong kind of file
    TrainState s;
    s.m = std::string(8, '\0');
    s.v = std::string(8, '\0');
    save_train_state(dir + "/s.state", s);
    CHECK_THROWS_WITH(load_model(dir + "/s.state"), Catch::Contains("bad magic"));
    CHECK_THROWS_WITH(load_model(dir + "/missing.model"), Catch::Contains("missing.model"));
}

TEST_CASE("training state round trip and resume flag check", "[checkpoint]") {
    const std::string dir = scratch_dir("checkpoint_state");
    TrainState s;
    s.step = 42;
    s.dtype = "fp64";
    std::vector<double> m = {1.5, -2.25, 3e-9}, v = {0.1, 0.2, 0.3}, p = {7, 8, 9};
    s.m.assign(reinterpret_cast<char*>(m.data()), 24);
    s.v.assign(reinterpret_cast<char*>(v.data()), 24);
    s.exact_params.assign(reinterpret_cast<char*>(p.data()), 24);
    s.loader_state = {1, 2, 3, 250};
    s.rng_state = {0x0123456789abcdefull, 99};
    s.flags = {{"B", 4}, {"T", 64}, {"config", config_to_json(tiny_cfg())}};
    save_train_state(dir + "/a.state", s);
    TrainState r = load_train_state(dir + "/a.state");
    CHECK(r.step == 42);
    CHECK(r.dtype == "fp64");
    CHECK(r.m == s.m);
    CHECK(r.v == s.v);
    CHECK(r.exact_params == s.exact_params);
    CHECK(r.loader_state == s.loader_state);
    CHECK(r.rng_state == s.rng_state);
    CHECK(r.flags == s.flags);
    CHECK_NOTHROW(check_resume_flags(r.flags, s.flags, "a.state"));
    nlohmann::json now = s.flags;
    now["B"] = 8;
    ModelConfig c2 = tiny_cfg();
    c2.n_layer = 3;
    now["config"] = config_to_json(c2);
    CHECK_THROWS_WITH(check_resume_flags(r.flags, now, "a.state"),
                      Catch::Contains("B differs: checkpoint 4, command line 8") && Catch::Contains("n_layer: 2 vs 3"));
}

TEST_CASE("a tensor table with a negative or overflowing shape is refused, naming the file", "[checkpoint]") {
    const std::string dir = scratch_dir("checkpoint_shape");
    TrainState s;
    std::vector<float> m = {1.5f, -2.25f}, v = {0.1f, 0.2f};
    s.m.assign(reinterpret_cast<char*>(m.data()), 8);
    s.v.assign(reinterpret_cast<char*>(v.data()), 8);
    save_train_state(dir + "/s.state", s);
    const std::string raw = read_file(dir + "/s.state");
    uint32_t hl;
    std::memcpy(&hl, raw.data() + 12, 4);
    const nlohmann::json hdr = nlohmann::json::parse(raw.substr(16, hl));
    // the file rebuilt with another header and a valid checksum: only the table is wrong
    auto rebuilt = [&](const nlohmann::json& h, const std::string& name) {
        const std::string hs = h.dump();
        const uint32_t n = uint32_t(hs.size());
        std::string out = raw.substr(0, 12);
        out.append(reinterpret_cast<const char*>(&n), 4);
        out += hs;
        out += raw.substr(16 + hl, raw.size() - 8 - 16 - hl);
        const uint64_t c = fnv1a64(out.data(), out.size());
        out.append(reinterpret_cast<const char*>(&c), 8);
        write_file_atomic(dir + "/" + name, out.data(), out.size());
        return dir + "/" + name;
    };
    CHECK_NOTHROW(load_train_state(rebuilt(hdr, "same.state")));  // the rebuild itself is faithful
    REQUIRE(hdr.at("tensors").size() >= 1);
    nlohmann::json neg = hdr;
    neg["tensors"][0]["shape"] = {-4};
    neg["tensors"][0]["nbytes"] = uint64_t(0) - 16;  // = -4 * 4 wrapped to 64 bits
    CHECK_THROWS_WITH(load_train_state(rebuilt(neg, "neg.state")),
                      Catch::Contains("inconsistent tensor table") && Catch::Contains("neg.state"));
    nlohmann::json huge = hdr;
    huge["tensors"][0]["shape"] = {int64_t(1) << 62, 8};  // 2^65 values: wraps to 0 in 64 bits
    huge["tensors"][0]["nbytes"] = 0;
    CHECK_THROWS_WITH(load_train_state(rebuilt(huge, "huge.state")),
                      Catch::Contains("inconsistent tensor table") && Catch::Contains("huge.state"));
}
