// Unit tests of ldm::Tokenizer that need no node: known ids derived from the vocabulary files
// themselves, decode(encode(x)) == x on all the shared data, invalid UTF-8 errors (source and byte
// offset), missing/corrupt/unsupported tokenizer files, EOT ids and vocabulary sizes, thread
// safety. The byte-exact comparison with independent encoders is in test_tokenizer_xcheck.cpp.
#include <omp.h>

#include <random>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/common.h"
#include "core/config.h"
#include "core/tokenizer.h"
#include "test/helpers.h"

using ldm::Tokenizer;
using json = nlohmann::json;

namespace {

const char* kOlmo = "/olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json";
const char* kNeox = "/gpt_neox_20b_tokenizer/20B_tokenizer.json";

json load_json(const std::string& path) { return json::parse(ldm::read_file(path)); }

// Runs f and returns the ldm::Error message ("" + FAIL if nothing was thrown).
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const ldm::Error& e) {
        return e.what();
    }
    FAIL("no ldm::Error thrown");
    return "";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

std::vector<std::string> data_texts(const std::string& d) {
    std::vector<std::string> t = {ldm::read_file(d + "/wikitext2/wiki.test.raw"),
                                  ldm::read_file(d + "/wikitext2/source_copy/airframe_wiki.test.raw"),
                                  ldm::read_file(d + "/tinyshakespeare/input.txt")};
    for (const char* f : {"/lambada/lambada_test.jsonl", "/fineweb_edu_sample/fineweb_edu_sample.jsonl"}) {
        std::istringstream in(ldm::read_file(d + f));
        std::string line;
        while (std::getline(in, line))
            if (!line.empty()) t.push_back(json::parse(line).at("text").get<std::string>());
    }
    return t;
}

}  // namespace

TEST_CASE("GPT-2: known ids come from encoder.json", "[tokenizer]") {
    std::string d = data_dir_or_skip("tokenizer");
    if (d.empty()) return;
    Tokenizer tok = Tokenizer::load(d + "/gpt2_tokenizer");
    json enc = load_json(d + "/gpt2_tokenizer/encoder.json");
    auto id = [&](const char* s) { return enc.at(s).get<uint32_t>(); };
    CHECK(tok.encode("Hello world") == std::vector<uint32_t>{id("Hello"), id("\xC4\xA0world")});  // "Ġworld"
    // " ?\p{L}+" keeps the leading space with the word; "\s+(?!\S)" leaves the last space of a
    // run to the next word; tokens "Ġ" (space) and "Ċ" (newline) are bytes 0x20 and 0x0A.
    CHECK(tok.encode("a  b") == std::vector<uint32_t>{id("a"), id("\xC4\xA0"), id("\xC4\xA0" "b")});
    CHECK(tok.encode("\n") == std::vector<uint32_t>{id("\xC4\x8A")});
    CHECK(tok.encode("it's") == std::vector<uint32_t>{id("it"), id("'s")});
    CHECK(tok.encode("") .empty());
    // "<|endoftext|>" in text is ordinary text for GPT-2, never id 50256
    auto e = tok.encode("<|endoftext|>");
    CHECK(e.size() > 1);
    CHECK(std::find(e.begin(), e.end(), 50256u) == e.end());
    CHECK(tok.decode(e) == "<|endoftext|>");
    CHECK(tok.eot_id() == 50256);
    CHECK(tok.vocab_size() == 50257);
    CHECK(tok.decode(std::vector<uint32_t>{50256}) == "<|endoftext|>");
    CHECK(id("<|endoftext|>") == tok.eot_id());
}

