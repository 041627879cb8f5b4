// core/tokenizer.cpp — byte-level BPE (GPT-2 / tiktoken `gpt2`, and HF tokenizer.json ByteLevel
// BPE) and the byte tokenizer. See core/tokenizer.h and doc/tokenizer.md.
#include "core/tokenizer.h"

#include "core/checkpoint.h"  // fnv1a64

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unordered_map>

#include "core/common.h"

namespace ldm {

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// UTF-8 validation. Returns the offset of the first invalid byte, or npos; `why` gets the reason.
// Rejects overlong forms, surrogates (U+D800..U+DFFF), code points > U+10FFFF, truncated
// sequences and stray continuation bytes (RFC 3629).
size_t find_invalid_utf8(std::string_view s, const char** why) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data());
    size_t n = s.size(), i = 0;
    while (i < n) {
        // fast path: 8 ASCII bytes at a time
        while (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned c = p[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0xC2) {
            *why = (c < 0xC0) ? "stray continuation byte" : "overlong encoding";
            return i;
        } else if (c < 0xE0) {
            len = 2;
        } else if (c < 0xF0) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;        // overlong
            else if (c == 0xED) hi = 0x9F;   // surrogates
        } else if (c < 0xF5) {
            len = 4;
            if (c == 0xF0) lo = 0x90;        // overlong
            else if (c == 0xF4) hi = 0x8F;   // > U+10FFFF
        } else {
            *why = "byte 0xF5..0xFF never occurs in UTF-8";
            return i;
        }
        if (i + 1 >= n) { *why = "truncated sequence at end of input"; return i; }
        unsigned c1 = p[i + 1];
        if (c1 < lo || c1 > hi) {
            if (c1 >= 0x80 && c1 <= 0xBF) {
                *why = (c == 0xED) ? "UTF-16 surrogate code point"
                       : (c == 0xF4) ? "code point above U+10FFFF" : "overlong encoding";
            } else {
                *why = "truncated sequence";
            }
            return i;
        }
        for (size_t k = 2; k < len; k++) {
            if (i + k >= n) { *why = "truncated sequence at end of input"; return i; }
            unsigned ck = p[i + k];
            if (ck < 0x80 || ck > 0xBF) { *why = "truncated sequence"; return i; }
        }
        i += len;
    }
    return std::string_view::npos;
}

void check_utf8(std::string_view text, const std::string& source, uint64_t base_offset) {
    const char* why = "";
    size_t bad = find_invalid_utf8(text, &why);
    if (bad != std::string_view::npos) {
        throw Error(strprintf("%s: invalid UTF-8 at byte offset %llu (%s; byte 0x%02X)",
                              source.c_str(), (unsigned long long)(base_offset + bad), why,
                              unsigned((unsigned char)text[bad])));
    }
}

// GPT-2's byte <-> printable code point table (bytes_to_unicode in openai/gpt-2 encoder.py):
// printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in byte order.
struct ByteLevelAlphabet {
    uint32_t byte_to_cp[256];
    std::unordered_map<uint32_t, uint8_t> cp_to_byte;
    ByteLevelAlphabet() {
        int n = 0;
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            byte_to_cp[b] = printable ? uint32_t(b) : uint32_t(256 + n++);
            cp_to_byte[byte_to_cp[b]] = uint8_t(b);
        }
    }
};
const ByteLevelAlphabet& alphabet() {
    static const ByteLevelAlphabet a;
    return a;
}

