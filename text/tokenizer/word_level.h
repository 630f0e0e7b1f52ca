// HF's WordLevel model: every piece is one token of the vocabulary, or the unknown token.
#pragma once

#include <optional>

#include "text/tokenizer/tokenizer_model.h"

namespace baton::data {

class WordLevel final : public TokenizerModel {
 public:
  // `config` is the "model" object of tokenizer.json; errors name `where`.
  WordLevel(const nlohmann::json& config, const std::string& where);
  // Throws TokenizerError when `piece` is not in the vocabulary and there is no unk_token.
  void tokenize(std::string_view piece, std::vector<int32_t>& ids) const override;
  const Vocabulary& vocabulary() const override { return vocab_; }

 private:
  Vocabulary vocab_;
  std::optional<int32_t> unk_id_;
};

}  // namespace baton::data
