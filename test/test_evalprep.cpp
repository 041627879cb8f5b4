// Tests for the eval binaries (core/evalfile.h) and the data tool's eval subcommands
// (data/prep_eval.h): issue #2 item 6, ../shared/spec/evals.md.
//
// Independent references used here:
//  * a Python 3 implementation of the evals.md definitions (WikiText page split, word/byte
//    counts, the harness's wikitext_detokenizer with Python's own `re`, HellaSwag preprocess,
//    str.capitalize/strip) run through popen and compared byte for byte with the C++ output;
//  * hand-written expected strings for each detokenizer rule;
//  * an independent byte decoder of the file layout (not the library reader);
//  * tok(" " + word) and tok(text) recomputed here for every LAMBADA example;
//  * `bzip2 -dc | sha256sum` against the checksum in shared/data/SOURCES.md.
#include "test/helpers.h"

#include <array>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/evalfile.h"
#include "core/tokenizer.h"
#include "data/prep_eval.h"

using ldm::Error;
namespace ep = ldm::evalprep;

namespace {

std::string python() {
  return ldm::file_exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command, returns its stdout; REQUIREs exit status 0.
std::string run_cmd(const std::string& cmd) {
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int rc = pclose(f);
  INFO("command: " << cmd);
  REQUIRE(rc == 0);
  return out;
}

// The independent Python reference (written from evals.md and the harness's documented
// behaviour; uses Python's own `re` and str methods).
const char* kPyRef = R"PY(
import json, re, sys

def detok(s):
    s = s.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)
    s = s.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    for p in [":", ";", ".", "!", "?", ","]:
        s = s.replace(" " + p + " ", p + " ")
    s = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    s = s.replace("= = = =", "====").replace("= = =", "===").replace("= =", "==")
    s = s.replace(" " + chr(176) + " ", chr(176))
    s = s.replace(" \n", "\n").replace("\n ", "\n")
    s = s.replace(" N ", " 1 ").replace(" 's", "'s")
    return s

def hs_pre(t):
    t = t.strip().replace(" [title]", ". ")
    t = re.sub("\\[.*?\\]", "", t)
    return t.replace("  ", " ")

def pages(text):
    out, cur = [], []
    def flush():
        p = "\n".join(cur)
        if p.strip():
            out.append(p)
    for line in text.split("\n"):
        r = line.replace("= = =", "===").replace("= =", "==").strip()
        if r.startswith("= ") and r.strip().endswith(" ="):
            flush()
            cur.clear()
        cur.append(line)
    flush()
    return out

mode = sys.argv[1]
if mode == "wikitext":
    with open(sys.argv[2], encoding="utf-8") as f:   # universal newlines, like the builder
        text = f.read()
    with open(sys.argv[3], "wb") as o:
        for p in pages(text):
            d = detok(p).encode("utf-8")
            o.write(b"%d %d %d\n" % (len(re.split(r"\s+", p)), len(p.encode("utf-8")), len(d)))
            o.write(d)
elif mode == "strings":
    xs = json.load(open(sys.argv[2], encoding="utf-8"))
    res = [{"detok": detok(x), "words": len(re.split(r"\s+", x)), "strip": x.strip(),
            "rstrip": x.rstrip(), "cap": x.capitalize(), "hs": hs_pre(x),
            "pages": pages(x), "len": len(x)} for x in xs]
    json.dump(res, open(sys.argv[3], "w", encoding="utf-8"), ensure_ascii=False)
elif mode == "hellaswag":
    with open(sys.argv[3], "w", encoding="utf-8") as o:
        for line in open(sys.argv[2], encoding="utf-8"):
            d = json.loads(line)
            q = hs_pre(d["activity_label"] + ": " + d["ctx_a"] + " " + d["ctx_b"].capitalize())
            o.write(json.dumps({"query": q, "choices": [hs_pre(e) for e in d["endings"]],
                                "gold": int(d["label"])}, ensure_ascii=False) + "\n")
)PY";

std::string write_pyref(const std::string& dir) {
  std::string p = dir + "/ref.py";
  ldm::write_file_atomic(p, kPyRef, std::strlen(kPyRef));
  return p;
}

void write_text(const std::string& path, const std::string& s) { ldm::write_file_atomic(path, s.data(), s.size()); }

// Calls a cmd_* function with a constructed argv; returns its exit status.
int call(int (*cmd)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  return cmd(int(args.size()), argv.data());
}

template <typename F>
void expect_error(F f, std::initializer_list<const char*> parts) {
  try {
    f();
    FAIL("no exception");
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const char* p : parts) {
      INFO("message: " << msg);
      CHECK(msg.find(p) != std::string::npos);
    }
  }
}

// Independent little-endian field access on raw file bytes.
uint64_t le(const std::string& b, size_t off, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= uint64_t(uint8_t(b[off + i])) << (8 * i);
  return v;
}
void put_le(std::string& b, size_t off, uint64_t v, int n) {
  for (int i = 0; i < n; i++) b[off + i] = char((v >> (8 * i)) & 0xff);
}

std::vector<uint32_t> rand_tokens(std::mt19937_64& rng, uint32_t vocab, size_t lo, size_t hi) {
  std::vector<uint32_t> v(lo + rng() % (hi - lo + 1));
  for (auto& x : v) x = uint32_t(rng() % vocab);
  return v;
}

ldm::EvalTokenizerInfo tinfo(uint32_t vocab, uint32_t eot) {
  ldm::EvalTokenizerInfo t;
  t.vocab_size = vocab;
  t.eot_id = eot;
  t.fingerprint = 0x0123456789abcdefull;
  t.name = "test_tok";
  return t;
}

// Recomputes every LAMBADA example independently from the jsonl text: the last word is what
// follows the last ' '; target must equal tok(" " + word) and context + target must equal
// tok(text). Returns the number of multi-token targets.
size_t check_lambada_against_text(const ldm::LambadaSet& L, const ldm::Tokenizer& tok, const std::string& in) {
  std::ifstream f(in);
  std::string line;
  size_t i = 0, bad_target = 0, bad_whole = 0, multi = 0;
  while (std::getline(f, line)) {
    REQUIRE(i < L.examples.size());
    std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
    size_t sp = text.find_last_of(' ');
    REQUIRE(sp != std::string::npos);
    std::vector<uint32_t> want_target = tok.encode(" " + text.substr(sp + 1));
    const auto& e = L.examples[i];
    bad_target += e.target != want_target;
    std::vector<uint32_t> whole = e.context;
    whole.insert(whole.end(), e.target.begin(), e.target.end());
    bad_whole += whole != tok.encode(text);
    multi += e.target.size() > 1;
    i++;
  }
  CHECK(i == L.examples.size());
  CHECK(bad_target == 0);
  CHECK(bad_whole == 0);
  return multi;
}

}  // namespace

// ============================================================================ file format