// Maps a vocabulary string written in the byte-level alphabet back to raw bytes. Returns false
// when it contains a character outside the alphabet (or is not valid UTF-8).
bool byte_level_to_bytes(const std::string& s, std::string* out) {
    const auto& A = alphabet();
    out->clear();
    size_t i = 0;
    while (i < s.size()) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(reinterpret_cast<const uint8_t*>(s.data()) + i,
                                              utf8proc_ssize_t(s.size() - i), &cp);
        if (k <= 0) return false;
        auto it = A.cp_to_byte.find(uint32_t(cp));
        if (it == A.cp_to_byte.end()) return false;
        out->push_back(char(it->second));
        i += size_t(k);
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// The GPT-2 pre-tokenization pattern with `\s` written out as Unicode White_Space (what Rust
// regex in tiktoken and Oniguruma in HF tokenizers use); PCRE2's UCP `\s` would miss U+0085.
// \p{L} and \p{N} are completed to Unicode 15.0 (utf8proc 2.8's tables): PCRE2 10.42 has Unicode
// 14.0 tables, and these are the letters/digits added in 15.0 (Kawi, Nag Mundari, Kaktovik
// numerals, CJK Ext. H, ...). With a newer PCRE2 the extra ranges are redundant.
#define LDM_WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define LDM_L15 "\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}" \
    "\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{2B739}\\x{31350}-\\x{323AF}"
#define LDM_N15 "\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"
const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?[\\p{L}" LDM_L15 "]+| ?[\\p{N}" LDM_N15 "]+| ?[^" LDM_WS "\\p{L}\\p{N}" LDM_L15
    LDM_N15 "]+|[" LDM_WS "]+(?![^" LDM_WS "])|[" LDM_WS "]+";
#undef LDM_L15
#undef LDM_N15
#undef LDM_WS

struct Regex {
    pcre2_code* code = nullptr;
    bool jit = false;
    Regex() {
        int err = 0;
        PCRE2_SIZE off = 0;
        code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
        if (!code) {
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(err, buf, sizeof buf);
            throw Error(strprintf("tokenizer: PCRE2 cannot compile the GPT-2 pattern at %zu: %s",
                                  size_t(off), reinterpret_cast<char*>(buf)));
        }
        jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    }
    ~Regex() { pcre2_code_free(code); }
};
const Regex& gpt2_regex() {
    static const Regex r;
    return r;
}

// Per-thread PCRE2 match data and JIT stack.
struct ThreadMatch {
    pcre2_match_data* md = nullptr;
    pcre2_match_context* mctx = nullptr;
    pcre2_jit_stack* stack = nullptr;
    ThreadMatch() {
        md = pcre2_match_data_create(4, nullptr);
        mctx = pcre2_match_context_create(nullptr);
        stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
        if (stack) pcre2_jit_stack_assign(mctx, nullptr, stack);
    }
    ~ThreadMatch() {
        pcre2_match_data_free(md);
        pcre2_match_context_free(mctx);
        if (stack) pcre2_jit_stack_free(stack);
    }
};

// Calls f(begin, end) for each pre-token of `s` (valid UTF-8) in order.
template <typename F>
void split_gpt2(std::string_view s, F&& f) {
    const Regex& re = gpt2_regex();
    thread_local ThreadMatch tm;
    PCRE2_SPTR subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0, n = s.size();
    while (pos < n) {
        int rc = re.jit ? pcre2_jit_match(re.code, subj, n, pos, PCRE2_NO_UTF_CHECK, tm.md, tm.mctx)
                        : pcre2_match(re.code, subj, n, pos, PCRE2_NO_UTF_CHECK, tm.md, tm.mctx);
        if (rc < 0) {
            if (rc == PCRE2_ERROR_NOMATCH) { f(pos, n); return; }  // cannot happen: the pattern covers every character
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(rc, buf, sizeof buf);
            throw Error(strprintf("tokenizer: regex match failed at byte %zu: %s", pos,
                                  reinterpret_cast<char*>(buf)));
        }
        PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tm.md);
        size_t b = ov[0], e = ov[1];
        if (b > pos) f(pos, b);  // unmatched gap (cannot happen; kept as its own piece)
        if (e == b) { // empty match cannot happen either; avoid an infinite loop
            f(b, n);
            return;
        }
        f(b, e);
        pos = e;
    }
}

uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

// Open-addressing hash map uint64 -> uint64 (pair -> rank<<32 | merged id); read-only after build.
struct PairMap {
    std::vector<uint64_t> keys, vals;
    uint64_t mask = 0;
    static constexpr uint64_t kEmpty = ~0ull;
    static uint64_t h(uint64_t k) {
        k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ull;
        return k ^ (k >> 33);
    }
    void init(size_t n) {
        size_t cap = 16;
        while (cap < n * 2 + 16) cap <<= 1;
        keys.assign(cap, kEmpty);
        vals.assign(cap, 0);
        mask = cap - 1;
    }
    // returns false when the key already exists (value kept)
    bool insert(uint64_t k, uint64_t v) {
        for (uint64_t i = h(k) & mask;; i = (i + 1) & mask) {
            if (keys[i] == kEmpty) { keys[i] = k; vals[i] = v; return true; }
            if (keys[i] == k) return false;
        }
    }
    const uint64_t* find(uint64_t k) const {
        for (uint64_t i = h(k) & mask;; i = (i + 1) & mask) {
            if (keys[i] == k) return &vals[i];
            if (keys[i] == kEmpty) return nullptr;
        }
    }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
struct AddedToken {
    std::string content;  // raw UTF-8 (normalized form for normalized tokens)
    uint32_t id;
    bool special = false;  // "special": true in tokenizer.json (matched only by encode_with_special)
};

// Leftmost-longest matcher for a small set of added tokens (HF AddedVocabulary semantics:
// Aho-Corasick MatchKind::LeftmostLongest). A 1-byte and a 2-byte prefix filter skip most
// positions; candidates are tried longest first.
struct AddedMatcher {
    std::vector<AddedToken> toks;  // sorted by length, longest first
    bool one[256] = {};
    std::vector<uint64_t> two = std::vector<uint64_t>(1024, 0);  // bit (b0 | b1 << 8)
    void build() {
        std::stable_sort(toks.begin(), toks.end(), [](const AddedToken& a, const AddedToken& b) {
            return a.content.size() > b.content.size();
        });
        for (const auto& t : toks) {
            if (t.content.size() == 1) {
                one[(unsigned char)t.content[0]] = true;
            } else {
                unsigned k = (unsigned char)t.content[0] | (unsigned((unsigned char)t.content[1]) << 8);
                two[k >> 6] |= 1ull << (k & 63);
            }
        }
    }
    bool empty() const { return toks.empty(); }
    // Position of the leftmost match in s[from..] (longest there) or npos; special tokens count
    // only when with_special.
    size_t find(std::string_view s, size_t from, const AddedToken** hit, bool with_special) const {
        const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data());
        size_t n = s.size();
        for (size_t i = from; i < n; i++) {
            bool cand = one[p[i]];
            if (!cand && i + 1 < n) {
                unsigned k = p[i] | (unsigned(p[i + 1]) << 8);
                cand = (two[k >> 6] >> (k & 63)) & 1;
            }
            if (!cand) continue;
            for (const auto& t : toks) {
                if (t.special && !with_special) continue;
                if (t.content.size() <= n - i && std::memcmp(p + i, t.content.data(), t.content.size()) == 0) {
                    *hit = &t;
                    return i;
                }
            }
        }
        return std::string_view::npos;
    }
};

struct TokenizerImpl {
    bool hf = false;                      // false: GPT-2 / tiktoken semantics (or bytes)
    bool bytes = false;                   // the byte tokenizer: id = byte value, eot = 256
    std::vector<std::string> id_to_bytes; // decode table: id -> raw bytes
    std::vector<uint8_t> id_present;      // 0 for ids no token has (decode error)
    std::unordered_map<std::string, uint32_t> bytes_to_id;  // BPE vocab (raw bytes)
    int32_t byte_id[256];                 // id of each single-byte token, -1 if absent
    PairMap pairs;                        // (left id, right id) -> rank << 32 | merged id
    uint32_t eot = 0, nvocab = 0;
    uint64_t uid = 0;                     // identifies this table for the per-thread caches
    // HF only
    AddedMatcher added_raw;               // normalized=false, matched on raw text
    AddedMatcher added_norm;              // normalized=true, matched on normalized text
    std::vector<std::string> normalizers; // NFC | NFD | NFKC | NFKD, applied in order
    bool add_prefix_space = false, use_regex = true;

    void bpe(std::string_view word, std::vector<uint32_t>& out) const;
    void bpe_long(std::vector<uint32_t>& sym, std::vector<uint32_t>& out) const;
    static constexpr size_t kLongWord = 96;  // longer words use the O(n log n) merge loop
    void encode_pretoken(std::string_view word, std::vector<uint32_t>& out) const;
    void encode_ordinary(std::string_view text, std::vector<uint32_t>& out) const;
    void encode_hf(std::string_view text, std::vector<uint32_t>& out, bool with_special) const;
    std::string normalize(std::string_view s) const;
    void finish();
};

namespace {
std::atomic<uint64_t> g_uid{1};

// Per-thread cache of pre-token -> ids, one per tokenizer table: open addressing on a 64-bit
// hash, words and ids stored in flat arenas; starts at 2^12 slots, doubles when half full up to
// 2^18 slots, then is emptied.
uint64_t hash_bytes(const char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h = (h ^ w) * 0x9FB21C651E98DF25ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        std::memcpy(&w, p, n);
        h = (h ^ w) * 0x9FB21C651E98DF25ull;
        h ^= h >> 29;
    }
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 32);
}

