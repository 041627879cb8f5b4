// core/evalfile.cpp — writers and readers of the eval binaries. Layout: core/evalfile.h and
// doc/formats.md "Eval binaries".
#include "core/evalfile.h"

#include <cstring>

#include "core/checkpoint.h"
#include "core/common.h"

namespace ldm {

namespace {

// Header field offsets (bytes). Keep in sync with doc/formats.md.
constexpr size_t kOffMagic = 0, kOffVersion = 8, kOffHeaderBytes = 12, kOffTokenBytes = 16,
                 kOffSeqsPerItem = 20, kOffRecordBytes = 24, kOffSourceFormat = 28,
                 kOffNItems = 32, kOffNSeqs = 40, kOffNTokens = 48, kOffEot = 56,
                 kOffVocab = 60, kOffFingerprint = 64, kOffTotalWords = 72,
                 kOffTotalBytes = 80, kOffTokName = 88, kTokNameBytes = 64,
                 kOffChecksum = kOffTokName + kTokNameBytes,  // version 2; version 1: reserved
                 kOffReserved = kOffChecksum + 8;             // 160..255 must be zero

enum Kind { kLambada = 0, kWikiText = 1, kHellaSwag = 2 };

struct KindInfo {
  const char* magic;       // 8 bytes, no NUL
  const char* name;        // for messages
  const char* tool;        // the `ldm_data` command that makes it; eval_file_kind's answer
  uint32_t seqs_per_item;
  uint32_t record_bytes;
};
const KindInfo kKinds[3] = {
    {"LDMEVLMB", "LAMBADA", "lambada", 2, 0},
    {"LDMEVWKT", "WikiText", "wikitext", 1, 16},
    {"LDMEVHSW", "HellaSwag", "hellaswag", 5, 24},
};

void put32(std::string& b, size_t off, uint32_t v) {
  for (int i = 0; i < 4; i++) b[off + i] = char((v >> (8 * i)) & 0xff);
}
void put64(std::string& b, size_t off, uint64_t v) {
  for (int i = 0; i < 8; i++) b[off + i] = char((v >> (8 * i)) & 0xff);
}
uint32_t get32(const std::string& b, size_t off) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= uint32_t(uint8_t(b[off + i])) << (8 * i);
  return v;
}
uint64_t get64(const std::string& b, size_t off) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= uint64_t(uint8_t(b[off + i])) << (8 * i);
  return v;
}
// The version-2 checksum: FNV-1a 64 of the whole file with its own 8 bytes taken as zero.
uint64_t file_checksum(const std::string& b) {
  const char zeros[8] = {};
  uint64_t h = fnv1a64(b.data(), kOffChecksum);
  h = fnv1a64(zeros, 8, h);
  return fnv1a64(b.data() + kOffChecksum + 8, b.size() - kOffChecksum - 8, h);  // (b.size() >= 256)
}

void app32(std::string& b, uint32_t v) {
  size_t o = b.size();
  b.resize(o + 4);
  put32(b, o, v);
}
void app64(std::string& b, uint64_t v) {
  size_t o = b.size();
  b.resize(o + 8);
  put64(b, o, v);
}

// What a writer hands to the common serializer.
struct Payload {
  Kind kind;
  const EvalTokenizerInfo* tok;
  uint32_t source_format = 0;
  uint64_t n_items = 0;
  uint64_t total_words = 0, total_bytes = 0;
  std::string records;                              // n_items * record_bytes
  std::vector<const std::vector<uint32_t>*> seqs;   // n_items * seqs_per_item
};