TEST_CASE("eval binaries round-trip (2- and 4-byte tokens) and match the documented layout", "[evalfile]") {
  std::string dir = scratch_dir("evalprep_roundtrip");
  std::mt19937_64 rng(1234);
  for (uint32_t vocab : {50257u, 100277u}) {
    INFO("vocab " << vocab);
    const int tb = vocab <= 65536 ? 2 : 4;
    // LAMBADA
    ldm::LambadaSet L;
    L.tok = tinfo(vocab, vocab - 1);
    for (int i = 0; i < 37; i++) L.examples.push_back({rand_tokens(rng, vocab, 0, 50), rand_tokens(rng, vocab, 1, 3)});
    std::string lp = dir + "/l.bin";
    ldm::write_lambada(lp, L);
    auto L2 = ldm::read_lambada(lp);
    CHECK(L2.tok.vocab_size == vocab);
    CHECK(L2.tok.eot_id == vocab - 1);
    CHECK(L2.tok.fingerprint == 0x0123456789abcdefull);
    CHECK(L2.tok.name == "test_tok");
    REQUIRE(L2.examples.size() == L.examples.size());
    for (size_t i = 0; i < L.examples.size(); i++) {
      CHECK(L2.examples[i].context == L.examples[i].context);
      CHECK(L2.examples[i].target == L.examples[i].target);
    }
    // Independent decode of the layout: header, offsets, token array.
    std::string b = ldm::read_file(lp);
    CHECK(b.compare(0, 8, "LDMEVLMB") == 0);
    CHECK(le(b, 8, 4) == 2);
    CHECK(le(b, 12, 4) == 256);
    CHECK(le(b, 16, 4) == uint64_t(tb));
    CHECK(le(b, 20, 4) == 2);
    CHECK(le(b, 24, 4) == 0);
    CHECK(le(b, 32, 8) == 37);
    CHECK(le(b, 40, 8) == 74);
    uint64_t ntok = le(b, 48, 8);
    CHECK(le(b, 56, 4) == vocab - 1);
    CHECK(le(b, 60, 4) == vocab);
    CHECK(std::string(&b[88]) == "test_tok");
    CHECK(b.size() == 256 + 75 * 8 + ntok * tb);
    // example 5's target, read through the offset table
    uint64_t s0 = le(b, 256 + 8 * 11, 8), s1 = le(b, 256 + 8 * 12, 8);
    std::vector<uint32_t> t5;
    for (uint64_t k = s0; k < s1; k++) t5.push_back(uint32_t(le(b, 256 + 75 * 8 + k * tb, tb)));
    CHECK(t5 == L.examples[5].target);

    // WikiText
    ldm::WikiTextSet W;
    W.tok = tinfo(vocab, 7);
    for (int i = 0; i < 9; i++) {
      W.docs.push_back({rand_tokens(rng, vocab, 1, 300), rng() % 1000 + 1, rng() % 5000 + 1});
      W.total_words += W.docs.back().words;
      W.total_bytes += W.docs.back().bytes;
    }
    std::string wp = dir + "/w.bin";
    ldm::write_wikitext(wp, W);
    auto W2 = ldm::read_wikitext(wp);
    REQUIRE(W2.docs.size() == 9);
    CHECK(W2.total_words == W.total_words);
    CHECK(W2.total_bytes == W.total_bytes);
    for (int i = 0; i < 9; i++) {
      CHECK(W2.docs[i].tokens == W.docs[i].tokens);
      CHECK(W2.docs[i].words == W.docs[i].words);
      CHECK(W2.docs[i].bytes == W.docs[i].bytes);
    }
    std::string wb = ldm::read_file(wp);
    CHECK(wb.compare(0, 8, "LDMEVWKT") == 0);
    CHECK(le(wb, 72, 8) == W.total_words);
    CHECK(le(wb, 80, 8) == W.total_bytes);
    CHECK(le(wb, 256 + 16 * 3, 8) == W.docs[3].words);
    CHECK(le(wb, 256 + 16 * 3 + 8, 8) == W.docs[3].bytes);

    // HellaSwag
    ldm::HellaSwagSet H;
    H.tok = tinfo(vocab, 0);
    H.source_format = ldm::kHellaSwagReformattedTxt;
    for (int i = 0; i < 13; i++) {
      ldm::HellaSwagItem it;
      it.context = rand_tokens(rng, vocab, 1, 60);
      for (int k = 0; k < 4; k++) {
        it.endings[k] = rand_tokens(rng, vocab, 1, 20);
        it.ending_chars[k] = uint32_t(rng() % 200);
      }
      it.label = uint32_t(rng() % 4);
      H.items.push_back(it);
    }
    std::string hp = dir + "/h.bin";
    ldm::write_hellaswag(hp, H);
    auto H2 = ldm::read_hellaswag(hp);
    CHECK(H2.source_format == ldm::kHellaSwagReformattedTxt);
    REQUIRE(H2.items.size() == 13);
    for (int i = 0; i < 13; i++) {
      CHECK(H2.items[i].context == H.items[i].context);
      CHECK(H2.items[i].endings == H.items[i].endings);
      CHECK(H2.items[i].ending_chars == H.items[i].ending_chars);
      CHECK(H2.items[i].label == H.items[i].label);
    }
    std::string hb = ldm::read_file(hp);
    CHECK(hb.compare(0, 8, "LDMEVHSW") == 0);
    CHECK(le(hb, 28, 4) == 2);
    CHECK(le(hb, 256 + 24 * 4, 4) == H.items[4].label);
    CHECK(le(hb, 256 + 24 * 4 + 4 + 4 * 2, 4) == H.items[4].ending_chars[2]);
    CHECK(ldm::eval_file_kind(hp) == "hellaswag");
    CHECK(ldm::eval_file_kind(wp) == "wikitext");
    CHECK(ldm::eval_file_kind(lp) == "lambada");
  }
}