struct WordCache {
    struct Slot {
        uint64_t h = 0;
        uint32_t woff = 0, ioff = 0;
        uint16_t wlen = 0, nids = 0;
        bool used = false;
    };
    uint64_t uid = 0;
    std::vector<Slot> slots;
    std::string words;
    std::vector<uint32_t> ids;
    size_t count = 0;
    static constexpr size_t kMinSlots = size_t(1) << 12, kMaxSlots = size_t(1) << 18;
    void clear() {
        slots.assign(kMinSlots, Slot());
        words.clear();
        ids.clear();
        count = 0;
    }
    // returns the slot holding `w` (used) or the empty slot where it belongs
    Slot* find(std::string_view w, uint64_t h) {
        size_t mask = slots.size() - 1;
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            Slot& s = slots[i];
            if (!s.used) return &s;
            if (s.h == h && s.wlen == w.size() && std::memcmp(words.data() + s.woff, w.data(), w.size()) == 0)
                return &s;
        }
    }
    // doubles the table (small tables stay in cache; they grow with the vocabulary in use)
    void grow() {
        std::vector<Slot> old(slots.size() * 2);
        old.swap(slots);
        size_t mask = slots.size() - 1;
        for (const Slot& s : old) {
            if (!s.used) continue;
            size_t i = s.h & mask;
            while (slots[i].used) i = (i + 1) & mask;
            slots[i] = s;
        }
    }
};
constexpr size_t kCacheWordMax = 256;  // longer words are not cached

WordCache& thread_cache(uint64_t uid) {
    thread_local WordCache caches[4];
    thread_local unsigned next = 0;
    for (auto& c : caches)
        if (c.uid == uid) return c;
    WordCache& c = caches[next++ % 4];
    c.uid = uid;
    c.clear();
    return c;
}

}  // namespace

// Byte-pair merging of one pre-token (raw bytes). Repeatedly merges the adjacent pair with the
// lowest rank (leftmost on ties) — the rule of tiktoken's _byte_pair_merge and of HF BPE.
void TokenizerImpl::bpe(std::string_view word, std::vector<uint32_t>& out) const {
    size_t n = word.size();
    if (n == 0) return;
    if (!hf || n == 1) {
        // tiktoken: a pre-token that is itself a token is emitted as such
        auto it = bytes_to_id.find(std::string(word));
        if (it != bytes_to_id.end()) { out.push_back(it->second); return; }
    }
    constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
    thread_local std::vector<uint32_t> sym, rank;
    sym.resize(n);
    rank.resize(n);
    for (size_t i = 0; i < n; i++) {
        int32_t id = byte_id[(unsigned char)word[i]];
        if (id < 0)
            throw Error(strprintf("tokenizer: byte 0x%02X has no token in this vocabulary",
                                  unsigned((unsigned char)word[i])));
        sym[i] = uint32_t(id);
    }
    if (n > kLongWord) { bpe_long(sym, out); return; }
    auto rank_of = [&](size_t i) -> uint32_t {
        const uint64_t* v = pairs.find(pair_key(sym[i], sym[i + 1]));
        return v ? uint32_t(*v >> 32) : kNone;
    };
    for (size_t i = 0; i + 1 < n; i++) rank[i] = rank_of(i);
    size_t m = n;
    while (m > 1) {
        uint32_t best = kNone;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) { best = rank[i]; bi = i; }
        if (best == kNone) break;
        const uint64_t* v = pairs.find(pair_key(sym[bi], sym[bi + 1]));
        sym[bi] = uint32_t(*v & 0xffffffffu);
        // remove bi+1
        for (size_t i = bi + 1; i + 1 < m; i++) { sym[i] = sym[i + 1]; rank[i] = rank[i + 1]; }
        m--;
        if (bi + 1 < m) rank[bi] = rank_of(bi); else rank[bi] = kNone;
        if (bi > 0) rank[bi - 1] = rank_of(bi - 1);
    }
    out.insert(out.end(), sym.begin(), sym.begin() + m);
}

