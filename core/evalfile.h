// core/evalfile.h — the three eval binaries ("raw binaries" of ../shared/spec/evals.md):
// LAMBADA, WikiText-2 and HellaSwag, written by the data tool (`ldm_data lambada|wikitext|
// hellaswag`, data/prep_eval.cpp) and read by the evaluator. Tokenization happens once, in the
// data tool; these files carry everything scoring needs. Byte layout: doc/formats.md, section
// "Eval binaries". Owner: evalprep.
//
// Common layout (little-endian, no padding, easy to mmap):
//   [256-byte header] [item records: n_items x record_bytes] [sequence offsets: (n_seqs+1) x u64]
//   [tokens: n_tokens x token_bytes (2 = uint16 when vocab_size <= 65536, else 4 = uint32)]
// Every item owns `seqs_per_item` consecutive token sequences (LAMBADA 2: context, target;
// WikiText 1: the detokenized page; HellaSwag 5: context, ending 0..3). Sequence s is
// tokens[offsets[s], offsets[s+1]).
//
// Readers check the magic (which also names the kind), version, header fields, exact file size
// (truncated / trailing bytes), offsets (start 0, non-decreasing, end = n_tokens), token ids
// < vocab_size, labels and totals, at least one item, WikiText documents with >= 1 token, word
// and byte, last the checksum (FNV-1a 64 of the file; version 2), and throw ldm::Error naming
// the file and what is wrong. Writers refuse the same
// sets and write atomically (temp file + rename).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ldm {

// The tokenizer the file was made with, so the evaluator can refuse a mismatch with the model
// (vocab size, end-of-text id, and the fingerprint when the model's tokenizer is known) or with
// another binary (fingerprint).
struct EvalTokenizerInfo {
  uint32_t eot_id = 0;        // end-of-text id: prefix token of WikiText rolling windows
  uint32_t vocab_size = 0;    // number of ids (max id + 1); every stored token is < vocab_size
  uint64_t fingerprint = 0;   // FNV-1a 64 of the id -> bytes table (tokenizer_fingerprint in
                              // core/tokenizer.h); 0 = unknown
  std::string name;           // e.g. "gpt2_tokenizer" (basename of the tokenizer path), <= 63 bytes
};

// LAMBADA (lambada_openai): one example per line of lambada_test.jsonl.
struct LambadaExample {
  std::vector<uint32_t> context;  // tok(context) — text before the last single ASCII space
  std::vector<uint32_t> target;   // tok(context + target)[len(tok(context)):], target = " " + word
};
struct LambadaSet {
  EvalTokenizerInfo tok;
  std::vector<LambadaExample> examples;
};

// WikiText-2 (wikitext, wikitext-2-raw-v1 test): one entry per document (page).
struct WikiTextDoc {
  std::vector<uint32_t> tokens;  // tok(wikitext_detokenizer(page)); no EOT inside
  uint64_t words = 0;            // len(re.split(r"\s+", page)) on the ORIGINAL page
  uint64_t bytes = 0;            // UTF-8 bytes of the ORIGINAL page
};
struct WikiTextSet {
  EvalTokenizerInfo tok;
  std::vector<WikiTextDoc> docs;
  uint64_t total_words = 0;      // sum of docs[i].words (checked on read)
  uint64_t total_bytes = 0;      // sum of docs[i].bytes (checked on read)
};

// HellaSwag (validation): one entry per item.
enum HellaSwagSource : uint32_t {
  kHellaSwagOriginalJsonl = 1,   // rowanz hellaswag_val.jsonl + lm-eval-harness preprocessing
  kHellaSwagReformattedTxt = 2,  // klosax 6-line text copy (its own preprocessing, kept verbatim)
};
struct HellaSwagItem {
  std::vector<uint32_t> context;                  // tok(ctx)
  std::array<std::vector<uint32_t>, 4> endings;   // tok(ctx + " " + choice)[len(tok(ctx)):]
  std::array<uint32_t, 4> ending_chars{};         // Unicode code points of choice (no leading
                                                  // space): the acc_norm divisor
  uint32_t label = 0;                             // gold ending, 0..3
};
struct HellaSwagSet {
  EvalTokenizerInfo tok;
  uint32_t source_format = kHellaSwagOriginalJsonl;  // HellaSwagSource
  std::vector<HellaSwagItem> items;
};

// Written: 2 (a checksum at header byte 152). Read: 1 (no checksum) and 2.
constexpr uint32_t kEvalFileVersion = 2;
constexpr uint32_t kEvalHeaderBytes = 256;

// Writers: validate the set (non-empty target/endings, label 0..3, ids < vocab_size, totals)
// and write atomically. Throw ldm::Error naming `path`.
void write_lambada(const std::string& path, const LambadaSet& s);
void write_wikitext(const std::string& path, const WikiTextSet& s);
void write_hellaswag(const std::string& path, const HellaSwagSet& s);

// Readers: full validation (see top of file); throw ldm::Error naming `path` on any mismatch.
LambadaSet read_lambada(const std::string& path);
WikiTextSet read_wikitext(const std::string& path);
HellaSwagSet read_hellaswag(const std::string& path);

// Kind of an eval binary from its magic: "lambada", "wikitext", "hellaswag"; ldm::Error if the
// file is shorter than 8 bytes or has no eval magic.
std::string eval_file_kind(const std::string& path);

}  // namespace ldm