void serialize_and_write(const std::string& path, const Payload& p) {
  const KindInfo& k = kKinds[p.kind];
  const EvalTokenizerInfo& t = *p.tok;
  if (t.vocab_size == 0) throw Error(path + ": cannot write eval binary: tokenizer vocab_size is 0");
  if (t.eot_id >= t.vocab_size)
    throw Error(strprintf("%s: cannot write eval binary: eot id %u >= vocab size %u", path.c_str(),
                          t.eot_id, t.vocab_size));
  if (t.name.size() >= kTokNameBytes)
    throw Error(path + ": cannot write eval binary: tokenizer name longer than 63 bytes: " + t.name);
  if (p.records.size() != p.n_items * k.record_bytes || p.seqs.size() != p.n_items * k.seqs_per_item)
    throw Error(path + ": internal error: eval payload sizes disagree");
  if (p.n_items == 0)
    throw Error(strprintf("%s: cannot write an empty %s eval binary (no items)", path.c_str(), k.name));
  const uint32_t tb = t.vocab_size <= 65536 ? 2 : 4;
  uint64_t n_tokens = 0;
  for (size_t s = 0; s < p.seqs.size(); s++) {
    for (uint32_t id : *p.seqs[s])
      if (id >= t.vocab_size)
        throw Error(strprintf("%s: cannot write eval binary: token id %u >= vocab size %u in item %zu",
                              path.c_str(), id, t.vocab_size, s / k.seqs_per_item));
    n_tokens += p.seqs[s]->size();
  }
  const uint64_t n_seqs = p.seqs.size();
  std::string b(kEvalHeaderBytes, '\0');
  std::memcpy(&b[kOffMagic], k.magic, 8);
  put32(b, kOffVersion, kEvalFileVersion);
  put32(b, kOffHeaderBytes, kEvalHeaderBytes);
  put32(b, kOffTokenBytes, tb);
  put32(b, kOffSeqsPerItem, k.seqs_per_item);
  put32(b, kOffRecordBytes, k.record_bytes);
  put32(b, kOffSourceFormat, p.source_format);
  put64(b, kOffNItems, p.n_items);
  put64(b, kOffNSeqs, n_seqs);
  put64(b, kOffNTokens, n_tokens);
  put32(b, kOffEot, t.eot_id);
  put32(b, kOffVocab, t.vocab_size);
  put64(b, kOffFingerprint, t.fingerprint);
  put64(b, kOffTotalWords, p.total_words);
  put64(b, kOffTotalBytes, p.total_bytes);
  std::memcpy(&b[kOffTokName], t.name.data(), t.name.size());
  b.reserve(kEvalHeaderBytes + p.records.size() + (n_seqs + 1) * 8 + n_tokens * tb);
  b += p.records;
  uint64_t off = 0;
  app64(b, 0);
  for (const auto* s : p.seqs) {
    off += s->size();
    app64(b, off);
  }
  for (const auto* s : p.seqs)
    for (uint32_t id : *s) {
      if (tb == 2) {
        b.push_back(char(id & 0xff));
        b.push_back(char((id >> 8) & 0xff));
      } else {
        app32(b, id);
      }
    }
  put64(b, kOffChecksum, file_checksum(b));
  write_file_atomic(path, b.data(), b.size());
}

// A parsed, validated file: header values, records and sequences.
struct Parsed {
  EvalTokenizerInfo tok;
  uint32_t version = 0;
  uint64_t stored_checksum = 0, computed_checksum = 0;  // version 2
  uint32_t source_format = 0;
  uint64_t n_items = 0, total_words = 0, total_bytes = 0;
  std::string records;
  std::vector<std::vector<uint32_t>> seqs;
};

std::string show_magic(const std::string& b) {
  std::string m;
  for (size_t i = 0; i < 8 && i < b.size(); i++) {
    unsigned char c = uint8_t(b[i]);
    if (c >= 32 && c < 127) m += char(c);
    else m += strprintf("\\x%02x", c);
  }
  return m;
}

int kind_of_magic(const std::string& b) {
  if (b.size() < 8) return -1;
  for (int i = 0; i < 3; i++)
    if (std::memcmp(b.data(), kKinds[i].magic, 8) == 0) return i;
  return -1;
}