// The same merge rule for long words in O(n log n): a doubly linked list of symbols and a
// min-heap of (rank, left position) pairs. Stale entries are skipped: an entry is current when its
// left symbol is alive and the pair now at that position still has the entry's rank (a different
// pair has a different rank: ranks are unique per pair in both rank schemes). Ties in rank pop
// the leftmost position first, as in the quadratic loop.
void TokenizerImpl::bpe_long(std::vector<uint32_t>& sym, std::vector<uint32_t>& out) const {
    constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
    const size_t n = sym.size();
    std::vector<uint32_t> next(n), prev(n);
    std::vector<uint8_t> alive(n, 1);
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? uint32_t(i + 1) : kNone;
        prev[i] = i > 0 ? uint32_t(i - 1) : kNone;
    }
    auto lookup = [&](uint32_t l, uint64_t* val) -> bool {
        if (next[l] == kNone) return false;
        const uint64_t* v = pairs.find(pair_key(sym[l], sym[next[l]]));
        if (!v) return false;
        *val = *v;
        return true;
    };
    using Entry = std::pair<uint32_t, uint32_t>;  // (rank, left position)
    std::vector<Entry> heap;
    heap.reserve(n);
    auto cmp = [](const Entry& a, const Entry& b) { return a > b; };  // min-heap
    uint64_t v;
    for (size_t i = 0; i + 1 < n; i++)
        if (lookup(uint32_t(i), &v)) heap.push_back({uint32_t(v >> 32), uint32_t(i)});
    std::make_heap(heap.begin(), heap.end(), cmp);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), cmp);
        Entry e = heap.back();
        heap.pop_back();
        uint32_t l = e.second;
        if (!alive[l] || !lookup(l, &v) || uint32_t(v >> 32) != e.first) continue;
        uint32_t r = next[l];
        sym[l] = uint32_t(v & 0xffffffffu);
        alive[r] = 0;
        next[l] = next[r];
        if (next[r] != kNone) prev[next[r]] = l;
        if (prev[l] != kNone && lookup(prev[l], &v)) {
            heap.push_back({uint32_t(v >> 32), prev[l]});
            std::push_heap(heap.begin(), heap.end(), cmp);
        }
        if (lookup(l, &v)) {
            heap.push_back({uint32_t(v >> 32), l});
            std::push_heap(heap.begin(), heap.end(), cmp);
        }
    }
    for (uint32_t i = 0; i != kNone; i = next[i]) out.push_back(sym[i]);
}

void TokenizerImpl::encode_pretoken(std::string_view word, std::vector<uint32_t>& out) const {
    if (word.size() == 1 && byte_id[(unsigned char)word[0]] >= 0) {
        out.push_back(uint32_t(byte_id[(unsigned char)word[0]]));
        return;
    }
    if (word.size() > kCacheWordMax) { bpe(word, out); return; }
    WordCache& c = thread_cache(uid);
    uint64_t h = hash_bytes(word.data(), word.size());
    WordCache::Slot* s = c.find(word, h);
    if (s->used) {
        out.insert(out.end(), c.ids.begin() + s->ioff, c.ids.begin() + s->ioff + s->nids);
        return;
    }
    size_t start = out.size();
    bpe(word, out);
    if (c.count * 2 >= c.slots.size() || c.ids.size() > (1u << 30)) {
        if (c.slots.size() < WordCache::kMaxSlots && c.ids.size() <= (1u << 30)) c.grow();
        else c.clear();
        s = c.find(word, h);
    }
    s->used = true;
    s->h = h;
    s->woff = uint32_t(c.words.size());
    s->wlen = uint16_t(word.size());
    s->ioff = uint32_t(c.ids.size());
    s->nids = uint16_t(out.size() - start);
    c.words.append(word.data(), word.size());
    c.ids.insert(c.ids.end(), out.begin() + start, out.end());
    c.count++;
}

void TokenizerImpl::encode_ordinary(std::string_view text, std::vector<uint32_t>& out) const {
    split_gpt2(text, [&](size_t b, size_t e) { encode_pretoken(text.substr(b, e - b), out); });
}

// Applies the normalizers. Normalization forms act independently on the segments before an
// ASCII character (an ASCII character is a starter that never composes with what precedes it and
// blocks reordering), so only the segments around "suspicious" characters go through utf8proc:
// for NFC any code point >= U+0300 (UTF-8 lead byte >= 0xCC; below it there are no combining
// marks, jamo, singletons or composition exclusions), for the other forms any non-ASCII byte.
std::string TokenizerImpl::normalize(std::string_view s) const {
    std::string cur(s), next;
    for (const auto& nm : normalizers) {
        int opts = UTF8PROC_STABLE;
        if (nm == "NFC") opts |= UTF8PROC_COMPOSE;
        else if (nm == "NFD") opts |= UTF8PROC_DECOMPOSE;
        else if (nm == "NFKC") opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        else if (nm == "NFKD") opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        const unsigned char limit = nm == "NFC" ? 0xCC : 0x80;
        const unsigned char* p = reinterpret_cast<const unsigned char*>(cur.data());
        size_t n = cur.size(), pos = 0;
        size_t i = 0;
        while (i < n && p[i] < limit) i++;
        if (i == n) continue;  // invariant
        next.clear();
        while (i < n) {
            size_t b = i;
            while (b > pos && p[b - 1] >= 0x80) b--;  // back to the segment start
            if (b > pos) b--;                         // include the ASCII starter before it
            if (b < pos) b = pos;
            size_t e = i + 1;
            while (e < n && p[e] >= 0x80) e++;        // up to the next ASCII character
            next.append(cur, pos, b - pos);
            utf8proc_uint8_t* res = nullptr;
            utf8proc_ssize_t r = utf8proc_map(p + b, utf8proc_ssize_t(e - b), &res, utf8proc_option_t(opts));
            if (r < 0) throw Error(std::string("tokenizer: normalization failed: ") + utf8proc_errmsg(r));
            next.append(reinterpret_cast<char*>(res), size_t(r));
            std::free(res);
            pos = e;
            i = e;
            while (i < n && p[i] < limit) i++;
        }
        next.append(cur, pos, n - pos);
        cur.swap(next);
    }
    return cur;
}