TEST_CASE("corrupt eval binaries are rejected with a message naming the file", "[evalfile]") {
  std::string dir = scratch_dir("evalprep_corrupt");
  std::mt19937_64 rng(99);
  ldm::HellaSwagSet H;
  H.tok = tinfo(50257, 50256);
  for (int i = 0; i < 5; i++) {
    ldm::HellaSwagItem it;
    it.context = rand_tokens(rng, 50257, 3, 9);
    for (int k = 0; k < 4; k++) it.endings[k] = rand_tokens(rng, 50257, 1, 4), it.ending_chars[k] = 5;
    it.label = uint32_t(i % 4);
    H.items.push_back(it);
  }
  std::string good = dir + "/good.bin";
  ldm::write_hellaswag(good, H);
  const std::string B = ldm::read_file(good);
  const uint64_t n_tokens = le(B, 48, 8);
  const size_t off_offs = 256 + 5 * 24, off_tok = off_offs + 26 * 8;
  auto bad = [&](const std::string& name, const std::string& bytes) {
    std::string p = dir + "/" + name;
    write_text(p, bytes);
    return p;
  };
  SECTION("wrong magic") {
    std::string b = B;
    b[0] = 'X';
    std::string p = bad("magic.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"magic.bin", "wrong magic"});
  }
  SECTION("another kind of eval binary") {
    std::string p = bad("kind.bin", B);
    expect_error([&] { ldm::read_lambada(p); }, {"kind.bin", "HellaSwag", "expected LAMBADA"});
    expect_error([&] { ldm::read_wikitext(p); }, {"kind.bin", "HellaSwag"});
  }
  SECTION("wrong version") {
    std::string b = B;
    put_le(b, 8, 3, 4);
    std::string p = bad("version.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"version.bin", "version 3"});
  }
  SECTION("the checksum: FNV-1a 64 of the file with its own bytes 152..159 as zero") {
    // computed here from FNV-1a's definition (offset basis and prime of the published algorithm)
    std::string z = B;
    for (size_t i = 152; i < 160; i++) z[i] = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : z) h = (h ^ c) * 0x100000001b3ull;
    CHECK(le(B, 8, 4) == 2);
    CHECK(le(B, 152, 8) == h);
    CHECK(h != 0);
  }
  SECTION("a change no other check sees: a token that is still a valid id, a label still in range") {
    for (size_t off : {off_tok + 2 * 3, size_t(256 + 24 * 1)}) {
      INFO("byte " << off);
      std::string b = B;
      put_le(b, off, le(b, off, 2) == 1 ? 2 : 1, 2);
      std::string p = bad("changed.bin", b);
      expect_error([&] { ldm::read_hellaswag(p); }, {"changed.bin", "checksum mismatch", "ldm_data hellaswag"});
    }
    std::string b = B;
    b[155] ^= 0x10;  // the checksum itself
    std::string p = bad("sum.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"sum.bin", "checksum mismatch"});
  }
  SECTION("a version-1 file (no checksum) still reads; its bytes 152..159 must be zero") {
    std::string b = B;
    put_le(b, 8, 1, 4);
    put_le(b, 152, 0, 8);
    const std::string p = bad("v1.bin", b);
    const ldm::HellaSwagSet R = ldm::read_hellaswag(p);
    REQUIRE(R.items.size() == H.items.size());
    for (size_t i = 0; i < H.items.size(); i++) {
      CHECK(R.items[i].context == H.items[i].context);
      CHECK(R.items[i].endings == H.items[i].endings);
      CHECK(R.items[i].label == H.items[i].label);
    }
    b[153] = 1;
    const std::string q = bad("v1_reserved.bin", b);
    expect_error([&] { ldm::read_hellaswag(q); }, {"v1_reserved.bin", "reserved byte 153"});
  }
  SECTION("shorter than the header") {
    std::string p = bad("short.bin", B.substr(0, 100));
    expect_error([&] { ldm::read_hellaswag(p); }, {"short.bin", "truncated"});
  }
  SECTION("truncated token array") {
    std::string p = bad("trunc.bin", B.substr(0, B.size() - 1));
    expect_error([&] { ldm::read_hellaswag(p); }, {"trunc.bin", "truncated"});
  }
  SECTION("trailing bytes") {
    std::string p = bad("trail.bin", B + std::string(3, '\0'));
    expect_error([&] { ldm::read_hellaswag(p); }, {"trail.bin", "3 trailing bytes"});
  }
  SECTION("offset out of range") {
    std::string b = B;
    put_le(b, off_offs + 8 * 7, n_tokens + 5, 8);
    std::string p = bad("offs.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"offs.bin", "offsets out of range"});
  }
  SECTION("decreasing offsets") {
    std::string b = B;
    put_le(b, off_offs + 8 * 3, 0, 8);
    std::string p = bad("dec.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"dec.bin", "offsets out of range"});
  }
  SECTION("token id >= vocab") {
    std::string b = B;
    put_le(b, off_tok + 2 * 4, 60000, 2);
    std::string p = bad("tok.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"tok.bin", "token id 60000 >= vocab size 50257"});
  }
  SECTION("label out of range") {
    std::string b = B;
    put_le(b, 256 + 24 * 2, 4, 4);
    std::string p = bad("label.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"label.bin", "label 4 out of range"});
  }
  SECTION("token count disagreeing with the file size") {
    std::string b = B;
    put_le(b, 48, n_tokens + 1, 8);
    std::string p = bad("count.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"count.bin", "truncated"});
  }
  SECTION("token width not matching the vocabulary") {
    std::string b = B;
    put_le(b, 16, 4, 4);
    std::string p = bad("width.bin", b);
    expect_error([&] { ldm::read_hellaswag(p); }, {"width.bin", "token width"});
  }
  SECTION("missing file") {
    expect_error([&] { ldm::read_hellaswag(dir + "/nope.bin"); }, {"nope.bin"});
  }
  SECTION("WikiText totals disagreeing with the documents") {
    ldm::WikiTextSet W;
    W.tok = tinfo(50257, 50256);
    W.docs.push_back({{1, 2, 3}, 10, 20});
    W.total_words = 10;
    W.total_bytes = 20;
    std::string p = dir + "/wt.bin";
    ldm::write_wikitext(p, W);
    std::string b = ldm::read_file(p);
    put_le(b, 72, 11, 8);
    std::string q = bad("wt_bad.bin", b);
    expect_error([&] { ldm::read_wikitext(q); }, {"wt_bad.bin", "totals"});
    W.total_words = 9;
    expect_error([&] { ldm::write_wikitext(dir + "/wt2.bin", W); }, {"wt2.bin", "totals"});
  }
  SECTION("empty sets and impossible WikiText documents (their metrics would be NaN or biased)") {
    // A header that counts no items: n_items = n_seqs = n_tokens = 0, one offset (0).
    std::string e = B.substr(0, 256);
    put_le(e, 32, 0, 8);
    put_le(e, 40, 0, 8);
    put_le(e, 48, 0, 8);
    e += std::string(8, '\0');
    std::string p = bad("empty.bin", e);
    expect_error([&] { ldm::read_hellaswag(p); }, {"empty.bin", "empty HellaSwag eval binary"});
    ldm::HellaSwagSet H0;
    H0.tok = H.tok;
    H0.source_format = H.source_format;
    expect_error([&] { ldm::write_hellaswag(dir + "/e1.bin", H0); }, {"e1.bin", "empty HellaSwag"});
    ldm::LambadaSet L0;
    L0.tok = H.tok;
    expect_error([&] { ldm::write_lambada(dir + "/e2.bin", L0); }, {"e2.bin", "empty LAMBADA"});
    CHECK_FALSE(ldm::file_exists(dir + "/e1.bin"));
    ldm::WikiTextSet W;
    W.tok = tinfo(50257, 50256);
    W.docs.push_back({{1, 2, 3}, 10, 20});
    W.docs.push_back({{4}, 1, 1});
    W.total_words = 11;
    W.total_bytes = 21;
    const std::string wp = dir + "/wt_ok.bin";
    ldm::write_wikitext(wp, W);
    const std::string wb = ldm::read_file(wp);
    for (int field : {0, 1, 2}) {  // document 1: words, bytes, tokens
      INFO("field " << field);
      auto W2 = W;
      std::string b = wb;
      if (field == 0) W2.docs[1].words = 0, W2.total_words = 10, put_le(b, 256 + 16, 0, 8), put_le(b, 72, 10, 8);
      if (field == 1) W2.docs[1].bytes = 0, W2.total_bytes = 20, put_le(b, 256 + 24, 0, 8), put_le(b, 80, 20, 8);
      if (field == 2) {
        W2.docs[1].tokens.clear();
        // 3 tokens, offsets [0, 3, 3]: drop the last token (2 bytes) and fix the count
        put_le(b, 48, 3, 8);
        put_le(b, 256 + 32 + 16, 3, 8);
        b.resize(b.size() - 2);
      }
      expect_error([&] { ldm::write_wikitext(dir + "/wt_w.bin", W2); }, {"wt_w.bin", "document 1", "must be >= 1"});
      std::string q = bad("wt_doc.bin", b);
      expect_error([&] { ldm::read_wikitext(q); }, {"wt_doc.bin", "document 1", "must be >= 1"});
    }
  }
  SECTION("writers refuse invalid sets") {
    auto H2 = H;
    H2.items[1].label = 7;
    expect_error([&] { ldm::write_hellaswag(dir + "/w1.bin", H2); }, {"w1.bin", "label 7"});
    H2 = H;
    H2.items[0].endings[2].clear();
    expect_error([&] { ldm::write_hellaswag(dir + "/w2.bin", H2); }, {"w2.bin", "no tokens"});
    H2 = H;
    H2.items[0].context[0] = 50257;
    expect_error([&] { ldm::write_hellaswag(dir + "/w3.bin", H2); }, {"w3.bin", "token id 50257"});
    CHECK_FALSE(ldm::file_exists(dir + "/w3.bin"));
  }
}

// ============================================================================ text processing

TEST_CASE("wikitext_detokenize: each harness rule on hand-made strings", "[evalprep]") {
  // Expected values written by hand from the rule list in evals.md.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"the players ' union", "the players' union"},                 // s ' -> s'
      {"a /' 5/ b", "a /'[0-9]/ b"},                                  // the literal-replacement regex
      {"1 @-@ 2 , 3 @,@ 000 and 4 @.@ 5", "1-2, 3,000 and 4.5"},     // number separators, " , "
      {"a : b ; c . d ! e ? f , g", "a: b; c. d! e? f, g"},          // punctuation
      {"x ( a b ) y [ c ] z { d }", "x (a b) y [c] z {d}"},          // brackets
      {"he said \" hello there \" .", "he said \"hello there\" ."},  // double quotes
      {"the ' quoted ' word", "the 'quoted' word"},                  // single quotes
      {"= = = = Deep = = = =", "==== Deep ===="},                    // heading markers
      {"= = Section = =", "== Section =="},
      {"15 \xC2\xB0 C", "15\xC2\xB0" "C"},                           // degree sign
      {" line one \n line two \n", " line one\nline two\n"},         // " \n" and "\n "
      {"in N years", "in 1 years"},                                  // " N " -> " 1 "
      {"John 's book", "John's book"},                               // " 's" -> "'s"
      {"( \n a \n )", "(a)"},                                        // \s spans newlines
      {"a ( b ( c ) d )", "a (b ( c) d )"},                          // no nesting: first ')' closes
      {"( unclosed", "( unclosed"},
      {"", ""},
  };
  for (auto& c : cases) {
    INFO("input: " << c.first);
    CHECK(ep::wikitext_detokenize(c.first) == c.second);
  }
}

TEST_CASE("Python str/re semantics: C++ helpers agree with CPython on hand-made strings", "[evalprep]") {
  std::string dir = scratch_dir("evalprep_pystrings");
  std::string ref = write_pyref(dir);
  std::vector<std::string> xs = {
      "", " ", "a", "  a  b\t\tc \n", "\x1c" "x\x1f" "y", "a\xC2\x85" "b\xC2\xA0" "c\xE2\x80\x80" "d\xE3\x80\x80",
      "x\xE2\x80\x8B" "y",  // U+200B is NOT whitespace in Python
      "x\xEF\xBB\xBF" "y",  // U+FEFF neither
      " = Robert Boulter = \n Robert is an English actor . \n", "the players ' union , ( a ) [ b ] { c }",
      "\" a \" ' b ' 1 @-@ 2 @,@ 3 @.@ 4", "= = = = x = = = = = = y = = = =", "15 \xC2\xB0 C N 's",
      "( a\n( b ) c )", "\"unbalanced \" quote \" here", "it 's Jack 's and James ' s", "a /' 7/ b",
      "hello WORLD. foo", "\xC3\x89" "COLE \xC3\x89T\xC3\x89", "\xC3\x9F" "eta", "\xC4\xB0stanbul",
      "\xCE\xA3\xCE\x91\xCE\xA3 \xCE\x9F\xCE\xA3", "\xCE\xA3", "abc\xCE\xA3.", "\xC7\x85" "ab",
      "[header] How to do it [title] Step one [step] do  this.", "Foo [title] bar", "  [x] y [z]  ",
      "[title] Clean [step] the  floor", "a [b\nc] d", " = Title = \n x \n = = Sub = = \n y \n = T2 = \n z",
      " \n = A = \n\n = B = \n \n", "= A =\n= B =", "no titles at all",
      // Python's Unicode \s inside the bracket/quote regexes
      "( \xC2\xA0" "a\xC2\x85 )", "' \xE3\x80\x80" "x\x1c '", "[\x1f" "b\xE2\x80\xAF]", "{\xE2\x80\x8B" "c}",
      "\" \xEF\xBB\xBF" "d \"", " = T = \r\n x \x1c\n = U = \n y",
  };
  nlohmann::json j = xs;
  write_text(dir + "/in.json", j.dump());
  run_cmd(python() + " " + shell_quote(ref) + " strings " + shell_quote(dir + "/in.json") + " " +
          shell_quote(dir + "/out.json"));
  nlohmann::json res = nlohmann::json::parse(ldm::read_file(dir + "/out.json"));
  REQUIRE(res.size() == xs.size());
  for (size_t i = 0; i < xs.size(); i++) {
    const std::string& x = xs[i];
    INFO("string #" << i << ": " << x);
    CHECK(ep::wikitext_detokenize(x) == res[i]["detok"].get<std::string>());
    CHECK(ep::py_split_ws_count(x) == res[i]["words"].get<uint64_t>());
    CHECK(ep::py_strip(x) == res[i]["strip"].get<std::string>());
    CHECK(ep::py_rstrip(x) == res[i]["rstrip"].get<std::string>());
    CHECK(ep::py_capitalize(x) == res[i]["cap"].get<std::string>());
    CHECK(ep::hellaswag_preprocess(x) == res[i]["hs"].get<std::string>());
    CHECK(ep::count_code_points(x) == res[i]["len"].get<size_t>());
    CHECK(ep::wikitext_split_pages(x) == res[i]["pages"].get<std::vector<std::string>>());
  }
}

TEST_CASE("small helpers: universal newlines, UTF-8 check, LAMBADA split, bz2", "[evalprep]") {
  CHECK(ep::universal_newlines("a\r\nb\rc\n\r\n") == "a\nb\nc\n\n");
  ep::check_utf8("ok \xC3\xA9 \xF0\x9F\x98\x80", "s");
  expect_error([] { ep::check_utf8("abc\xC3(", "f.txt"); }, {"f.txt", "byte 3"});
  expect_error([] { ep::check_utf8("ab\xC0\x80", "f.txt"); }, {"f.txt", "byte 2"});
  expect_error([] { ep::check_utf8("\xED\xA0\x80", "f.txt"); }, {"f.txt", "byte 0"});
  auto t = ep::lambada_split("He said to her  Smith", "x");
  CHECK(t.context == "He said to her ");
  CHECK(t.target == " Smith");
  expect_error([] { ep::lambada_split("nospace", "lam.jsonl:7"); }, {"lam.jsonl:7", "no space"});

  std::string dir = scratch_dir("evalprep_bz2");
  std::string text = "line one\nline two\n";
  for (int i = 0; i < 2000; i++) text += "more text " + std::to_string(i) + "\n";
  write_text(dir + "/t.txt", text);
  run_cmd("bzip2 -c " + shell_quote(dir + "/t.txt") + " > " + shell_quote(dir + "/t.txt.bz2"));
  CHECK(ep::read_maybe_bz2(dir + "/t.txt.bz2") == text);
  CHECK(ep::read_maybe_bz2(dir + "/t.txt") == text);
  // two concatenated streams (what `cat a.bz2 b.bz2` gives) decode to both texts
  run_cmd("cat " + shell_quote(dir + "/t.txt.bz2") + " " + shell_quote(dir + "/t.txt.bz2") + " > " +
          shell_quote(dir + "/tt.bz2"));
  CHECK(ep::read_maybe_bz2(dir + "/tt.bz2") == text + text);
  std::string bz = ldm::read_file(dir + "/t.txt.bz2");
  write_text(dir + "/cut.bz2", bz.substr(0, bz.size() / 2));
  expect_error([&] { ep::read_maybe_bz2(dir + "/cut.bz2"); }, {"cut.bz2"});
  std::string corrupt = bz;
  corrupt[bz.size() / 2] ^= 0x55;
  write_text(dir + "/bad.bz2", corrupt);
  expect_error([&] { ep::read_maybe_bz2(dir + "/bad.bz2"); }, {"bad.bz2"});
}

// ============================================================================ real data

TEST_CASE("WikiText-2 binary: documents, words, bytes and detokenized text match the Python reference",
          "[evalprep][data]") {
  std::string data = data_dir_or_skip("WikiText-2 eval binary");
  if (data.empty()) return;
  std::string dir = scratch_dir("evalprep_wikitext");
  std::string tokdir = data + "/gpt2_tokenizer", raw = data + "/wikitext2/wiki.test.raw";
  std::string out = dir + "/wikitext2_test.bin";
  REQUIRE(call(cmd_wikitext, {"wikitext", "--tokenizer", tokdir, "--input", raw, "--out", out}) == 0);
  auto W = ldm::read_wikitext(out);
  ldm::Tokenizer tok = ldm::Tokenizer::load(tokdir);
  CHECK(W.tok.vocab_size == 50257);
  CHECK(W.tok.eot_id == 50256);
  CHECK(W.tok.name == "gpt2_tokenizer");
  CHECK(W.tok.fingerprint == ep::tokenizer_fingerprint(tok));

  // Python reference, byte for byte.
  std::string ref = write_pyref(dir);
  run_cmd(python() + " " + shell_quote(ref) + " wikitext " + shell_quote(raw) + " " + shell_quote(dir + "/ref.out"));
  std::string R = ldm::read_file(dir + "/ref.out");
  size_t pos = 0, i = 0, mismatched = 0;
  uint64_t sw = 0, sb = 0;
  while (pos < R.size()) {
    size_t nl = R.find('\n', pos);
    REQUIRE(nl != std::string::npos);
    std::istringstream hdr(R.substr(pos, nl - pos));
    uint64_t words, bytes, len;
    hdr >> words >> bytes >> len;
    std::string detok = R.substr(nl + 1, len);
    pos = nl + 1 + len;
    REQUIRE(i < W.docs.size());
    INFO("document " << i);
    CHECK(W.docs[i].words == words);
    CHECK(W.docs[i].bytes == bytes);
    bool same = tok.decode(W.docs[i].tokens) == detok;
    CHECK(same);
    mismatched += !same;
    sw += words;
    sb += bytes;
    i++;
  }
  CHECK(i == W.docs.size());
  CHECK(mismatched == 0);
  CHECK(W.total_words == sw);
  CHECK(W.total_bytes == sb);
  // Hand-verified constants for shared/data/wikitext2/wiki.test.raw (1,290,590 bytes):
  //  * 62 documents: the 62 top-level " = Title = " lines (the text before the first one is the
  //    single blank line " ", a whitespace-only page, skipped);
  //  * bytes = 1,290,590 - 2 (the skipped " \n") - 61 (the "\n" between consecutive pages; the
  //    last page keeps the file's final "\n") = 1,290,527;
  //  * words = 241,211 whitespace-separated words + 2 x 62 (every page starts with " " and ends
  //    with whitespace, so re.split adds an empty string at each end) = 241,335.
  CHECK(W.docs.size() == 62);
  CHECK(W.total_bytes == 1290527);
  CHECK(W.total_words == 241335);
  // Token count of the detokenized pages == tok of the whole detokenized text per page.
  CHECK(W.docs[0].tokens == tok.encode(ep::wikitext_detokenize(ep::wikitext_split_pages(ldm::read_file(raw))[0])));
  // The first document starts with its title, detokenized.
  CHECK(tok.decode(W.docs[0].tokens).rfind(" = Robert Boulter =\n\nRobert Boulter is an English", 0) == 0);
}

TEST_CASE("LAMBADA binary: 5153 examples, target == tok(\" \" + last word), context+target == tok(text)",
          "[evalprep][data]") {
  std::string data = data_dir_or_skip("LAMBADA eval binary");
  if (data.empty()) return;
  std::string dir = scratch_dir("evalprep_lambada");
  std::string tokdir = data + "/gpt2_tokenizer", in = data + "/lambada/lambada_test.jsonl";
  std::string out = dir + "/lambada.bin";
  REQUIRE(call(cmd_lambada, {"lambada", "--tokenizer", tokdir, "--input", in, "--out", out}) == 0);
  auto L = ldm::read_lambada(out);
  REQUIRE(L.examples.size() == 5153);
  ldm::Tokenizer tok = ldm::Tokenizer::load(tokdir);
  size_t multi = check_lambada_against_text(L, tok, in);
  CHECK(multi > 0);  // some words are several tokens: the acc needs every position
  CHECK(L.tok.eot_id == 50256);
  // Deterministic: one thread gives the same bytes as all threads.
  std::string out1 = dir + "/lambada_1thread.bin";
  REQUIRE(call(cmd_lambada, {"lambada", "--tokenizer", tokdir, "--input", in, "--out", out1, "--threads", "1"}) == 0);
  CHECK(ldm::read_file(out1) == ldm::read_file(out));
}

TEST_CASE("LAMBADA binary with the OLMo tokenizer.json: the tool's assertions hold, header records it",
          "[evalprep][data]") {
  std::string data = data_dir_or_skip("LAMBADA eval binary (OLMo tokenizer)");
  if (data.empty()) return;
  std::string tj = data + "/olmo_tokenizer/allenai_gpt-neox-olmo-dolma-v1_5.json";
  if (!ldm::file_exists(tj)) {
    WARN("SKIP: no OLMo tokenizer in the data directory");
    return;
  }
  std::string dir = scratch_dir("evalprep_lambada_olmo");
  std::string out = dir + "/lambada_olmo.bin";
  REQUIRE(call(cmd_lambada, {"lambada", "--tokenizer", tj, "--input", data + "/lambada/lambada_test.jsonl", "--out", out}) == 0);
  auto L = ldm::read_lambada(out);
  CHECK(L.examples.size() == 5153);
  CHECK(L.tok.eot_id == 50279);
  CHECK(L.tok.vocab_size == 50280);
  CHECK(L.tok.name == "allenai_gpt-neox-olmo-dolma-v1_5.json");
  ldm::Tokenizer tok = ldm::Tokenizer::load(tj);
  CHECK(L.tok.fingerprint == ep::tokenizer_fingerprint(tok));
  CHECK(L.tok.fingerprint != ep::tokenizer_fingerprint(ldm::Tokenizer::load(data + "/gpt2_tokenizer")));
  std::string b = ldm::read_file(out);
  CHECK(le(b, 16, 4) == 2);  // 50,280 ids fit uint16
  CHECK(check_lambada_against_text(L, tok, data + "/lambada/lambada_test.jsonl") > 0);
}

TEST_CASE("HellaSwag binary from the bz2 copy: 10042 items, labels, endings, and the plain .txt",
          "[evalprep][data]") {
  std::string data = data_dir_or_skip("HellaSwag eval binary");
  if (data.empty()) return;
  std::string dir = scratch_dir("evalprep_hellaswag");
  std::string tokdir = data + "/gpt2_tokenizer", bz = data + "/hellaswag/hellaswag_val_full.txt.bz2";
  std::string out = dir + "/hellaswag.bin";
  REQUIRE(call(cmd_hellaswag, {"hellaswag", "--tokenizer", tokdir, "--input", bz, "--out", out}) == 0);
  auto H = ldm::read_hellaswag(out);
  REQUIRE(H.items.size() == 10042);
  CHECK(H.source_format == ldm::kHellaSwagReformattedTxt);
  // Independent decompression, checked against the sha256 in SOURCES.md §6.
  std::string txt = dir + "/hellaswag_val_full.txt";
  run_cmd("bzip2 -dc " + shell_quote(bz) + " > " + shell_quote(txt));
  std::string sha = run_cmd("sha256sum " + shell_quote(txt));
  CHECK(sha.substr(0, 64) == "d572539320eb2050e858ca34b495bbe2103e3b3f1391a9c3bcdf215b0bb93bd1");
  ldm::Tokenizer tok = ldm::Tokenizer::load(tokdir);
  std::ifstream f(txt);
  std::array<int, 4> label_count{};
  size_t not_prefix = 0;
  for (size_t i = 0; i < H.items.size(); i++) {
    std::string lines[6];
    for (auto& l : lines) REQUIRE(std::getline(f, l));
    const auto& it = H.items[i];
    INFO("item " << i);
    REQUIRE(it.label < 4);
    CHECK(it.label == uint32_t(std::stoi(lines[1])));
    label_count[it.label]++;
    CHECK(tok.decode(it.context) == lines[0]);
    for (int k = 0; k < 4; k++) {
      // code points counted here with utf8proc-free logic: std::u32string via manual decode
      size_t cps = 0;
      for (unsigned char c : lines[2 + k]) cps += (c & 0xC0) != 0x80;
      CHECK(it.ending_chars[k] == cps);
      std::vector<uint32_t> whole = tok.encode(lines[0] + " " + lines[2 + k]);
      std::vector<uint32_t> ctx = tok.encode(lines[0]);
      CHECK(it.context == ctx);
      CHECK(it.endings[k] == std::vector<uint32_t>(whole.begin() + long(ctx.size()), whole.end()));
      not_prefix += !std::equal(ctx.begin(), ctx.end(), whole.begin());
    }
  }
  for (int c : label_count) CHECK(c > 2000);  // HellaSwag val labels are roughly balanced
  CHECK(not_prefix == 0);
  // The plain decompressed text gives a byte-identical binary.
  std::string out2 = dir + "/hellaswag_txt.bin";
  REQUIRE(call(cmd_hellaswag, {"hellaswag", "--tokenizer", tokdir, "--input", txt, "--out", out2}) == 0);
  CHECK(ldm::read_file(out2) == ldm::read_file(out));
}

TEST_CASE("HellaSwag original jsonl: harness preprocessing (capitalize, [title], [header]) and the 6-line form",
          "[evalprep]") {
  std::string dir = scratch_dir("evalprep_hs_jsonl");
  // Hand-made items in the original rowanz format.
  std::vector<nlohmann::json> items = {
      {{"activity_label", "Roof shingle removal"}, {"ctx_a", "A man is sitting on a roof."}, {"ctx_b", "he"},
       {"endings", {"is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                    "is holding a rubik's cube.", "starts pulling up roofing on a roof."}}, {"label", 3}},
      {{"activity_label", "Home and Garden"},
       {"ctx_a", "[header] How to clean a grill [title] Heat the grill. [step] Turn it on  high."},
       {"ctx_b", "THE GRATES get HOT"},
       {"endings", {"[title] Scrub the grates. [step] Use a brush.", "Wait  [substeps] a bit.",
                    " Leave it ", "[step] Done"}}, {"label", "1"}},
      {{"activity_label", "Canoeing"}, {"ctx_a", "Two women are in a canoe."}, {"ctx_b", ""},
       {"endings", {"They paddle.", "They sing.", "They swim.", "They sleep."}}, {"label", 0}},
      {{"activity_label", "Greek"}, {"ctx_a", "x"}, {"ctx_b", "\xCE\xA3\xCE\x91\xCE\xA3 \xC3\x89T\xC3\x89"},
       {"endings", {"a", "b", "c", "d"}}, {"label", 2}},
      {{"activity_label", "Canoeing"}, {"ctx_a", ""}, {"ctx_b", "they [step]"},
       {"endings", {"paddle.", "sing.", "swim.", "sleep."}}, {"label", 1}},
  };
  std::string jl;
  for (auto& j : items) jl += j.dump() + "\n";
  std::string jpath = dir + "/hellaswag_val.jsonl";
  write_text(jpath, jl);
  auto got = ep::parse_hellaswag_jsonl(jl, jpath);
  REQUIRE(got.size() == items.size());
  // Against the Python reference of the harness's process_docs.
  std::string ref = write_pyref(dir);
  run_cmd(python() + " " + shell_quote(ref) + " hellaswag " + shell_quote(jpath) + " " + shell_quote(dir + "/ref.jsonl"));
  std::ifstream rf(dir + "/ref.jsonl");
  std::string line;
  for (size_t i = 0; i < got.size(); i++) {
    REQUIRE(std::getline(rf, line));
    auto r = nlohmann::json::parse(line);
    INFO("item " << i);
    CHECK(got[i].context == r["query"].get<std::string>());
    for (int k = 0; k < 4; k++) CHECK(got[i].endings[k] == r["choices"][k].get<std::string>());
    CHECK(got[i].label == r["gold"].get<uint32_t>());
  }
  // Hand-written expectations.
  CHECK(got[0].context == "Roof shingle removal: A man is sitting on a roof. He");
  CHECK(got[1].context == "Home and Garden: How to clean a grill. Heat the grill. Turn it on high. The grates get hot");
  CHECK(got[1].endings[0] == " Scrub the grates. Use a brush.");  // harness keeps this leading space
  CHECK(got[1].endings[1] == "Wait  a bit.");  // 3 spaces -> one "  " -> " " replacement -> 2
  CHECK(got[1].endings[2] == "Leave it");
  CHECK(got[2].context == "Canoeing: Two women are in a canoe.");  // empty ctx_b: space stripped
  CHECK(got[3].context == "Greek: x \xCE\xA3\xCE\xB1\xCF\x82 \xC3\xA9t\xC3\xA9");  // "Σας été" (final sigma)
  CHECK(got[4].context == "Canoeing: They ");  // "[step]" removed after strip(): trailing space stays

  // The 6-line reformatted form of the same items, as the shared copy writes them (its
  // preprocessing does not capitalize ctx_b): equal where capitalize() is a no-op, and the
  // known difference (item 0: "he" vs the harness's "He") is reported, not hidden.
  std::string six = got[0].context.substr(0, got[0].context.size() - 2) + "he\n3\n";
  for (auto& e : got[0].endings) six += e + "\n";
  six += got[2].context + "\n0\n";
  for (auto& e : got[2].endings) six += e + "\n";
  auto txt = ep::parse_hellaswag_txt(six, "six.txt");
  REQUIRE(txt.size() == 2);
  CHECK(txt[0].endings == got[0].endings);
  CHECK(txt[0].label == got[0].label);
  CHECK(txt[0].context == "Roof shingle removal: A man is sitting on a roof. he");
  CHECK(txt[0].context != got[0].context);
  CHECK(txt[1].endings == got[2].endings);
  CHECK(txt[1].label == got[2].label);

  // Through the tool: the trailing space of item 4's query moves into the continuation
  // (_encode_pair), and the binary records the source format.
  std::string data = ldm::find_data_dir();
  if (data.empty()) return;
  std::string out = dir + "/hs.bin";
  REQUIRE(call(cmd_hellaswag, {"hellaswag", "--tokenizer", data + "/gpt2_tokenizer", "--input", jpath, "--out", out}) == 0);
  auto H = ldm::read_hellaswag(out);
  REQUIRE(H.items.size() == 5);
  CHECK(H.source_format == ldm::kHellaSwagOriginalJsonl);
  ldm::Tokenizer tok = ldm::Tokenizer::load(data + "/gpt2_tokenizer");
  CHECK(tok.decode(H.items[4].context) == "Canoeing: They");
  CHECK(tok.decode(H.items[4].endings[1]) == "  sing.");
  CHECK(H.items[4].endings[1] == std::vector<uint32_t>{tok.encode("  sing.")});
  CHECK(tok.decode(H.items[2].endings[1]) == " They sing.");
  CHECK(H.items[1].ending_chars[0] == 31);  // " Scrub the grates. Use a brush." has 31 characters
  CHECK(H.items[0].label == 3);
  CHECK(H.items[1].label == 1);
}

// ============================================================================ CLI errors

TEST_CASE("eval subcommands: --help, usage errors and bad inputs give non-zero exits", "[evalprep]") {
  std::string dir = scratch_dir("evalprep_cli");
  CHECK(call(cmd_lambada, {"lambada", "--help"}) == 0);
  CHECK(call(cmd_wikitext, {"wikitext", "--help"}) == 0);
  CHECK(call(cmd_hellaswag, {"hellaswag", "--help"}) == 0);
  CHECK(call(cmd_lambada, {"lambada"}) == 2);
  CHECK(call(cmd_lambada, {"lambada", "--bogus", "x"}) == 2);
  CHECK(call(cmd_wikitext, {"wikitext", "--input"}) == 2);
  CHECK(call(cmd_hellaswag, {"hellaswag", "--input", "a", "--out", "b"}) == 2);  // no --tokenizer

  std::string data = data_dir_or_skip("eval subcommand error paths");
  if (data.empty()) return;
  std::string tokdir = data + "/gpt2_tokenizer";
  auto run_on = [&](int (*cmd)(int, char**), const char* name, const std::string& file, const std::string& content) {
    std::string in = dir + "/" + file;
    write_text(in, content);
    std::string out = in + ".bin";
    int rc = call(cmd, {name, "--tokenizer", tokdir, "--input", in, "--out", out});
    if (rc != 0) CHECK_FALSE(ldm::file_exists(out));  // nothing written on error
    else CHECK(ldm::file_exists(out));
    return rc;
  };
  // LAMBADA
  CHECK(run_on(cmd_lambada, "lambada", "ok.jsonl", "{\"text\": \"a b c\"}\n") == 0);
  CHECK(run_on(cmd_lambada, "lambada", "badjson.jsonl", "{\"text\": \"a b\"}\n{\"text\": \"a b\"\n") == 1);
  CHECK(run_on(cmd_lambada, "lambada", "nofield.jsonl", "{\"txt\": \"a b\"}\n") == 1);
  CHECK(run_on(cmd_lambada, "lambada", "notstring.jsonl", "{\"text\": 5}\n") == 1);
  CHECK(run_on(cmd_lambada, "lambada", "nospace.jsonl", "{\"text\": \"a b\"}\n{\"text\": \"word\"}\n") == 1);
  CHECK(run_on(cmd_lambada, "lambada", "empty.jsonl", "") == 1);
  CHECK(run_on(cmd_lambada, "lambada", "badutf8.jsonl", "{\"text\": \"a \xFF\"}\n") == 1);
  expect_error([] { ep::parse_lambada_jsonl("{\"text\": \"a b\"}\n\n{\"text\": \"ab\"}\n", "L.jsonl"); },
               {"L.jsonl:3", "no space"});
  expect_error([] { ep::parse_lambada_jsonl("{\"text\": \"a b\"}\n[1]\n", "L.jsonl"); }, {"L.jsonl:2", "not an object"});
  expect_error([] { ep::parse_lambada_jsonl("{\"x\": 1}\n", "L.jsonl"); }, {"L.jsonl:1", "missing field \"text\""});
  // WikiText
  CHECK(run_on(cmd_wikitext, "wikitext", "blank.raw", " \n \n") == 1);
  CHECK(run_on(cmd_wikitext, "wikitext", "badutf8.raw", " = T = \n x \xC3\n") == 1);
  expect_error([] { ep::check_utf8(" = T = \n x \xC3\n", "w.raw"); }, {"w.raw", "byte 11"});
  // HellaSwag: six-line form
  std::string item = "ctx\n2\na\nb\nc\nd\n";
  CHECK(run_on(cmd_hellaswag, "hellaswag", "label.txt", item + "ctx\n4\na\nb\nc\nd\n") == 1);
  CHECK(run_on(cmd_hellaswag, "hellaswag", "labelx.txt", "ctx\nx\na\nb\nc\nd\n") == 1);
  CHECK(run_on(cmd_hellaswag, "hellaswag", "short.txt", item + "ctx\n1\na\n") == 1);
  expect_error([&] { ep::parse_hellaswag_txt(item + "ctx\n9\na\nb\nc\nd\n", "h.txt"); }, {"h.txt:8", "label \"9\""});
  expect_error([&] { ep::parse_hellaswag_txt(item + "c\n1\n", "h.txt"); }, {"h.txt", "not a multiple of 6"});
  // HellaSwag: jsonl form
  std::string good = R"({"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["1","2","3","4"], "label": 0})";
  CHECK(run_on(cmd_hellaswag, "hellaswag", "hs_ok.jsonl", good + "\n") == 0);
  CHECK(run_on(cmd_hellaswag, "hellaswag", "lab.jsonl", good + "\n" + R"({"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["1","2","3","4"], "label": 4})" "\n") == 1);
  CHECK(run_on(cmd_hellaswag, "hellaswag", "end3.jsonl", R"({"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["1","2","3"], "label": 0})" "\n") == 1);
  CHECK(run_on(cmd_hellaswag, "hellaswag", "noctx.jsonl", R"({"activity_label": "A", "ctx_b": "c", "endings": ["1","2","3","4"], "label": 0})" "\n") == 1);
  CHECK(run_on(cmd_hellaswag, "hellaswag", "bad.jsonl", good + "\n{\"activity_label\": \n") == 1);
  expect_error([&] { ep::parse_hellaswag_jsonl(good + "\n" + R"({"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["1","2","3","4"]})", "h.jsonl"); },
               {"h.jsonl:2", "missing field \"label\""});
  expect_error([&] { ep::parse_hellaswag_jsonl(R"({"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["1","2","3","4"], "label": -1})", "h.jsonl"); },
               {"h.jsonl:1", "label -1 out of range"});
  // --out naming the --input file (by any spelling): a usage error, the text kept
  const std::string ok_text = ldm::read_file(dir + "/ok.jsonl");
  for (const std::string& o : {dir + "/ok.jsonl", dir + "/./ok.jsonl"})
    CHECK(call(cmd_lambada, {"lambada", "--tokenizer", tokdir, "--input", dir + "/ok.jsonl", "--out", o}) == 2);
  CHECK(call(cmd_wikitext, {"wikitext", "--tokenizer", tokdir, "--input", dir + "/ok.jsonl", "--out", dir + "/ok.jsonl"}) == 2);
  CHECK(ldm::read_file(dir + "/ok.jsonl") == ok_text);
  // Missing input file, bad tokenizer path, unwritable output.
  CHECK(call(cmd_lambada, {"lambada", "--tokenizer", tokdir, "--input", dir + "/none.jsonl", "--out", dir + "/o.bin"}) == 1);
  CHECK(call(cmd_lambada, {"lambada", "--tokenizer", dir + "/no_tokenizer", "--input", dir + "/ok.jsonl", "--out", dir + "/o.bin"}) == 1);
  CHECK(call(cmd_lambada, {"lambada", "--tokenizer", tokdir, "--input", dir + "/ok.jsonl", "--out", dir + "/ok.jsonl.bin/o.bin"}) == 1);
  // --out's missing directories are created (like `mkdir -p`), and removed again when the run fails.
  run_cmd("rm -rf '" + dir + "/made'");
  CHECK(call(cmd_lambada, {"lambada", "--tokenizer", tokdir, "--input", dir + "/ok.jsonl", "--out", dir + "/made/eval/o.bin"}) == 0);
  CHECK(ldm::read_lambada(dir + "/made/eval/o.bin").examples.size() == 1);
  CHECK(call(cmd_lambada, {"lambada", "--tokenizer", tokdir, "--input", dir + "/none.jsonl", "--out", dir + "/made2/eval/o.bin"}) == 1);
  CHECK_FALSE(ldm::file_exists(dir + "/made2"));
  // A truncated .bz2 input.
  std::string bz = ldm::read_file(data + "/hellaswag/hellaswag_val_full.txt.bz2");
  CHECK(run_on(cmd_hellaswag, "hellaswag", "cut.txt.bz2", bz.substr(0, 5000)) == 1);
}

TEST_CASE("encode_pair: lm-eval-harness _encode_pair rules (empty context, trailing whitespace, prefix check)",
          "[evalprep][data]") {
  std::string data = data_dir_or_skip("encode_pair");
  if (data.empty()) return;
  ldm::Tokenizer tok = ldm::Tokenizer::load(data + "/gpt2_tokenizer");
  std::vector<uint32_t> ctx, cont;
  // Empty context: the harness scores the continuation after [eot].
  ep::encode_pair(tok, "", " hello world", ctx, cont, "t", true);
  CHECK(ctx == std::vector<uint32_t>{50256});
  CHECK(cont == tok.encode(" hello world"));
  // Whitespace-only context is empty after rstrip; its whitespace joins the continuation.
  ep::encode_pair(tok, " \t", " hi", ctx, cont, "t", true);
  CHECK(ctx == std::vector<uint32_t>{50256});
  CHECK(cont == tok.encode(" \t hi"));
  // Trailing whitespace moves: context "The cat  " + " sat" -> "The cat" + "   sat".
  ep::encode_pair(tok, "The cat  ", " sat", ctx, cont, "t", true);
  CHECK(ctx == tok.encode("The cat"));
  std::vector<uint32_t> whole = tok.encode("The cat   sat");
  CHECK(cont == std::vector<uint32_t>(whole.begin() + long(ctx.size()), whole.end()));
  CHECK(tok.decode(cont) == "   sat");
  // Ordinary case: cont = tok(ctx + cont)[len(tok(ctx)):]
  ep::encode_pair(tok, "It was a", " dog", ctx, cont, "t", true);
  CHECK(ctx == tok.encode("It was a"));
  CHECK(cont == tok.encode(" dog"));
  // A continuation that merges into the context's last pre-token breaks the prefix property.
  expect_error([&] { ep::encode_pair(tok, "hello", "world", ctx, cont, "ex 7", true); },
               {"ex 7", "not a prefix"});
  ep::encode_pair(tok, "hello", "world", ctx, cont, "ex 7", false);  // harness semantics: allowed
  CHECK(ctx == tok.encode("hello"));
  whole = tok.encode("helloworld");
  CHECK(cont == std::vector<uint32_t>(whole.begin() + std::min<long>(long(ctx.size()), long(whole.size())), whole.end()));
}