Parsed parse_file(const std::string& path, Kind want) {
  const KindInfo& k = kKinds[want];
  std::string b = read_file(path);
  const char* P = path.c_str();
  if (b.size() < kEvalHeaderBytes)
    throw Error(strprintf("%s: truncated %s eval binary: %zu bytes, shorter than the %u-byte header", P,
                          k.name, b.size(), kEvalHeaderBytes));
  int got = kind_of_magic(b);
  if (got < 0)
    throw Error(strprintf("%s: not an eval binary: wrong magic '%s' (expected '%s' for %s)", P,
                          show_magic(b).c_str(), k.magic, k.name));
  if (got != int(want))
    throw Error(strprintf("%s: wrong magic '%s': this is a %s eval binary, expected %s ('%s')", P,
                          show_magic(b).c_str(), kKinds[got].name, k.name, k.magic));
  uint32_t version = get32(b, kOffVersion);
  if (version != 1 && version != kEvalFileVersion)
    throw Error(strprintf("%s: unsupported %s eval binary version %u (this build reads 1 and %u)", P, k.name,
                          version, kEvalFileVersion));
  uint32_t hb = get32(b, kOffHeaderBytes), tb = get32(b, kOffTokenBytes);
  uint32_t spi = get32(b, kOffSeqsPerItem), rb = get32(b, kOffRecordBytes);
  if (hb != kEvalHeaderBytes)
    throw Error(strprintf("%s: bad header: header_bytes %u, expected %u", P, hb, kEvalHeaderBytes));
  if (tb != 2 && tb != 4) throw Error(strprintf("%s: bad header: token width %u bytes (must be 2 or 4)", P, tb));
  if (spi != k.seqs_per_item || rb != k.record_bytes)
    throw Error(strprintf("%s: bad header: seqs_per_item %u / record_bytes %u, expected %u / %u for %s", P,
                          spi, rb, k.seqs_per_item, k.record_bytes, k.name));
  Parsed r;
  r.version = version;
  r.source_format = get32(b, kOffSourceFormat);
  r.n_items = get64(b, kOffNItems);
  uint64_t n_seqs = get64(b, kOffNSeqs), n_tokens = get64(b, kOffNTokens);
  r.tok.eot_id = get32(b, kOffEot);
  r.tok.vocab_size = get32(b, kOffVocab);
  r.tok.fingerprint = get64(b, kOffFingerprint);
  r.total_words = get64(b, kOffTotalWords);
  r.total_bytes = get64(b, kOffTotalBytes);
  const char* name = &b[kOffTokName];
  size_t nl = strnlen(name, kTokNameBytes);
  if (nl == kTokNameBytes) throw Error(std::string(P) + ": bad header: tokenizer name not NUL-terminated");
  r.tok.name.assign(name, nl);
  for (size_t i = kOffTokName + nl; i < kEvalHeaderBytes; i++)
    if (b[i] != 0 && !(version >= 2 && i >= kOffChecksum && i < kOffReserved))
      throw Error(strprintf("%s: bad header: reserved byte %zu is not zero", P, i));
  if (r.tok.vocab_size == 0 || r.tok.eot_id >= r.tok.vocab_size)
    throw Error(strprintf("%s: bad header: eot id %u, vocab size %u", P, r.tok.eot_id, r.tok.vocab_size));
  if ((tb == 2) != (r.tok.vocab_size <= 65536))
    throw Error(strprintf("%s: bad header: token width %u bytes does not fit vocab size %u", P, tb,
                          r.tok.vocab_size));
  // Guard the size arithmetic against absurd counts before multiplying.
  const uint64_t lim = uint64_t(1) << 40;
  if (r.n_items > lim || n_seqs > lim || n_tokens > lim)
    throw Error(strprintf("%s: bad header: absurd counts (items %llu, seqs %llu, tokens %llu)", P,
                          (unsigned long long)r.n_items, (unsigned long long)n_seqs,
                          (unsigned long long)n_tokens));
  if (r.n_items == 0)
    throw Error(strprintf("%s: empty %s eval binary: the header counts no items", P, k.name));
  if (n_seqs != r.n_items * spi)
    throw Error(strprintf("%s: bad header: %llu sequences for %llu items (expected %u per item)", P,
                          (unsigned long long)n_seqs, (unsigned long long)r.n_items, spi));
  const uint64_t off_rec = kEvalHeaderBytes, off_offs = off_rec + r.n_items * rb,
                 off_tok = off_offs + (n_seqs + 1) * 8, expect = off_tok + n_tokens * tb;
  if (b.size() < expect)
    throw Error(strprintf("%s: truncated %s eval binary: header implies %llu bytes, file has %zu", P,
                          k.name, (unsigned long long)expect, b.size()));
  if (b.size() > expect)
    throw Error(strprintf("%s: %llu trailing bytes after the token array (header implies %llu bytes, "
                          "file has %zu)", P, (unsigned long long)(b.size() - expect),
                          (unsigned long long)expect, b.size()));
  if (version >= 2) {  // compared by the reader after its own checks (check_checksum)
    r.stored_checksum = get64(b, kOffChecksum);
    r.computed_checksum = file_checksum(b);
  }
  r.records = b.substr(off_rec, r.n_items * rb);
  std::vector<uint64_t> offs(n_seqs + 1);
  for (uint64_t i = 0; i <= n_seqs; i++) offs[i] = get64(b, off_offs + 8 * i);
  if (offs[0] != 0) throw Error(strprintf("%s: offsets out of range: first offset %llu, must be 0", P,
                                          (unsigned long long)offs[0]));
  for (uint64_t i = 0; i < n_seqs; i++)
    if (offs[i + 1] < offs[i] || offs[i + 1] > n_tokens)
      throw Error(strprintf("%s: offsets out of range: sequence %llu (item %llu) spans [%llu, %llu) of %llu "
                            "tokens", P, (unsigned long long)i, (unsigned long long)(i / spi),
                            (unsigned long long)offs[i], (unsigned long long)offs[i + 1],
                            (unsigned long long)n_tokens));
  if (offs[n_seqs] != n_tokens)
    throw Error(strprintf("%s: offsets out of range: last offset %llu, token count %llu", P,
                          (unsigned long long)offs[n_seqs], (unsigned long long)n_tokens));
  r.seqs.resize(n_seqs);
  const unsigned char* tp = reinterpret_cast<const unsigned char*>(b.data()) + off_tok;
  for (uint64_t s = 0; s < n_seqs; s++) {
    auto& v = r.seqs[s];
    v.resize(offs[s + 1] - offs[s]);
    for (uint64_t j = 0; j < v.size(); j++) {
      const unsigned char* q = tp + (offs[s] + j) * tb;
      uint32_t id = tb == 2 ? uint32_t(q[0] | (q[1] << 8))
                            : uint32_t(q[0]) | (uint32_t(q[1]) << 8) | (uint32_t(q[2]) << 16) |
                                  (uint32_t(q[3]) << 24);
      if (id >= r.tok.vocab_size)
        throw Error(strprintf("%s: token id %u >= vocab size %u at token %llu (item %llu)", P, id,
                              r.tok.vocab_size, (unsigned long long)(offs[s] + j),
                              (unsigned long long)(s / spi)));
      v[j] = id;
    }
  }
  return r;
}