void TokenizerImpl::encode_hf(std::string_view text, std::vector<uint32_t>& out, bool with_special) const {
    auto pretokenize = [&](std::string_view piece) {
        if (piece.empty()) return;
        std::string tmp;
        if (add_prefix_space && piece[0] != ' ') {
            tmp.reserve(piece.size() + 1);
            tmp += ' ';
            tmp.append(piece.data(), piece.size());
            piece = tmp;
        }
        if (use_regex) encode_ordinary(piece, out);
        else encode_pretoken(piece, out);
    };
    auto normalized_piece = [&](std::string_view raw) {
        if (raw.empty()) return;
        std::string norm = normalize(raw);
        std::string_view s(norm);
        size_t pos = 0;
        while (pos < s.size()) {
            const AddedToken* hit = nullptr;
            size_t at = added_norm.empty() ? std::string_view::npos
                                           : added_norm.find(s, pos, &hit, with_special);
            if (at == std::string_view::npos) { pretokenize(s.substr(pos)); break; }
            pretokenize(s.substr(pos, at - pos));
            out.push_back(hit->id);
            pos = at + hit->content.size();
        }
    };
    size_t pos = 0;
    while (pos < text.size()) {
        const AddedToken* hit = nullptr;
        size_t at = added_raw.empty() ? std::string_view::npos
                                      : added_raw.find(text, pos, &hit, with_special);
        if (at == std::string_view::npos) { normalized_piece(text.substr(pos)); break; }
        normalized_piece(text.substr(pos, at - pos));
        out.push_back(hit->id);
        pos = at + hit->content.size();
    }
}

// Fills the single-byte ids and gives the table its cache identity.
void TokenizerImpl::finish() {
    for (int b = 0; b < 256; b++) {
        auto it = bytes_to_id.find(std::string(1, char(b)));
        byte_id[b] = it == bytes_to_id.end() ? -1 : int32_t(it->second);
    }
    uid = g_uid.fetch_add(1);
}

// ---------------------------------------------------------------------------------------------
namespace {

json parse_json_file(const std::string& path) {
    std::string s = read_file(path);
    try {
        return json::parse(s);
    } catch (const json::exception& e) {
        throw Error(path + ": invalid JSON: " + e.what());
    }
}

constexpr uint64_t kMaxTokenId = 10000000;

// A token id from JSON: a non-negative integer up to kMaxTokenId (read as 64 bits, so that a
// value of 2^32 or more is refused instead of wrapping onto another id). `what` names the entry.
uint32_t json_token_id(const json& v, const std::string& path, const std::string& what) {
    if (!v.is_number_unsigned()) throw Error(path + ": id of " + what + " is not a non-negative integer");
    const uint64_t id = v.get<uint64_t>();
    if (id > kMaxTokenId)
        throw Error(strprintf("%s: id %llu of %s is implausibly large (more than %llu)", path.c_str(),
                              (unsigned long long)id, what.c_str(), (unsigned long long)kMaxTokenId));
    return uint32_t(id);
}

// Every id below the largest one must name a token: ids are 0..N-1.
void require_no_id_holes(const TokenizerImpl& T, const std::string& path) {
    for (size_t i = 0; i < T.id_present.size(); i++)
        if (!T.id_present[i]) throw Error(strprintf("%s: id %zu is missing (ids must be 0..N-1)", path.c_str(), i));
}

void set_token(TokenizerImpl& T, uint32_t id, const std::string& bytes, const std::string& path) {
    if (id > kMaxTokenId) throw Error(strprintf("%s: token id %u is implausibly large", path.c_str(), id));
    if (T.id_to_bytes.size() <= id) {
        T.id_to_bytes.resize(id + 1);
        T.id_present.resize(id + 1, 0);
    }
    if (T.id_present[id] && T.id_to_bytes[id] != bytes)
        throw Error(strprintf("%s: id %u is given to two different tokens", path.c_str(), id));
    T.id_to_bytes[id] = bytes;
    T.id_present[id] = 1;
}

}  // namespace

