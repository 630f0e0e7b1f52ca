// The `model` of an HF tokenizer.json: turns one pre-tokenized piece into token ids.
// Supported: BPE (bpe.h) and WordLevel (word_level.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace baton::data {

// A model's "vocab": token string <-> id (ids need not be contiguous).
class Vocabulary {
 public:
  // Throws TokenizerError naming `where` unless `vocab` maps strings to distinct ids >= 0.
  static Vocabulary from_json(const nlohmann::json& vocab, const std::string& where);

  std::optional<int32_t> find(std::string_view token) const;
  const std::string* token(int32_t id) const;  // nullptr for an id with no token
  // One past the largest id.
  int32_t end_id() const { return static_cast<int32_t>(tokens_.size()); }
  std::size_t size() const { return ids_.size(); }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ids_;
  std::vector<std::string> tokens_;
  std::vector<bool> has_token_;
};

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  // Appends the ids of `piece` (non-empty, valid UTF-8). Thread-safe.
  virtual void tokenize(std::string_view piece, std::vector<int32_t>& ids) const = 0;
  virtual const Vocabulary& vocabulary() const = 0;
};

// Builds the model `config` describes. Throws TokenizerError naming `where` (file and JSON
// path) and the type or field for an unsupported model or option.
std::unique_ptr<TokenizerModel> make_tokenizer_model(const nlohmann::json& config,
                                                     const std::string& where);

}  // namespace baton::data
