// An HF tokenizer (tokenizer.json + tokenizer_config.json) in plain C++: encode and decode give
// what HF `tokenizers` gives, token for token.
//
// Supported components (anything else fails at load with an error naming it and the file):
//   model:          BPE (byte-level, as GPT-2 / Qwen2 / Llama-3; both merges forms,
//                   ignore_merges, byte_fallback) and WordLevel
//   normalizer:     none, NFC, Sequence
//   pre_tokenizer:  ByteLevel, Split (PCRE2 with Unicode classes), Digits, Whitespace, Sequence
//   post_processor: TemplateProcessing, ByteLevel, Sequence
//   decoder:        ByteLevel, Fuse, Strip, Replace, Sequence
//   added_tokens:   matched before the normalizer and the model, so never split
// From tokenizer_config.json: bos_token, eos_token, pad_token, unk_token (strings or
// {"content": ...}), add_bos_token / add_eos_token, chat_template.
//
// Example:
//   auto tok = baton::data::Tokenizer::load("models/qwen2-0.5b");
//   std::vector<int32_t> ids = tok.encode("Hello world", /*add_special_tokens=*/true);
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// Thread safety: a loaded Tokenizer is immutable; encode and decode may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/tokenizer/tokenizer_error.h"

namespace baton::data {

class Tokenizer {
 public:
  // Reads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json. Throws
  // TokenizerError naming the file (and the JSON path) for a missing or malformed file or an
  // unsupported component.
  static Tokenizer load(const std::filesystem::path& dir);
  // The same from the files' contents; `source` names them in errors. `config_json` may be
  // empty (no tokenizer_config.json).
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json,
                             const std::string& source);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Token ids of `text` (UTF-8; throws TokenizerError at the first invalid byte). With
  // `add_special_tokens` the post-processor's tokens are added, and add_bos_token /
  // add_eos_token of tokenizer_config.json, when set, decide whether the sequence starts with
  // bos_token / ends with eos_token (as transformers does for Llama-style tokenizers).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Text of `ids`; ids with no token are skipped (as HF does), special tokens too when
  // `skip_special_tokens`. Bytes that do not form UTF-8 come out as U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // One past the largest id of the model and the added tokens (the rows an embedding needs).
  int32_t vocab_size() const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // The Jinja chat template of tokenizer_config.json ("" when there is none).
  const std::string& chat_template() const;
  // The named special tokens of tokenizer_config.json that are set (bos_token, eos_token,
  // unk_token, sep_token, pad_token, cls_token, mask_token, in that order) with their text:
  // the variables transformers passes to a chat template.
  const std::vector<std::pair<std::string, std::string>>& special_tokens() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::data
