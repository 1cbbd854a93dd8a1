// The umT5 tokenizer as Wan drives it (wan/modules/tokenizers.py with
// clean='whitespace', the HF google/umt5-xxl tokenizer): clean the prompt,
// SentencePiece-encode it, append </s>, truncate to max_length (warning) and
// pad with <pad> to max_length, with an attention mask.
//
// The SentencePiece model is the checkpoint's `spiece.model` (HF tokenizer
// folder layout). Wan loads HF's fast tokenizer (tokenizer.json), which is the
// same unigram model; turbodiff runs the SentencePiece library on spiece.model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace td::models::umt5 {

// Wan's prompt cleaning without ftfy: HTML unescape twice, then every run of
// whitespace (Python's Unicode \s: ASCII space/controls, U+0085, U+00A0,
// U+1680, U+2000-U+200A, U+2028/9, U+202F, U+205F, U+3000, U+001C-U+001F)
// becomes one space, then strip. The unescape handles numeric references
// (&#NN; &#xHH;, with Python's replacements: Windows-1252 for 0x80-0x9F,
// U+FFFD for NUL/surrogates/out of range, forbidden controls and
// noncharacters dropped) and the common named entities (amp lt gt quot apos
// nbsp, typographic and a few Latin-1 ones; the legacy ones also without ';').
// Not done: ftfy's mojibake and Unicode repair (ftfy.fix_text), and the ~2200
// rarer HTML5 entity names, which stay as written.
std::string clean_prompt(std::string_view text);

struct TokenizedBatch {
  Tensor ids;   // i64 [B, max_length], <pad> after the tokens
  Tensor mask;  // i64 [B, max_length], 1 for tokens (including </s>), 0 for padding
  std::vector<int64_t> lengths;     // tokens per prompt (the real length: the context_lens)
  std::vector<int64_t> untruncated; // tokens each prompt had before truncation (with </s>)
};

class UMT5Tokenizer {
 public:
  // `dir_or_model`: a tokenizer folder holding spiece.model (HF google/umt5-xxl
  // or a diffusers tokenizer/ folder), or the .model file itself.
  static UMT5Tokenizer load(const std::string& dir_or_model);
  ~UMT5Tokenizer();
  UMT5Tokenizer(UMT5Tokenizer&&) noexcept;
  UMT5Tokenizer& operator=(UMT5Tokenizer&&) noexcept;

  const std::string& path() const { return path_; }
  int64_t vocab_size() const;
  int64_t pad_id() const { return 0; }
  int64_t eos_id() const { return 1; }

  // The pieces of an already cleaned text, then </s> (no truncation).
  std::vector<int64_t> encode(std::string_view cleaned) const;
  // Cleans, encodes, truncates to max_length (keeping max_length - 1 tokens and
  // </s>, as HF truncation does; logs a warning naming the prompt's length) and pads.
  TokenizedBatch tokenize(const std::vector<std::string>& prompts, int64_t max_length = 512) const;

 private:
  UMT5Tokenizer() = default;
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// The zero-pad rule before the DiT (reference §1.2.3): rows of `hidden`
// [B, L, d] at and past lengths[b] become zero, the real rows are kept. Host
// f32 in, fresh host f32 out.
Tensor zero_pad_context(const Tensor& hidden, const std::vector<int64_t>& lengths);

}  // namespace td::models::umt5