TEST_CASE("HF tokenizer.json: known ids, added tokens, EOT and vocabulary sizes", "[tokenizer]") {
    std::string d = data_dir_or_skip("tokenizer");
    if (d.empty()) return;
    for (const char* f : {kOlmo, kNeox}) {
        INFO(f);
        Tokenizer tok = Tokenizer::load(d + f);
        json j = load_json(d + f);
        auto id = [&](const char* s) { return j.at("model").at("vocab").at(s).get<uint32_t>(); };
        uint32_t eot = 0, two_spaces = 0, twentyfour = 0;
        for (const auto& a : j.at("added_tokens")) {
            std::string c = a.at("content");
            if (c == "<|endoftext|>") eot = a.at("id");
            if (c == std::string(2, ' ')) two_spaces = a.at("id");
            if (c == std::string(24, ' ')) twentyfour = a.at("id");
        }
        bool olmo = std::string(f) == kOlmo;
        CHECK(eot == (olmo ? 50279u : 0u));
        CHECK(tok.eot_id() == eot);
        CHECK(tok.vocab_size() == (olmo ? 50280u : 50277u));
        CHECK(two_spaces == 50276);
        CHECK(twentyfour == 50254);
        CHECK(tok.encode("Hello world") == std::vector<uint32_t>{id("Hello"), id("\xC4\xA0world")});
        // SOURCES.md §7: runs of >= 2 spaces are added tokens; the next word loses its space
        CHECK(tok.encode("a  b") == std::vector<uint32_t>{id("a"), two_spaces, id("b")});
        CHECK(tok.encode("a" + std::string(25, ' ') + "y") ==
              std::vector<uint32_t>{id("a"), twentyfour, id("\xC4\xA0y")});
        // "<|endoftext|>" inside text is the special token only for encode_with_special (HF's
        // default); encode (document text) treats it as ordinary text
        CHECK(tok.encode_with_special("x<|endoftext|>y") == std::vector<uint32_t>{id("x"), eot, id("y")});
        {
            const std::vector<uint32_t> e = tok.encode("x<|endoftext|>y");
            CHECK(std::count(e.begin(), e.end(), eot) == 0);
            CHECK(e.size() > 3);
            CHECK(tok.decode(e) == "x<|endoftext|>y");
        }
        CHECK(tok.decode(std::vector<uint32_t>{eot}) == "<|endoftext|>");
        // NFC: "e" + U+0301 encodes like the precomposed U+00E9
        CHECK(tok.encode("caf" "e\xCC\x81") == tok.encode("caf\xC3\xA9"));
        CHECK(tok.encode("").empty());
    }
}

TEST_CASE("decode(encode(x)) == x on all the shared data", "[tokenizer]") {
    std::string d = data_dir_or_skip("tokenizer round trip");
    if (d.empty()) return;
    auto texts = data_texts(d);
    REQUIRE(texts.size() == 3 + 5153 + 150);
    for (std::string f : {std::string("/gpt2_tokenizer"), std::string(kOlmo), std::string(kNeox)}) {
        Tokenizer tok = Tokenizer::load(d + f);
        size_t bad = 0, ntok = 0, nbytes = 0;
        for (const auto& t : texts) {
            auto ids = tok.encode(t);
            ntok += ids.size();
            nbytes += t.size();
            bool in_range = true;
            for (uint32_t x : ids) in_range &= x < tok.vocab_size();
            if (!in_range || tok.decode(ids) != t) bad++;
        }
        INFO(f << ": " << nbytes << " bytes -> " << ntok << " tokens");
        CHECK(bad == 0);
        CHECK(ntok > nbytes / 8);
        CHECK(ntok < nbytes / 2);
    }
    // the byte tokenizer: ids are exactly the bytes of every text
    {
        const Tokenizer b = Tokenizer::load("bytes");
        size_t bad = 0;
        for (const auto& t : texts) {
            const auto ids = b.encode(t);
            bool same = ids.size() == t.size();
            for (size_t i = 0; same && i < ids.size(); i++) same = ids[i] == uint32_t((unsigned char)t[i]);
            if (!same || b.decode(ids) != t) bad++;
        }
        CHECK(bad == 0);
    }
    // NFC is lossy for non-NFC input (HF), but GPT-2 round-trips anything
    Tokenizer g = Tokenizer::load(d + "/gpt2_tokenizer");
    std::string nfd = "e\xCC\x81 A\xCC\x8A \xE2\x84\xAB";
    CHECK(g.decode(g.encode(nfd)) == nfd);
}

