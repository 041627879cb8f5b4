// core/tokenizer.h — byte-level BPE tokenizer: GPT-2 (encoder.json + vocab.bpe, tiktoken `gpt2`
// semantics) and Hugging Face tokenizer.json files of the byte-level BPE family (GPT-NeoX-20B,
// OLMo) (issue #2 item 3), and the plain byte tokenizer "bytes" (one id per byte, issue #20).
// How it works, the whitespace semantics and the supported subset of tokenizer.json are
// described in doc/tokenizer.md.
//
// Token ids are uint32. Text is UTF-8 for every tokenizer; invalid UTF-8 is rejected with
// ldm::Error naming the source and the byte offset. A Tokenizer is cheap to copy (shared
// immutable tables) and every const method is thread-safe (per-thread regex match data and word
// cache).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ldm {

struct TokenizerImpl;

class Tokenizer {
 public:
  static constexpr const char* kBytesName = "bytes";
  // `spec`: "bytes" (the byte tokenizer, bytes() below; to load a directory of that name write
  // "./bytes"), a directory holding encoder.json + vocab.bpe (GPT-2), or a HF tokenizer.json.
  static Tokenizer load(const std::string& spec);            // throws ldm::Error
  static Tokenizer load_gpt2(const std::string& encoder_json, const std::string& vocab_bpe);
  static Tokenizer load_hf_json(const std::string& tokenizer_json);
  // The byte tokenizer: ids 0..255 are the bytes of the UTF-8 text (id = byte value, no
  // pre-tokenization, no merges), id 256 is the end-of-text token "<|endoftext|>"; 257 ids.
  static Tokenizer bytes();
  // Encodes document text as ordinary text: special tokens are NEVER matched, so the only way an
  // end-of-text id enters a token stream is the data tool's document separator. GPT-2 and bytes:
  // "<|endoftext|>" in the text is ordinary text; HF: added tokens marked "special" (the NeoX /
  // OLMo "<|endoftext|>", "<|padding|>") are encoded like any other text (normalizer,
  // pre-tokenizer, BPE: HF tokenizers' split_special_tokens=True), the other added tokens (space
  // runs, "|||IP_ADDRESS|||") are matched as HF tokenizers does. Thread-safe (const). Invalid
  // UTF-8 -> ldm::Error naming `source` and the byte offset (base_offset + offset within text).
  std::vector<uint32_t> encode(std::string_view text, const std::string& source = "<text>",
                               uint64_t base_offset = 0) const;
  // As encode, but special-token text gives its id: HF tokenizers' default (every added token
  // matched), tiktoken's allowed_special="all" for GPT-2, "<|endoftext|>" -> 256 for bytes. For
  // comparisons with reference encoders (test_tokenizer_xcheck); never used for document text.
  std::vector<uint32_t> encode_with_special(std::string_view text, const std::string& source = "<text>",
                                            uint64_t base_offset = 0) const;
  std::string decode(const uint32_t* ids, size_t n) const;   // raw bytes (may be partial UTF-8)
  std::string decode(const std::vector<uint32_t>& ids) const;
  uint32_t eot_id() const;       // 50256 GPT-2, 50279 OLMo, 0 GPT-NeoX-20B, 256 bytes
  uint32_t vocab_size() const;   // number of ids (max id + 1): 50257 GPT-2, 50280 OLMo, 257 bytes
  bool is_bytes() const;         // the byte tokenizer

 private:
  std::shared_ptr<const TokenizerImpl> impl_;
};

// The --tokenizer flag of the trainers and evaluators, in one place: "bytes" -> the byte
// tokenizer; any other non-empty value -> Tokenizer::load of that path (ldm::Error
// "--tokenizer: PATH does not exist" when it does not); "" -> <data dir>/gpt2_tokenizer when
// find_data_dir() has one, else nullptr (whether that is an error is the caller's decision).
std::unique_ptr<Tokenizer> load_tokenizer_flag(const std::string& flag_value);

// The tokenizer's identity as stored in eval binaries (doc/formats.md "Eval binaries"): FNV-1a 64
// (started from 1469598103934665603, not FNV's offset basis) over, for id = 0..vocab_size-1,
// the uint32 LE byte length and the bytes of decode({id}), then the ids of encode() of a fixed
// probe sentence (so merges count too). Never 0 in practice; 0 in a binary means "not recorded".
uint64_t tokenizer_fingerprint(const Tokenizer& tok);

}  // namespace ldm
