// data/prep_shards.h — the data tool's shard builder and its small user subcommands
// (issue #2 item 5). The `ldm_data` binary (data/ldm_data.cpp) only dispatches to the cmd_*
// functions below; tests call prepare_shards() and the cmd_* functions directly.
//
// Document model (doc/formats.md "Data tool"):
//   jsonl: one JSON object per line, the document is the string field `text_field`; blank lines
//          are skipped; bad JSON, a non-object, a missing or non-string field -> ldm::Error
//          naming the file and the 1-based line.
//   text:  text_split = "file": each file is one document, verbatim (default);
//          text_split = "blank": documents are the runs of non-blank lines (a blank line is empty
//          or only ASCII whitespace), each taken verbatim with its line ends; blank lines dropped.
// Every document is written as [EOT] + encode(document). The first documents go to the
// validation shard NAME_val_000000.bin (whole documents until it holds >= val_tokens tokens, or
// the first val_docs documents); the rest fill NAME_train_000001.bin, ... with exactly
// shard_tokens tokens each (the last may be shorter; documents may continue into the next
// shard, as in llm.c). Token width: uint16 when vocab_size <= 65536, else the uint32 variant.
// Document text is encoded with Tokenizer::encode (no special-token matching), so a document
// holding the text "<|endoftext|>" adds no end-of-text id: a shard of N documents has exactly N.
//
// Bad documents (invalid UTF-8, bad JSON line, missing/non-string field, encoding error): by
// default the run fails (ldm::Error naming the file and line/offset); with skip_bad_docs they
// are left out, counted and reported instead. Either way nothing partial is left behind: shards
// are written into a private staging directory inside out_dir and moved into place only when
// the run succeeds; a failed run removes the staging directory and any directories it created.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tokenizer.h"

namespace ldm {

struct ShardsOptions {
    std::string tokenizer;            // "bytes", dir with encoder.json + vocab.bpe, or a tokenizer.json
    std::vector<std::string> inputs;  // files or glob patterns, in order (each glob sorted)
    std::string format = "jsonl";     // jsonl | text
    std::string text_field = "text";  // jsonl field holding the document
    std::string text_split = "file";  // text: file | blank
    std::string out_dir, name;
    uint64_t shard_tokens = 100000000;  // tokens per train shard (llm.c's default)
    int64_t val_tokens = -1;            // >= 0: val budget in tokens (default 10,000,000)
    int64_t val_docs = -1;              // >= 0: val = the first val_docs documents
    int threads = 0;                    // 0 = all cores (OpenMP default)
    bool progress = true;               // progress line on stderr
    size_t piece_bytes = 1 << 18;       // plain text: split long documents at safe line breaks
                                        // into pieces of about this size for parallel encoding
                                        // (only for tokenizers where that is exact: GPT-2 and HF
                                        // ByteLevel with use_regex and no add_prefix_space)
    size_t batch_bytes = 0;             // bytes read per parallel batch (0 = 4 MiB * threads)
    bool skip_bad_docs = false;         // leave out (and count) bad documents instead of failing;
                                        // plain-text documents are then encoded whole (a document
                                        // must be dropped before any of its tokens are written)
};

struct ShardsSummary {
    uint64_t docs = 0, tokens = 0;          // all documents / tokens (EOTs included)
    uint64_t val_docs = 0, val_tokens = 0;  // in NAME_val_000000.bin
    uint64_t train_docs = 0, train_tokens = 0;
    uint64_t input_bytes = 0;
    uint64_t pieces = 0;                    // units encoded separately (> docs when text was split)
    double seconds = 0;
    bool uint32_tokens = false;
    std::vector<std::string> shards;        // paths written, in order (val first)
    uint64_t skipped_docs = 0;              // bad documents left out (skip_bad_docs)
    std::vector<std::string> skipped_examples;  // the first few of their error messages
};

// Expands files/globs (each glob's matches sorted; a pattern without matches -> ldm::Error).
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

// Builds the shards. `tok` may be given to reuse a loaded tokenizer (else opt.tokenizer is
// loaded; opt.tokenizer should still name its path, which decides whether long plain-text
// documents may be split for the threads). Memory: one batch of input (batch_bytes) plus the
// longest single jsonl line / text line; tokens are streamed to the shard files. Throws
// ldm::Error on any bad input (see "Bad documents" above: out_dir is then as before the run).
// On success the shards move from the staging directory into out_dir, and stale
// NAME_{val,train}_*.bin files of an earlier run that this run did not write are removed.
ShardsSummary prepare_shards(const ShardsOptions& opt, const Tokenizer* tok = nullptr);

// Subcommands of ldm_data (argv[0] = subcommand name). Return the exit status: 0 ok, 1 error
// (message "error: ..." on stderr), 2 usage error. Each prints its help for --help / -h.
int cmd_shards(int argc, char** argv);
int cmd_encode(int argc, char** argv);  // prints the ids of a text (file, --text or stdin)
int cmd_decode(int argc, char** argv);  // prints the bytes of ids (arguments or stdin)
int cmd_info(int argc, char** argv);    // header and token statistics of a shard

}  // namespace ldm