TEST_CASE("invalid UTF-8 is an ldm::Error naming the source and byte offset", "[tokenizer]") {
    std::string d = data_dir_or_skip("tokenizer");
    if (d.empty()) return;
    struct Case { std::string text; size_t off; const char* why; };
    std::vector<Case> cases = {
        {"abc\xC0\xAFxyz", 3, "overlong"},            // overlong '/'
        {"ab\xC1\xBF", 2, "overlong"},
        {"\xE0\x80\xAF", 0, "overlong"},                // 3-byte overlong
        {"x\xF0\x80\x80\xAF", 1, "overlong"},           // 4-byte overlong
        {"ok \xED\xA0\x80 surrogate", 3, "surrogate"},  // U+D800
        {"\xED\xBF\xBF", 0, "surrogate"},               // U+DFFF
        {"big \xF4\x90\x80\x80", 4, "U+10FFFF"},         // U+110000
        {"\xF5\x80\x80\x80", 0, "0xF5"},
        {"end \xE2\x82", 4, "truncated"},               // truncated at end of input
        {"mid \xE2\x82" "A", 4, "truncated"},           // truncated before ASCII
        {"\xF0\x9F\x98", 0, "truncated"},
        {"stray \x80 byte", 6, "continuation"},
        {"\xBF", 0, "continuation"},
        {"caf\xC3\xA9 \xC3\xA9\xA9", 8, "continuation"},  // valid é é then a stray byte
        {std::string(100000, 'a') + "\xFF", 100000, "0xF5"},
    };
    for (std::string f : {std::string("/gpt2_tokenizer"), std::string(kOlmo), std::string("bytes")}) {
        Tokenizer tok = Tokenizer::load(f == "bytes" ? f : d + f);
        for (const auto& c : cases) {
            INFO(f << " case at " << c.off);
            std::string msg = error_of([&] { tok.encode(c.text, "docs/file.jsonl", 1000); });
            CHECK(contains(msg, "docs/file.jsonl"));
            CHECK(contains(msg, "byte offset " + std::to_string(1000 + c.off)));
            CHECK(contains(msg, c.why));
            CHECK(contains(msg, "invalid UTF-8"));
        }
        // the largest valid code points and sequences are accepted
        CHECK_NOTHROW(tok.encode("\xF4\x8F\xBF\xBF \xEF\xBF\xBF \xED\x9F\xBF \xEE\x80\x80 \xC2\x80"));
    }
}