// Last of a reader's checks (a damaged field with a check of its own gets that check's message):
// a version-2 file whose bytes differ from what its writer hashed.
void check_checksum(const std::string& path, const Parsed& r, Kind kind) {
  if (r.version >= 2 && r.stored_checksum != r.computed_checksum)
    throw Error(strprintf("%s: checksum mismatch (header %016llx, contents %016llx): the file changed after it "
                          "was written; make it again with `ldm_data %s`", path.c_str(),
                          (unsigned long long)r.stored_checksum, (unsigned long long)r.computed_checksum,
                          kKinds[kind].tool));
}

}  // namespace

std::string eval_file_kind(const std::string& path) {
  std::string b = read_file(path);
  int k = kind_of_magic(b);
  if (k < 0) throw Error(path + ": not an eval binary (magic '" + show_magic(b) + "')");
  return kKinds[k].tool;
}

// ---------------------------------------------------------------- LAMBADA
void write_lambada(const std::string& path, const LambadaSet& s) {
  Payload p;
  p.kind = kLambada;
  p.tok = &s.tok;
  p.n_items = s.examples.size();
  for (size_t i = 0; i < s.examples.size(); i++) {
    if (s.examples[i].target.empty())
      throw Error(strprintf("%s: cannot write LAMBADA example %zu: empty target", path.c_str(), i));
    p.seqs.push_back(&s.examples[i].context);
    p.seqs.push_back(&s.examples[i].target);
  }
  serialize_and_write(path, p);
}