Tokenizer Tokenizer::load_gpt2(const std::string& encoder_json, const std::string& vocab_bpe) {
    auto T = std::make_shared<TokenizerImpl>();
    T->hf = false;
    json enc = parse_json_file(encoder_json);
    if (!enc.is_object() || enc.empty())
        throw Error(encoder_json + ": expected a JSON object mapping token strings to ids");
    std::string bytes;
    bool have_eot = false;
    for (auto it = enc.begin(); it != enc.end(); ++it) {
        const uint32_t id = json_token_id(it.value(), encoder_json, "token \"" + it.key() + "\"");
        if (it.key() == "<|endoftext|>") {
            T->eot = id;
            have_eot = true;
            set_token(*T, id, it.key(), encoder_json);
            continue;  // special token: never produced from text
        }
        if (!byte_level_to_bytes(it.key(), &bytes))
            throw Error(encoder_json + ": token \"" + it.key() + "\" is not in the byte-level alphabet");
        if (!T->bytes_to_id.emplace(bytes, id).second)
            throw Error(encoder_json + ": token \"" + it.key() + "\" occurs twice");
        set_token(*T, id, bytes, encoder_json);
    }
    if (!have_eot) throw Error(encoder_json + ": no \"<|endoftext|>\" entry");
    require_no_id_holes(*T, encoder_json);
    T->nvocab = uint32_t(T->id_to_bytes.size());

    // vocab.bpe: "#version" line, then one merge "a b" per line, in rank order. tiktoken ranks a
    // token by its id (= 256 + merge index); check that the two files agree.
    std::string bpe = read_file(vocab_bpe);
    size_t pos = 0, line_no = 0, nmerge = 0;
    std::string a, b;
    while (pos < bpe.size()) {
        size_t e = bpe.find('\n', pos);
        if (e == std::string::npos) e = bpe.size();
        std::string line = bpe.substr(pos, e - pos);
        pos = e + 1;
        line_no++;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
        size_t sp = line.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
            line.find(' ', sp + 1) != std::string::npos)
            throw Error(strprintf("%s:%zu: expected a merge \"A B\"", vocab_bpe.c_str(), line_no));
        if (!byte_level_to_bytes(line.substr(0, sp), &a) || !byte_level_to_bytes(line.substr(sp + 1), &b))
            throw Error(strprintf("%s:%zu: merge is not in the byte-level alphabet", vocab_bpe.c_str(), line_no));
        auto ia = T->bytes_to_id.find(a), ib = T->bytes_to_id.find(b), ic = T->bytes_to_id.find(a + b);
        if (ia == T->bytes_to_id.end() || ib == T->bytes_to_id.end() || ic == T->bytes_to_id.end())
            throw Error(strprintf("%s:%zu: merge \"%s\" refers to a token missing from %s",
                                  vocab_bpe.c_str(), line_no, line.c_str(), encoder_json.c_str()));
        if (ic->second != 256 + nmerge)
            throw Error(strprintf("%s:%zu: merge %zu gives token id %u, expected %zu (files do not match)",
                                  vocab_bpe.c_str(), line_no, nmerge, ic->second, 256 + nmerge));
        nmerge++;
    }
    if (nmerge == 0) throw Error(vocab_bpe + ": no merges");
    // every token other than the 256 bytes and <|endoftext|> is a merge's result (ids 256 + rank)
    if (nmerge + 257 != T->nvocab)
        throw Error(strprintf("%s: %zu merges, but %s has %zu tokens besides the 256 bytes and <|endoftext|> "
                              "(a truncated file, or files that do not match)",
                              vocab_bpe.c_str(), nmerge, encoder_json.c_str(), size_t(T->nvocab) - 257));
    // tiktoken semantics: any adjacent pair whose concatenation is a token merges, with the
    // rank (= id) of that token. Enumerate every split of every token.
    std::vector<std::pair<uint64_t, uint64_t>> splits;
    for (const auto& kv : T->bytes_to_id) {
        const std::string& t = kv.first;
        for (size_t k = 1; k < t.size(); k++) {
            auto l = T->bytes_to_id.find(t.substr(0, k));
            if (l == T->bytes_to_id.end()) continue;
            auto r = T->bytes_to_id.find(t.substr(k));
            if (r == T->bytes_to_id.end()) continue;
            splits.push_back({pair_key(l->second, r->second), (uint64_t(kv.second) << 32) | kv.second});
        }
    }
    T->pairs.init(splits.size());
    for (const auto& p : splits) T->pairs.insert(p.first, p.second);
    T->finish();
    for (int c = 0; c < 256; c++)
        if (T->byte_id[c] < 0) throw Error(strprintf("%s: byte 0x%02X has no token", encoder_json.c_str(), c));
    Tokenizer tok;
    tok.impl_ = T;
    return tok;
}