TEST_CASE("missing, corrupt and unsupported tokenizer files give clear errors", "[tokenizer]") {
    std::string d = data_dir_or_skip("tokenizer");
    if (d.empty()) return;
    std::string s = scratch_dir("tokenizer_bad");
    auto write = [&](const std::string& name, const std::string& content) {
        ldm::write_file_atomic(s + "/" + name, content.data(), content.size());
        return s + "/" + name;
    };
    // missing
    CHECK(contains(error_of([&] { Tokenizer::load(s + "/nope.json"); }), "nope.json"));
    CHECK(contains(error_of([&] { Tokenizer::load(s); }), "neither encoder.json"));
    CHECK(contains(error_of([&] { Tokenizer::load_gpt2(s + "/enc.json", d + "/gpt2_tokenizer/vocab.bpe"); }), "enc.json"));
    // corrupt encoder.json / vocab.bpe
    std::string enc = ldm::read_file(d + "/gpt2_tokenizer/encoder.json");
    std::string bpe = ldm::read_file(d + "/gpt2_tokenizer/vocab.bpe");
    std::string trunc = write("trunc.json", enc.substr(0, enc.size() / 2));
    std::string msg = error_of([&] { Tokenizer::load_gpt2(trunc, d + "/gpt2_tokenizer/vocab.bpe"); });
    CHECK(contains(msg, "trunc.json"));
    CHECK(contains(msg, "invalid JSON"));
    std::string badbpe = write("bad.bpe", bpe.substr(0, 2000) + "\nonlyonefield\n");
    msg = error_of([&] { Tokenizer::load_gpt2(d + "/gpt2_tokenizer/encoder.json", badbpe); });
    CHECK(contains(msg, "bad.bpe:"));
    std::string swapped = bpe;
    swapped.replace(swapped.find("\n\xC4\xA0 t\n"), 6, "\nh e\n");  // merge order no longer matches ids
    msg = error_of([&] { Tokenizer::load_gpt2(d + "/gpt2_tokenizer/encoder.json", write("swap.bpe", swapped)); });
    CHECK(contains(msg, "swap.bpe:2"));
    json e = json::parse(enc);
    e.erase("<|endoftext|>");
    msg = error_of([&] { Tokenizer::load_gpt2(write("noeot.json", e.dump()), d + "/gpt2_tokenizer/vocab.bpe"); });
    CHECK(contains(msg, "<|endoftext|>"));
    // unsupported tokenizer.json components are named
    json j = load_json(d + kOlmo);
    auto with = [&](const char* key, const json& v) {
        json k = j;
        k[key] = v;
        return write(std::string("t_") + key + ".json", k.dump());
    };
    msg = error_of([&] { Tokenizer::load(with("pre_tokenizer", {{"type", "Metaspace"}})); });
    CHECK(contains(msg, "unsupported pre_tokenizer type \"Metaspace\""));
    msg = error_of([&] { Tokenizer::load(with("normalizer", {{"type", "Lowercase"}})); });
    CHECK(contains(msg, "unsupported normalizer type \"Lowercase\""));
    json m = j["model"];
    m["type"] = "WordPiece";
    msg = error_of([&] { Tokenizer::load(with("model", m)); });
    CHECK(contains(msg, "unsupported model type \"WordPiece\""));
    m = j["model"];
    m["merges"][5] = "Ġ nosuchtoken";
    msg = error_of([&] { Tokenizer::load(with("model", m)); });
    CHECK(contains(msg, "model.merges[5]"));
    // a merge listed twice (which rank wins differs between implementations)
    m = j["model"];
    m["merges"].push_back(m["merges"][3]);
    msg = error_of([&] { Tokenizer::load(with("model", m)); });
    CHECK(contains(msg, "model.merges[" + std::to_string(m["merges"].size() - 1) + "]"));
    CHECK(contains(msg, "is listed twice"));
    // an id of 2^32 + 5 is refused, not wrapped onto id 5
    m = j["model"];
    m["vocab"]["\xC4\xA0the"] = 4294967301ull;
    msg = error_of([&] { Tokenizer::load(with("model", m)); });
    CHECK(contains(msg, "id 4294967301 of model.vocab token"));
    CHECK(contains(msg, "implausibly large"));
    // an added token past the end leaves ids without a token; a second <|endoftext|>
    json added = j["added_tokens"];
    uint32_t top = 0;
    for (const auto& a : added) top = std::max(top, a["id"].get<uint32_t>());
    json gap = added;
    gap.push_back({{"id", top + 20}, {"content", "<|gap|>"}, {"special", true}});
    msg = error_of([&] { Tokenizer::load(with("added_tokens", gap)); });
    CHECK(contains(msg, "id " + std::to_string(top + 1) + " is missing"));
    json eot2 = added;
    eot2.push_back({{"id", top + 1}, {"content", "<|endoftext|>"}, {"special", true}});
    msg = error_of([&] { Tokenizer::load(with("added_tokens", eot2)); });
    CHECK(contains(msg, "\"<|endoftext|>\" has two ids"));
    // GPT-2 files: a vocab.bpe cut after 10 merges does not match encoder.json; a huge id
    size_t cut = 0;
    for (int n = 0; n < 11; n++) cut = bpe.find('\n', cut) + 1;  // "#version" + 10 merges
    msg = error_of([&] { Tokenizer::load_gpt2(d + "/gpt2_tokenizer/encoder.json", write("ten.bpe", bpe.substr(0, cut))); });
    CHECK(contains(msg, "ten.bpe: 10 merges, but"));
    CHECK(contains(msg, "has 50000 tokens besides the 256 bytes"));
    json big = json::parse(enc);
    big["\xC4\xA0the"] = 4294967301ull;
    msg = error_of([&] { Tokenizer::load_gpt2(write("big.json", big.dump()), d + "/gpt2_tokenizer/vocab.bpe"); });
    CHECK(contains(msg, "id 4294967301 of token"));
    msg = error_of([&] { Tokenizer::load(write("notjson.json", "{\"model\": [1, 2")); });
    CHECK(contains(msg, "notjson.json"));
    // a supported Sequence normalizer and the use_regex/add_prefix_space flags load
    json seq = {{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "NFC"}}})}};
    CHECK(Tokenizer::load(with("normalizer", seq)).encode("Hello world") ==
          Tokenizer::load(d + kOlmo).encode("Hello world"));
    // decode of an id outside the vocabulary
    Tokenizer g = Tokenizer::load(d + "/gpt2_tokenizer");
    CHECK(contains(error_of([&] { g.decode(std::vector<uint32_t>{1, 50257}); }), "50257"));
    // an unloaded tokenizer
    CHECK(contains(error_of([&] { Tokenizer().encode("x"); }), "unloaded"));
}