LambadaSet read_lambada(const std::string& path) {
  Parsed r = parse_file(path, kLambada);
  if (r.source_format != 0 || r.total_words != 0 || r.total_bytes != 0)
    throw Error(path + ": bad header: LAMBADA binary with non-zero source_format/totals");
  LambadaSet s;
  s.tok = r.tok;
  s.examples.resize(r.n_items);
  for (uint64_t i = 0; i < r.n_items; i++) {
    s.examples[i].context = std::move(r.seqs[2 * i]);
    s.examples[i].target = std::move(r.seqs[2 * i + 1]);
    if (s.examples[i].target.empty())
      throw Error(strprintf("%s: LAMBADA example %llu has an empty target", path.c_str(),
                            (unsigned long long)i));
  }
  check_checksum(path, r, kLambada);
  return s;
}

// ---------------------------------------------------------------- WikiText
void write_wikitext(const std::string& path, const WikiTextSet& s) {
  Payload p;
  p.kind = kWikiText;
  p.tok = &s.tok;
  p.n_items = s.docs.size();
  uint64_t w = 0, by = 0;
  for (size_t i = 0; i < s.docs.size(); i++) {
    const WikiTextDoc& d = s.docs[i];
    if (d.tokens.empty() || d.words == 0 || d.bytes == 0)
      throw Error(strprintf("%s: cannot write WikiText document %zu: %zu tokens, %llu words, %llu bytes "
                            "(each must be >= 1)", path.c_str(), i, d.tokens.size(),
                            (unsigned long long)d.words, (unsigned long long)d.bytes));
    app64(p.records, d.words);
    app64(p.records, d.bytes);
    w += d.words;
    by += d.bytes;
    p.seqs.push_back(&d.tokens);
  }
  if (w != s.total_words || by != s.total_bytes)
    throw Error(path + ": cannot write WikiText binary: totals disagree with the per-document counts");
  p.total_words = w;
  p.total_bytes = by;
  serialize_and_write(path, p);
}

WikiTextSet read_wikitext(const std::string& path) {
  Parsed r = parse_file(path, kWikiText);
  if (r.source_format != 0) throw Error(path + ": bad header: WikiText binary with non-zero source_format");
  WikiTextSet s;
  s.tok = r.tok;
  s.docs.resize(r.n_items);
  uint64_t w = 0, by = 0;
  for (uint64_t i = 0; i < r.n_items; i++) {
    s.docs[i].words = get64(r.records, 16 * i);
    s.docs[i].bytes = get64(r.records, 16 * i + 8);
    s.docs[i].tokens = std::move(r.seqs[i]);
    if (s.docs[i].tokens.empty() || s.docs[i].words == 0 || s.docs[i].bytes == 0)
      throw Error(strprintf("%s: WikiText document %llu: %zu tokens, %llu words, %llu bytes (each must be >= 1)",
                            path.c_str(), (unsigned long long)i, s.docs[i].tokens.size(),
                            (unsigned long long)s.docs[i].words, (unsigned long long)s.docs[i].bytes));
    w += s.docs[i].words;
    by += s.docs[i].bytes;
  }
  if (w != r.total_words || by != r.total_bytes)
    throw Error(strprintf("%s: header totals (%llu words, %llu bytes) disagree with the documents "
                          "(%llu words, %llu bytes)", path.c_str(), (unsigned long long)r.total_words,
                          (unsigned long long)r.total_bytes, (unsigned long long)w, (unsigned long long)by));
  s.total_words = w;
  s.total_bytes = by;
  check_checksum(path, r, kWikiText);
  return s;
}

