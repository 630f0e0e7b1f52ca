// HF's BPE model: a piece starts as its characters and the merges (lowest rank first) join
// neighbours until none applies. Options: both JSON forms of "merges" ("a b" strings and
// ["a", "b"] pairs), ignore_merges (a piece that is a token is taken whole), unk_token,
// fuse_unk and byte_fallback. Pieces up to 256 bytes are cached (10000 of them).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer/tokenizer_model.h"

namespace baton::data {

class Bpe final : public TokenizerModel {
 public:
  // `config` is the "model" object of tokenizer.json; errors name `where` and the field.
  // Rejects dropout > 0, continuing_subword_prefix and end_of_word_suffix.
  Bpe(const nlohmann::json& config, const std::string& where);
  void tokenize(std::string_view piece, std::vector<int32_t>& ids) const override;
  const Vocabulary& vocabulary() const override { return vocab_; }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::vector<int32_t> merge_word(std::string_view piece) const;

  Vocabulary vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  mutable std::mutex cache_mutex_;
  struct PieceHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>>
      cache_;  // GUARDED_BY(cache_mutex_)
};

}  // namespace baton::data