TEST_CASE("add_prefix_space and use_regex=false are honoured", "[tokenizer]") {
    std::string d = data_dir_or_skip("tokenizer");
    if (d.empty()) return;
    std::string s = scratch_dir("tokenizer_flags");
    json j = load_json(d + kOlmo);
    auto id = [&](const char* t) { return j.at("model").at("vocab").at(t).get<uint32_t>(); };
    json k = j;
    k["pre_tokenizer"]["add_prefix_space"] = true;
    std::string p = s + "/prefix.json", dump = k.dump();
    ldm::write_file_atomic(p, dump.data(), dump.size());
    Tokenizer tp = Tokenizer::load(p);
    CHECK(tp.encode("Hello world") == std::vector<uint32_t>{id("\xC4\xA0Hello"), id("\xC4\xA0world")});
    CHECK(tp.encode(" Hello") == std::vector<uint32_t>{id("\xC4\xA0Hello")});
    k = j;
    k["pre_tokenizer"]["use_regex"] = false;
    p = s + "/noregex.json";
    dump = k.dump();
    ldm::write_file_atomic(p, dump.data(), dump.size());
    Tokenizer tn = Tokenizer::load(p);
    // With the regex, "\n\t" before a word splits into "\n" (\s+(?!\S)) and "\t" (\s+); without
    // it the whole text is one BPE word and the merge "Ċ ĉ" applies.
    std::string text = "a,\n\tb";
    CHECK(Tokenizer::load(d + kOlmo).encode(text) ==
          std::vector<uint32_t>{id("a"), id(","), id("\xC4\x8A"), id("\xC4\x89"), id("b")});
    CHECK(tn.encode(text) == std::vector<uint32_t>{id("a"), id(","), id("\xC4\x8A\xC4\x89"), id("b")});
    CHECK(tn.decode(tn.encode("Hello world, it's 2024!")) == "Hello world, it's 2024!");
}

TEST_CASE("encode is thread-safe and copies share tables", "[tokenizer]") {
    std::string d = data_dir_or_skip("tokenizer threads");
    if (d.empty()) return;
    auto texts = data_texts(d);
    Tokenizer a = Tokenizer::load(d + "/gpt2_tokenizer");
    Tokenizer b = Tokenizer::load(d + kOlmo);
    std::vector<std::vector<uint32_t>> sa(texts.size()), sb(texts.size()), pa(texts.size()), pb(texts.size());
    for (size_t i = 0; i < texts.size(); i++) { sa[i] = a.encode(texts[i]); sb[i] = b.encode(texts[i]); }
    Tokenizer a2 = a;  // copy
#pragma omp parallel for schedule(dynamic, 1) num_threads(4)
    for (size_t i = 0; i < texts.size(); i++) {
        // alternate tokenizers on each thread to exercise the per-thread caches
        pb[texts.size() - 1 - i] = b.encode(texts[texts.size() - 1 - i]);
        pa[i] = a2.encode(texts[i]);
    }
    CHECK(pa == sa);
    CHECK(pb == sb);
}