// ---------------------------------------------------------------- HellaSwag
void write_hellaswag(const std::string& path, const HellaSwagSet& s) {
  if (s.source_format != kHellaSwagOriginalJsonl && s.source_format != kHellaSwagReformattedTxt)
    throw Error(strprintf("%s: cannot write HellaSwag binary: unknown source format %u", path.c_str(),
                          s.source_format));
  Payload p;
  p.kind = kHellaSwag;
  p.tok = &s.tok;
  p.source_format = s.source_format;
  p.n_items = s.items.size();
  for (size_t i = 0; i < s.items.size(); i++) {
    const auto& it = s.items[i];
    if (it.label > 3)
      throw Error(strprintf("%s: cannot write HellaSwag item %zu: label %u out of range 0..3", path.c_str(),
                            i, it.label));
    app32(p.records, it.label);
    for (int j = 0; j < 4; j++) {
      if (it.endings[j].empty())
        throw Error(strprintf("%s: cannot write HellaSwag item %zu: ending %d has no tokens", path.c_str(),
                              i, j));
      app32(p.records, it.ending_chars[j]);
    }
    app32(p.records, 0);
    p.seqs.push_back(&it.context);
    for (int j = 0; j < 4; j++) p.seqs.push_back(&it.endings[j]);
  }
  serialize_and_write(path, p);
}

HellaSwagSet read_hellaswag(const std::string& path) {
  Parsed r = parse_file(path, kHellaSwag);
  if (r.source_format != kHellaSwagOriginalJsonl && r.source_format != kHellaSwagReformattedTxt)
    throw Error(strprintf("%s: bad header: unknown HellaSwag source format %u", path.c_str(), r.source_format));
  if (r.total_words != 0 || r.total_bytes != 0)
    throw Error(path + ": bad header: HellaSwag binary with non-zero totals");
  HellaSwagSet s;
  s.tok = r.tok;
  s.source_format = r.source_format;
  s.items.resize(r.n_items);
  for (uint64_t i = 0; i < r.n_items; i++) {
    auto& it = s.items[i];
    it.label = get32(r.records, 24 * i);
    if (it.label > 3)
      throw Error(strprintf("%s: HellaSwag item %llu: label %u out of range 0..3", path.c_str(),
                            (unsigned long long)i, it.label));
    for (int j = 0; j < 4; j++) it.ending_chars[j] = get32(r.records, 24 * i + 4 + 4 * j);
    if (get32(r.records, 24 * i + 20) != 0)
      throw Error(strprintf("%s: HellaSwag item %llu: reserved record field is not zero", path.c_str(),
                            (unsigned long long)i));
    it.context = std::move(r.seqs[5 * i]);
    for (int j = 0; j < 4; j++) {
      it.endings[j] = std::move(r.seqs[5 * i + 1 + j]);
      if (it.endings[j].empty())
        throw Error(strprintf("%s: HellaSwag item %llu: ending %d has no tokens", path.c_str(),
                              (unsigned long long)i, j));
    }
  }
  check_checksum(path, r, kHellaSwag);
  return s;
}

}  // namespace ldm