Tokenizer Tokenizer::load_hf_json(const std::string& path) {
    auto T = std::make_shared<TokenizerImpl>();
    T->hf = true;
    bool have_eot = false;
    json j = parse_json_file(path);
    if (!j.is_object()) throw Error(path + ": expected a JSON object");
    try {
        // --- model
        if (!j.contains("model") || !j["model"].is_object()) throw Error(path + ": no \"model\" object");
        const json& m = j["model"];
        std::string mtype = m.value("type", std::string("BPE"));
        if (mtype != "BPE") throw Error(path + ": unsupported model type \"" + mtype + "\" (only BPE)");
        auto require_null_or = [&](const char* key, const json& ok) {
            if (m.contains(key) && !m[key].is_null() && m[key] != ok)
                throw Error(path + ": unsupported model." + key + " = " + m[key].dump());
        };
        require_null_or("dropout", 0.0);
        require_null_or("continuing_subword_prefix", "");
        require_null_or("end_of_word_suffix", "");
        require_null_or("byte_fallback", false);
        require_null_or("ignore_merges", false);
        if (!m.contains("vocab") || !m["vocab"].is_object()) throw Error(path + ": model.vocab is not an object");
        std::string bytes;
        for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
            const uint32_t id = json_token_id(it.value(), path, "model.vocab token \"" + it.key() + "\"");
            if (!byte_level_to_bytes(it.key(), &bytes)) {
                // Not reachable by byte-level BPE (e.g. the raw space runs that are also added
                // tokens); kept for decoding only, as the raw string.
                set_token(*T, id, it.key(), path);
                continue;
            }
            if (!T->bytes_to_id.emplace(bytes, id).second)
                throw Error(path + ": model.vocab token \"" + it.key() + "\" occurs twice");
            set_token(*T, id, bytes, path);
        }
        // --- merges: "a b" strings or ["a", "b"] pairs; rank = index
        if (!m.contains("merges") || !m["merges"].is_array()) throw Error(path + ": model.merges is not an array");
        const json& merges = m["merges"];
        T->pairs.init(merges.size());
        std::string a, b;
        for (size_t r = 0; r < merges.size(); r++) {
            std::string sa, sb;
            const json& e = merges[r];
            if (e.is_string()) {
                std::string s = e.get<std::string>();
                size_t sp = s.find(' ');
                if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                    throw Error(strprintf("%s: model.merges[%zu] is not \"A B\"", path.c_str(), r));
                sa = s.substr(0, sp);
                sb = s.substr(sp + 1);
            } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
                sa = e[0].get<std::string>();
                sb = e[1].get<std::string>();
            } else {
                throw Error(strprintf("%s: model.merges[%zu] has an unsupported form", path.c_str(), r));
            }
            if (!byte_level_to_bytes(sa, &a) || !byte_level_to_bytes(sb, &b))
                throw Error(strprintf("%s: model.merges[%zu] is not in the byte-level alphabet", path.c_str(), r));
            auto ia = T->bytes_to_id.find(a), ib = T->bytes_to_id.find(b), ic = T->bytes_to_id.find(a + b);
            if (ia == T->bytes_to_id.end() || ib == T->bytes_to_id.end() || ic == T->bytes_to_id.end())
                throw Error(strprintf("%s: model.merges[%zu] \"%s %s\" refers to a token not in model.vocab",
                                      path.c_str(), r, sa.c_str(), sb.c_str()));
            // A merge listed twice would get its rank from whichever insert the implementation
            // keeps (Hugging Face's map keeps the last): refused, since the supported files have none.
            if (!T->pairs.insert(pair_key(ia->second, ib->second), (uint64_t(r) << 32) | ic->second))
                throw Error(strprintf("%s: model.merges[%zu] \"%s %s\" is listed twice", path.c_str(), r,
                                      sa.c_str(), sb.c_str()));
        }
        // --- normalizer
        if (j.contains("normalizer") && !j["normalizer"].is_null()) {
            std::vector<std::string> list;
            std::function<void(const json&)> add = [&](const json& n) {
                std::string t = n.value("type", std::string("?"));
                if (t == "Sequence") {
                    for (const auto& x : n.at("normalizers")) add(x);
                } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
                    list.push_back(t);
                } else {
                    throw Error(path + ": unsupported normalizer type \"" + t +
                                "\" (supported: NFC, NFD, NFKC, NFKD, Sequence of these)");
                }
            };
            add(j["normalizer"]);
            T->normalizers = list;
        }
        // --- pre-tokenizer
        if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
            throw Error(path + ": no pre_tokenizer (only ByteLevel is supported)");
        {
            const json& p = j["pre_tokenizer"];
            std::string t = p.value("type", std::string("?"));
            if (t != "ByteLevel")
                throw Error(path + ": unsupported pre_tokenizer type \"" + t + "\" (only ByteLevel is supported)");
            T->add_prefix_space = p.value("add_prefix_space", false);
            T->use_regex = p.value("use_regex", true);
        }
        // --- added tokens
        if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
            for (const auto& at : j["added_tokens"]) {
                std::string content = at.at("content").get<std::string>();
                const uint32_t id = json_token_id(at.at("id"), path, "added token \"" + content + "\"");
                for (const char* k : {"single_word", "lstrip", "rstrip"})
                    if (at.value(k, false))
                        throw Error(path + ": added token \"" + content + "\" uses " + k + "=true, which is not supported");
                if (content.empty()) throw Error(path + ": added token with empty content");
                const char* why = "";
                if (find_invalid_utf8(content, &why) != std::string_view::npos)
                    throw Error(path + ": added token content is not valid UTF-8");
                const bool special = at.value("special", false);
                bool normalized = at.value("normalized", !special);
                set_token(*T, id, content, path);
                if (normalized) T->added_norm.toks.push_back({T->normalize(content), id, special});
                else T->added_raw.toks.push_back({content, id, special});
                if (content == "<|endoftext|>") {
                    if (have_eot && T->eot != id)
                        throw Error(strprintf("%s: added token \"<|endoftext|>\" has two ids, %u and %u", path.c_str(),
                                              T->eot, id));
                    T->eot = id;
                    have_eot = true;
                }
            }
        }
    } catch (const json::exception& e) {
        throw Error(path + ": unexpected tokenizer.json structure: " + e.what());
    }
    T->added_raw.build();
    T->added_norm.build();
    if (!have_eot) throw Error(path + ": no \"<|endoftext|>\" added token");
    require_no_id_holes(*T, path);
    T->nvocab = uint32_t(T->id_to_bytes.size());
    T->finish();
    Tokenizer tok;
    tok.impl_ = T;
    return tok;
}