namespace {
// UTF-8 of a code point, written out here (independent of the library).
std::string utf8(uint32_t cp) {
    std::string o;
    if (cp < 0x80) {
        o += char(cp);
    } else if (cp < 0x800) {
        o += char(0xC0 | (cp >> 6));
        o += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o += char(0xE0 | (cp >> 12));
        o += char(0x80 | ((cp >> 6) & 0x3F));
        o += char(0x80 | (cp & 0x3F));
    } else {
        o += char(0xF0 | (cp >> 18));
        o += char(0x80 | ((cp >> 12) & 0x3F));
        o += char(0x80 | ((cp >> 6) & 0x3F));
        o += char(0x80 | (cp & 0x3F));
    }
    return o;
}
}  // namespace

TEST_CASE("bytes: 256 byte ids + EOT 256, encode = the UTF-8 bytes, decode = any bytes", "[tokenizer]") {
    const Tokenizer b = Tokenizer::load("bytes");
    CHECK(b.is_bytes());
    CHECK(b.vocab_size() == 257);
    CHECK(b.eot_id() == 256);
    CHECK(ldm::preset_config("small", int(b.vocab_size())).padded_vocab == 384);  // multiple of 128
    CHECK(Tokenizer::bytes().encode("x") == std::vector<uint32_t>{120});
    CHECK(b.encode("").empty());
    CHECK(b.decode(std::vector<uint32_t>{}).empty());
    CHECK(b.encode("Hi \n") == std::vector<uint32_t>{72, 105, 32, 10});
    // 1- to 4-byte sequences: "é" = C3 A9, "€" = E2 82 AC, U+1F600 = F0 9F 98 80
    CHECK(b.encode("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80") ==
          std::vector<uint32_t>{0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80});
    CHECK(b.encode(std::string("a\0b", 3)) == std::vector<uint32_t>{97, 0, 98});
    // random valid UTF-8 over every sequence length (surrogates excluded): ids = bytes, round trip
    std::mt19937_64 rng(20);
    const uint32_t lo[4] = {0, 0x80, 0x800, 0x10000}, hi[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int it = 0; it < 300; it++) {
        std::string s;
        const int n = int(rng() % 40);
        for (int k = 0; k < n; k++) {
            const int len = int(rng() % 4);
            uint32_t cp = lo[len] + uint32_t(rng() % (hi[len] - lo[len] + 1));
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xE000;
            s += utf8(cp);
        }
        const std::vector<uint32_t> ids = b.encode(s);
        REQUIRE(ids.size() == s.size());
        for (size_t i = 0; i < s.size(); i++) REQUIRE(ids[i] == uint32_t((unsigned char)s[i]));
        REQUIRE(b.decode(ids) == s);
    }
    // decode takes any ids < 257: all 256 bytes in a random order (invalid UTF-8 included)
    std::vector<uint32_t> all(256);
    for (uint32_t i = 0; i < 256; i++) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    const std::string raw = b.decode(all);
    REQUIRE(raw.size() == 256);
    for (size_t i = 0; i < 256; i++) CHECK(uint32_t((unsigned char)raw[i]) == all[i]);
    CHECK(b.decode(std::vector<uint32_t>{0xFF, 0xC0, 0x80}) == "\xFF\xC0\x80");
    // EOT decodes like the other tokenizers' EOT; an id >= 257 is an error
    CHECK(b.decode(std::vector<uint32_t>{104, 256, 105}) == "h<|endoftext|>i");
    CHECK(contains(error_of([&] { b.decode(std::vector<uint32_t>{65, 257}); }), "cannot decode id 257 at position 1"));
    // "<|endoftext|>" in text is ordinary text (13 bytes); only encode_with_special matches it
    const std::vector<uint32_t> lit = b.encode("a<|endoftext|>b");
    CHECK(lit.size() == 15);
    CHECK(std::count(lit.begin(), lit.end(), 256u) == 0);
    CHECK(b.encode_with_special("a<|endoftext|>b<|endoftext|>") == std::vector<uint32_t>{97, 256, 98, 256});
    CHECK(b.encode_with_special("<|endoftext|") == b.encode("<|endoftext|"));
}

