// The `model` of an HF tokenizer.json: turns one pre-tokenized piece into token ids.
// Supported: BPE (bpe.h) and WordLevel (word_level.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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
  std::size_t size() const { return size_; }

 private:
  void index(int32_t id);

  std::vector<std::string> tokens_;
  std::vector<bool> has_token_;
  std::size_t size_ = 0;
  // find's hash table (open addressing, linear probing, at most half full): a slot holds the
  // token's hash in its high 32 bits and id + 1 in its low 32 (0: an empty slot). Flat, so a
  // lookup in a 150k-token vocabulary touches two cache lines, not a node chain.
  std::vector<uint64_t> slots_;
  std::size_t mask_ = 0;
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