Tokenizer Tokenizer::bytes() {
    static const std::shared_ptr<const TokenizerImpl> table = [] {
        auto T = std::make_shared<TokenizerImpl>();
        T->bytes = true;
        T->id_to_bytes.resize(257);
        T->id_present.assign(257, 1);
        for (int b = 0; b < 256; b++) T->id_to_bytes[size_t(b)] = std::string(1, char(b));
        T->id_to_bytes[256] = "<|endoftext|>";
        T->eot = 256;
        T->nvocab = 257;
        T->uid = g_uid.fetch_add(1);
        for (int b = 0; b < 256; b++) T->byte_id[b] = b;
        return std::shared_ptr<const TokenizerImpl>(T);
    }();
    Tokenizer tok;
    tok.impl_ = table;
    return tok;
}

Tokenizer Tokenizer::load(const std::string& path) {
    if (path == kBytesName) return bytes();
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) throw Error("tokenizer: " + path + " does not exist");
    if (S_ISDIR(st.st_mode)) {
        std::string e = path + "/encoder.json", v = path + "/vocab.bpe", t = path + "/tokenizer.json";
        if (file_exists(e) && file_exists(v)) return load_gpt2(e, v);
        if (file_exists(t)) return load_hf_json(t);
        throw Error("tokenizer: " + path + " holds neither encoder.json + vocab.bpe nor tokenizer.json");
    }
    return load_hf_json(path);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, const std::string& source,
                                        uint64_t base_offset) const {
    if (!impl_) throw Error("tokenizer: encode on an unloaded Tokenizer");
    check_utf8(text, source, base_offset);
    std::vector<uint32_t> out;
    if (impl_->bytes) {
        out.assign(reinterpret_cast<const unsigned char*>(text.data()),
                   reinterpret_cast<const unsigned char*>(text.data()) + text.size());
        return out;
    }
    out.reserve(text.size() / 3 + 4);
    if (impl_->hf) impl_->encode_hf(text, out, false);
    else impl_->encode_ordinary(text, out);
    return out;
}

std::vector<uint32_t> Tokenizer::encode_with_special(std::string_view text, const std::string& source,
                                                     uint64_t base_offset) const {
    if (!impl_) throw Error("tokenizer: encode on an unloaded Tokenizer");
    check_utf8(text, source, base_offset);
    std::vector<uint32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (impl_->hf) {
        impl_->encode_hf(text, out, true);
        return out;
    }
    // GPT-2 and bytes: the one special token is "<|endoftext|>" (tiktoken allowed_special="all").
    const std::string& eot = impl_->id_to_bytes[impl_->eot];
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t at = text.find(eot, pos);
        std::string_view piece = text.substr(pos, (at == std::string_view::npos ? text.size() : at) - pos);
        if (impl_->bytes) out.insert(out.end(), reinterpret_cast<const unsigned char*>(piece.data()),
                                     reinterpret_cast<const unsigned char*>(piece.data()) + piece.size());
        else impl_->encode_ordinary(piece, out);
        if (at == std::string_view::npos) break;
        out.push_back(impl_->eot);
        pos = at + eot.size();
    }
    return out;
}

std::string Tokenizer::decode(const uint32_t* ids, size_t n) const {
    if (!impl_) throw Error("tokenizer: decode on an unloaded Tokenizer");
    std::string out;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (id >= impl_->id_to_bytes.size() || !impl_->id_present[id])
            throw Error(strprintf("tokenizer: cannot decode id %u at position %zu (vocabulary has %u ids)",
                                  id, i, impl_->nvocab));
        out += impl_->id_to_bytes[id];
    }
    return out;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const { return decode(ids.data(), ids.size()); }

uint32_t Tokenizer::eot_id() const {
    if (!impl_) throw Error("tokenizer: eot_id on an unloaded Tokenizer");
    return impl_->eot;
}

uint32_t Tokenizer::vocab_size() const {
    if (!impl_) throw Error("tokenizer: vocab_size on an unloaded Tokenizer");
    return impl_->nvocab;
}

bool Tokenizer::is_bytes() const {
    if (!impl_) throw Error("tokenizer: is_bytes on an unloaded Tokenizer");
    return impl_->bytes;
}

std::unique_ptr<Tokenizer> load_tokenizer_flag(const std::string& flag_value) {
    std::string path = flag_value;
    if (path.empty()) {
        const std::string dd = find_data_dir();
        if (dd.empty() || !file_exists(dd + "/gpt2_tokenizer/encoder.json")) return nullptr;
        path = dd + "/gpt2_tokenizer";
    } else if (path != Tokenizer::kBytesName && !file_exists(path)) {
        throw Error("--tokenizer: " + path + " does not exist");
    }
    return std::unique_ptr<Tokenizer>(new Tokenizer(Tokenizer::load(path)));
}

uint64_t tokenizer_fingerprint(const Tokenizer& tok) {
    // Not FNV's offset basis (14695981039346656037): this value, one digit short, is what every
    // eval binary written so far holds, so it stays (the hash is an identity, not a checksum).
    uint64_t h = 1469598103934665603ull;
    for (uint32_t id = 0; id < tok.vocab_size(); id++) {
        std::string b = tok.decode(&id, 1);
        uint8_t len[4] = {uint8_t(b.size()), uint8_t(b.size() >> 8), uint8_t(b.size() >> 16), uint8_t(b.size() >> 24)};
        h = fnv1a64(len, 4, h);
        h = fnv1a64(b.data(), b.size(), h);
    }
    static const char* probe =
        "The quick brown fox's 12345 jumps -- over\tthe lazy dog's  back.\n Naïve café, ελληνικά, 日本語!";
    for (uint32_t id : tok.encode(probe)) {
        uint8_t b[4] = {uint8_t(id), uint8_t(id >> 8), uint8_t(id >> 16), uint8_t(id >> 24)};
        h = fnv1a64(b, 4, h);
    }
    return h;
}

}  // namespace ldm