TEST_CASE("encode_with_special matches the special tokens; encode never does", "[tokenizer]") {
    std::string d = data_dir_or_skip("tokenizer");
    if (d.empty()) return;
    const Tokenizer g = Tokenizer::load(d + "/gpt2_tokenizer");
    auto cat = [](std::vector<std::vector<uint32_t>> parts) {
        std::vector<uint32_t> o;
        for (auto& p : parts) o.insert(o.end(), p.begin(), p.end());
        return o;
    };
    // GPT-2 (tiktoken allowed_special="all"): pieces between the literals encode on their own
    CHECK(g.encode_with_special("Hello<|endoftext|> world<|endoftext|>") ==
          cat({g.encode("Hello"), {50256}, g.encode(" world"), {50256}}));
    CHECK(g.encode_with_special("no special here, it's fine") == g.encode("no special here, it's fine"));
    for (const char* f : {kOlmo, kNeox}) {
        INFO(f);
        const Tokenizer t = Tokenizer::load(d + f);
        const uint32_t eot = t.eot_id();
        for (const std::string s : {"a<|endoftext|>b", "<|padding|>x", "<|endoftext|><|endoftext|>"}) {
            INFO(s);
            const std::vector<uint32_t> o = t.encode(s), w = t.encode_with_special(s);
            CHECK(t.decode(o) == s);
            CHECK(t.decode(w) == s);
            CHECK(std::count(o.begin(), o.end(), eot) == 0);
            CHECK(std::count(o.begin(), o.end(), 1u) == 0);  // <|padding|> = 1 in both files
            CHECK(o != w);
        }
        // non-special added tokens (space runs) are still matched by encode
        const std::vector<uint32_t> sp = t.encode("a  b");
        CHECK(std::count(sp.begin(), sp.end(), 50276u) == 1);
        CHECK(t.encode_with_special("a  b") == sp);
    }
}

TEST_CASE("load_tokenizer_flag: bytes, a path, the data directory default, a missing path", "[tokenizer]") {
    auto b = ldm::load_tokenizer_flag("bytes");
    REQUIRE(b);
    CHECK(b->is_bytes());
    CHECK(b->vocab_size() == 257);
    CHECK(contains(error_of([] { ldm::load_tokenizer_flag("/nonexistent/tok"); }),
                   "--tokenizer: /nonexistent/tok does not exist"));
    std::string d = data_dir_or_skip("tokenizer flag default");
    if (d.empty()) return;
    auto g = ldm::load_tokenizer_flag("");
    REQUIRE(g);
    CHECK(!g->is_bytes());
    CHECK(g->vocab_size() == 50257);
    auto o = ldm::load_tokenizer_flag(d + kOlmo);
    REQUIRE(o);
    CHECK(o->vocab_size() == 50280);
}

TEST_CASE("tokenizer_fingerprint of the byte tokenizer: the value eval binaries hold", "[tokenizer]") {
    // Pinned: computed outside this project (Python, FNV-1a 64 from 1469598103934665603 over the
    // u32 length + bytes of each id's decoding, 0..255 one byte each, 256 "<|endoftext|>", then
    // the probe sentence's UTF-8 bytes as u32 ids). A change here invalidates every eval binary.
    CHECK(ldm::tokenizer_fingerprint(ldm::Tokenizer::bytes()) == 0x057ceec4a05acd2eull);
}
