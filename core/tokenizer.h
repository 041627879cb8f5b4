// core/tokenizer.h — byte-level BPE tokenizer: GPT-2 (encoder.json + vocab.bpe, tiktoken `gpt2`
// semantics) and Hugging Face tokenizer.json files of the byte-level BPE family (GPT-NeoX-20B,
// OLMo). Issue #2 item 3. How it works, the whitespace semantics and the supported subset of
// tokenizer.json are described in doc/tokenizer.md.
//
// Token ids are uint32. Text is UTF-8; invalid UTF-8 is rejected with ldm::Error naming the
// source and the byte offset. A Tokenizer is cheap to copy (shared immutable tables) and every
// const method is thread-safe (per-thread regex match data and word cache).
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
  // `path`: a directory holding encoder.json + vocab.bpe (GPT-2), or a HF tokenizer.json file.
  static Tokenizer load(const std::string& path);            // throws ldm::Error
  static Tokenizer load_gpt2(const std::string& encoder_json, const std::string& vocab_bpe);
  static Tokenizer load_hf_json(const std::string& tokenizer_json);
  // Encode ordinary text (GPT-2: "<|endoftext|>" inside text is ordinary text; HF: added tokens
  // are honoured exactly as HF tokenizers does). Thread-safe (const). Invalid UTF-8 -> ldm::Error
  // naming `source` and the byte offset (base_offset + offset within text).
  std::vector<uint32_t> encode(std::string_view text, const std::string& source = "<text>",
                               uint64_t base_offset = 0) const;
  std::string decode(const uint32_t* ids, size_t n) const;   // raw bytes (may be partial UTF-8)
  std::string decode(const std::vector<uint32_t>& ids) const;
  uint32_t eot_id() const;       // 50256 GPT-2, 50279 OLMo
  uint32_t vocab_size() const;   // number of ids (max id + 1): 50257 GPT-2, 50280 OLMo

 private:
  std::shared_ptr<const TokenizerImpl> impl_;
};

}  // namespace ldm
