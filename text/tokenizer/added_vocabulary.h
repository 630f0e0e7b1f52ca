// The "added_tokens" of an HF tokenizer.json (special tokens such as <|im_end|> and other added
// tokens): found in the text before the normalizer and the model run, so they are never split.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace baton::data {

class Normalizer;
class Regex;

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false;  // only where no word character touches it
  bool lstrip = false;       // takes the whitespace before it
  bool rstrip = false;       // takes the whitespace after it
  bool normalized = true;    // matched in the normalized text (else in the raw text)
  bool special = false;      // dropped by decode(..., skip_special_tokens = true)
};

class AddedVocabulary {
 public:
  // `tokens` is the "added_tokens" array; `normalizer` (may be null) gives the normalized form
  // of tokens with "normalized": true. Throws TokenizerError naming `where`.
  AddedVocabulary(const nlohmann::json& tokens, const Normalizer* normalizer,
                  const std::string& where);
  ~AddedVocabulary();
  AddedVocabulary(AddedVocabulary&&) noexcept;

  // A piece of text, or an added token found in it.
  struct Segment {
    std::string text;
    std::optional<int32_t> id;
  };
  // HF's extract_and_normalize: tokens that are not normalized are found in `text`, the rest
  // is normalized, then normalized tokens are found in it. Empty segments are dropped.
  std::vector<Segment> split(std::string_view text, const Normalizer* normalizer) const;

  std::optional<int32_t> find(std::string_view content) const;
  const AddedToken* token(int32_t id) const;
  // The string decode uses for `id` (the normalized content where normalization changed it).
  const std::string* decoded(int32_t id) const;
  bool is_special(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<Segment> find_in(std::string_view text, bool normalized) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> match_form_;  // per token: the string searched for
  // Per kind (raw, normalized) and first byte: the tokens that can start there.
  std::array<std::vector<std::size_t>, 256> starts_[2];
  bool has_normalized_ = false;  // any token matched in the normalized text
  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, std::size_t> by_id_;
  std::unique_ptr<Regex> word_char_;
};

}  // namespace baton::data
