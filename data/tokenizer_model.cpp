#include "data/tokenizer_model.h"

#include <nlohmann/json.hpp>

#include "data/bpe.h"
#include "data/json_fields.h"
#include "data/tokenizer_error.h"
#include "data/word_level.h"

namespace baton::data {

Vocabulary Vocabulary::from_json(const nlohmann::json& vocab, const std::string& where) {
  if (!vocab.is_object()) throw TokenizerError(where + ": expected an object of token -> id");
  Vocabulary v;
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > INT32_MAX) {
      throw TokenizerError(where + "[\"" + token + "\"]: expected an id >= 0");
    }
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    if (static_cast<std::size_t>(id) >= v.tokens_.size()) {
      v.tokens_.resize(static_cast<std::size_t>(id) + 1);
      v.has_token_.resize(static_cast<std::size_t>(id) + 1, false);
    }
    if (v.has_token_[static_cast<std::size_t>(id)]) {
      throw TokenizerError(where + ": id " + std::to_string(id) + " is given to both '" +
                           v.tokens_[static_cast<std::size_t>(id)] + "' and '" + token + "'");
    }
    v.tokens_[static_cast<std::size_t>(id)] = token;
    v.has_token_[static_cast<std::size_t>(id)] = true;
    v.ids_.emplace(token, id);
  }
  return v;
}

std::optional<int32_t> Vocabulary::find(std::string_view token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string* Vocabulary::token(int32_t id) const {
  if (id < 0 || id >= end_id() || !has_token_[static_cast<std::size_t>(id)]) return nullptr;
  return &tokens_[static_cast<std::size_t>(id)];
}

std::unique_ptr<TokenizerModel> make_tokenizer_model(const nlohmann::json& config,
                                                     const std::string& where) {
  // HF omits "type" in some older files; BPE is then recognised by its merges.
  std::string type;
  if (config.is_object() && !config.contains("type") && config.contains("merges")) {
    type = "BPE";
  } else {
    type = json_type(config, where);
  }
  if (type == "BPE") return std::make_unique<Bpe>(config, where);
  if (type == "WordLevel") return std::make_unique<WordLevel>(config, where);
  throw TokenizerError(where + ": unsupported model type '" + type +
                       "' (baton supports BPE and WordLevel)");
}

}  // namespace baton::data
